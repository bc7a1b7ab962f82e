"""Token embedding and absolute / relative position parameters."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from txf import ops


def check_position_table(position: str, max_len: int, length: int, what: str) -> None:
  """Rejects `length` positions (of `what`) beyond a learned table of max_len rows."""
  if position == "learned" and length > max_len:
    raise ValueError(f"model.max_len: {what} of {length} positions is longer than the "
                     f"learned position table ({max_len} rows)")


class Embedder(nn.Module):
  """Token embedding plus an absolute position encoding, and the tied logits.

  Attributes:
    vocab_size: V.
    d_model: D.
    position: 'learned' adds a [max_len, D] table, 'sinusoidal' adds the
      fixed encoding, anything else adds nothing (relative schemes act in
      attention).
    max_len: size of the learned table.
  """

  vocab_size: int
  d_model: int
  position: str
  max_len: int
  dtype: Any

  def setup(self):
    # N(0, 1) rows with tied logits scaled by 1/sqrt(D) (Mesh TF / flax lm1b):
    # embeddings and sinusoids are both O(1) and initial logits are O(1).
    self.token = nn.Embed(self.vocab_size, self.d_model, dtype=self.dtype,
                          embedding_init=nn.with_logical_partitioning(
                              nn.initializers.normal(stddev=1.0), ("vocab", "embed")))
    if self.position == "learned":
      self.position_table = self.param(
          "position_table",
          nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
          (self.max_len, self.d_model), jnp.float32)

  def __call__(self, tokens_BxT: jax.Array, positions_BxT: jax.Array) -> jax.Array:
    """tokens [B, T] int, positions [B|1, T] -> [B, T, D].

    Token ids must lie in [0, vocab_size): concrete ids outside it raise
    ValueError. Under jit the ids cannot be inspected, so they are clamped to
    [0, vocab_size - 1] (a wrong but finite embedding, never NaN logits).
    """
    tokens_BxT = self._check_tokens(tokens_BxT)
    x_BxTxD = self.token(tokens_BxT)
    check_position_table(self.position, self.max_len, tokens_BxT.shape[1], "a sequence")
    if self.position == "learned":
      x_BxTxD = x_BxTxD + jnp.take(self.position_table, positions_BxT, axis=0).astype(self.dtype)
    elif self.position == "sinusoidal":
      x_BxTxD = x_BxTxD + ops.sinusoidal_embedding(positions_BxT, self.d_model).astype(self.dtype)
    return x_BxTxD

  def _check_tokens(self, tokens_BxT: jax.Array) -> jax.Array:
    tokens_BxT = jnp.asarray(tokens_BxT)
    if not jnp.issubdtype(tokens_BxT.dtype, jnp.integer):
      raise ValueError(f"tokens must be integer ids, got dtype {tokens_BxT.dtype}")
    if not isinstance(tokens_BxT, jax.core.Tracer) and tokens_BxT.size:
      # numpy, not jnp: concrete ids closed over by a jitted function would
      # otherwise become tracers again.
      ids = np.asarray(tokens_BxT)
      low, high = int(ids.min()), int(ids.max())
      if low < 0 or high >= self.vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"tokens: id {bad} outside the vocabulary [0, {self.vocab_size}) "
                         "(model.vocab_size)")
    # jnp.take would wrap negative ids and give NaN rows past the table.
    return jnp.clip(tokens_BxT, 0, self.vocab_size - 1)

  def attend(self, x_BxTxD: jax.Array) -> jax.Array:
    """Tied output projection: [B, T, D] -> float32 logits [B, T, V]."""
    logits = self.token.attend(x_BxTxD.astype(self.dtype))
    return logits.astype(jnp.float32) / jnp.sqrt(self.d_model).astype(jnp.float32)


class RelativePositionTable(nn.Module):
  """T5's learned relative-position bias table [num_buckets, H], one per stack
  and shared by all its layers (Raffel et al. 2020)."""

  num_buckets: int
  num_heads: int

  @nn.compact
  def __call__(self) -> jax.Array:
    return self.param("table",
                      nn.with_logical_partitioning(nn.initializers.normal(stddev=1.0),
                                                   (None, "heads")),
                      (self.num_buckets, self.num_heads), jnp.float32)


class Positions(nn.Module):
  """Absolute positions of the current inputs, and the KV-cache write index.

  Outside decoding the inputs sit at 0..T-1. With use_cache a `cache/index`
  variable remembers how many tokens the stack has seen: the inputs sit at
  index..index+T-1 and the index advances by T. Creating the cache (the
  `model.init(..., use_cache=True)` call) leaves it at 0.
  """

  @nn.compact
  def __call__(self, length: int, use_cache: bool) -> tuple[jax.Array, jax.Array | None]:
    """Returns (positions [1, T] int32, cache_index scalar int32 or None)."""
    positions_1xT = jnp.arange(length, dtype=jnp.int32)[None]
    if not use_cache:
      return positions_1xT, None
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    cache_index = index.value
    if not self.is_initializing():
      index.value = cache_index + length
    return positions_1xT + cache_index, cache_index
