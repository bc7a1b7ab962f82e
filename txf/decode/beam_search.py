"""Beam search with GNMT length normalisation (as flax's wmt example / t5x).

The search keeps, per example, the K best hypotheses still going (live) and
the K best that have ended (finished) in a `BeamState`; each step
(`_beam_step`) scores 2K candidates, keeps the K best that go on and merges
the ones that ended into the finished pool.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple, overload

import jax
import jax.numpy as jnp
from flax import struct

from txf import checks
from txf.decode.cache import Cache, TokensToLogits, cache_leaves
from txf.decode.prompts import (
  check_finite_at_least,
  check_search,
  prompt_lengths,
  restore_padding_side,
  right_aligned,
)

Array = jax.Array


@overload
def length_penalty_factor(length: Array, alpha: float | Array) -> Array: ...
@overload
def length_penalty_factor(length: int, alpha: float | Array) -> Array | float: ...
def length_penalty_factor(length: Array | int, alpha: float | Array) -> Array | float:
  """GNMT length normalisation ((5 + length) / 6) ** alpha (Wu et al. 2016)."""
  return ((5.0 + length) / 6.0) ** alpha


@struct.dataclass
class BeamState:
  """The search loop's carry for B examples, K beams and T = P + N columns.

  Hypotheses are right-aligned prompts followed by their new tokens, pad_id
  after their end. A log-probability or score of -inf marks an empty slot.
  """

  position: Array  # int32 scalar: the column this step's tokens go to
  live_tokens_BxKxT: Array  # int32: the hypotheses still going
  live_logprobs_BxK: Array  # float32: their summed log-probabilities
  finished_tokens_BxKxT: Array  # int32: the best ended hypotheses
  finished_scores_BxK: Array  # float32: their length-normalised scores, best first
  cache: Cache  # the model's cache for B * K rows, in live-beam order


class _Candidates(NamedTuple):
  """A step's 2K best extensions per example, 2K = 2 * num_beams."""

  logprobs_Bx2K: Array  # float32: summed log-probabilities
  source_beams_Bx2K: Array  # int32: the live beam each extends
  tokens_Bx2KxT: Array  # int32: the hypotheses with their new token
  ended_Bx2K: Array  # bool: ended at EOS or at the row's last token


def _map_batch_leaves(
  fn: Callable[[Array, int], Array], cache: Cache, batch_axes: Cache | None
) -> Cache:
  """Applies fn(leaf, batch_axis) to the leaves that have a batch axis.

  batch_axes None: axis 0 of every non-scalar leaf (the t5x convention).
  """
  if batch_axes is None:
    batch_axes = jax.tree.map(lambda x: 0 if jnp.ndim(x) else None, cache)
  return jax.tree.map(lambda x, axis: x if axis is None else fn(x, axis), cache, batch_axes)


def _rows_past_axis_0(cache: Cache) -> bool:
  """Whether a txf cache's self-attention keys ([..., B, L, K, Dh]) lead
  with another axis than their rows."""
  return any(jnp.ndim(leaf) > 4 for leaf in cache_leaves(cache, "cached_key"))


def per_beam(cache: Cache, num_beams: int, batch_axes: Cache | None) -> Cache:
  """`cache` with each row repeated num_beams times along its batch axis (as
  `_map_batch_leaves` finds it): the cache of beam search's steps after the
  prompt's, B * K rows."""
  return _map_batch_leaves(lambda x, axis: jnp.repeat(x, num_beams, axis=axis), cache, batch_axes)


def _gather_beams(x: Array, beam_indices_BxK: Array, axis: int) -> Array:
  """Reorders beams along x's flat batch * beam axis: new beam k of row b is
  old beam beam_indices[b, k]."""
  num_beams = beam_indices_BxK.shape[1]
  flat_indices = jnp.arange(beam_indices_BxK.shape[0])[:, None] * num_beams + beam_indices_BxK
  return jnp.take(x, flat_indices.reshape(-1), axis=axis)


