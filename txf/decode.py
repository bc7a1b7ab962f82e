"""KV-cache generation: greedy decoding, sampling and beam search.

The search functions (`sample`, `beam_search`) know nothing about models (t5x
style). They take

  tokens_to_logits(tokens_Bx1, cache) -> (logits_BxV, new_cache)

which feeds one token per row through the model at the cache's current index
and returns the float logits of the next token, and the cache pytree it
threads (any pytree: beam search also reorders it along each leaf's batch
axis, see `batch_axes`). The batch B seen by `tokens_to_logits` is the prompt
batch for `sample` and batch * num_beams for `beam_search`. Both run their
loop on device (`lax.while_loop`) and trace under `jax.jit`; `tokens_to_logits`
and the integer / search-shape arguments must then be static, so build the
callable inside the jitted function (as `generate` does) rather than passing
a fresh closure over parameters to a jitted search.

Prompts. A batch of prompts of different lengths is one int [B, P] array,
right-padded (the default) or left-padded (`padding_side='left'`), with the
lengths given (`prompt_lengths_B`) or counted as the tokens that are not
`pad_id`. Every row needs at least one token (e.g. BOS). The searches
right-align the prompts and feed position i of every row at step i, at one
shared cache index; while a row's prompt lasts, its next token is forced to
the prompt's (t5x style), so rows of any length share one loop. Outputs
keep the input's side: [B, P + N] holds each right-padded prompt followed
directly by its new tokens, or each left-padded prompt with the new tokens
from column P on. Each row generates at most N = max_new_tokens tokens, ends
after an EOS it generates (not one in its prompt) and holds pad_id after its
end.

Cache size. The cache needs room for P + N - 1 positions. Both searches check
this for a txf cache (one with self-attention `cached_key` leaves, as
`init_cache` builds) before tracing their loop, and raise a ValueError naming
the sizes; for another cache it is the caller's to ensure.

Encoder-decoders. `encode_for_decoding` runs the encoder once and stores each
decoder layer's cross-attention keys and values of the encoding (with its
padding mask) in the cache, so a decoding step only runs the decoder on its
one token. Beam search keeps one copy of them per example, which all its
beams attend to (`cache_batch_axes` marks them None), so neither copying
them per beam nor reordering them costs anything. `cache_cross_attention=
False` recomputes them at every step instead, kept to compare and benchmark
against (experiments/bench_seq2seq_decode.py): inside one jitted loop, as in
`generate`, XLA hoists that loop-invariant work out of the loop by itself,
so the cache saves time mainly when decoding runs step by step.

`init_cache`, `cache_batch_axes`, `make_tokens_to_logits` and
`encode_for_decoding` adapt txf models (`txf.models.build`) to this
interface; `generate` combines them into one call for both families, with
sampling, greedy decoding or beam search.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from txf.layers.attention import CROSS_CACHE_NAMES
from txf.layers.embedding import check_position_table

Array = jax.Array
Cache = Any  # a pytree of arrays
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]

_GENERATIVE_FAMILIES = ("decoder", "encoder_decoder", "lstm")
PADDING_SIDES = ("right", "left")


# ----------------------------------------------------------------------------
# Caches of txf models.


def _check_generative(model: nn.Module) -> None:
  cfg = model.cfg
  if cfg.family not in _GENERATIVE_FAMILIES:
    raise ValueError(f"model.family: {cfg.family!r} cannot generate "
                     f"(KV-cache decoding needs one of {_GENERATIVE_FAMILIES})")
  if cfg.head != "lm":
    raise ValueError(f"model.head: generation needs an 'lm' head, got {cfg.head!r}")


def _cache_shapes(model: nn.Module, batch_size: int, cache_len: int, encoder_len: int) -> Cache:
  """The model's 'cache' collection as a pytree of jax.ShapeDtypeStruct."""
  _check_generative(model)
  check_position_table(model.cfg.position, model.cfg.max_len, cache_len, "a cache")
  inputs = (jax.ShapeDtypeStruct((batch_size, cache_len), jnp.int32),)
  if model.cfg.family == "encoder_decoder":
    inputs = (jax.ShapeDtypeStruct((batch_size, encoder_len), jnp.int32),) + inputs
  # eval_shape: the init call would otherwise materialise all parameters.
  variables = jax.eval_shape(functools.partial(model.init, use_cache=True),
                             jax.random.key(0), *inputs)
  return variables["cache"]


