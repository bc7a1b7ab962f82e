"""Attention maps of a txf model, as its own attention layers computed them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

# TransformerStack names its blocks `block_{i}`, or `blocks` when run under
# `nn.scan` (cfg.scan_layers), which stacks what they record along a leading
# layer axis.
_SCANNED_BLOCKS = "blocks"
_BLOCK = re.compile(r"block_(\d+)$")
# The kinds of attention layer, in the order analyses list them.
KINDS = ("self", "encoder_self", "decoder_self", "cross")


def attention_maps(
  model: nn.Module, params: Any, *inputs: jax.Array, **kwargs: Any
) -> dict[str, jax.Array]:
  """The attention weights of every attention layer for one batch.

  Applies the model with its 'intermediates' collection mutable, so each
  `MultiHeadAttention` computes its output from the weights it records
  (`txf.layers.attention`): the maps are the model's, not a re-implementation.

  Args:
    model: a txf model (`txf.models.build(config.model)`).
    params: its parameters (plain or boxed).
    *inputs: the model's inputs: tokens [B, T], or for an encoder-decoder the
      encoder tokens [B, S] and decoder tokens [B, T].
    **kwargs: passed on to `model.apply` (e.g. `deterministic`).

  Returns:
    {module path: float32 [B, H, T, S]}, e.g. 'stack/block_0/self_attention',
    'decoder/block_1/cross_attention' (T queries, S keys). Layers under
    `scan_layers` get the same per-layer paths as unscanned ones.
  """
  # Compiled as one program: applied eagerly, each of the model's operations
  # would be dispatched (and compiled, per new shape) on its own. Not cached
  # across calls: a cached trace would ignore the interceptors a caller wraps
  # the call in (txf.analysis.patching). Callers that repeat it jit it once
  # themselves (jax.jit(functools.partial(attention_maps, model))).
  apply = jax.jit(lambda p, *x: model.apply({"params": p}, *x, mutable=["intermediates"], **kwargs))
  _, state = apply(params, *inputs)
  maps = {}
  for path, sown in traverse_util.flatten_dict(state["intermediates"]).items():
    if path[-1] != "attention_weights":
      continue
    (weights,) = sown  # each attention layer runs once per apply
    if weights.ndim == 4:
      maps["/".join(path[:-1])] = weights
      continue
    for layer, weights_BxHxTxS in enumerate(weights):
      parts = (f"block_{layer}" if part == _SCANNED_BLOCKS else part for part in path[:-1])
      maps["/".join(parts)] = weights_BxHxTxS
  return maps


def mass_beyond(weights_BxHxTxS: Any, min_distance: int) -> np.ndarray:
  """float64 [B, H, T]: the attention mass each query puts on keys at least
  `min_distance` positions before it (query t, key s: t - s >= min_distance)
  in a self-attention map whose queries and keys are the same T positions
  (an `attention_maps` entry of a decoder)."""
  weights_BxHxTxS = np.asarray(weights_BxHxTxS, np.float64)
  T, S = weights_BxHxTxS.shape[-2:]
  if weights_BxHxTxS.ndim != 4 or T != S:
    raise ValueError(
      f"weights must be a self-attention map [B, H, T, T], got shape {weights_BxHxTxS.shape}"
    )
  far_TxS = np.arange(T)[:, None] - np.arange(S)[None, :] >= min_distance
  return np.einsum("bhts,ts->bht", weights_BxHxTxS, far_TxS)


def attention_kind(module_path: Sequence[str]) -> str:
  """The kind of the attention layer at `module_path` (a path of
  `attention_maps` split at '/', or of the params): 'self' (the one stack of
  a decoder or encoder), 'encoder_self', 'decoder_self' or 'cross', e.g.
  ('decoder', 'block_1', 'cross_attention') -> 'cross'."""
  stack, name = module_path[0], module_path[-1]
  if name == "cross_attention":
    return "cross"
  return "self" if stack == "stack" else f"{stack}_self"


def layer_index(module_path: Sequence[str]) -> int:
  """The block index in `module_path` (0 for the scanned `blocks`, which hold all)."""
  for part in module_path:
    found = _BLOCK.match(part)
    if found:
      return int(found.group(1))
  return 0


def maps_by_kind(maps: dict[str, jax.Array]) -> dict[str, list[jax.Array]]:
  """`attention_maps`' result as {kind: [B, H, T, S] per layer, in block order}."""
  grouped: dict[str, list[tuple[int, jax.Array]]] = {}
  for path, weights_BxHxTxS in maps.items():
    parts = path.split("/")
    grouped.setdefault(attention_kind(parts), []).append((layer_index(parts), weights_BxHxTxS))
  return {
    kind: [weights for _, weights in sorted(grouped[kind], key=lambda item: item[0])]
    for kind in KINDS
    if kind in grouped
  }
