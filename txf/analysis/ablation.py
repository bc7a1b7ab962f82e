"""Head ablation through the model's own attention layers.

A txf model reads an optional 'head_mask' variable collection
(`txf.layers.attention.HEAD_MASK`): each `MultiHeadAttention` that finds a
`mask` [H] there multiplies its heads' outputs by it before the output
projection. Under `scan_layers` the masks of the stacked `blocks` are one
[L, H] array, sliced per layer by `nn.scan`. Passing no such collection
leaves the model's numerics and parameters as they are.

Attention layers are grouped by kind (`txf.analysis.attention.attention_kind`):
'self' (the one stack of a decoder or encoder), 'encoder_self',
'decoder_self' and 'cross' (encoder-decoder). One kind's heads form an [L, H] grid, the unit of
`txf.analysis.head_scores.head_ablation`:

  loss_fns = ablation_loss_fns(model, params, batches, loss_sums)
  deltas_LxH = head_ablation(loss_fns['self'], *attention_shapes(params)['self'])

A group of heads is zeroed together with `parse_heads` ('L1H0,L1H2'),
`txf.analysis.head_scores.group_mask` and `ablation_metric_fns` (loss and accuracy).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from txf.analysis.attention import KINDS, attention_kind, layer_index
from txf.layers.attention import HEAD_MASK

# (loss-computing model, params, batch) -> (weighted loss sum, weight sum).
LossSums = Callable[[Any, Any, Any], tuple[jax.Array, jax.Array]]


def _attention_kernels(params: Any) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{attention module path: its heads' shape}, (H,) or (L, H) under scan,
  read from the output projections' kernels [(L,) H, Dh, D]."""
  flat = traverse_util.flatten_dict(nn.meta.unbox(params))
  return {
    path[:-2]: tuple(kernel.shape[:-2])
    for path, kernel in flat.items()
    if path[-2:] == ("out", "kernel") and path[-3].endswith("_attention")
  }


def attention_shapes(params: Any) -> dict[str, tuple[int, int]]:
  """{kind: (L, H)}: the layers and heads of each attention kind of a model,
  in `KINDS` order."""
  kernels = _attention_kernels(params)
  shapes = {}
  for kind in KINDS:
    heads = [shape for path, shape in kernels.items() if attention_kind(path) == kind]
    if heads:  # one (L, H) under scan, else L times (H,)
      shapes[kind] = heads[0] if len(heads[0]) == 2 else (len(heads), heads[0][0])
  return shapes


def head_mask(params: Any, masks: Mapping[str, Any]) -> dict[str, Any]:
  """The 'head_mask' collection scaling each kind's heads by `masks[kind]`.

  Args:
    params: the model's parameters (plain or boxed); they locate the
      attention layers.
    masks: kind -> float [L, H] (layer l of the kind is its l-th block);
      kinds left out keep every head (ones).

  Returns:
    A nested dict to pass as `model.apply({'params': params, 'head_mask':
    ...}, ...)`.
  """
  shapes = attention_shapes(params)
  for kind, mask in masks.items():
    if kind not in shapes:
      raise ValueError(f"masks: the model has no {kind!r} attention (it has {sorted(shapes)})")
    if tuple(np.shape(mask)) != shapes[kind]:
      raise ValueError(f"masks[{kind!r}] must be [L, H] = {shapes[kind]}, got {np.shape(mask)}")
  by_path = {}
  for path, heads_shape in _attention_kernels(params).items():
    kind = attention_kind(path)
    mask_LxH = masks.get(kind)
    if mask_LxH is None:
      by_path[path + ("mask",)] = np.ones(heads_shape, np.float32)
    elif len(heads_shape) == 2:  # scanned: all layers in one array
      by_path[path + ("mask",)] = mask_LxH
    else:
      by_path[path + ("mask",)] = mask_LxH[layer_index(path)]
  return traverse_util.unflatten_dict(by_path)