def _prefill(
  tokens_to_logits: TokensToLogits, cache: Cache, tokens_BxP: Array, num_tokens: Array
) -> Cache:
  """Feeds the first num_tokens columns of tokens [B, P] through the cache, one
  position at a time; keeps the cache."""
  return jax.lax.fori_loop(
    0,
    num_tokens,
    lambda i, cache: tokens_to_logits(jax.lax.dynamic_slice_in_dim(tokens_BxP, i, 1, 1), cache)[1],
    cache,
  )


def _beam_init(tokens_BxT: Array, num_beams: int, position: Array, cache: Cache) -> BeamState:
  """K copies of each row's tokens [B, T], of which only beam 0 is live.

  All beams start as the same prompt: were they all live, the first step
  would return K copies of each candidate.
  """
  batch_size = tokens_BxT.shape[0]
  live_tokens_BxKxT = jnp.repeat(tokens_BxT[:, None], num_beams, axis=1)
  live_logprobs_BxK = jnp.tile(
    jnp.where(jnp.arange(num_beams) == 0, 0.0, -jnp.inf), (batch_size, 1)
  )
  return BeamState(
    position=position,
    live_tokens_BxKxT=live_tokens_BxKxT,
    live_logprobs_BxK=live_logprobs_BxK,
    finished_tokens_BxKxT=live_tokens_BxKxT,
    finished_scores_BxK=jnp.full((batch_size, num_beams), -jnp.inf),
    cache=cache,
  )


def _search_continues(state: BeamState, total_len: int, max_length_factor: Array | float) -> Array:
  """Whether columns remain and some live beam can still beat its example's
  worst finished one (its best possible score is its log-prob over the
  longest length's factor, as length_penalty >= 0)."""
  best_possible_B = jnp.max(state.live_logprobs_BxK, axis=1) / max_length_factor
  can_improve_B = best_possible_B > jnp.min(state.finished_scores_BxK, axis=1)
  return (state.position < total_len) & jnp.any(can_improve_B)


def _next_logprobs(
  tokens_to_logits: TokensToLogits, state: BeamState, tokens_BxT: Array, in_prompt_B: Array
) -> tuple[Array, Cache]:
  """Log-probabilities [B, K, V] of each live beam's next token, and the cache.

  Inside its prompt a row's next token is forced: it keeps the beam's
  log-prob and every other token is impossible.
  """
  batch_size, num_beams = state.live_logprobs_BxK.shape
  logits_BKxV, cache = tokens_to_logits(
    state.live_tokens_BxKxT[:, :, state.position - 1].reshape(-1, 1), state.cache
  )
  vocab_size = logits_BKxV.shape[-1]
  logprobs_BxKxV = jax.nn.log_softmax(logits_BKxV.astype(jnp.float32)).reshape(
    batch_size, num_beams, vocab_size
  )
  forced_BxV = jnp.where(
    jnp.arange(vocab_size) == tokens_BxT[:, state.position, None], 0.0, -jnp.inf
  )
  return jnp.where(in_prompt_B[:, None, None], forced_BxV[:, None], logprobs_BxKxV), cache


def _top_candidates(
  state: BeamState,
  logprobs_BxKxV: Array,
  ended_by_length_B: Array,
  in_prompt_B: Array,
  eos_id: int | None,
) -> _Candidates:
  """The 2K best extensions of the live beams, and which of them end.

  2K candidates always hold K that do not end in EOS (each beam has one EOS).
  """
  batch_size, num_beams, vocab_size = logprobs_BxKxV.shape
  candidate_logprobs_BxKV = (state.live_logprobs_BxK[..., None] + logprobs_BxKxV).reshape(
    batch_size, -1
  )
  logprobs_Bx2K, flat_indices_Bx2K = jax.lax.top_k(candidate_logprobs_BxKV, 2 * num_beams)
  source_beams_Bx2K = flat_indices_Bx2K // vocab_size
  new_tokens_Bx2K = flat_indices_Bx2K % vocab_size
  tokens_Bx2KxT = (
    jnp.take_along_axis(state.live_tokens_BxKxT, source_beams_Bx2K[..., None], axis=1)
    .at[:, :, state.position]
    .set(new_tokens_Bx2K)
  )
  ended_Bx2K = jnp.broadcast_to(ended_by_length_B[:, None], new_tokens_Bx2K.shape)
  if eos_id is not None:
    ended_Bx2K |= ~in_prompt_B[:, None] & (new_tokens_Bx2K == eos_id)
  return _Candidates(logprobs_Bx2K, source_beams_Bx2K, tokens_Bx2KxT, ended_Bx2K)