def init_cache(model: nn.Module, batch_size: int, cache_len: int, *,
               encoder_tokens: Array | None = None) -> Cache:
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
      cache_len longer than a learned position table, or encoder_tokens
      missing (encoder_decoder) or given (decoder).
  """
  _check_generative(model)
  is_seq2seq = model.cfg.family == "encoder_decoder"
  if is_seq2seq and encoder_tokens is None:
    raise ValueError("init_cache: encoder_tokens: an encoder_decoder cache needs the encoder "
                     "inputs (their length sizes the cross-attention keys/values)")
  if not is_seq2seq and encoder_tokens is not None:
    raise ValueError("init_cache: encoder_tokens only apply to family='encoder_decoder'")
  encoder_len = encoder_tokens.shape[1] if is_seq2seq else 0
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
  return jax.tree_util.tree_map_with_path(batch_axis, _cache_shapes(model, 1, cache_len, 1),
                                          _cache_shapes(model, 2, cache_len, 1))


def cache_length(prompt_len: int, max_new_tokens: int) -> int:
  """Positions a search writes into the cache: every prompt column and every
  new token but the last, which is never fed back."""
  return prompt_len + max_new_tokens - 1


def _cache_len(cache: Cache) -> int | None:
  """Positions a txf cache holds: the length axis of its self-attention
  `cached_key` leaves ([..., B, L, K, Dh]); None for a cache without them."""
  lengths = {leaf.shape[-3] for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
             if path and getattr(path[-1], "key", None) == "cached_key"}
  return min(lengths) if lengths else None


def make_tokens_to_logits(model: nn.Module, params: Any, *context: Array | None,
                          method: str | None = None) -> TokensToLogits:
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
    [B, V] float32, updated cache).
  """
  def tokens_to_logits(tokens_BxT: Array, cache: Cache) -> tuple[Array, Cache]:
    logits_BxTxV, variables = model.apply({"params": params, "cache": cache}, *context,
                                          tokens_BxT, use_cache=True, mutable=["cache"],
                                          method=method)
    return logits_BxTxV[:, -1], variables["cache"]
  return tokens_to_logits


def encode_for_decoding(model: nn.Module, params: Any, encoder_tokens_BxS: Array,
                        cache_len: int, *,
                        cache_cross_attention: bool = True) -> tuple[TokensToLogits, Cache]:
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
      exists to compare and benchmark against (experiments/bench_seq2seq_decode.py:
      inside one jitted loop, as in `generate`, XLA hoists that
      loop-invariant projection out of the loop itself, so the two cost
      about the same there; decoding step by step, the cache saves it).

  Returns:
    (tokens_to_logits, cache) for batch B; beam search copies the
    self-attention part of the cache per beam (with `cache_batch_axes`).
  """
  batch_size = encoder_tokens_BxS.shape[0]
  encoded_BxSxD, encoder_mask = model.apply({"params": params}, encoder_tokens_BxS,
                                            method="encode")
  cache = init_cache(model, batch_size, cache_len, encoder_tokens=encoder_tokens_BxS)
  if not cache_cross_attention:
    # Each step projects the encoding again (and stores the result over the
    # stored copy, which it does not read).
    return make_tokens_to_logits(model, params, encoded_BxSxD, encoder_mask,
                                 method="decode"), cache
  # Decoding zero tokens with the encoding only stores its keys and values:
  # the self-attention slots and the index stay empty.
  no_tokens_Bx0 = jnp.zeros((batch_size, 0), jnp.int32)
  _, variables = model.apply({"params": params, "cache": cache}, encoded_BxSxD, encoder_mask,
                             no_tokens_Bx0, use_cache=True, mutable=["cache"], method="decode")
  return make_tokens_to_logits(model, params, None, None, method="decode"), variables["cache"]


# ----------------------------------------------------------------------------
# Prompts and checks shared by the searches.


def _concrete(x: Any) -> np.ndarray | None:
  """x as a numpy array, or None when its values are not at hand here (traced,
  or spread over other processes' devices)."""
  if isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True):
    return None
  return np.asarray(x)


