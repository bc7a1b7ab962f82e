"""Temperature, top-k and top-p sampling; temperature 0 (below MIN_TEMPERATURE)
is greedy decoding."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from txf import checks
from txf.decode.cache import Cache, TokensToLogits
from txf.decode.prompts import (
  check_finite_at_least,
  check_search,
  prompt_lengths,
  restore_padding_side,
  right_aligned,
)

Array = jax.Array


def check_sampling(temperature: Any, top_k: Any, top_p: Any) -> None:
  """The sampling arguments' check, which every caller shares (`sample`,
  `generate`, txf-generate's flags): a finite temperature >= 0 (one that is
  traced is not known here and not checked), an integer top_k >= 0 and a
  top_p in (0, 1] (0 would keep no token; NaN passes every comparison).

  Raises:
    ValueError: naming the first argument out of range.
  """
  check_finite_at_least(temperature, "temperature", 0)
  checks.int_at_least(top_k, "top_k", 0)
  checks.fraction(top_p, "top_p", low_open=True, high_open=False)


def _filter_top_k(logits_BxV: Array, top_k: int) -> tuple[Array, Array]:
  """Keeps the k largest logits per row (ties at the k-th may keep more; k
  above the vocabulary keeps all of it): (the filtered logits, the k largest
  [B, min(k, V)], descending)."""
  top_BxK = jax.lax.top_k(logits_BxV, min(top_k, logits_BxV.shape[-1]))[0]
  return jnp.where(logits_BxV >= top_BxK[:, -1:], logits_BxV, -jnp.inf), top_BxK


def _filter_top_p(logits_BxV: Array, top_p: float, descending_BxN: Array | None) -> Array:
  """Nucleus filter: keeps the most likely tokens whose probabilities reach top_p.

  A token is kept when the probability of all more likely tokens is still
  below top_p, so the most likely token always survives. `descending_BxN`:
  the N largest logits in descending order where they hold every token the
  filter can keep (the top-k filter's: the others are -inf), or None: the
  filter sorts the whole row. The probabilities are normalised over the
  whole row either way; a logit tied with the N-th is kept with it.
  """
  if descending_BxN is None:
    descending_BxN = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
  # logsumexp over the row, its maximum read from the sorted logits rather
  # than found again (a reduction over the vocabulary fewer).
  top_Bx1 = descending_BxN[:, :1]
  log_total_Bx1 = jnp.log(jnp.sum(jnp.exp(logits_BxV - top_Bx1), axis=-1, keepdims=True)) + top_Bx1
  probs_BxN = jnp.exp(descending_BxN - log_total_Bx1)
  mass_before_BxN = jnp.cumsum(probs_BxN, axis=-1) - probs_BxN
  cutoff_Bx1 = jnp.min(
    jnp.where(mass_before_BxN < top_p, descending_BxN, jnp.inf), axis=-1, keepdims=True
  )
  return jnp.where(logits_BxV >= cutoff_Bx1, logits_BxV, -jnp.inf)


# Below this temperature (0 included) sampling is the argmax. Gumbel noise
# scaled by it (what sampling at it amounts to: argmax(l / t + g) is
# argmax(l + t g)) is below float32's resolution of logits of order 10,
# about 1e-6, so it is the argmax already; and the scaled logits l / t of a
# smaller one overflow to inf (the first such token drawn, not the largest).
MIN_TEMPERATURE = 1e-6
# A larger temperature samples as this one does (every kept token alike, to
# float32's precision): XLA divides by multiplying with the reciprocal,
# which past about 8.5e37 is subnormal, flushed to 0, and a filtered
# logit's -inf times 0 is NaN.
MAX_TEMPERATURE = 1e30


def _next_token(
  rng: Array, logits_BxV: Array, temperature: float | Array, top_k: int, top_p: float
) -> Array:
  """Samples [B] tokens from temperature-scaled, top-k then top-p filtered logits.

  temperature below MIN_TEMPERATURE (0 included) means argmax; one above
  MAX_TEMPERATURE samples as MAX_TEMPERATURE. temperature may be traced (no
  recompile per value); top_k and top_p are Python numbers (top_k sets a
  shape).
  """
  logits_BxV = logits_BxV.astype(jnp.float32)
  sampled = temperature >= MIN_TEMPERATURE
  # The sampled branch must stay finite where it is not sampled; it is discarded then.
  divisor = jnp.where(sampled, jnp.minimum(temperature, MAX_TEMPERATURE), 1.0)
  # The top-k filter reads the logits before they are divided (which keeps
  # their order): a huge temperature scales them all to about 0, where it
  # kept every token, tied. After it, top-p reads its k logits, already
  # sorted, instead of sorting the row (a dozen kernels a token on a GPU).
  scaled_BxV, descending_BxK = logits_BxV, None
  if top_k:
    scaled_BxV, descending_BxK = _filter_top_k(logits_BxV, top_k)
    descending_BxK = descending_BxK / divisor
  scaled_BxV = scaled_BxV / divisor
  if top_p < 1.0:
    scaled_BxV = _filter_top_p(scaled_BxV, top_p, descending_BxK)
  # jax.random.categorical(rng, scaled) is the argmax of the scaled logits
  # plus Gumbel noise (the Gumbel-max trick, as jax draws it); choosing
  # between those and the plain logits before one argmax, not between two
  # argmaxes after, gives the same token from one pass over the vocabulary.
  noisy_BxV = jax.random.gumbel(rng, scaled_BxV.shape, scaled_BxV.dtype) + scaled_BxV
  return jnp.argmax(jnp.where(sampled, noisy_BxV, logits_BxV), axis=-1)


def _check_key(rng: Any) -> None:
  """One PRNG key: a typed key (jax.random.key) or a raw uint32 [2]
  (jax.random.PRNGKey). `generate` takes rng=None as greedy decoding; here
  it was jax's TypeError about the key's type, from inside the loop."""
  dtype, shape = getattr(rng, "dtype", None), jnp.shape(rng) if rng is not None else None
  typed = dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key) and shape == ()
  if not (typed or (dtype == jnp.uint32 and shape == (2,))):
    got = "None" if rng is None else f"{dtype} {shape}" if dtype is not None else type(rng).__name__
    raise ValueError(
      f"sample: rng: one PRNG key (jax.random.key(0)), got {got}; temperature=0 decodes "
      "greedily with any key (generate's rng=None does so)"
    )


def sample(
  tokens_to_logits: TokensToLogits,
  cache: Cache,
  prompt_BxP: Array,
  *,
  max_new_tokens: int,
  rng: Array,
  temperature: float | Array = 1.0,
  top_k: int = 0,
  top_p: float = 1.0,
  eos_id: int | None = None,
  pad_id: int = 0,
  prompt_lengths_B: Array | None = None,
  padding_side: str = "right",
) -> Array:
  """Temperature / top-k / top-p sampling; temperature 0 is greedy decoding.

  Prompts, padding and EOS as in `txf.decode`'s docstring. The loop stops as
  soon as every row has ended.

  Args:
    tokens_to_logits: (tokens [B, 1], cache) -> (logits [B, V], cache).
    cache: empty cache with room for P + max_new_tokens - 1 positions.
    prompt_BxP: int prompts.
    max_new_tokens: N >= 1.
    rng: PRNG key; step i uses fold_in(rng, i).
    temperature: logits are divided by it; below MIN_TEMPERATURE (1e-6; 0
      included): argmax, which sampling at it is to float32's precision
      (and dividing by a smaller one may overflow); above MAX_TEMPERATURE
      (1e30): as at it, every kept token alike.
    top_k: sample among the k most likely tokens; 0 (or k at least the
      vocabulary size): all.
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
    ValueError: for sampling arguments out of range (`check_sampling`), an
      rng that is not one key, a txf cache of other rows or too short, bad
      shapes, or (concrete prompts) rows without a token or not padded on
      padding_side.
  """
  check_sampling(temperature, top_k, top_p)
  _check_key(rng)
  check_search("sample", cache, prompt_BxP, prompt_lengths_B, max_new_tokens, pad_id, padding_side)
  prompt_len = prompt_BxP.shape[1]
  lengths_B = prompt_lengths(prompt_BxP, pad_id, prompt_lengths_B)
  prompt_BxP = right_aligned(prompt_BxP, lengths_B, pad_id, padding_side)
  last_position_B = lengths_B + max_new_tokens - 1
  # The prompts are read from this first state of the buffer, which the loop
  # does not write: on a GPU the read is then part of the kernel that writes
  # the buffer's next token (reading the buffer it writes took a kernel).
  prompts_BxT = jnp.pad(prompt_BxP, ((0, 0), (0, max_new_tokens)), constant_values=pad_id)
  # The rows that generated eos_id (none without one). A row has also
  # finished after its last_position: a function of the position, not a
  # state, so the loop carries no rows' state for the token's write to copy
  # (deviceless H100, gpt2_small at batch 1: 73 -> 71 kernels a token).
  ended_B = jnp.zeros(prompt_BxP.shape[:1], bool)

  def step(state):
    i, tokens_BxT, ended_B, _, cache = state
    logits_BxV, cache = tokens_to_logits(
      jax.lax.dynamic_slice_in_dim(tokens_BxT, i, 1, axis=1), cache
    )
    sampled_B = _next_token(jax.random.fold_in(rng, i), logits_BxV, temperature, top_k, top_p)
    position = i + 1
    in_prompt_B = position < lengths_B
    finished_B = ended_B | (i >= last_position_B)  # before this position
    token_B = jnp.where(
      in_prompt_B, prompts_BxT[:, position], jnp.where(finished_B, pad_id, sampled_B)
    )
    # (0, position) in one integer type, as dynamic_update_slice takes (a
    # python 0 is int64 where jax_enable_x64 is set).
    start = (jnp.zeros_like(position), position)
    # argmax's int64 under jax_enable_x64 written into the int32 buffer.
    token_Bx1 = token_B[:, None].astype(tokens_BxT.dtype)
    tokens_BxT = jax.lax.dynamic_update_slice(tokens_BxT, token_Bx1, start)
    if eos_id is not None:
      ended_B |= ~in_prompt_B & (token_B == eos_id)
    # Whether to go on, computed here with the rows' states: the loop's
    # condition only reads it (no kernel of its own on a GPU).
    return i + 1, tokens_BxT, ended_B, ~jnp.all(ended_B | (position >= last_position_B)), cache

  # Every row finishes at its last_position (<= P + N - 1), so this ends
  # before `position` runs off the buffer.
  _, tokens_BxT, _, _, _ = jax.lax.while_loop(
    lambda state: state[3],
    step,
    (jnp.int32(0), prompts_BxT, ended_B, ~jnp.all(ended_B), cache),
  )
  return restore_padding_side(tokens_BxT, lengths_B, prompt_len, padding_side)
