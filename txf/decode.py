"""KV-cache generation: greedy decoding, sampling and beam search.

The search functions (`sample`, `beam_search`) know nothing about models (t5x
style). They take

  tokens_to_logits(tokens_Bx1, cache) -> (logits_BxV, new_cache)

which feeds one token per row through the model at the cache's current index
and returns the float logits of the next token, and the cache pytree it
threads. The batch B seen by `tokens_to_logits` is the prompt batch for
`sample` and batch * beam_size for `beam_search`. Both run their loop on
device (`lax.while_loop`) and trace under `jax.jit`; `tokens_to_logits` and
the integer / search-shape arguments must then be static, so build the
callable inside the jitted function (as `generate` does) rather than passing
a fresh closure over parameters to a jitted search.

The cache must have room for every token fed to it: P + max_new_tokens - 1
positions for a prompt of P tokens. Feeding past its end does not fail: the
write index is clamped, and the results are silently wrong.

`init_cache`, `cache_batch_axes` and `make_tokens_to_logits` adapt txf models
(`txf.models.build`) to this interface; `generate` and `generate_seq2seq`
combine them into one jitted call.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers.embedding import check_position_table

Array = jax.Array
Cache = Any  # a pytree of arrays
TokensToLogits = Callable[[Array, Cache], tuple[Array, Cache]]

_GENERATIVE_FAMILIES = ("decoder", "encoder_decoder", "lstm")


# ----------------------------------------------------------------------------
# Caches of txf models.


def _cache_shapes(model: nn.Module, batch_size: int, cache_len: int,
                  encoder_tokens: Array | None) -> Cache:
  """The model's 'cache' collection as a pytree of jax.ShapeDtypeStruct."""
  cfg = model.cfg
  if cfg.family not in _GENERATIVE_FAMILIES:
    raise ValueError(f"model.family: {cfg.family!r} cannot generate "
                     f"(KV-cache decoding needs one of {_GENERATIVE_FAMILIES})")
  if cfg.head != "lm":
    raise ValueError(f"model.head: generation needs an 'lm' head, got {cfg.head!r}")
  check_position_table(cfg.position, cfg.max_len, cache_len, "a cache")
  if encoder_tokens is not None and cfg.family != "encoder_decoder":
    raise ValueError("init_cache: encoder_tokens only apply to family='encoder_decoder'")
  decoder_tokens = jax.ShapeDtypeStruct((batch_size, cache_len), jnp.int32)
  inputs = (decoder_tokens,)
  if cfg.family == "encoder_decoder":
    # The cache holds decoder self-attention only; the encoder length is
    # irrelevant to it, so any length does when none is given.
    encoder_shape = (batch_size, 1) if encoder_tokens is None else encoder_tokens.shape
    inputs = (jax.ShapeDtypeStruct(encoder_shape, jnp.int32),) + inputs
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
    encoder_tokens: encoder_decoder only, optional: [B, S] encoder inputs
      (only their shape is used).

  Returns:
    The model's 'cache' collection: per layer `cached_key`/`cached_value`
    [B, L, K, Dh] ([N, B, L, K, Dh] with scan_layers) and a scalar `index`.

  Raises:
    ValueError: naming the field, for a family or head that cannot generate,
      or cache_len longer than a learned position table.
  """
  shapes = _cache_shapes(model, batch_size, cache_len, encoder_tokens)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def cache_batch_axes(model: nn.Module, cache_len: int) -> Cache:
  """Which axis of each cache leaf is the batch axis (for `beam_search`).

  Found by comparing the cache shapes for batch sizes 1 and 2, so it holds
  for any layout (e.g. scanned layers put the batch on axis 1).

  Returns:
    A pytree with the cache's structure: an int axis per leaf, or None for a
    leaf without a batch axis (the shared `index`).
  """
  def batch_axis(one, two):
    differing = [a for a, (m, n) in enumerate(zip(one.shape, two.shape)) if m != n]
    return differing[0] if differing else None
  return jax.tree.map(batch_axis, _cache_shapes(model, 1, cache_len, None),
                      _cache_shapes(model, 2, cache_len, None))


def make_tokens_to_logits(model: nn.Module, params: Any, *context: Array,
                          method: str | None = None) -> TokensToLogits:
  """Wraps a txf model as the `tokens_to_logits` of `sample` / `beam_search`.

  Args:
    model: decoder or encoder-decoder.
    params: its parameters.
    *context: leading arguments of `method` before the tokens, e.g.
      (encoded [B, S, D], encoder mask [B, 1, 1, S]) for
      `method='decode'` of an encoder-decoder. Their batch must match the
      tokens' (expand them for beam search).
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
           pad_id: int = 0) -> Array:
  """Temperature / top-k / top-p sampling; temperature 0 is greedy decoding.

  Prompts are left-aligned and right-padded with pad_id and may differ in
  length; each row needs at least one token (e.g. BOS). All rows share one
  cache index: step i feeds position i of every row and, while a row's
  prompt lasts, the next token is forced to the prompt's instead of the
  sampled one (t5x style), so no separate prefill is needed.

  Each row generates at most max_new_tokens tokens after its own prompt and
  stops after EOS; positions after a row's end hold pad_id. The loop stops
  as soon as every row has ended.

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

  Returns:
    int32 [B, P + N]: prompts followed by the generated tokens.
  """
  if max_new_tokens < 1:
    raise ValueError(f"sample: max_new_tokens must be >= 1, got {max_new_tokens}")
  prompt_lengths_B = jnp.sum(prompt_BxP != pad_id, axis=1)
  last_position_B = prompt_lengths_B + max_new_tokens - 1
  tokens_BxT = jnp.pad(prompt_BxP.astype(jnp.int32), ((0, 0), (0, max_new_tokens)),
                       constant_values=pad_id)
  finished_B = jnp.zeros(prompt_BxP.shape[:1], bool)

  def step(state):
    i, tokens_BxT, finished_B, cache = state
    logits_BxV, cache = tokens_to_logits(
        jax.lax.dynamic_slice_in_dim(tokens_BxT, i, 1, axis=1), cache)
    sampled_B = _next_token(jax.random.fold_in(rng, i), logits_BxV, temperature, top_k, top_p)
    position = i + 1
    in_prompt_B = position < prompt_lengths_B
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
  return tokens_BxT


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