def _check_search(caller: str, cache: Cache, prompt_BxP: Array, prompt_lengths_B: Array | None,
                  max_new_tokens: int, pad_id: int, padding_side: str) -> None:
  """Rejects bad search arguments before anything is traced: shapes, sizes,
  and (when they are concrete) prompt lengths and padding."""
  if max_new_tokens < 1:
    raise ValueError(f"{caller}: max_new_tokens must be >= 1, got {max_new_tokens}")
  if padding_side not in PADDING_SIDES:
    raise ValueError(f"{caller}: padding_side must be one of {PADDING_SIDES}, "
                     f"got {padding_side!r}")
  if prompt_BxP.ndim != 2 or not prompt_BxP.shape[1] or \
      not jnp.issubdtype(prompt_BxP.dtype, jnp.integer):
    raise ValueError(f"{caller}: prompts must be int [B, P] with P >= 1, got "
                     f"{prompt_BxP.dtype} {prompt_BxP.shape}")
  batch_size, prompt_len = prompt_BxP.shape
  needed, cache_len = cache_length(prompt_len, max_new_tokens), _cache_len(cache)
  if cache_len is not None and cache_len < needed:
    raise ValueError(f"{caller}: the cache holds {cache_len} positions, but prompts of "
                     f"{prompt_len} tokens and max_new_tokens={max_new_tokens} need "
                     f"{needed} (prompt + max_new_tokens - 1)")
  if prompt_lengths_B is not None:
    if jnp.shape(prompt_lengths_B) != (batch_size,):
      raise ValueError(f"{caller}: prompt_lengths_B must have shape ({batch_size},), got "
                       f"{jnp.shape(prompt_lengths_B)}")
    lengths_B = _concrete(prompt_lengths_B)
    if lengths_B is not None and not np.all((lengths_B >= 1) & (lengths_B <= prompt_len)):
      raise ValueError(f"{caller}: prompt_lengths_B must lie in [1, {prompt_len}] (every row "
                       f"needs a token), got {lengths_B.tolist()}")
    return
  prompt = _concrete(prompt_BxP)
  if prompt is None:
    return
  is_token = prompt != pad_id
  lengths_B = is_token.sum(axis=1)
  if not np.all(lengths_B):
    raise ValueError(f"{caller}: prompt rows {np.flatnonzero(lengths_B == 0).tolist()} hold "
                     f"only pad_id={pad_id}; every row needs a token (e.g. BOS)")
  columns = np.arange(prompt_len)[None]
  expected = (columns < lengths_B[:, None] if padding_side == "right"
              else columns >= prompt_len - lengths_B[:, None])
  misplaced = np.flatnonzero(np.any(is_token != expected, axis=1))
  if misplaced.size:
    raise ValueError(f"{caller}: prompt rows {misplaced.tolist()} are not {padding_side}-padded "
                     f"with pad_id={pad_id} (a pad between tokens, or the other side); pass "
                     "padding_side or prompt_lengths_B")


def _prompt_lengths(prompt_BxP: Array, pad_id: int, prompt_lengths_B: Array | None) -> Array:
  if prompt_lengths_B is None:
    return jnp.sum(prompt_BxP != pad_id, axis=1, dtype=jnp.int32)
  return jnp.asarray(prompt_lengths_B, jnp.int32)


def _right_aligned(prompt_BxP: Array, lengths_B: Array, pad_id: int, padding_side: str) -> Array:
  """Prompts starting at column 0, pad_id after each one's end."""
  prompt_len = prompt_BxP.shape[1]
  columns_BxP = jnp.arange(prompt_len)[None]
  if padding_side == "left":
    columns_BxP = (columns_BxP + (prompt_len - lengths_B)[:, None]) % prompt_len
    prompt_BxP = jnp.take_along_axis(prompt_BxP, columns_BxP, axis=1)
  return jnp.where(jnp.arange(prompt_len)[None] < lengths_B[:, None],
                   prompt_BxP.astype(jnp.int32), pad_id)


def _restore_padding_side(tokens_Bx_xT: Array, lengths_B: Array, prompt_len: int,
                          padding_side: str) -> Array:
  """Right-aligned outputs [B, T] or [B, K, T] back to the prompts' padding side.

  A left-padded row moves right by its padding, P - length; what wraps
  around is the pad after the row's end (a row fills at most length + N
  of the T = P + N columns).
  """
  if padding_side == "right":
    return tokens_Bx_xT
  total_len = tokens_Bx_xT.shape[-1]
  columns_BxT = (jnp.arange(total_len)[None] - (prompt_len - lengths_B)[:, None]) % total_len
  columns = columns_BxT.reshape(columns_BxT.shape[:1] + (1,) * (tokens_Bx_xT.ndim - 2)
                                + columns_BxT.shape[1:])
  return jnp.take_along_axis(tokens_Bx_xT, columns, axis=-1)


# ----------------------------------------------------------------------------
# Sampling.


def _filter_top_k(logits_BxV: Array, top_k: int) -> Array:
  """Keeps the k largest logits per row (ties at the k-th may keep more)."""
  kth_Bx1 = jax.lax.top_k(logits_BxV, top_k)[0][:, -1:]
  return jnp.where(logits_BxV >= kth_Bx1, logits_BxV, -jnp.inf)


