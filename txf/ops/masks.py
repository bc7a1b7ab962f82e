"""Boolean attention masks (pure jnp, no state).

Convention: a mask is a boolean array broadcastable to ``[B, H, T, S]``
(batch, heads, query length, key length); ``True`` means "query may attend to
this key". Masks are combined with logical AND (:func:`combine_masks`).

Positions: query row ``i`` sits at absolute position ``q_offset + i``; key
column ``j`` sits at absolute position ``j``. With ``q_offset = 0`` and
``T == S`` this is ordinary self-attention. For KV-cache decoding the keys are
cache slots and ``q_offset`` is the cache index of the first new query
(a scalar, or an int array ``[B]`` when each batch row is at its own index).
"""

from __future__ import annotations

import operator
from typing import Any

import jax.numpy as jnp
import numpy as np

__all__ = [
  "causal_mask",
  "sliding_window_mask",
  "padding_mask",
  "prefix_lm_mask",
  "segment_mask",
  "combine_masks",
]


def _check_len(value: Any, name: str) -> int:
  try:
    n = operator.index(value)
  except TypeError:
    raise ValueError(f"{name} must be a python int, got {value!r}") from None
  if n < 0:
    raise ValueError(f"{name} must be >= 0, got {n}")
  return n


def check_window(window: Any) -> int:
  """A sliding-window width: a python int >= 1 (bools rejected), else ValueError."""
  if isinstance(window, bool):
    raise ValueError(f"window must be a python int >= 1, got {window!r}")
  try:
    window = operator.index(window)
  except TypeError:
    raise ValueError(f"window must be a python int >= 1, got {window!r}") from None
  if window < 1:
    raise ValueError(f"window must be >= 1, got window={window}")
  return window


def _query_positions(q_len: int, q_offset: Any) -> jnp.ndarray:
  """Absolute query positions: ``[1, T]`` for a scalar offset, ``[B, T]`` for ``[B]``."""
  off = jnp.asarray(q_offset)
  if not jnp.issubdtype(off.dtype, jnp.integer):
    raise ValueError(
      f"q_offset must be an integer (python int or int array), got dtype {off.dtype}"
    )
  if off.ndim == 0:
    off = off[None]
  elif off.ndim != 1:
    raise ValueError(f"q_offset must be a scalar or an int array [B], got shape {off.shape}")
  return off[:, None] + jnp.arange(q_len, dtype=off.dtype)[None, :]


def _positions(q_len, k_len, q_offset):
  """Returns (q_pos [B|1, 1, T, 1], k_pos [1, 1, 1, S])."""
  q_len = _check_len(q_len, "q_len")
  k_len = q_len if k_len is None else _check_len(k_len, "k_len")
  q_pos = _query_positions(q_len, q_offset)[:, None, :, None]
  k_pos = jnp.arange(k_len, dtype=q_pos.dtype)[None, None, None, :]
  return q_pos, k_pos


def causal_mask(q_len: int, k_len: int | None = None, *, q_offset: Any = 0):
  """Causal (autoregressive) mask.

  Query row ``i`` (absolute position ``q_offset + i``) may attend key ``j`` iff
  ``j <= q_offset + i``.

  Args:
    q_len: number of queries ``T`` (python int).
    k_len: number of keys ``S`` (python int); defaults to ``q_len``.
    q_offset: absolute position of query row 0: a python int, a scalar int
      array, or an int array ``[B]`` (one offset per batch row, e.g. the
      KV-cache index while decoding).

  Returns:
    bool ``[1, 1, T, S]``, or ``[B, 1, T, S]`` when ``q_offset`` has shape ``[B]``.
  """
  q_pos, k_pos = _positions(q_len, k_len, q_offset)
  return k_pos <= q_pos


def prefix_lm_mask(prefix_len_B: Any, length: int):
  """Prefix-LM mask (T5, UL2): a row's first ``prefix_len_B[b]`` positions
  attend to each other both ways, the rest causally (to the whole prefix too).

  Query ``i`` of row ``b`` may attend key ``j`` iff ``j <= i`` or
  ``j < prefix_len_B[b]``; a prefix of 0 is the causal mask.

  Args:
    prefix_len_B: int ``[B]``, each row's prefix length.
    length: ``T``, the queries and keys (self-attention).

  Returns:
    bool ``[B, 1, T, T]``.
  """
  prefix_len_B = jnp.asarray(prefix_len_B)
  if prefix_len_B.ndim != 1 or not jnp.issubdtype(prefix_len_B.dtype, jnp.integer):
    raise ValueError(f"prefix_len_B must be int [B], got {prefix_len_B.dtype} {prefix_len_B.shape}")
  in_prefix_Bx1x1xT = (jnp.arange(_check_len(length, "length")) < prefix_len_B[:, None])[
    :, None, None, :
  ]
  return causal_mask(length) | in_prefix_Bx1x1xT


