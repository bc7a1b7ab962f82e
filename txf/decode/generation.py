"""`generate`: one call that continues prompts with a txf decoder or
encoder-decoder, by sampling, greedy decoding or beam search.

`build_generate` makes it, and is where benchmarks and the training loop
reach for the switches the public `generate` leaves out: recomputing
cross-attention at every step (to compare against the cache) and lowering
the program instead of running it (to compile ahead of time).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from txf import checks, hardware
from txf.decode.beam_search import beam_search, per_beam
from txf.decode.cache import (
  cache_batch_axes,
  cache_bytes,
  cache_length,
  check_generative,
  encode_for_decoding,
  init_cache,
  make_tokens_to_logits,
)
from txf.decode.prompts import check_finite_at_least, check_search, concrete
from txf.decode.sampling import check_sampling, sample
from txf.layers.embedding import check_id_range

Array = jax.Array


def _checked_prompts(
  model: nn.Module,
  prompt_BxP: Array | None,
  encoder_tokens_BxS: Array | None,
  prompt_lengths_B: Array | None,
  bos_id: int,
) -> tuple[Array, Array | None]:
  """The decoder's prompts [B, P] and their lengths: those given, or an
  encoder-decoder's default BOS column, one token each (bos_id may be the
  pad_id: T5 starts from its pad token); raises a ValueError for missing or
  extra inputs."""
  check_generative(model)
  # A list of lists, as the ops take (arrays, tracers and abstract values,
  # which txf.aot compiles for a device it does not have, stay as they are).
  prompt_BxP = _as_array("prompt_BxP", prompt_BxP)
  encoder_tokens_BxS = _as_array("encoder_tokens_BxS", encoder_tokens_BxS)
  prompt_lengths_B = _as_array("prompt_lengths_B", prompt_lengths_B)
  for name, ids in (("prompt_BxP", prompt_BxP), ("encoder_tokens_BxS", encoder_tokens_BxS)):
    if ids is not None and len(ids.shape) != 2:
      raise ValueError(f"generate: {name} must be [B, L], got shape {tuple(ids.shape)}")
  is_seq2seq = model.cfg.family == "encoder_decoder"
  if is_seq2seq and encoder_tokens_BxS is None:
    raise ValueError("generate: encoder_tokens_BxS: an encoder_decoder needs encoder inputs")
  if not is_seq2seq and encoder_tokens_BxS is not None:
    raise ValueError("generate: encoder_tokens_BxS only apply to family='encoder_decoder'")
  # From here encoder_tokens_BxS is None exactly when the model is not seq2seq.
  if encoder_tokens_BxS is not None and not encoder_tokens_BxS.shape[1]:
    # An empty source decoded as if unconditioned (its cross-attention all zeros).
    raise ValueError("generate: encoder_tokens_BxS must hold at least one token a row, got S = 0")
  if prompt_BxP is None:
    if encoder_tokens_BxS is None:
      raise ValueError("generate: prompt_BxP: a decoder needs prompts")
    prompt_BxP = jnp.full((encoder_tokens_BxS.shape[0], 1), bos_id, jnp.int32)
    if prompt_lengths_B is None:
      prompt_lengths_B = jnp.ones(prompt_BxP.shape[:1], jnp.int32)
  if encoder_tokens_BxS is not None and encoder_tokens_BxS.shape[0] != prompt_BxP.shape[0]:
    raise ValueError(
      f"generate: encoder_tokens_BxS has {encoder_tokens_BxS.shape[0]} rows, "
      f"prompt_BxP {prompt_BxP.shape[0]}"
    )
  for name, ids in (("prompt_BxP", prompt_BxP), ("encoder_tokens_BxS", encoder_tokens_BxS)):
    _check_vocabulary(name, ids, model.cfg.vocab_size)
  _check_sources(encoder_tokens_BxS, model.cfg.pad_id)
  return prompt_BxP, prompt_lengths_B


def _check_sources(encoder_tokens_BxS: Array | None, pad_id: int) -> None:
  """ValueError for a concrete source row of pad_id only: the encoder masks
  every key, so the row is decoded as if unconditioned (as an empty source,
  S = 0, which is refused too)."""
  values = None if encoder_tokens_BxS is None else concrete(encoder_tokens_BxS)
  if values is None:
    return  # none (a decoder), or traced
  empty = np.flatnonzero(np.all(values == pad_id, axis=1))
  if empty.size:
    raise ValueError(
      f"generate: encoder_tokens_BxS rows {empty.tolist()} hold only pad_id={pad_id}; "
      "every source needs a token"
    )


def _as_array(name: str, ids: Any) -> Any:
  """Lists and tuples of ids as a numpy array; anything else as it is."""
  if not isinstance(ids, (list, tuple)):
    return ids
  try:
    return np.asarray(ids)
  except ValueError:  # numpy's "inhomogeneous shape"
    raise ValueError(
      f"generate: {name}: rows of different lengths; pad them to one length with "
      "model.pad_id (prompts: right, or left with padding_side='left')"
    ) from None


def _check_vocabulary(name: str, ids: Array | None, vocab_size: int) -> None:
  """ValueError for concrete ids outside [0, vocab_size): inside the jitted
  program the embedding clamps them (an id past the table read as the last
  one), so generation would continue another prompt than the one given."""
  values = None if ids is None else concrete(ids)
  if values is None or not np.issubdtype(values.dtype, np.integer):
    return  # traced (checked where they were made) or malformed (check_search says so)
  check_id_range(values, vocab_size, f"generate: {name}", "the vocabulary", "model.vocab_size")


def _check_search_choice(
  num_beams: int,
  return_beams: bool,
  rng: Array | None,
  top_k: int,
  top_p: float,
  length_penalty: float | Array,
) -> None:
  """Rejects beam widths below 1 and sampling options given to beam search."""
  # An int, not only >= 1: a float width reached jnp.repeat inside the
  # program (and jax cached the failure for later valid calls).
  num_beams = checks.int_at_least(num_beams, "generate: num_beams", 1)
  beam = num_beams > 1 or return_beams
  if beam and (rng is not None or top_k or top_p < 1.0):
    raise ValueError(
      f"generate: rng, top_k and top_p sample, but num_beams={num_beams} / "
      f"return_beams={return_beams} runs beam search, which is deterministic"
    )
  if beam:  # its early stop assumes a length_penalty >= 0
    check_finite_at_least(length_penalty, "generate: length_penalty", 0)


@functools.partial(
  jax.jit,
  static_argnames=(
    "model",
    "max_new_tokens",
    "top_k",
    "top_p",
    "eos_id",
    "num_beams",
    "return_beams",
    "padding_side",
    "cache_cross_attention",
  ),
)
def _generate(
  model,
  params,
  prompt_BxP,
  encoder_tokens_BxS,
  prompt_lengths_B,
  rng,
  temperature,
  length_penalty,
  *,
  max_new_tokens,
  top_k,
  top_p,
  eos_id,
  num_beams,
  return_beams,
  padding_side,
  cache_cross_attention,
):
  """`generate` after its checks: one jitted program per shape and option."""
  batch_size, prompt_len = prompt_BxP.shape
  cache_len = cache_length(prompt_len, max_new_tokens)
  if encoder_tokens_BxS is not None:
    tokens_to_logits, cache = encode_for_decoding(
      model, params, encoder_tokens_BxS, cache_len, cache_cross_attention=cache_cross_attention
    )
  else:
    tokens_to_logits = make_tokens_to_logits(model, params)
    cache = init_cache(model, batch_size, cache_len)
  searches = num_beams > 1 or return_beams
  batch_axes = cache_batch_axes(model, cache_len) if searches else None
  # The weights the steps read only in the compute dtype, cast once before
  # the loop (XLA would convert them in every step): for each kind of step,
  # the prompt's batch and, under beam search, B * K rows after it.
  steps = [(prompt_BxP[:, :1], cache)]
  if searches:
    beams = jax.eval_shape(lambda batch: per_beam(batch, num_beams, batch_axes), cache)
    steps.append((jax.ShapeDtypeStruct((batch_size * num_beams, 1), jnp.int32), beams))
  tokens_to_logits = tokens_to_logits.cast_for(*steps)
  search = dict(
    max_new_tokens=max_new_tokens,
    eos_id=eos_id,
    pad_id=model.cfg.pad_id,
    prompt_lengths_B=prompt_lengths_B,
    padding_side=padding_side,
  )
  if not searches:
    if rng is None:
      rng, temperature = jax.random.key(0), 0.0  # the key is unused by argmax
    return sample(
      tokens_to_logits,
      cache,
      prompt_BxP,
      rng=rng,
      temperature=temperature,
      top_k=top_k,
      top_p=top_p,
      **search,
    )
  tokens_BxKxT, scores_BxK = beam_search(
    tokens_to_logits,
    cache,
    prompt_BxP,
    num_beams=num_beams,
    length_penalty=length_penalty,
    batch_axes=batch_axes,
    **search,
  )
  return (tokens_BxKxT, scores_BxK) if return_beams else tokens_BxKxT[:, 0]


def check_decoding_fits(
  model: nn.Module,
  params: Any,
  rows: int,
  prompt_len: int,
  max_new_tokens: int,
  encoder_len: int = 0,
) -> None:
  """Refuses a search whose parameters and cache (`rows` rows, beams
  included, of `prompt_len` + `max_new_tokens` positions) cannot fit the
  memory of the device holding `params` (txf.hardware.check_fits).

  Raises:
    ValueError: naming max_new_tokens and the sizes.
  """
  leaves = jax.tree.leaves(params)
  if any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
    return  # traced by the caller's jit: its program's memory is the caller's
  held = leaves[0].devices() if leaves and isinstance(leaves[0], jax.Array) else ()
  device = min(held, key=lambda d: d.id) if held else jax.local_devices()[0]
  cache = cache_bytes(model, rows, cache_length(prompt_len, max_new_tokens), encoder_len)
  hardware.check_fits(
    "max_new_tokens",
    f"{rows} x {prompt_len} + {max_new_tokens} tokens' decoding cache and the parameters",
    hardware.bytes_per_device(params) + cache,
    device,
  )


def build_generate(
  *, cache_cross_attention: bool = True, lower: bool = False
) -> Callable[..., Any]:
  """`generate` with its benchmark-only switches set.

  Args:
    cache_cross_attention: encoder_decoder: compute the cross-attention keys
      and values once per source (True) or at every step (False, the path
      before caching, kept to compare and benchmark against).
    lower: the function returns the jitted program lowered for its
      arguments (a `jax.stages.Lowered`; `params` may then be
      jax.ShapeDtypeStructs) instead of running it, so a caller can compile
      it ahead of time: the training loop does, in a thread.

  Returns:
    A function with `generate`'s signature and checks.
  """
  run = _generate.lower if lower else _generate

  def generate(
    model: nn.Module,
    params: Any,
    prompt_BxP: Array | None = None,
    *,
    max_new_tokens: int,
    encoder_tokens_BxS: Array | None = None,
    rng: Array | None = None,
    temperature: float | Array = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    eos_id: int | None = None,
    num_beams: int = 1,
    length_penalty: float | Array = 0.6,
    return_beams: bool = False,
    prompt_lengths_B: Array | None = None,
    padding_side: str = "right",
    bos_id: int = 1,
  ) -> Array | tuple[Array, Array] | jax.stages.Lowered:
    """Continues prompts with a decoder or an encoder-decoder (jitted; compiles
    once per shape and static option).

    num_beams=1 samples (`sample`; greedy without rng); num_beams > 1, or
    return_beams, runs `beam_search`. Prompts, padding and EOS handling are
    the same for both (`txf.decode`'s docstring).

    Args:
      model: decoder or encoder_decoder from `txf.models.build` with an 'lm'
        head; its cfg.pad_id pads prompts and encoder inputs.
      params: its parameters.
      prompt_BxP: int prompts. Required for a decoder; for an encoder-decoder
        the decoder's prompts, by default a column of bos_id.
      max_new_tokens: N >= 1 new tokens per row at most.
      encoder_tokens_BxS: encoder_decoder only (required there): encoder
        inputs, padded with cfg.pad_id. Their cross-attention keys and values
        are computed once and cached.
      rng: sampling key; None: greedy decoding (temperature, top_k and top_p
        ignored, as `sample` ignores them at temperature 0).
      temperature, top_k, top_p: as in `sample` (num_beams=1 only; beam search
        ignores temperature and rejects rng, top_k and top_p).
      eos_id: token that ends a row or hypothesis when generated; None: none.
      num_beams: K; 1: no beam search.
      length_penalty: beam search's GNMT alpha, >= 0.
      return_beams: return every beam and its score (beam search; with
        num_beams=1 the greedy sequence where eos_id is None: with an
        eos_id, a hypothesis ended by EOS where greedy continues can score
        better, length-normalised, and is returned instead).
      prompt_lengths_B, padding_side: as in `sample`.
      bos_id: start token of an encoder-decoder's default prompts (a token
        even where it equals cfg.pad_id, as T5's decoder start token does).

    Returns:
      int32 [B, P + N], prompts followed by their new tokens (the best beam
      under beam search). With return_beams: tokens int32 [B, K, P + N] and
      scores float32 [B, K], best first (see `beam_search`).

    Raises:
      ValueError: naming the argument or field, before anything runs: a
        family or head that cannot generate, missing or extra encoder inputs,
        sampling arguments out of range (`sampling.check_sampling`: a
        temperature NaN, infinite or negative, top_p outside (0, 1], top_k
        negative), sampling options with beam search, a negative length_penalty, bad
        prompts (see `sample`), a cache and parameters that cannot fit the
        device's memory (`check_decoding_fits`).
    """
    prompt_BxP, prompt_lengths_B = _checked_prompts(
      model, prompt_BxP, encoder_tokens_BxS, prompt_lengths_B, bos_id
    )
    check_sampling(temperature, top_k, top_p)
    _check_search_choice(num_beams, return_beams, rng, top_k, top_p, length_penalty)
    if eos_id is not None:  # one past the vocabulary is never generated: rows never stop
      checks.int_at_least(eos_id, "generate: eos_id", 0, model.cfg.vocab_size - 1)
    # The searches' checks of the prompts (generate sizes the cache itself),
    # here while they are concrete: inside the jitted program they are traced.
    check_search(
      "generate", None, prompt_BxP, prompt_lengths_B, max_new_tokens, model.cfg.pad_id, padding_side
    )
    if not lower:  # lowered, it may be for another device (txf.aot)
      rows = prompt_BxP.shape[0] * num_beams
      encoder_len = 0 if encoder_tokens_BxS is None else encoder_tokens_BxS.shape[1]
      check_decoding_fits(model, params, rows, prompt_BxP.shape[1], max_new_tokens, encoder_len)
    return run(
      model,
      params,
      prompt_BxP,
      encoder_tokens_BxS,
      prompt_lengths_B,
      rng,
      temperature,
      length_penalty,
      max_new_tokens=max_new_tokens,
      top_k=top_k,
      top_p=top_p,
      eos_id=eos_id,
      num_beams=num_beams,
      return_beams=return_beams,
      padding_side=padding_side,
      cache_cross_attention=cache_cross_attention,
    )

  return generate


generate = build_generate()