def _filter_top_p(logits_BxV: Array, top_p: float) -> Array:
  """Nucleus filter: keeps the most likely tokens whose probabilities reach top_p.

  A token is kept when the probability of all more likely tokens is still
  below top_p, so the most likely token always survives.
  """
  sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
  probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
  mass_before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
  cutoff_Bx1 = jnp.min(jnp.where(mass_before_BxV < top_p, sorted_BxV, jnp.inf),
                       axis=-1, keepdims=True)
  return jnp.where(logits_BxV >= cutoff_Bx1, logits_BxV, -jnp.inf)


def _next_token(rng: Array, logits_BxV: Array, temperature: float | Array, top_k: int,
                top_p: float) -> Array:
  """Samples [B] tokens from temperature-scaled, top-k then top-p filtered logits.

  temperature 0 means argmax. temperature may be traced (no recompile per
  value); top_k and top_p are Python numbers (top_k sets a shape).
  """
  logits_BxV = logits_BxV.astype(jnp.float32)
  # The sampled branch must stay finite when temperature is 0; it is discarded then.
  scaled_BxV = logits_BxV / jnp.where(temperature > 0, temperature, 1.0)
  if top_k:
    scaled_BxV = _filter_top_k(scaled_BxV, top_k)
  if top_p < 1.0:
    scaled_BxV = _filter_top_p(scaled_BxV, top_p)
  sampled_B = jax.random.categorical(rng, scaled_BxV, axis=-1)
  return jnp.where(temperature > 0, sampled_B, jnp.argmax(logits_BxV, axis=-1))


def sample(tokens_to_logits: TokensToLogits, cache: Cache, prompt_BxP: Array, *,
           max_new_tokens: int, rng: Array, temperature: float | Array = 1.0,
           top_k: int = 0, top_p: float = 1.0, eos_id: int | None = None,
           pad_id: int = 0, prompt_lengths_B: Array | None = None,
           padding_side: str = "right") -> Array:
  """Temperature / top-k / top-p sampling; temperature 0 is greedy decoding.

  Prompts, padding and EOS as in the module docstring. The loop stops as
  soon as every row has ended.

  Args:
    tokens_to_logits: (tokens [B, 1], cache) -> (logits [B, V], cache).
    cache: empty cache with room for P + max_new_tokens - 1 positions.
    prompt_BxP: int prompts.
    max_new_tokens: N >= 1.
    rng: PRNG key; step i uses fold_in(rng, i).
    temperature: logits are divided by it; 0: argmax.
    top_k: sample among the k most likely tokens; 0: all.
    top_p: sample among the most likely tokens holding probability top_p
      (nucleus sampling); 1: all.
    eos_id: token that ends a row (only when generated, not in a prompt);
      None: rows run to max_new_tokens.
    pad_id: prompt padding and filler after a row ends.
    prompt_lengths_B: int [B] prompt lengths; None: the tokens != pad_id.
    padding_side: 'right' or 'left', where the prompts' padding is.

  Returns:
    int32 [B, P + N]: prompts followed by the generated tokens.

  Raises:
    ValueError: for a txf cache too short, bad shapes, or (concrete
      prompts) rows without a token or not padded on padding_side.
  """
  _check_search("sample", cache, prompt_BxP, prompt_lengths_B, max_new_tokens, pad_id,
                padding_side)
  prompt_len = prompt_BxP.shape[1]
  lengths_B = _prompt_lengths(prompt_BxP, pad_id, prompt_lengths_B)
  prompt_BxP = _right_aligned(prompt_BxP, lengths_B, pad_id, padding_side)
  last_position_B = lengths_B + max_new_tokens - 1
  tokens_BxT = jnp.pad(prompt_BxP, ((0, 0), (0, max_new_tokens)), constant_values=pad_id)
  finished_B = jnp.zeros(prompt_BxP.shape[:1], bool)

  def step(state):
    i, tokens_BxT, finished_B, cache = state
    logits_BxV, cache = tokens_to_logits(
        jax.lax.dynamic_slice_in_dim(tokens_BxT, i, 1, axis=1), cache)
    sampled_B = _next_token(jax.random.fold_in(rng, i), logits_BxV, temperature, top_k, top_p)
    position = i + 1
    in_prompt_B = position < lengths_B
    token_B = jnp.where(in_prompt_B, tokens_BxT[:, position],
                        jnp.where(finished_B, pad_id, sampled_B))
    tokens_BxT = tokens_BxT.at[:, position].set(token_B)
    finished_B |= position == last_position_B
    if eos_id is not None:
      finished_B |= ~in_prompt_B & (token_B == eos_id)
    return i + 1, tokens_BxT, finished_B, cache

  # Every row finishes at its last_position (<= P + N - 1), so this ends
  # before `position` runs off the buffer.
  _, tokens_BxT, _, _ = jax.lax.while_loop(lambda state: ~jnp.all(state[2]), step,
                                           (jnp.int32(0), tokens_BxT, finished_B, cache))
  return _restore_padding_side(tokens_BxT, lengths_B, prompt_len, padding_side)