def _prefill(tokens_to_logits: TokensToLogits, cache: Cache, tokens_BxT: Array) -> Cache:
  """Feeds tokens [B, T] through the cache one position at a time; keeps the cache."""
  if not tokens_BxT.shape[1]:
    return cache  # the loop body could not even be traced on zero columns
  return jax.lax.fori_loop(
      0, tokens_BxT.shape[1],
      lambda i, cache: tokens_to_logits(jax.lax.dynamic_slice_in_dim(tokens_BxT, i, 1, 1),
                                        cache)[1],
      cache)


def beam_search(tokens_to_logits: TokensToLogits, cache: Cache, prompt_BxP: Array, *,
                beam_size: int, max_new_tokens: int, eos_id: int | None,
                length_penalty: float | Array = 0.6, pad_id: int = 0,
                batch_axes: Cache | None = None) -> tuple[Array, Array]:
  """Beam search with GNMT length normalisation (as flax's wmt example / t5x).

  Hypotheses are scored by sum of log-probabilities of the generated tokens
  divided by ((5 + n) / 6) ** length_penalty, n = number of generated tokens
  (EOS included). A hypothesis ends at EOS or at max_new_tokens; ended ones
  are kept in a separate top-beam_size pool, and the search stops early once
  no live beam can still beat the worst kept one (assumes
  length_penalty >= 0, so a live beam's best possible score is its log-prob
  over the longest length's factor).

  Args:
    tokens_to_logits: (tokens [B * beam_size, 1], cache) -> (logits, cache);
      row b * beam_size + k is beam k of example b.
    cache: empty cache for batch B (it is expanded to B * beam_size here)
      with room for P + max_new_tokens - 1 positions.
    prompt_BxP: int [B, P] prompts of one length without padding, e.g. a
      BOS column [B, 1].
    beam_size: K.
    max_new_tokens: N >= 1.
    eos_id: end-of-sequence token; None: every hypothesis runs to N tokens.
    length_penalty: alpha; 0 ranks by the plain log-probability.
    pad_id: filler after EOS.
    batch_axes: the batch axis of each cache leaf (None for leaves
      shared by all rows), a pytree with the cache's structure (e.g. from
      `cache_batch_axes(model, cache_len)`); None: axis 0 of every non-scalar
      leaf.

  Returns:
    tokens int32 [B, K, P + N] (prompt included, pad after EOS) and scores
    float32 [B, K], best first. A score of -inf marks a slot for which fewer
    than K distinct hypotheses exist.
  """
  if max_new_tokens < 1:
    raise ValueError(f"beam_search: max_new_tokens must be >= 1, got {max_new_tokens}")
  batch_size, prompt_len = prompt_BxP.shape
  num_beams = beam_size
  # The prompt goes through the cache before it is copied per beam; its last
  # token is fed by the first search step.
  cache = _prefill(tokens_to_logits, cache, prompt_BxP[:, :-1])
  cache = _map_batch_leaves(lambda x, axis: jnp.repeat(x, num_beams, axis=axis),
                            cache, batch_axes)

  tokens_BxT = jnp.pad(prompt_BxP.astype(jnp.int32), ((0, 0), (0, max_new_tokens)),
                       constant_values=pad_id)
  live_tokens_BxKxT = jnp.repeat(tokens_BxT[:, None], num_beams, axis=1)
  # All beams start as the same prompt: only beam 0 may expand, or the first
  # step would return K copies of each candidate.
  live_logprobs_BxK = jnp.tile(jnp.where(jnp.arange(num_beams) == 0, 0.0, -jnp.inf),
                               (batch_size, 1))
  finished_scores_BxK = jnp.full((batch_size, num_beams), -jnp.inf)
  max_length_factor = length_penalty_factor(max_new_tokens, length_penalty)

  def search_continues(state):
    step, _, live_logprobs_BxK, _, finished_scores_BxK, _ = state
    best_possible_B = jnp.max(live_logprobs_BxK, axis=1) / max_length_factor
    can_improve_B = best_possible_B > jnp.min(finished_scores_BxK, axis=1)
    return (step < max_new_tokens) & jnp.any(can_improve_B)

  def search_step(state):
    step, live_tokens_BxKxT, live_logprobs_BxK, finished_tokens_BxKxT, finished_scores_BxK, \
        cache = state
    position = prompt_len + step  # where this step's tokens go
    logits_BKxV, cache = tokens_to_logits(
        live_tokens_BxKxT[:, :, position - 1].reshape(-1, 1), cache)
    vocab_size = logits_BKxV.shape[-1]
    logprobs_BxKxV = jax.nn.log_softmax(logits_BKxV.astype(jnp.float32)).reshape(
        batch_size, num_beams, vocab_size)
    candidate_logprobs_BxKV = (live_logprobs_BxK[..., None] + logprobs_BxKxV).reshape(
        batch_size, -1)

    # 2K candidates always hold K that do not end in EOS (each beam has one EOS).
    candidate_logprobs_Bx2K, flat_indices_Bx2K = jax.lax.top_k(candidate_logprobs_BxKV,
                                                               2 * num_beams)
    source_beams_Bx2K = flat_indices_Bx2K // vocab_size
    candidate_tokens_Bx2KxT = jnp.take_along_axis(
        live_tokens_BxKxT, source_beams_Bx2K[..., None], axis=1).at[:, :, position].set(
            flat_indices_Bx2K % vocab_size)
    ended_Bx2K = jnp.full(candidate_logprobs_Bx2K.shape, step + 1 == max_new_tokens)
    if eos_id is not None:
      ended_Bx2K |= flat_indices_Bx2K % vocab_size == eos_id

    # Live beams: the K best candidates that go on.
    live_logprobs_BxK, live_picks_BxK = jax.lax.top_k(
        jnp.where(ended_Bx2K, -jnp.inf, candidate_logprobs_Bx2K), num_beams)
    live_tokens_BxKxT = jnp.take_along_axis(candidate_tokens_Bx2KxT, live_picks_BxK[..., None],
                                            axis=1)
    live_sources_BxK = jnp.take_along_axis(source_beams_Bx2K, live_picks_BxK, axis=1)
    cache = _map_batch_leaves(lambda x, axis: _gather_beams(x, live_sources_BxK, axis),
                              cache, batch_axes)

    # Finished pool: the K best of the old pool and the candidates that ended.
    ended_scores_Bx2K = jnp.where(
        ended_Bx2K, candidate_logprobs_Bx2K / length_penalty_factor(step + 1, length_penalty),
        -jnp.inf)
    finished_scores_BxK, finished_picks_BxK = jax.lax.top_k(
        jnp.concatenate([finished_scores_BxK, ended_scores_Bx2K], axis=1), num_beams)
    finished_tokens_BxKxT = jnp.take_along_axis(
        jnp.concatenate([finished_tokens_BxKxT, candidate_tokens_Bx2KxT], axis=1),
        finished_picks_BxK[..., None], axis=1)
    return (step + 1, live_tokens_BxKxT, live_logprobs_BxK, finished_tokens_BxKxT,
            finished_scores_BxK, cache)

  # Every hypothesis ends by max_new_tokens, so the pool is the answer: no
  # fallback to live beams is needed.
  state = jax.lax.while_loop(search_continues, search_step,
                             (jnp.int32(0), live_tokens_BxKxT, live_logprobs_BxK,
                              live_tokens_BxKxT, finished_scores_BxK, cache))
  return state[3], state[4]


