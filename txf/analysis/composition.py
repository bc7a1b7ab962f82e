"""Composition scores: which head reads which, from the weights alone.

Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits").
A head h of a layer has, in row-vector form (x W, x a [D] residual-stream
row): W_QK = W_Q W_K^T [D, D], so its attention logit from a query row x_q
to a key row x_k is x_q W_QK x_k^T (times 1/sqrt(Dh)), and W_OV = W_V W_O
[D, D], so an attended row x writes x W_OV into the residual stream. A head
h1 of layer l composes with a head h2 of layer l + 1 through:

  Q: h1's output in h2's queries:  ||W_OV^h1 W_QK^h2||_F
  K: h1's output in h2's keys:     ||W_QK^h2 (W_OV^h1)^T||_F
  V: h1's output in h2's values:   ||W_OV^h1 W_OV^h2||_F

each divided by ||W_OV^h1||_F ||W_..^h2||_F (the paper's definitions, there
in column-vector form). A score is in [0, 1]; two matrices of random
orientation score about `random_composition_baseline` (about 1/sqrt(D)),
not 0.

What the scores ignore:
  - the norm in front of each attention layer (Pre-LN) is folded in only
    as far as it is linear: its per-feature scale, and LayerNorm's
    subtraction of the mean over features; its division by each token's
    standard deviation (a positive number per token, which rescales a whole
    row) and its bias (a constant added to every token) are left out, as
    are the projections' biases (model.use_bias);
  - RoPE: queries and keys are rotated by their positions, so a head's
    bilinear form at query-key distance t - s is W_Q M(t - s) W_K^T
    (`rope_rotation`), not W_Q W_K^T. The paper's scores (and the
    default) take distance 0; `composition_scores`' rope_distances averages
    the scores over the distances given instead;
  - the feed-forward layers (a head's output also reaches the next layer
    through the FFN between them) and the softmax.
`txf.analysis.patching` has none of these gaps: it runs the model's own
layers on real prompts and measures what the weights only suggest.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import numpy as np
from flax import traverse_util

from txf.checks import int_at_least

COMPOSITIONS = ("q", "k", "v")
_SCANNED_BLOCKS = "blocks"


def _frobenius(matrices_NxDxD: np.ndarray) -> np.ndarray:
  """[...]: the Frobenius norm of each matrix in the last two axes."""
  return np.sqrt(np.sum(matrices_NxDxD**2, axis=(-2, -1)))


def _block_weights(params: Any, stack: str) -> list[dict[str, np.ndarray | None]]:
  """Per layer of `stack`: the self-attention kernels and the norm in front
  of it, float64 (None where the model has no such parameter)."""
  flat = {
    path: np.asarray(value, np.float64)
    for path, value in traverse_util.flatten_dict(nn.meta.unbox(params)).items()
  }
  names = {
    "query": ("self_attention", "query", "kernel"),
    "key": ("self_attention", "key", "kernel"),
    "value": ("self_attention", "value", "kernel"),
    "out": ("self_attention", "out", "kernel"),
    "scale": ("self_attention_norm", "scale"),
    "bias": ("self_attention_norm", "bias"),
  }
  scanned = {name: flat.get((stack, _SCANNED_BLOCKS, *suffix)) for name, suffix in names.items()}
  if scanned["query"] is not None:
    return [
      {name: None if value is None else value[layer] for name, value in scanned.items()}
      for layer in range(scanned["query"].shape[0])
    ]
  layers = []
  for layer in itertools.count():
    if (stack, f"block_{layer}", *names["query"]) not in flat:
      break
    layers.append(
      {name: flat.get((stack, f"block_{layer}", *suffix)) for name, suffix in names.items()}
    )
  if not layers:
    raise ValueError(f"params: no self-attention layers under {stack!r}")
  return layers


def rope_rotation(
  distance: float, head_dim: int, *, base: float = 10000.0, scale: float = 1.0
) -> np.ndarray:
  """float64 `[Dh, Dh]` M(distance): RoPE (`txf.ops.apply_rope`, rotate-half
  layout) turns a query row q at position t into q M(t), so the logit from
  query t to key s is q M(t - s) k^T: a head's bilinear form at query-key
  distance t - s is W_Q M(t - s) W_K^T."""
  head_dim = int_at_least(head_dim, "head_dim", 2)
  if head_dim % 2:
    raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
  half = head_dim // 2
  angles_E = (distance / scale) * base ** (-2.0 * np.arange(half) / head_dim)
  cos, sin = np.diag(np.cos(angles_E)), np.diag(np.sin(angles_E))
  return np.block([[cos, sin], [-sin, cos]])


def head_circuits(
  params: Any,
  *,
  fold_norm: bool = True,
  stack: str = "stack",
  rope_distance: float = 0,
  rope_base: float = 10000.0,
  rope_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
  """Every head's W_QK and W_OV, float64 `[L, H, D, D]` each (see the module docstring).

  Args:
    params: a txf model's parameters (plain or boxed; scanned layers too).
      Grouped-query heads share their key/value head's W_K and W_V.
    fold_norm: fold the Pre-LN norm in front of each attention layer into
      W_Q, W_K and W_V: its scale and, for LayerNorm (a norm with a bias),
      its centring (x - mean(x) = x C, C = I - 11^T / D). Its division by a
      token's standard deviation and its bias are not linear maps of x and
      are left out. False: the raw projections (a Post-LN model's norms act
      elsewhere, and folding them this way would be wrong).
    stack: the stack whose self-attention to read ('stack' for a decoder or
      encoder, 'encoder' or 'decoder' for an encoder-decoder).
    rope_distance: W_QK = W_Q M(d) W_K^T at this query-key distance d
      (`rope_rotation`, of `rope_base` and `rope_scale`); 0: W_Q W_K^T,
      what a model without RoPE has at every distance.

  Returns:
    (qk_LxHxDxD, ov_LxHxDxD).
  """
  qk_layers, ov_layers = [], []
  for weights in _block_weights(params, stack):
    query_DxHxE, key_DxKxE, value_DxKxE = (weights[name] for name in ("query", "key", "value"))
    out_HxExD = weights["out"]
    assert query_DxHxE is not None and key_DxKxE is not None  # found by _block_weights
    assert value_DxKxE is not None and out_HxExD is not None
    d_model, num_heads, head_dim = query_DxHxE.shape
    group = num_heads // key_DxKxE.shape[1]
    fold_DxD = np.eye(d_model)
    if fold_norm and weights["scale"] is not None:
      if weights["bias"] is not None:  # LayerNorm: centred
        fold_DxD = fold_DxD - 1.0 / d_model
      fold_DxD = fold_DxD * weights["scale"][None, :]  # C diag(scale)
    query_DxHxE = np.einsum("de,ehk->dhk", fold_DxD, query_DxHxE)
    key_DxHxE = np.einsum("de,ehk->dhk", fold_DxD, np.repeat(key_DxKxE, group, axis=1))
    value_DxHxE = np.einsum("de,ehk->dhk", fold_DxD, np.repeat(value_DxKxE, group, axis=1))
    rotation_ExE = rope_rotation(rope_distance, head_dim, base=rope_base, scale=rope_scale)
    qk_layers.append(np.einsum("ahk,kl,bhl->hab", query_DxHxE, rotation_ExE, key_DxHxE))
    ov_layers.append(np.einsum("ahk,hkb->hab", value_DxHxE, out_HxExD))
  return np.stack(qk_layers), np.stack(ov_layers)


def _compose(
  ov_writer_NxDxD: np.ndarray, qk_reader_NxDxD: np.ndarray, ov_reader_NxDxD: np.ndarray
) -> dict[str, np.ndarray]:
  """{'q', 'k', 'v': [N]} of writer/reader pairs; the leading axes broadcast."""
  ov_norm_N = _frobenius(ov_writer_NxDxD)
  products = {
    "q": (ov_writer_NxDxD @ qk_reader_NxDxD, qk_reader_NxDxD),  # W_OV^h1 W_QK^h2
    "k": (qk_reader_NxDxD @ ov_writer_NxDxD.swapaxes(-1, -2), qk_reader_NxDxD),
    "v": (ov_writer_NxDxD @ ov_reader_NxDxD, ov_reader_NxDxD),  # W_OV^h1 W_OV^h2
  }
  return {
    kind: _frobenius(product) / (ov_norm_N * _frobenius(reader))
    for kind, (product, reader) in products.items()
  }


def composition_scores(
  params: Any,
  *,
  fold_norm: bool = True,
  stack: str = "stack",
  rope_distances: Sequence[float] = (0,),
  rope_base: float = 10000.0,
  rope_scale: float = 1.0,
) -> dict[str, np.ndarray]:
  """Q-, K- and V-composition of every head of layer l into every head of layer l + 1.

  Args:
    params, fold_norm, stack: as `head_circuits` (what the scores ignore is
      in the module docstring).
    rope_distances: the scores are averaged over W_QK at these query-key
      distances (`head_circuits`' rope_distance); (0,): the paper's W_Q W_K^T,
      which ignores RoPE. V-composition does not involve W_QK.
    rope_base, rope_scale: the model's RoPE (`model.options.rope_base` and
      `rope_scale`: `cfg.settings("position")` of a rope model).

  Returns:
    {'q', 'k', 'v': float64 `[L - 1, H, H]`}: entry [l, h1, h2] is how much
    head h1 of layer l writes into what head h2 of layer l + 1 reads as its
    queries, keys or values, in [0, 1]. A one-layer model gives `[0, H, H]`.
  """
  if len(rope_distances) == 0:
    raise ValueError("rope_distances must hold at least one distance")
  per_distance = []
  for distance in rope_distances:
    qk_LxHxDxD, ov_LxHxDxD = head_circuits(
      params,
      fold_norm=fold_norm,
      stack=stack,
      rope_distance=distance,
      rope_base=rope_base,
      rope_scale=rope_scale,
    )
    num_layers, num_heads = qk_LxHxDxD.shape[:2]
    pairs = [
      _compose(
        ov_LxHxDxD[layer][:, None], qk_LxHxDxD[layer + 1][None, :], ov_LxHxDxD[layer + 1][None, :]
      )
      for layer in range(num_layers - 1)
    ]
    shape = (num_layers - 1, num_heads, num_heads)  # reshaped: a one-layer model has no pair
    per_distance.append(
      {kind: np.reshape([pair[kind] for pair in pairs], shape) for kind in COMPOSITIONS}
    )
  return {kind: np.mean([scores[kind] for scores in per_distance], axis=0) for kind in COMPOSITIONS}


def random_composition_baseline(
  d_model: int, head_dim: int, *, samples: int = 64, seed: int = 0
) -> dict[str, float]:
  """{'q', 'k', 'v': the mean composition score of Gaussian weights}.

  W_Q, W_K, W_V [D, Dh] and W_O [Dh, D] of two heads drawn i.i.d. normal:
  the score of two heads whose subspaces have nothing to do with each other
  (about 1 / sqrt(D): a random [D, D] product keeps 1/D of the squared
  norms). Trained heads that do not compose score near it, not at 0.

  Args:
    d_model: D, >= 1.
    head_dim: Dh, >= 1.
    samples: pairs of heads averaged, >= 1.
    seed: of the numpy generator.
  """
  d_model, head_dim = int_at_least(d_model, "d_model", 1), int_at_least(head_dim, "head_dim", 1)
  samples = int_at_least(samples, "samples", 1)
  rng = np.random.default_rng(seed)
  shape = (2, samples, d_model, head_dim)  # [writer or reader, pair, D, Dh]
  query_2xSxDxE, key_2xSxDxE, value_2xSxDxE = (rng.standard_normal(shape) for _ in range(3))
  out_2xSxExD = rng.standard_normal((2, samples, head_dim, d_model))
  qk_2xSxDxD = query_2xSxDxE @ key_2xSxDxE.swapaxes(-1, -2)
  ov_2xSxDxD = value_2xSxDxE @ out_2xSxExD
  scores = _compose(ov_2xSxDxD[0], qk_2xSxDxD[1], ov_2xSxDxD[1])
  return {kind: float(np.mean(scores[kind])) for kind in COMPOSITIONS}