def _keep_live(
  candidates: _Candidates, cache: Cache, num_beams: int, batch_axes: Cache | None
) -> tuple[Array, Array, Cache]:
  """The K best candidates that go on: (tokens [B, K, T], log-probs [B, K],
  the cache reordered to them)."""
  live_logprobs_BxK, live_picks_BxK = jax.lax.top_k(
    jnp.where(candidates.ended_Bx2K, -jnp.inf, candidates.logprobs_Bx2K), num_beams
  )
  live_tokens_BxKxT = jnp.take_along_axis(
    candidates.tokens_Bx2KxT, live_picks_BxK[..., None], axis=1
  )
  live_sources_BxK = jnp.take_along_axis(candidates.source_beams_Bx2K, live_picks_BxK, axis=1)
  cache = _map_batch_leaves(
    lambda x, axis: _gather_beams(x, live_sources_BxK, axis), cache, batch_axes
  )
  return live_tokens_BxKxT, live_logprobs_BxK, cache


def _merge_finished(
  state: BeamState, candidates: _Candidates, length_factor_B: Array
) -> tuple[Array, Array]:
  """The K best of the finished pool and the candidates that ended: (tokens
  [B, K, T], scores [B, K])."""
  num_beams = state.finished_scores_BxK.shape[1]
  ended_scores_Bx2K = jnp.where(
    candidates.ended_Bx2K, candidates.logprobs_Bx2K / length_factor_B[:, None], -jnp.inf
  )
  finished_scores_BxK, finished_picks_BxK = jax.lax.top_k(
    jnp.concatenate([state.finished_scores_BxK, ended_scores_Bx2K], axis=1), num_beams
  )
  finished_tokens_BxKxT = jnp.take_along_axis(
    jnp.concatenate([state.finished_tokens_BxKxT, candidates.tokens_Bx2KxT], axis=1),
    finished_picks_BxK[..., None],
    axis=1,
  )
  return finished_tokens_BxKxT, finished_scores_BxK


def _beam_step(
  state: BeamState,
  *,
  tokens_to_logits: TokensToLogits,
  tokens_BxT: Array,
  lengths_B: Array,
  max_new_tokens: int,
  eos_id: int | None,
  length_penalty: float | Array,
  batch_axes: Cache | None,
) -> BeamState:
  """Extends every live beam by one token at column state.position."""
  in_prompt_B = state.position < lengths_B
  generated_B = state.position - lengths_B + 1  # new tokens with this one (<= 0 in the prompt)
  logprobs_BxKxV, cache = _next_logprobs(tokens_to_logits, state, tokens_BxT, in_prompt_B)
  candidates = _top_candidates(
    state, logprobs_BxKxV, generated_B == max_new_tokens, in_prompt_B, eos_id
  )
  num_beams = state.live_logprobs_BxK.shape[1]
  live_tokens_BxKxT, live_logprobs_BxK, cache = _keep_live(candidates, cache, num_beams, batch_axes)
  length_factor_B = length_penalty_factor(jnp.maximum(generated_B, 1), length_penalty)
  finished_tokens_BxKxT, finished_scores_BxK = _merge_finished(state, candidates, length_factor_B)
  return BeamState(
    position=state.position + 1,
    live_tokens_BxKxT=live_tokens_BxKxT,
    live_logprobs_BxK=live_logprobs_BxK,
    finished_tokens_BxKxT=finished_tokens_BxKxT,
    finished_scores_BxK=finished_scores_BxK,
    cache=cache,
  )