# ----------------------------------------------------------------------------
# Model-level entry points.


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "top_k", "top_p",
                                             "eos_id"))
def generate(model: nn.Module, params: Any, prompt_BxP: Array, *, max_new_tokens: int,
             rng: Array | None = None, temperature: float | Array = 1.0, top_k: int = 0,
             top_p: float = 1.0, eos_id: int | None = None) -> Array:
  """Continues prompts with a decoder (jitted; recompiles per prompt shape).

  Args:
    model: decoder from `txf.models.build`; its cfg.pad_id pads the prompts.
    params: its parameters.
    prompt_BxP: left-aligned prompts, right-padded with cfg.pad_id.
    max_new_tokens, temperature, top_k, top_p, eos_id: as in `sample`.
    rng: sampling key; None: greedy decoding (temperature ignored).

  Returns:
    int32 [B, P + max_new_tokens], as `sample`.
  """
  if rng is None:
    rng, temperature = jax.random.key(0), 0.0  # the key is unused by argmax
  batch_size, prompt_len = prompt_BxP.shape
  cache = init_cache(model, batch_size, prompt_len + max_new_tokens - 1)
  return sample(make_tokens_to_logits(model, params), cache, prompt_BxP,
                max_new_tokens=max_new_tokens, rng=rng, temperature=temperature, top_k=top_k,
                top_p=top_p, eos_id=eos_id, pad_id=model.cfg.pad_id)


