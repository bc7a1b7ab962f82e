"""Decoding caches of txf models, and the callables that thread them.

`init_cache`, `cache_batch_axes`, `make_tokens_to_logits` and
`encode_for_decoding` adapt txf models (`txf.models.build`) to the searches'
interface (`txf.decode`'s docstring); `cache_length` says how many positions
a search writes, and `cache_positions` / `cache_rows` how many positions
and rows a txf cache holds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import checks, hardware
from txf.decode import casting
from txf.layers.attention import CROSS_CACHE_NAMES
from txf.layers.embedding import check_position_table
from txf.layers.model_config import FAMILIES, HEADS

Array = jax.Array
Cache = Any  # a pytree of arrays
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]

# The tasks whose head gives next-token logits [B, T, V].
_NEXT_TOKEN_TASKS = {"lm", "seq2seq"}


# Positions and the cache's index are int32.
MAX_CACHE_LEN = 2**31 - 1


def check_generative(model: nn.Module) -> None:
  """Raises a ValueError naming the field unless the model can generate."""
  cfg = model.cfg
  if not FAMILIES[cfg.family].generative:
    generative = tuple(name for name, family in FAMILIES.items() if family.generative)
    raise ValueError(
      f"model.family: {cfg.family!r} cannot generate (KV-cache decoding needs one of {generative})"
    )
  if not _NEXT_TOKEN_TASKS & set(HEADS[cfg.head].tasks):
    raise ValueError(
      f"model.head: generation needs a head that gives next-token logits (as 'lm'), "
      f"got {cfg.head!r}"
    )


def _cache_shapes(model: nn.Module, batch_size: int, cache_len: int, encoder_len: int) -> Cache:
  """The model's 'cache' collection as a pytree of jax.ShapeDtypeStruct."""
  check_generative(model)
  check_position_table(model.cfg.position, model.cfg.max_len, cache_len, "a cache")
  inputs = (jax.ShapeDtypeStruct((batch_size, cache_len), jnp.int32),)
  if model.cfg.family == "encoder_decoder":
    inputs = (jax.ShapeDtypeStruct((batch_size, encoder_len), jnp.int32),) + inputs
  # eval_shape: the init call would otherwise materialise all parameters.
  variables = jax.eval_shape(
    functools.partial(model.init, use_cache=True), jax.random.key(0), *inputs
  )
  return variables["cache"]


# generate checks it at every eager call (an evaluation's sample each time):
# tracing the model's init for the shapes is ~0.2 s for gpt2_small.
@functools.lru_cache(maxsize=32)
def cache_bytes(model: nn.Module, batch_size: int, cache_len: int, encoder_len: int = 0) -> int:
  """Bytes of `init_cache`'s cache for `batch_size` rows of `cache_len`
  positions (and an encoder-decoder's `encoder_len` source tokens),
  computed from shapes alone."""
  return hardware.bytes_per_device(_cache_shapes(model, batch_size, cache_len, encoder_len))


def init_cache(
  model: nn.Module, batch_size: int, cache_len: int, *, encoder_tokens: Array | None = None
) -> Cache:
  """An empty (all-zero) decoding cache for a decoder or encoder-decoder.

  Args:
    model: a module from `txf.models.build` with family 'decoder' or
      'encoder_decoder' and an 'lm' head.
    batch_size: B.
    cache_len: L, the number of positions the cache can hold.
    encoder_tokens: encoder_decoder only, and required there: [B, S] encoder
      inputs; only their length is used (it sizes the cross-attention keys
      and values, which `encode_for_decoding` computes and stores).

  Returns:
    The model's 'cache' collection: per layer self-attention
    `cached_key`/`cached_value` [B, L, K, Dh]; for an encoder-decoder also
    cross-attention `cross_key`/`cross_value` [B, S, K, Dh] and `cross_mask`
    [B, 1, 1, S]; scan_layers adds a leading [N] axis to each. And a scalar
    `index`.

  Raises:
    ValueError: naming the field, for a family or head that cannot generate,
      a batch_size or cache_len that is not a positive int, cache_len longer
      than a learned position table, or encoder_tokens missing
      (encoder_decoder), given (decoder) or not [B, S].
  """
  check_generative(model)
  # Sizes first: a negative length gave an empty cache, a float a flax traceback.
  batch_size = checks.int_at_least(batch_size, "init_cache: batch_size", 1)
  cache_len = checks.int_at_least(cache_len, "init_cache: cache_len", 1)
  is_seq2seq = model.cfg.family == "encoder_decoder"
  if is_seq2seq and encoder_tokens is None:
    raise ValueError(
      "init_cache: encoder_tokens: an encoder_decoder cache needs the encoder "
      "inputs (their length sizes the cross-attention keys/values)"
    )
  if not is_seq2seq and encoder_tokens is not None:
    raise ValueError("init_cache: encoder_tokens only apply to family='encoder_decoder'")
  if encoder_tokens is not None and len(encoder_tokens.shape) != 2:
    raise ValueError(f"init_cache: encoder_tokens must be [B, S], got shape {encoder_tokens.shape}")
  encoder_len = 0 if encoder_tokens is None else encoder_tokens.shape[1]  # None <=> not seq2seq
  shapes = _cache_shapes(model, batch_size, cache_len, encoder_len)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def cache_batch_axes(model: nn.Module, cache_len: int) -> Cache:
  """Which axis of each cache leaf `beam_search` copies per beam and reorders.

  Found by comparing the cache shapes for batch sizes 1 and 2, so it holds
  for any layout (e.g. scanned layers put the batch on axis 1).

  Returns:
    A pytree with the cache's structure: an int axis per leaf, or None for a
    leaf the search leaves alone: the shared `index`, and an
    encoder-decoder's cross-attention keys, values and mask, of which each
    example keeps one copy that all its beams attend to.
  """

  def batch_axis(path, one, two):
    if getattr(path[-1], "key", None) in CROSS_CACHE_NAMES:
      return None
    differing = [a for a, (m, n) in enumerate(zip(one.shape, two.shape)) if m != n]
    return differing[0] if differing else None

  return jax.tree_util.tree_map_with_path(
    batch_axis, _cache_shapes(model, 1, cache_len, 1), _cache_shapes(model, 2, cache_len, 1)
  )


