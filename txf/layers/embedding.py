"""Token embedding and absolute / relative position parameters."""

from __future__ import annotations

from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from txf.layers import positions
from txf.layers.model_config import ModelConfig
from txf.layers.norm import Norm


def check_position_table(position: str, max_len: int, length: int, what: str) -> None:
  """Rejects `length` positions (of `what`) beyond a learned table of max_len rows."""
  if positions.encoding(position).table == "absolute" and length > max_len:
    raise ValueError(
      f"model.max_len: {what} of {length} positions is longer than the "
      f"learned position table ({max_len} rows)"
    )


class Embedder(nn.Module):
  """Token embedding plus an absolute position encoding, and the tied logits.

  Reads the model's config: vocab_size V, d_model D, position (an encoding
  that contributes an embedding is added here; others act in attention or
  not at all), max_len (rows of an absolute table), num_token_types (N > 0
  adds a [N, D] token-type table, BERT), embed_norm (cfg.norm over the sum,
  BERT's embedding LayerNorm), scale_logits (the tied logits divided by
  sqrt(D); None: when the embeddings are tied) and the compute dtype.

  Attributes:
    cfg: the model's config.
  """

  cfg: ModelConfig

  # The config's dtype name as a jnp dtype.
  @property
  def dtype(self) -> Any:
    return jnp.dtype(self.cfg.dtype)

  def setup(self):
    # N(0, 1) rows with tied logits scaled by 1/sqrt(D) (Mesh TF / flax lm1b):
    # embeddings and sinusoids are both O(1) and initial logits are O(1).
    self.token = nn.Embed(
      self.cfg.vocab_size,
      self.cfg.d_model,
      dtype=self.dtype,
      embedding_init=nn.with_logical_partitioning(
        nn.initializers.normal(stddev=1.0), ("vocab", "embed")
      ),
    )
    self.encoding = positions.encoding(self.cfg.position)
    if self.encoding.table == "absolute":
      # N(0, 0.02), BERT's scale for its position rows (GPT-2: 0.01). Beside
      # N(0, 1) token rows that is 1/50 of the token scale, where GPT-2 has 1/2
      # and BERT 1; a table at GPT-2's ratio, N(0, 0.5), trained no better on
      # configs/base.py (docs/results.md, section 1), so the small start stays.
      self.position_table = self.param(
        "position_table",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
        (self.cfg.max_len, self.cfg.d_model),
        jnp.float32,
      )
    if self.cfg.num_token_types:
      # As the position table: small next to the N(0, 1) token rows.
      self.token_type_table = self.param(
        "token_type_table",
        nn.with_logical_partitioning(nn.initializers.normal(stddev=0.02), (None, "embed")),
        (self.cfg.num_token_types, self.cfg.d_model),
        jnp.float32,
      )
    if self.cfg.embed_norm:
      self.embed_norm = Norm(self.cfg)

  def __call__(
    self,
    tokens_BxT: jax.Array,
    positions_BxT: jax.Array | None,
    token_types_BxT: jax.Array | None = None,
  ) -> jax.Array:
    """tokens [B, T] int, positions [B|1, T], token types [B, T] int -> [B, T, D].

    positions may be None where the encoding adds no embedding (rope, alibi, none, ...).

    Token ids must lie in [0, vocab_size), token types in
    [0, num_token_types) and positions in a learned table's [0, max_len):
    concrete ids outside raise ValueError. Under jit the
    ids cannot be inspected, so they are clamped into range (a wrong but
    finite embedding, never NaN logits). token_types None means type 0
    everywhere (BERT's default); they are refused without a token-type table.
    """
    tokens_BxT = _checked_ids(
      tokens_BxT, self.cfg.vocab_size, "tokens", "the vocabulary", "model.vocab_size"
    )
    # The lookup in the float32 table, cast after (not nn.Embed's cast of the
    # whole table first): its gradient is then a float32 scatter-add. In
    # bfloat16 that scatter adds each id's rows in bfloat16 (a large error
    # for frequent ids) and, on a GPU, through compare-and-swap loops that
    # contend on text's few frequent rows: 57 ms of gpt2_small's 134 ms
    # step on an H100 (docs/benchmarks.md).
    x_BxTxD = jnp.take(self.token.embedding, tokens_BxT, axis=0).astype(self.dtype)
    check_position_table(self.cfg.position, self.cfg.max_len, tokens_BxT.shape[1], "a sequence")
    if self.encoding.embed is not None:
      assert positions_BxT is not None, f"model.position={self.cfg.position!r} needs positions"
      table_LxD = self.position_table if self.encoding.table == "absolute" else None
      if table_LxD is not None:  # a row past the table was NaN (jnp.take's fill)
        positions_BxT = _checked_ids(
          positions_BxT, table_LxD.shape[0], "positions", "the position table", "model.max_len"
        )
      x_BxTxD = x_BxTxD + self.encoding.embed(self.cfg, positions_BxT, table_LxD).astype(self.dtype)
    if self.cfg.num_token_types:
      if token_types_BxT is None:
        token_types_BxT = jnp.zeros_like(tokens_BxT)
      elif jnp.shape(token_types_BxT) != tokens_BxT.shape:
        raise ValueError(
          f"token_types: shape {jnp.shape(token_types_BxT)} differs from the "
          f"tokens' {tokens_BxT.shape}"
        )
      token_types_BxT = _checked_ids(
        token_types_BxT,
        self.cfg.num_token_types,
        "token_types",
        "the token types",
        "model.num_token_types",
      )
      x_BxTxD = x_BxTxD + jnp.take(self.token_type_table, token_types_BxT, axis=0).astype(
        self.dtype
      )
    elif token_types_BxT is not None:
      raise ValueError(
        "token_types: the model has no token-type embeddings (model.num_token_types=0)"
      )
    if self.cfg.embed_norm:
      x_BxTxD = self.embed_norm(x_BxTxD)
    return x_BxTxD

  def output_kernel(self) -> jax.Array:
    """The tied output projection [D, V] in the compute dtype: the token
    table transposed."""
    return self.token.embedding.T.astype(self.dtype)

  def attend(self, x_BxTxD: jax.Array, dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """Tied output projection: [B, T, D] -> logits [B, T, V] in `dtype`
    (`linear_logits`)."""
    return linear_logits(x_BxTxD, self.output_kernel(), self.cfg, dtype)


def linear_logits(
  x_BxTxD: jax.Array, kernel_DxV: jax.Array, cfg: ModelConfig, dtype: jnp.dtype
) -> jax.Array:
  """x @ kernel, computed in the kernel's dtype: logits [B, T, V] in `dtype`,
  divided by sqrt(D) when cfg.scale_logits: float32 logits after the
  projection; logits in another dtype (the compute dtype a GPU loss kernel
  reads) through x before it, so that no pass over [B, T, V] rescales them."""
  project = lambda x_BxTxD: jnp.dot(x_BxTxD.astype(kernel_DxV.dtype), kernel_DxV)
  if not cfg.scale_logits:
    return project(x_BxTxD).astype(dtype)
  root_d = jnp.sqrt(cfg.d_model)
  if jnp.dtype(dtype) != jnp.float32:
    return project(x_BxTxD / root_d.astype(x_BxTxD.dtype)).astype(dtype)
  return project(x_BxTxD).astype(jnp.float32) / root_d.astype(jnp.float32)


def _checked_ids(
  ids_BxT: jax.Array, size: int, what: str, range_name: str, field: str
) -> jax.Array:
  """Integer ids clamped to [0, size); concrete ids outside raise ValueError."""
  ids_BxT = jnp.asarray(ids_BxT)
  if not jnp.issubdtype(ids_BxT.dtype, jnp.integer):
    raise ValueError(f"{what} must be integer ids, got dtype {ids_BxT.dtype}")
  if not isinstance(ids_BxT, jax.core.Tracer):
    # numpy, not jnp: concrete ids closed over by a jitted function would
    # otherwise become tracers again.
    check_id_range(np.asarray(ids_BxT), size, what, range_name, field)
  # jnp.take would wrap negative ids and give NaN rows past the table.
  return jnp.clip(ids_BxT, 0, size - 1)


def check_id_range(ids: np.ndarray, size: int, what: str, range_name: str, field: str) -> None:
  """ValueError naming `what`, the first id out of range and `field`, for
  integer `ids` outside [0, size): inside a jitted program the embedding
  clamps them (txf.decode.generate checks its prompts with it while they are
  concrete)."""
  if not ids.size:
    return
  low, high = int(ids.min()), int(ids.max())
  if low < 0 or high >= size:
    bad = low if low < 0 else high
    raise ValueError(f"{what}: id {bad} outside {range_name} [0, {size}) ({field})")


class RelativePositionTable(nn.Module):
  """T5's learned relative-position bias table [num_buckets, H], one per stack
  and shared by all its layers (Raffel et al. 2020).

  Initialised as t5x / flaxformer's RelativePositionBiases:
  variance_scaling(1.0, 'fan_avg', 'uniform'), entries within
  +-sqrt(6 / (num_buckets + H)) (0.41 for 32 buckets and 4 heads). A unit
  normal table starts every head with biases as large as the content scores,
  and Adam, moving each entry about one learning rate a step, leaves it close
  to that random start for hundreds of steps.
  """

  cfg: ModelConfig  # its num_heads H and its position's setting t5_num_buckets

  @nn.compact
  def __call__(self) -> jax.Array:
    # cast: flax types a boxed initializer's parameter as the box; param returns it unboxed.
    return cast(
      jax.Array,
      self.param(
        "table",
        nn.with_logical_partitioning(
          nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), (None, "heads")
        ),
        (self.cfg.settings("position").t5_num_buckets, self.cfg.num_heads),
        jnp.float32,
      ),
    )


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