def sliding_window_mask(q_len: int, k_len: int | None = None, *, window: int, q_offset: Any = 0):
  """Symmetric local-attention band.

  Key ``j`` is allowed for the query at absolute position ``p = q_offset + i``
  iff ``|p - j| < window``: the query sees itself plus ``window - 1`` keys on
  each side. AND it with :func:`causal_mask` for causal local attention (then
  each query sees itself and the ``window - 1`` previous keys).

  Args:
    q_len: number of queries ``T``.
    k_len: number of keys ``S``; defaults to ``q_len``.
    window: band width, a python int ``>= 1``.
    q_offset: as in :func:`causal_mask`.

  Returns:
    bool ``[1, 1, T, S]``, or ``[B, 1, T, S]`` when ``q_offset`` has shape ``[B]``.
  """
  window = check_window(window)
  q_pos, k_pos = _positions(q_len, k_len, q_offset)
  return jnp.abs(q_pos - k_pos) < window


def padding_mask(
  *, lengths: Any = None, tokens: Any = None, pad_id: int = 0, k_len: int | None = None
):
  """Key-padding mask: which keys are real tokens.

  Give exactly one of:
    lengths: int ``[B]``; key ``j`` of row ``b`` is valid iff ``j < lengths[b]``.
      Needs ``k_len`` (``S``).
    tokens: int ``[B, S]``; key ``j`` of row ``b`` is valid iff
      ``tokens[b, j] != pad_id``.

  Returns:
    bool ``[B, 1, 1, S]`` (broadcasts over heads and queries).
  """
  if (lengths is None) == (tokens is None):
    given = [n for n, a in (("lengths", lengths), ("tokens", tokens)) if a is not None]
    raise ValueError(
      f"padding_mask needs exactly one of lengths= or tokens=, got {given or 'neither'}"
    )
  if lengths is not None:
    if k_len is None:
      raise ValueError("padding_mask(lengths=...) needs k_len (the key length S)")
    k_len = _check_len(k_len, "k_len")
    lengths = jnp.asarray(lengths)
    if lengths.ndim != 1:
      raise ValueError(f"lengths must have shape [B], got shape {lengths.shape}")
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
      raise ValueError(f"lengths must be integer, got dtype {lengths.dtype}")
    valid = jnp.arange(k_len, dtype=lengths.dtype)[None, :] < lengths[:, None]
  else:
    tokens = jnp.asarray(tokens)
    if tokens.ndim != 2:
      raise ValueError(f"tokens must have shape [B, S], got shape {tokens.shape}")
    if k_len is not None and _check_len(k_len, "k_len") != tokens.shape[1]:
      raise ValueError(f"k_len={k_len} does not match tokens shape {tokens.shape}")
    valid = tokens != pad_id
  return valid[:, None, None, :]


def segment_mask(q_segment_ids: Any, k_segment_ids: Any = None):
  """Packed-sequence mask: a query attends only keys of its own segment.

  Several documents packed into one row carry segment ids (1, 2, ... per
  document, 0 for padding); query ``i`` may attend key ``j`` iff
  ``q_segment_ids[b, i] == k_segment_ids[b, j]``. AND it with
  :func:`causal_mask` for a decoder, and with :func:`padding_mask` where
  padding queries must attend nothing.

  Args:
    q_segment_ids: int ``[B, T]``.
    k_segment_ids: int ``[B, S]``; defaults to ``q_segment_ids`` (self-attention).

  Returns:
    bool ``[B, 1, T, S]``.
  """
  q_ids = jnp.asarray(q_segment_ids)
  k_ids = q_ids if k_segment_ids is None else jnp.asarray(k_segment_ids)
  for name, ids in (("q_segment_ids", q_ids), ("k_segment_ids", k_ids)):
    if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
      raise ValueError(
        f"{name} must be an int array [B, T], got shape {ids.shape} dtype {ids.dtype}"
      )
  if q_ids.shape[0] != k_ids.shape[0]:
    raise ValueError(
      f"q_segment_ids {q_ids.shape} and k_segment_ids {k_ids.shape} differ in batch size"
    )
  return q_ids[:, None, :, None] == k_ids[:, None, None, :]


def combine_masks(*masks: Any):
  """Logical AND of boolean masks, with numpy broadcasting.

  ``None`` entries are skipped; returns ``None`` when every entry is ``None``.
  Raises ValueError for a non-boolean mask or shapes that do not broadcast.
  """
  present = [jnp.asarray(m) for m in masks if m is not None]
  if not present:
    return None
  for m in present:
    if m.dtype != jnp.bool_:
      raise ValueError(
        f"combine_masks: masks must be boolean, got dtype {m.dtype} (shape {m.shape})"
      )
  try:
    np.broadcast_shapes(*(m.shape for m in present))
  except ValueError:
    raise ValueError(
      f"combine_masks: mask shapes do not broadcast: {[m.shape for m in present]}"
    ) from None
  out = present[0]
  for m in present[1:]:
    out = jnp.logical_and(out, m)
  return out