def cache_length(prompt_len: int, max_new_tokens: int) -> int:
  """Positions a search writes into the cache: every prompt column and every
  new token but the last, which is never fed back."""
  return prompt_len + max_new_tokens - 1


def check_cache_length(field: str, prompt_len: int, max_new_tokens: int) -> int:
  """`cache_length`, refused past what int32 positions index.

  Raises:
    ValueError: starting with `field` (the caller's name for max_new_tokens).
  """
  length = cache_length(prompt_len, max_new_tokens)
  if length > MAX_CACHE_LEN:
    raise ValueError(
      f"{field}: prompts of {prompt_len} tokens and {max_new_tokens} new ones need a "
      f"cache of {length:,} positions, more than int32 positions index ({MAX_CACHE_LEN:,})"
    )
  return length


def cache_positions(cache: Cache) -> int | None:
  """Positions a txf cache holds: the length axis of its self-attention
  `cached_key` leaves ([..., B, L, K, Dh]); None for a cache without them."""
  return _cached_key_size(cache, -3)


def cache_rows(cache: Cache) -> int | None:
  """Rows (B) a txf cache holds, as `cache_positions`."""
  return _cached_key_size(cache, -4)


def _cached_key_size(cache: Cache, axis: int) -> int | None:
  """The smallest size of `axis` among the cache's `cached_key` leaves."""
  sizes = {leaf.shape[axis] for leaf in cache_leaves(cache, "cached_key")}
  return min(sizes) if sizes else None


def cache_leaves(cache: Cache, name: str) -> list[Array]:
  """The leaves of a cache named `name`: each layer's `cached_key`
  ([..., B, L, K, Dh]), a txf cache's scalar `index`, ..."""
  return [
    leaf
    for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
    if path and getattr(path[-1], "key", None) == name
  ]


def make_tokens_to_logits(
  model: nn.Module, params: Any, *context: Array | None, method: str | None = None
) -> ModelSteps:
  """Wraps a txf model as the `tokens_to_logits` of `sample` / `beam_search`.

  Args:
    model: decoder or encoder-decoder.
    params: its parameters.
    *context: leading arguments of `method` before the tokens, e.g.
      (encoded [B, S, D], encoder mask [B, 1, 1, S]) for `method='decode'`
      of an encoder-decoder, or (None, None) to read the encoding stored in
      the cache (see `encode_for_decoding`). An encoding may have fewer
      rows than the tokens, one per example when its beams share it.
    method: the model method to apply; None: `__call__`.

  Returns:
    tokens_to_logits(tokens [B, T], cache) -> (logits of the last position
    [B, V] float32, updated cache): a `ModelSteps`, whose `cast_for` casts
    the weights for a loop once. A step past the cache's end raises a
    ValueError eagerly; under jax.jit its logits, and every later step's,
    are NaN.
  """
  return ModelSteps(model, params, context, method)


