"""Prompts of different lengths in one batch, and the checks the searches share.

A batch of prompts is one int [B, P] array, right-padded (the default) or
left-padded (`padding_side='left'`), with the lengths given
(`prompt_lengths_B`) or counted as the tokens that are not `pad_id`. Every
row needs at least one token (e.g. BOS). The searches right-align the
prompts (`right_aligned`), run, and move their outputs back to the input's
side (`restore_padding_side`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from txf import checks
from txf.decode.cache import (
  Cache,
  cache_length,
  cache_positions,
  cache_rows,
  check_cache_length,
)

Array = jax.Array

PADDING_SIDES = ("right", "left")


def concrete(x: Any) -> np.ndarray | None:
  """x as a numpy array, or None when its values are not at hand here (traced,
  or spread over other processes' devices)."""
  if isinstance(x, jax.core.Tracer) or not getattr(x, "is_fully_addressable", True):
    return None
  return np.asarray(x)


def check_finite_at_least(x: Any, name: str, minimum: float) -> None:
  """Refuses a concrete `x` (see `concrete`; a traced one is not known here
  and not checked) that is not a scalar, or not a finite number >= minimum
  (`checks.finite_at_least`: NaN fails every comparison), in one line
  naming `name`."""
  value = concrete(x)
  if value is None:
    return
  if value.shape != ():
    raise ValueError(f"{name}: must be a scalar, got shape {value.shape}")
  checks.finite_at_least(value.item(), name, minimum)


def _check_options(caller: str, max_new_tokens: int, padding_side: str) -> None:
  # A float count (2.0) failed in flax's tracing of the cache, a traceback.
  checks.int_at_least(max_new_tokens, f"{caller}: max_new_tokens", 1)
  if padding_side not in PADDING_SIDES:
    raise ValueError(f"{caller}: padding_side must be one of {PADDING_SIDES}, got {padding_side!r}")


def _check_cache_size(
  caller: str, cache: Cache, batch_size: int, prompt_len: int, max_new_tokens: int
) -> None:
  """A txf cache (one `cache_positions` can measure) must hold a row per
  prompt and every position written."""
  rows = cache_rows(cache)
  if rows is not None and rows != batch_size:
    # Else a shape error from the first cache write, or, with more rows, the
    # attention layer's about sharing key rows.
    raise ValueError(
      f"{caller}: the cache holds {rows} rows, but there are {batch_size} prompts "
      f"(init_cache with batch_size={batch_size})"
    )
  needed, cache_len = cache_length(prompt_len, max_new_tokens), cache_positions(cache)
  if cache_len is not None and cache_len < needed:
    raise ValueError(
      f"{caller}: the cache holds {cache_len} positions, but prompts of "
      f"{prompt_len} tokens and max_new_tokens={max_new_tokens} need "
      f"{needed} (prompt + max_new_tokens - 1)"
    )


def _check_given_lengths(
  caller: str, prompt_lengths_B: Array, batch_size: int, prompt_len: int
) -> None:
  if jnp.shape(prompt_lengths_B) != (batch_size,):
    raise ValueError(
      f"{caller}: prompt_lengths_B must have shape ({batch_size},), got "
      f"{jnp.shape(prompt_lengths_B)}"
    )
  dtype = getattr(prompt_lengths_B, "dtype", None) or np.asarray(prompt_lengths_B).dtype
  if not jnp.issubdtype(dtype, jnp.integer):  # 2.5 was read as 2: another prompt continued
    raise ValueError(f"{caller}: prompt_lengths_B must be integers, got {dtype}")
  lengths_B = concrete(prompt_lengths_B)
  if lengths_B is not None and not np.all((lengths_B >= 1) & (lengths_B <= prompt_len)):
    raise ValueError(
      f"{caller}: prompt_lengths_B must lie in [1, {prompt_len}] (every row "
      f"needs a token), got {lengths_B.tolist()}"
    )


def _check_padding(caller: str, prompt_BxP: np.ndarray, pad_id: int, padding_side: str) -> None:
  """Concrete prompts: every row holds a token, and its pads are on padding_side."""
  prompt_len = prompt_BxP.shape[1]
  is_token = prompt_BxP != pad_id
  lengths_B = is_token.sum(axis=1)
  if not np.all(lengths_B):
    raise ValueError(
      f"{caller}: prompt rows {np.flatnonzero(lengths_B == 0).tolist()} hold "
      f"only pad_id={pad_id}; every row needs a token (e.g. BOS)"
    )
  columns = np.arange(prompt_len)[None]
  expected = (
    columns < lengths_B[:, None]
    if padding_side == "right"
    else columns >= prompt_len - lengths_B[:, None]
  )
  misplaced = np.flatnonzero(np.any(is_token != expected, axis=1))
  if misplaced.size:
    raise ValueError(
      f"{caller}: prompt rows {misplaced.tolist()} are not {padding_side}-padded "
      f"with pad_id={pad_id} (a pad between tokens, or the other side); pass "
      "padding_side or prompt_lengths_B"
    )


def check_search(
  caller: str,
  cache: Cache,
  prompt_BxP: Array,
  prompt_lengths_B: Array | None,
  max_new_tokens: int,
  pad_id: int,
  padding_side: str,
) -> None:
  """Rejects bad search arguments before anything is traced: shapes, sizes,
  and (when they are concrete) prompt lengths and padding.

  Raises:
    ValueError: starting with `caller`.
  """
  _check_options(caller, max_new_tokens, padding_side)
  if (
    prompt_BxP.ndim != 2
    or not prompt_BxP.shape[1]
    or not jnp.issubdtype(prompt_BxP.dtype, jnp.integer)
  ):
    raise ValueError(
      f"{caller}: prompts must be int [B, P] with P >= 1, got {prompt_BxP.dtype} {prompt_BxP.shape}"
    )
  batch_size, prompt_len = prompt_BxP.shape
  check_cache_length(f"{caller}: max_new_tokens", prompt_len, max_new_tokens)
  _check_cache_size(caller, cache, batch_size, prompt_len, max_new_tokens)
  if prompt_lengths_B is not None:
    _check_given_lengths(caller, prompt_lengths_B, batch_size, prompt_len)
    return
  prompt = concrete(prompt_BxP)
  if prompt is not None:
    _check_padding(caller, prompt, pad_id, padding_side)


def prompt_lengths(prompt_BxP: Array, pad_id: int, prompt_lengths_B: Array | None) -> Array:
  """int32 [B]: the lengths given, or else the tokens that are not pad_id."""
  if prompt_lengths_B is None:
    return jnp.sum(prompt_BxP != pad_id, axis=1, dtype=jnp.int32)
  return jnp.asarray(prompt_lengths_B, jnp.int32)


def right_aligned(prompt_BxP: Array, lengths_B: Array, pad_id: int, padding_side: str) -> Array:
  """Prompts starting at column 0, pad_id after each one's end."""
  prompt_len = prompt_BxP.shape[1]
  columns_BxP = jnp.arange(prompt_len)[None]
  if padding_side == "left":
    columns_BxP = (columns_BxP + (prompt_len - lengths_B)[:, None]) % prompt_len
    prompt_BxP = jnp.take_along_axis(prompt_BxP, columns_BxP, axis=1)
  return jnp.where(
    jnp.arange(prompt_len)[None] < lengths_B[:, None], prompt_BxP.astype(jnp.int32), pad_id
  )


def restore_padding_side(
  tokens_Bx_xT: Array, lengths_B: Array, prompt_len: int, padding_side: str
) -> Array:
  """Right-aligned outputs [B, T] or [B, K, T] back to the prompts' padding side.

  A left-padded row moves right by its padding, P - length; what wraps
  around is the pad after the row's end (a row fills at most length + N
  of the T = P + N columns).
  """
  if padding_side == "right":
    return tokens_Bx_xT
  total_len = tokens_Bx_xT.shape[-1]
  columns_BxT = (jnp.arange(total_len)[None] - (prompt_len - lengths_B)[:, None]) % total_len
  columns = columns_BxT.reshape(
    columns_BxT.shape[:1] + (1,) * (tokens_Bx_xT.ndim - 2) + columns_BxT.shape[1:]
  )
  return jnp.take_along_axis(tokens_Bx_xT, columns, axis=-1)