# ----------------------------------------------------------------------------
# Beam search.


def length_penalty_factor(length: Array, alpha: float | Array) -> Array:
  """GNMT length normalisation ((5 + length) / 6) ** alpha (Wu et al. 2016)."""
  return ((5.0 + length) / 6.0) ** alpha


def _map_batch_leaves(fn: Callable[[Array, int], Array], cache: Cache,
                      batch_axes: Cache | None) -> Cache:
  """Applies fn(leaf, batch_axis) to the leaves that have a batch axis.

  batch_axes None: axis 0 of every non-scalar leaf (the t5x convention).
  """
  if batch_axes is None:
    batch_axes = jax.tree.map(lambda x: 0 if jnp.ndim(x) else None, cache)
  return jax.tree.map(lambda x, axis: x if axis is None else fn(x, axis), cache, batch_axes)


def _gather_beams(x: Array, beam_indices_BxK: Array, axis: int) -> Array:
  """Reorders beams along x's flat batch * beam axis: new beam k of row b is
  old beam beam_indices[b, k]."""
  num_beams = beam_indices_BxK.shape[1]
  flat_indices = jnp.arange(beam_indices_BxK.shape[0])[:, None] * num_beams + beam_indices_BxK
  return jnp.take(x, flat_indices.reshape(-1), axis=axis)


def _prefill(tokens_to_logits: TokensToLogits, cache: Cache, tokens_BxP: Array,
             num_tokens: Array) -> Cache:
  """Feeds the first num_tokens columns of tokens [B, P] through the cache, one
  position at a time; keeps the cache."""
  return jax.lax.fori_loop(
      0, num_tokens,
      lambda i, cache: tokens_to_logits(jax.lax.dynamic_slice_in_dim(tokens_BxP, i, 1, 1),
                                        cache)[1],
      cache)