class HeadMasked:
  """`model` whose `apply` also passes a 'head_mask' collection: a drop-in for
  code that only calls `model.apply({'params': ...}, ...)` (e.g. a train
  step's loss)."""

  def __init__(self, model: nn.Module, mask: Mapping[str, Any]):
    self.model, self.mask = model, mask

  def apply(self, variables: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
    return self.model.apply({**variables, HEAD_MASK: self.mask}, *args, **kwargs)


def _summed_fns(
  model: nn.Module,
  params: Any,
  batches: Iterable[Any],
  sums_fn: Callable[[Any, Any, Any], Mapping[str, jax.Array]],
) -> dict[str, Callable[[np.ndarray], dict[str, float]]]:
  """{kind: `fn(head_mask_LxH) -> {name: sum over batches}`} of `sums_fn`'s
  per-batch sums; one compiled step for all calls (the mask is an argument)."""
  batches = list(batches)
  if not batches:
    raise ValueError("batches: at least one batch to evaluate the ablation on")
  step = jax.jit(lambda params, mask, batch: sums_fn(HeadMasked(model, mask), params, batch))

  def summed(kind: str, head_mask_LxH: np.ndarray) -> dict[str, float]:
    mask = head_mask(params, {kind: np.asarray(head_mask_LxH, np.float32)})
    totals: dict[str, float] = {}
    for batch in batches:
      for name, value in jax.device_get(step(params, mask, batch)).items():
        totals[name] = totals.get(name, 0.0) + float(value)
    return totals

  return {kind: functools.partial(summed, kind) for kind in attention_shapes(params)}


def ablation_loss_fns(
  model: nn.Module, params: Any, batches: Iterable[Any], loss_sums: LossSums
) -> dict[str, Callable[[np.ndarray], float]]:
  """{kind: `loss_fn(head_mask_LxH) -> mean loss` over `batches`}, for `head_ablation`.

  Each kind's function masks that kind's [L, H] heads and keeps every head
  of the other kinds. All share one compiled step: the mask is an argument.

  Args:
    model: a txf model.
    params: its parameters.
    batches: the batches to evaluate on every call (device-ready), e.g. a
      run's validation batches; read once, into a list.
    loss_sums: `(model, params, batch) -> (loss_sum, count)`, computed with
      `model.apply` (it receives a `HeadMasked` model), e.g. a run's eval
      step.

  Returns:
    The functions, in `KINDS` order; a loss is sum(loss_sum) / sum(count)
    over the batches.
  """

  def sums_fn(masked_model, params, batch):
    loss_sum, count = loss_sums(masked_model, params, batch)
    return {"loss_sum": loss_sum, "count": count}

  def loss_fn(summed, head_mask_LxH):
    totals = summed(head_mask_LxH)
    return totals["loss_sum"] / totals["count"]

  return {
    kind: functools.partial(loss_fn, summed)
    for kind, summed in _summed_fns(model, params, batches, sums_fn).items()
  }


def ablation_metric_fns(
  model: nn.Module,
  params: Any,
  batches: Iterable[Any],
  eval_sums: Callable[[Any, Any, Any], Mapping[str, jax.Array]],
) -> dict[str, Callable[[np.ndarray], dict[str, float]]]:
  """{kind: `fn(head_mask_LxH) -> {"loss", "accuracy"}`} over `batches`, as
  `ablation_loss_fns` but from `eval_sums(model, params, batch)` -> sums
  with "loss_sum", "count" and "correct" (a run's eval step): the weighted
  mean loss and the share of weighted targets predicted right."""

  def metrics(summed, head_mask_LxH):
    totals = summed(head_mask_LxH)
    return {
      "loss": totals["loss_sum"] / totals["count"],
      "accuracy": totals["correct"] / totals["count"],
    }

  return {
    kind: functools.partial(metrics, summed)
    for kind, summed in _summed_fns(model, params, batches, eval_sums).items()
  }


def head_name(layer: int, head: int) -> str:
  """'L<layer>H<head>': a head as `parse_heads` reads it."""
  return f"L{layer}H{head}"


def parse_heads(spec: str, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
  """The heads of a spec like 'L1H0,L1H2' as [(layer, head)], checked.

  ValueError in one line for bad syntax, a layer or head the model does not
  have, or a head named twice.
  """
  heads = []
  for item in str(spec).split(","):
    match = re.fullmatch(r"L(\d+)H(\d+)", item.strip())
    if match is None:
      raise ValueError(
        f"ablate: {item.strip()!r} is not a head; expected L<layer>H<head>, e.g. 'L1H0,L1H2'"
      )
    layer, head = int(match[1]), int(match[2])
    if layer >= num_layers or head >= num_heads:
      raise ValueError(
        f"ablate: {item.strip()} is not a head of the model (layers 0.."
        f"{num_layers - 1}, heads 0..{num_heads - 1})"
      )
    if (layer, head) in heads:
      raise ValueError(f"ablate: {item.strip()} is named twice")
    heads.append((layer, head))
  return heads