# eq=False: hashed by identity, as a function is (jax.jit takes it as one).
@dataclasses.dataclass(frozen=True, eq=False)
class ModelSteps:
  """A txf model's decoding step as a search's `tokens_to_logits`
  (`make_tokens_to_logits`'s arguments)."""

  model: nn.Module
  params: Any
  context: tuple[Array | None, ...]
  method: str | None

  def __call__(self, tokens_BxT: Array, cache: Cache) -> tuple[Array, Cache]:
    """(logits of the last position [B, V], the updated cache)."""
    return self._step(self.params, tokens_BxT, cache)

  def _step(self, params: Any, tokens_BxT: Array, cache: Cache) -> tuple[Array, Cache]:
    logits_BxTxV, variables = self.model.apply(
      {"params": params, "cache": cache},
      *self.context,
      tokens_BxT,
      use_cache=True,
      mutable=["cache"],
      method=self.method,
    )
    cache = variables["cache"]
    return _nan_past_the_end(logits_BxTxV[:, -1], cache), cache

  def cast_for(self, *calls: tuple[Any, Cache]) -> ModelSteps:
    """These steps with each parameter that every kind of call a loop makes
    reads only in the model's compute dtype cast to it, once
    (`txf.decode.casting`), so that the loop's steps convert nothing; their
    results are the same bit for bit.

    Args:
      *calls: (tokens [B, 1], cache) of each kind of call, as arrays or
        jax.ShapeDtypeStructs (beam search: the prompt's batch, then B * K).
    """
    dtype = jnp.dtype(self.model.cfg.dtype)
    return dataclasses.replace(
      self, params=casting.cast_once(self._step, self.params, *calls, dtype=dtype)
    )


def _nan_past_the_end(logits_BxV: Array, cache: Cache) -> Array:
  """`logits_BxV` of a step that left `cache` at its index, NaN where that
  index passed the cache's end. Under jax.jit the index is traced, so the
  attention layers cannot refuse such a step as they do eagerly: the write
  clamps onto the last slots and the logits would be finite wrong numbers.
  The index stays past the end, so every later step's logits are NaN too.
  A search sizes its cache first and never gets here (the select is the
  same logits)."""
  indices = [leaf for leaf in cache_leaves(cache, "index") if not jnp.ndim(leaf)]
  length = cache_positions(cache)
  if length is None or len(indices) != 1 or not isinstance(indices[0], jax.core.Tracer):
    return logits_BxV
  return jnp.where(indices[0] <= length, logits_BxV, jnp.nan)


def encode_for_decoding(
  model: nn.Module,
  params: Any,
  encoder_tokens_BxS: Array,
  cache_len: int,
  *,
  cache_cross_attention: bool = True,
) -> tuple[ModelSteps, Cache]:
  """Runs an encoder-decoder's encoder once and adapts its decoder to the searches.

  Args:
    model: encoder_decoder from `txf.models.build`.
    params: its parameters.
    encoder_tokens_BxS: encoder inputs padded with cfg.pad_id.
    cache_len: decoder positions the cache holds.
    cache_cross_attention: True: each decoder layer's cross-attention keys
      and values of the encoding (and its padding mask) are computed here,
      once, and stored in the cache. False: every step projects the
      encoding again, as decoding did before they were cached; this path
      exists to compare and benchmark against (benchmarks/seq2seq_decode.py:
      inside one jitted loop, as in `generate`, XLA hoists that
      loop-invariant projection out of the loop itself, so the two cost
      about the same there; decoding step by step, the cache saves it).

  Returns:
    (tokens_to_logits, cache) for batch B; beam search copies the
    self-attention part of the cache per beam (with `cache_batch_axes`).
  """
  batch_size = encoder_tokens_BxS.shape[0]
  # Any: flax types apply's result as the output or (output, mutated variables).
  encoded: Any = model.apply({"params": params}, encoder_tokens_BxS, method="encode")
  encoded_BxSxD, encoder_mask = encoded
  cache = init_cache(model, batch_size, cache_len, encoder_tokens=encoder_tokens_BxS)
  if not cache_cross_attention:
    # Each step projects the encoding again (and stores the result over the
    # stored copy, which it does not read).
    return make_tokens_to_logits(model, params, encoded_BxSxD, encoder_mask, method="decode"), cache
  # Decoding zero tokens with the encoding only stores its keys and values:
  # the self-attention slots and the index stay empty.
  no_tokens_Bx0 = jnp.zeros((batch_size, 0), jnp.int32)
  _, variables = model.apply(
    {"params": params, "cache": cache},
    encoded_BxSxD,
    encoder_mask,
    no_tokens_Bx0,
    use_cache=True,
    mutable=["cache"],
    method="decode",
  )
  return make_tokens_to_logits(model, params, None, None, method="decode"), variables["cache"]