def beam_search(tokens_to_logits: TokensToLogits, cache: Cache, prompt_BxP: Array, *,
                num_beams: int, max_new_tokens: int, eos_id: int | None,
                length_penalty: float | Array = 0.6, pad_id: int = 0,
                prompt_lengths_B: Array | None = None, padding_side: str = "right",
                batch_axes: Cache | None = None) -> tuple[Array, Array]:
  """Beam search with GNMT length normalisation (as flax's wmt example / t5x).

  Hypotheses are scored by the sum of log-probabilities of the generated
  tokens divided by ((5 + n) / 6) ** length_penalty, n = number of generated
  tokens (EOS included). A hypothesis ends at EOS or at max_new_tokens;
  ended ones are kept in a separate top-num_beams pool, and the search stops
  early once no live beam can still beat the worst kept one (assumes
  length_penalty >= 0, so a live beam's best possible score is its log-prob
  over the longest length's factor).

  Prompts may differ in length (module docstring). The tokens that every
  row's prompt holds before its last go through the cache once per row,
  before it is copied per beam; a longer prompt's remaining tokens are
  forced during the search (probability 1, so they add nothing to the
  score) while its beam 0 carries it and the other beams stay empty.

  Args:
    tokens_to_logits: (tokens [B * num_beams, 1], cache) -> (logits, cache);
      row b * num_beams + k is beam k of example b.
    cache: empty cache for batch B (it is expanded to B * num_beams here)
      with room for P + max_new_tokens - 1 positions.
    prompt_BxP: int [B, P] prompts, e.g. a BOS column [B, 1].
    num_beams: K >= 1.
    max_new_tokens: N >= 1.
    eos_id: end-of-sequence token; None: every hypothesis runs to N tokens.
    length_penalty: alpha; 0 ranks by the plain log-probability.
    pad_id: prompt padding and filler after EOS.
    prompt_lengths_B: int [B] prompt lengths; None: the tokens != pad_id.
    padding_side: 'right' or 'left', where the prompts' padding is.
    batch_axes: the batch axis of each cache leaf (None for leaves
      shared by all rows), a pytree with the cache's structure (e.g. from
      `cache_batch_axes(model, cache_len)`); None: axis 0 of every non-scalar
      leaf.

  Returns:
    tokens int32 [B, K, P + N] (prompt included, laid out as `sample`'s
    output, pad after EOS) and scores float32 [B, K], best first. A score of
    -inf marks a slot for which fewer than K distinct hypotheses exist (its
    tokens mean nothing).

  Raises:
    ValueError: as `sample`, or num_beams < 1.
  """
  _check_search("beam_search", cache, prompt_BxP, prompt_lengths_B, max_new_tokens, pad_id,
                padding_side)
  if num_beams < 1:
    raise ValueError(f"beam_search: num_beams must be >= 1, got {num_beams}")
  batch_size, prompt_len = prompt_BxP.shape
  lengths_B = _prompt_lengths(prompt_BxP, pad_id, prompt_lengths_B)
  prompt_BxP = _right_aligned(prompt_BxP, lengths_B, pad_id, padding_side)
  shared_len = jnp.min(lengths_B) - 1
  cache = _prefill(tokens_to_logits, cache, prompt_BxP, shared_len)
  cache = _map_batch_leaves(lambda x, axis: jnp.repeat(x, num_beams, axis=axis),
                            cache, batch_axes)

  tokens_BxT = jnp.pad(prompt_BxP, ((0, 0), (0, max_new_tokens)), constant_values=pad_id)
  live_tokens_BxKxT = jnp.repeat(tokens_BxT[:, None], num_beams, axis=1)
  # All beams start as the same prompt: only beam 0 may expand, or the first
  # step would return K copies of each candidate.
  live_logprobs_BxK = jnp.tile(jnp.where(jnp.arange(num_beams) == 0, 0.0, -jnp.inf),
                               (batch_size, 1))
  finished_scores_BxK = jnp.full((batch_size, num_beams), -jnp.inf)
  max_length_factor = length_penalty_factor(max_new_tokens, length_penalty)

  def search_continues(state):
    position, _, live_logprobs_BxK, _, finished_scores_BxK, _ = state
    best_possible_B = jnp.max(live_logprobs_BxK, axis=1) / max_length_factor
    can_improve_B = best_possible_B > jnp.min(finished_scores_BxK, axis=1)
    return (position < prompt_len + max_new_tokens) & jnp.any(can_improve_B)

  def search_step(state):
    position, live_tokens_BxKxT, live_logprobs_BxK, finished_tokens_BxKxT, \
        finished_scores_BxK, cache = state  # position: where this step's tokens go
    logits_BKxV, cache = tokens_to_logits(
        live_tokens_BxKxT[:, :, position - 1].reshape(-1, 1), cache)
    vocab_size = logits_BKxV.shape[-1]
    logprobs_BxKxV = jax.nn.log_softmax(logits_BKxV.astype(jnp.float32)).reshape(
        batch_size, num_beams, vocab_size)
    # Inside its prompt a row's next token is forced: it keeps the beam's
    # log-prob and every other token is impossible.
    in_prompt_B = position < lengths_B
    forced_BxV = jnp.where(jnp.arange(vocab_size) == tokens_BxT[:, position, None], 0.0,
                           -jnp.inf)
    logprobs_BxKxV = jnp.where(in_prompt_B[:, None, None], forced_BxV[:, None],
                               logprobs_BxKxV)
    candidate_logprobs_BxKV = (live_logprobs_BxK[..., None] + logprobs_BxKxV).reshape(
        batch_size, -1)

    # 2K candidates always hold K that do not end in EOS (each beam has one EOS).
    candidate_logprobs_Bx2K, flat_indices_Bx2K = jax.lax.top_k(candidate_logprobs_BxKV,
                                                               2 * num_beams)
    source_beams_Bx2K = flat_indices_Bx2K // vocab_size
    new_tokens_Bx2K = flat_indices_Bx2K % vocab_size
    candidate_tokens_Bx2KxT = jnp.take_along_axis(
        live_tokens_BxKxT, source_beams_Bx2K[..., None], axis=1).at[:, :, position].set(
            new_tokens_Bx2K)
    generated_B = position - lengths_B + 1  # new tokens with this one (<= 0 in the prompt)
    ended_Bx2K = jnp.broadcast_to((generated_B == max_new_tokens)[:, None],
                                  new_tokens_Bx2K.shape)
    if eos_id is not None:
      ended_Bx2K |= ~in_prompt_B[:, None] & (new_tokens_Bx2K == eos_id)

    # Live beams: the K best candidates that go on.
    live_logprobs_BxK, live_picks_BxK = jax.lax.top_k(
        jnp.where(ended_Bx2K, -jnp.inf, candidate_logprobs_Bx2K), num_beams)
    live_tokens_BxKxT = jnp.take_along_axis(candidate_tokens_Bx2KxT, live_picks_BxK[..., None],
                                            axis=1)
    live_sources_BxK = jnp.take_along_axis(source_beams_Bx2K, live_picks_BxK, axis=1)
    cache = _map_batch_leaves(lambda x, axis: _gather_beams(x, live_sources_BxK, axis),
                              cache, batch_axes)

    # Finished pool: the K best of the old pool and the candidates that ended.
    length_factor_B = length_penalty_factor(jnp.maximum(generated_B, 1), length_penalty)
    ended_scores_Bx2K = jnp.where(ended_Bx2K, candidate_logprobs_Bx2K / length_factor_B[:, None],
                                  -jnp.inf)
    finished_scores_BxK, finished_picks_BxK = jax.lax.top_k(
        jnp.concatenate([finished_scores_BxK, ended_scores_Bx2K], axis=1), num_beams)
    finished_tokens_BxKxT = jnp.take_along_axis(
        jnp.concatenate([finished_tokens_BxKxT, candidate_tokens_Bx2KxT], axis=1),
        finished_picks_BxK[..., None], axis=1)
    return (position + 1, live_tokens_BxKxT, live_logprobs_BxK, finished_tokens_BxKxT,
            finished_scores_BxK, cache)

  # Every hypothesis ends by its row's max_new_tokens, so the pool is the
  # answer: no fallback to live beams is needed.
  state = jax.lax.while_loop(search_continues, search_step,
                             (shared_len + 1, live_tokens_BxKxT, live_logprobs_BxK,
                              live_tokens_BxKxT, finished_scores_BxK, cache))
  return _restore_padding_side(state[3], lengths_B, prompt_len, padding_side), state[4]