@functools.partial(jax.jit, static_argnames=("model", "max_new_tokens", "top_k", "top_p",
                                             "eos_id", "beam_size", "bos_id"))
def generate_seq2seq(model: nn.Module, params: Any, encoder_tokens_BxS: Array, *,
                     max_new_tokens: int, rng: Array | None = None,
                     temperature: float | Array = 1.0, top_k: int = 0, top_p: float = 1.0,
                     eos_id: int | None = None, beam_size: int | None = None,
                     length_penalty: float | Array = 0.6, bos_id: int = 1
                     ) -> Array | tuple[Array, Array]:
  """Decodes an encoder-decoder from bos_id (jitted; recompiles per input shape).

  The encoder runs once; each step runs the decoder on one token.

  Args:
    model: encoder_decoder from `txf.models.build`.
    params: its parameters.
    encoder_tokens_BxS: encoder inputs padded with cfg.pad_id.
    max_new_tokens: number of decoder tokens to generate at most.
    rng: sampling key; None: greedy (temperature ignored). Unused by beam search.
    temperature, top_k, top_p: as in `sample`.
    eos_id: end-of-sequence token, or None.
    beam_size: None: greedy / sampling; K: beam search with length_penalty.
    bos_id: the decoder's start token.

  Returns:
    Without beam_size: tokens int32 [B, max_new_tokens]. With beam_size:
    tokens int32 [B, K, max_new_tokens] and scores float32 [B, K], best
    first. The start token is not included; pad after EOS.
  """
  batch_size = encoder_tokens_BxS.shape[0]
  cfg = model.cfg
  encoded_BxSxD, encoder_mask = model.apply({"params": params}, encoder_tokens_BxS,
                                            method="encode")
  cache = init_cache(model, batch_size, max_new_tokens, encoder_tokens=encoder_tokens_BxS)
  bos_Bx1 = jnp.full((batch_size, 1), bos_id, jnp.int32)
  if beam_size is None:
    if rng is None:
      rng, temperature = jax.random.key(0), 0.0  # the key is unused by argmax
    tokens_to_logits = make_tokens_to_logits(model, params, encoded_BxSxD, encoder_mask,
                                             method="decode")
    tokens_BxT = sample(tokens_to_logits, cache, bos_Bx1, max_new_tokens=max_new_tokens,
                        rng=rng, temperature=temperature, top_k=top_k, top_p=top_p,
                        eos_id=eos_id, pad_id=cfg.pad_id)
    return tokens_BxT[:, 1:]
  # Every beam of an example reads the same encoding, so repeating it once
  # matches the beam-expanded cache rows for the whole search.
  tokens_to_logits = make_tokens_to_logits(
      model, params, jnp.repeat(encoded_BxSxD, beam_size, axis=0),
      jnp.repeat(encoder_mask, beam_size, axis=0), method="decode")
  tokens_BxKxT, scores_BxK = beam_search(
      tokens_to_logits, cache, bos_Bx1, beam_size=beam_size, max_new_tokens=max_new_tokens,
      eos_id=eos_id, length_penalty=length_penalty, pad_id=cfg.pad_id,
      batch_axes=cache_batch_axes(model, max_new_tokens))
  return tokens_BxKxT[:, :, 1:], scores_BxK