def beam_search(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  prompt_BxP: Array,
  *,
  num_beams: int,
  max_new_tokens: int,
  eos_id: int | None,
  length_penalty: float | Array = 0.6,
  pad_id: int = 0,
  prompt_lengths_B: Array | None = None,
  padding_side: str = "right",
  batch_axes: Cache | None = None,
) -> tuple[Array, Array]:
  """Beam search with GNMT length normalisation (as flax's wmt example / t5x).

  Hypotheses are scored by the sum of log-probabilities of the generated
  tokens divided by ((5 + n) / 6) ** length_penalty, n = number of generated
  tokens (EOS included). A hypothesis ends at EOS or at max_new_tokens;
  ended ones are kept in a separate top-num_beams pool, and the search stops
  early once no live beam can still beat the worst kept one (assumes
  length_penalty >= 0, so a live beam's best possible score is its log-prob
  over the longest length's factor).

  Prompts may differ in length (`txf.decode`'s docstring). The tokens that
  every row's prompt holds before its last go through the cache once per
  row, before it is copied per beam; a longer prompt's remaining tokens are
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
    ValueError: as `sample`, num_beams < 1, a txf cache of scanned layers
      without batch_axes, or (concrete) a length_penalty
      not finite and >= 0.
  """
  check_search(
    "beam_search", cache, prompt_BxP, prompt_lengths_B, max_new_tokens, pad_id, padding_side
  )
  num_beams = checks.int_at_least(num_beams, "beam_search: num_beams", 1)
  if batch_axes is None and _rows_past_axis_0(cache):
    # Axis 0 there is the layers': the beams would copy layers, and the first
    # step fail on a shape (or, with as many layers as beams, decode wrongly).
    raise ValueError(
      "beam_search: batch_axes: the cache holds its rows after axis 0 (scan_layers' "
      "[N, B, L, K, Dh]); pass batch_axes=decode.cache_batch_axes(model, cache_len)"
    )
  # Its early stop assumes a length_penalty >= 0.
  check_finite_at_least(length_penalty, "beam_search: length_penalty", 0)
  prompt_len = prompt_BxP.shape[1]
  lengths_B = prompt_lengths(prompt_BxP, pad_id, prompt_lengths_B)
  prompt_BxP = right_aligned(prompt_BxP, lengths_B, pad_id, padding_side)
  shared_len = jnp.min(lengths_B) - 1
  cache = _prefill(tokens_to_logits, cache, prompt_BxP, shared_len)
  cache = per_beam(cache, num_beams, batch_axes)
  tokens_BxT = jnp.pad(prompt_BxP, ((0, 0), (0, max_new_tokens)), constant_values=pad_id)
  continues = functools.partial(
    _search_continues,
    total_len=prompt_len + max_new_tokens,
    max_length_factor=length_penalty_factor(max_new_tokens, length_penalty),
  )
  step = functools.partial(
    _beam_step,
    tokens_to_logits=tokens_to_logits,
    tokens_BxT=tokens_BxT,
    lengths_B=lengths_B,
    max_new_tokens=max_new_tokens,
    eos_id=eos_id,
    length_penalty=length_penalty,
    batch_axes=batch_axes,
  )
  # Every hypothesis ends by its row's max_new_tokens, so the pool is the
  # answer: no fallback to live beams is needed.
  state = jax.lax.while_loop(
    continues, step, _beam_init(tokens_BxT, num_beams, shared_len + 1, cache)
  )
  return (
    restore_padding_side(state.finished_tokens_BxKxT, lengths_B, prompt_len, padding_side),
    state.finished_scores_BxK,
  )