# ----------------------------------------------------------------------------
# Model-level entry point.


def generate(model: nn.Module, params: Any, prompt_BxP: Array | None = None, *,
             max_new_tokens: int, encoder_tokens_BxS: Array | None = None,
             rng: Array | None = None, temperature: float | Array = 1.0, top_k: int = 0,
             top_p: float = 1.0, eos_id: int | None = None, num_beams: int = 1,
             length_penalty: float | Array = 0.6, return_beams: bool = False,
             prompt_lengths_B: Array | None = None, padding_side: str = "right",
             bos_id: int = 1, cache_cross_attention: bool = True, lower: bool = False
             ) -> Array | tuple[Array, Array] | jax.stages.Lowered:
  """Continues prompts with a decoder or an encoder-decoder (jitted; compiles
  once per shape and static option).

  num_beams=1 samples (`sample`; greedy without rng); num_beams > 1, or
  return_beams, runs `beam_search`. Prompts, padding and EOS handling are
  the same for both (module docstring).

  Args:
    model: decoder or encoder_decoder from `txf.models.build` with an 'lm'
      head; its cfg.pad_id pads prompts and encoder inputs.
    params: its parameters.
    prompt_BxP: int prompts. Required for a decoder; for an encoder-decoder
      the decoder's prompts, by default a column of bos_id.
    max_new_tokens: N >= 1 new tokens per row at most.
    encoder_tokens_BxS: encoder_decoder only (required there): encoder inputs,
      padded with cfg.pad_id.
    rng: sampling key; None: greedy decoding (temperature ignored).
    temperature, top_k, top_p: as in `sample` (num_beams=1 only; beam search
      ignores temperature and rejects rng, top_k and top_p).
    eos_id: token that ends a row or hypothesis when generated; None: none.
    num_beams: K; 1: no beam search.
    length_penalty: beam search's GNMT alpha, >= 0.
    return_beams: return every beam and its score (beam search; with
      num_beams=1 it scores the greedy sequence).
    prompt_lengths_B, padding_side: as in `sample`.
    bos_id: start token of an encoder-decoder's default prompts.
    cache_cross_attention: encoder_decoder: compute the cross-attention keys
      and values once per source (True) or at every step (False, the path
      before caching, kept to compare and benchmark against).
    lower: return the jitted program lowered for these arguments instead of
      running it (`params` may then be jax.ShapeDtypeStructs), so a caller
      can compile it ahead of time: the training loop does, in a thread.

  Returns:
    int32 [B, P + N], prompts followed by their new tokens (the best beam
    under beam search). With return_beams: tokens int32 [B, K, P + N] and
    scores float32 [B, K], best first (see `beam_search`). With lower: the
    `jax.stages.Lowered` program.

  Raises:
    ValueError: naming the argument or field, before anything runs: a family
      or head that cannot generate, missing or extra encoder inputs,
      sampling options with beam search, a negative length_penalty, bad
      prompts (see `sample`).
  """
  _check_generative(model)
  is_seq2seq = model.cfg.family == "encoder_decoder"
  if is_seq2seq and encoder_tokens_BxS is None:
    raise ValueError("generate: encoder_tokens_BxS: an encoder_decoder needs encoder inputs")
  if not is_seq2seq and encoder_tokens_BxS is not None:
    raise ValueError("generate: encoder_tokens_BxS only apply to family='encoder_decoder'")
  if prompt_BxP is None:
    if not is_seq2seq:
      raise ValueError("generate: prompt_BxP: a decoder needs prompts")
    prompt_BxP = jnp.full((encoder_tokens_BxS.shape[0], 1), bos_id, jnp.int32)
  if is_seq2seq and encoder_tokens_BxS.shape[0] != prompt_BxP.shape[0]:
    raise ValueError(f"generate: encoder_tokens_BxS has {encoder_tokens_BxS.shape[0]} rows, "
                     f"prompt_BxP {prompt_BxP.shape[0]}")
  beam = num_beams > 1 or return_beams
  if num_beams < 1:
    raise ValueError(f"generate: num_beams must be >= 1, got {num_beams}")
  if beam and (rng is not None or top_k or top_p < 1.0):
    raise ValueError(f"generate: rng, top_k and top_p sample, but num_beams={num_beams} / "
                     f"return_beams={return_beams} runs beam search, which is deterministic")
  penalty = _concrete(length_penalty)
  if beam and penalty is not None and penalty < 0:
    raise ValueError(f"generate: length_penalty must be >= 0 (its early stop assumes it), "
                     f"got {length_penalty}")
  # The searches' checks of the prompts (generate sizes the cache itself),
  # here while they are concrete: inside the jitted program they are traced.
  _check_search("generate", None, prompt_BxP, prompt_lengths_B, max_new_tokens,
                model.cfg.pad_id, padding_side)
  program = _generate.lower if lower else _generate
  return program(model, params, prompt_BxP, encoder_tokens_BxS, prompt_lengths_B, rng,
                 temperature, length_penalty, max_new_tokens=max_new_tokens, top_k=top_k,
                 top_p=top_p, eos_id=eos_id, num_beams=num_beams, return_beams=return_beams,
                 padding_side=padding_side, cache_cross_attention=cache_cross_attention)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "top_k", "top_p",
                                             "eos_id", "num_beams", "return_beams",
                                             "padding_side", "cache_cross_attention"))
def _generate(model, params, prompt_BxP, encoder_tokens_BxS, prompt_lengths_B, rng, temperature,
              length_penalty, *, max_new_tokens, top_k, top_p, eos_id, num_beams, return_beams,
              padding_side, cache_cross_attention):
  """`generate` after its checks: one jitted program per shape and option."""
  batch_size, prompt_len = prompt_BxP.shape
  cache_len = cache_length(prompt_len, max_new_tokens)
  beam = num_beams > 1 or return_beams
  if encoder_tokens_BxS is not None:
    tokens_to_logits, cache = encode_for_decoding(model, params, encoder_tokens_BxS, cache_len,
                                                  cache_cross_attention=cache_cross_attention)
  else:
    tokens_to_logits = make_tokens_to_logits(model, params)
    cache = init_cache(model, batch_size, cache_len)
  search = dict(max_new_tokens=max_new_tokens, eos_id=eos_id, pad_id=model.cfg.pad_id,
                prompt_lengths_B=prompt_lengths_B, padding_side=padding_side)
  if not beam:
    if rng is None:
      rng, temperature = jax.random.key(0), 0.0  # the key is unused by argmax
    return sample(tokens_to_logits, cache, prompt_BxP, rng=rng, temperature=temperature,
                  top_k=top_k, top_p=top_p, **search)
  tokens_BxKxT, scores_BxK = beam_search(
      tokens_to_logits, cache, prompt_BxP, num_beams=num_beams, length_penalty=length_penalty,
      batch_axes=cache_batch_axes(model, cache_len), **search)
  return (tokens_BxKxT, scores_BxK) if return_beams else tokens_BxKxT[:, 0]
