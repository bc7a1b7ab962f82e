"""Conversion rules between Hugging Face tensors and txf parameters.

A `Rule` ties one or more HF tensors to one or more txf parameters (a fused
GPT-2 `c_attn` is one tensor for three projections) with the transform each
way and the shapes both sides must have. A family's rules are built by
walking its txf module tree (`txf.interop.bert`, `gpt2`, `llama`,
`gpt_neox`, `t5`), with the constructors below for the layer kinds txf has:
a projection (`linear`), a norm (`norm`), a table copied as it is (`same`),
and a tensor the architecture always has where txf's model has none
(`zeros`: all zeros).

`to_txf` applies a list of rules to a checkpoint's tensors and `to_hf` goes
back. Both check everything: a tensor the rules need that is missing, one
left over that no rule reads, and any shape that differs stop the conversion
with a `CheckpointError` naming the tensors; txf parameters are checked
against the model's own (`jax.eval_shape` of its init), so none is left
without a value.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flax import traverse_util

Shape = tuple[int, ...]
Arrays = tuple[np.ndarray, ...]


class CheckpointError(ValueError):
  """A checkpoint does not fit txf: unsupported, missing, unexpected or
  misshapen tensors (named in the message)."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """HF tensors `hf` (shapes `hf_shapes`) <-> txf parameters `txf` (paths
  like 'stack/block_0/ffn/wi/kernel', shapes `txf_shapes`)."""

  hf: tuple[str, ...]
  hf_shapes: tuple[Shape, ...]
  txf: tuple[str, ...]
  txf_shapes: tuple[Shape, ...]
  to_txf: Callable[..., Arrays]
  to_hf: Callable[..., Arrays]


def same(hf: str, txf: str, shape: Shape) -> Rule:
  """A tensor copied unchanged (embedding tables, T5's bias table, an output bias)."""
  return Rule((hf,), (tuple(shape),), (txf,), (tuple(shape),), lambda x: (x,), lambda x: (x,))


def zeros(hf: str, shape: Shape, why: str) -> Rule:
  """A tensor the architecture always has and txf does not (GPT-NeoX's
  feed-forward biases of a txf model without biases): written as zeros, and
  read only when it is all zeros (`why` says why txf has no parameter for
  it), so that the model is the same."""

  def to_txf(value: np.ndarray) -> Arrays:
    if np.any(value != 0):
      raise CheckpointError(
        f"tensor {hf} is not all zeros, and txf has no parameter for it ({why})"
      )
    return ()

  return Rule((hf,), (tuple(shape),), (), (), to_txf, lambda: (np.zeros(shape, np.float32),))


def norm(
  hf: str, txf: str, kind: str, dim: int, *, scale_name: str = "weight", bias_name: str = "bias"
) -> list[Rule]:
  """LayerNorm (weight, bias) or RMSNorm (weight) of `dim` features at HF
  module `hf` and txf module `txf`."""
  rules = [same(f"{hf}.{scale_name}", f"{txf}/scale", (dim,))]
  if kind == "layer":
    rules.append(same(f"{hf}.{bias_name}", f"{txf}/bias", (dim,)))
  return rules


def linear(
  hf: str, txf: str, in_shape: Shape, out_shape: Shape, *, bias: bool, transposed: bool = True
) -> list[Rule]:
  """A projection: HF `<hf>.weight` [out, in] (torch Linear; transposed=False:
  [in, out], GPT-2's Conv1D) and `<hf>.bias` [out] <-> txf `<txf>/kernel`
  [*in_shape, *out_shape] and `<txf>/bias` [*out_shape] (nn.Dense /
  nn.DenseGeneral with several input or output axes)."""
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  kernel_shape = (*in_shape, *out_shape)
  if transposed:
    weight = Rule(
      (f"{hf}.weight",),
      ((n_out, n_in),),
      (f"{txf}/kernel",),
      (kernel_shape,),
      lambda w: (w.T.reshape(kernel_shape),),
      lambda k: (k.reshape(n_in, n_out).T,),
    )
  else:
    weight = Rule(
      (f"{hf}.weight",),
      ((n_in, n_out),),
      (f"{txf}/kernel",),
      (kernel_shape,),
      lambda w: (w.reshape(kernel_shape),),
      lambda k: (k.reshape(n_in, n_out),),
    )
  if not bias:
    return [weight]
  return [
    weight,
    Rule(
      (f"{hf}.bias",),
      ((n_out,),),
      (f"{txf}/bias",),
      (tuple(out_shape),),
      lambda b: (b.reshape(out_shape),),
      lambda b: (b.reshape(n_out),),
    ),
  ]


# ---------------------------------------------------------------------------
# Parameter trees as flat {'a/b/c': array} dicts.


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
  """{'stack/block_0/ffn/wi/kernel': leaf} from a nested params dict."""
  return traverse_util.flatten_dict(tree, sep="/")


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
  """The nested params dict of a flat {'a/b': leaf} dict."""
  return traverse_util.unflatten_dict(flat, sep="/")


# ---------------------------------------------------------------------------
# Applying rules.


def _listing(names: Iterable[str], limit: int = 8) -> str:
  names = sorted(names)
  more = f", ... ({len(names) - limit} more)" if len(names) > limit else ""
  return ", ".join(names[:limit]) + more


def _check_shapes(
  names: Sequence[str], arrays: Sequence[np.ndarray], shapes: Sequence[Shape], where: str
) -> None:
  for name, array, shape in zip(names, arrays, shapes):
    if tuple(np.shape(array)) != tuple(shape):
      raise CheckpointError(
        f"{where}: tensor {name} has shape {tuple(np.shape(array))}, expected {tuple(shape)}"
      )


def check_rules_cover(rules: Sequence[Rule], param_shapes: Mapping[str, Shape], what: str) -> None:
  """The rules produce exactly the model's parameters, with its shapes.

  A difference is a bug in a family's rules or a config the rules do not
  describe, never something to skip.
  """
  produced = {path: shape for rule in rules for path, shape in zip(rule.txf, rule.txf_shapes)}
  if set(produced) != set(param_shapes):
    unset = set(param_shapes) - set(produced)
    extra = set(produced) - set(param_shapes)
    raise CheckpointError(
      f"{what}: the conversion does not match the txf model's parameters"
      + (f"; no tensor for {_listing(unset)}" if unset else "")
      + (f"; no parameter for {_listing(extra)}" if extra else "")
    )
  for path, shape in produced.items():
    if tuple(param_shapes[path]) != tuple(shape):
      raise CheckpointError(
        f"{what}: parameter {path} has shape {tuple(param_shapes[path])} "
        f"in the txf model, the conversion gives {tuple(shape)}"
      )


def to_txf(
  rules: Sequence[Rule], tensors: Mapping[str, np.ndarray], *, where: str
) -> dict[str, np.ndarray]:
  """The flat txf params from HF `tensors` (every tensor must be used).

  Raises:
    CheckpointError: naming the missing tensors, the unexpected ones, or a
      tensor whose shape differs.
  """
  needed = [name for rule in rules for name in rule.hf]
  missing = [name for name in needed if name not in tensors]
  if missing:
    raise CheckpointError(f"{where}: missing tensors {_listing(missing)}")
  unexpected = set(tensors) - set(needed)
  if unexpected:
    raise CheckpointError(
      f"{where}: unexpected tensors {_listing(unexpected)} (no txf parameter takes them)"
    )
  flat = {}
  for rule in rules:
    arrays = [tensors[name] for name in rule.hf]
    _check_shapes(rule.hf, arrays, rule.hf_shapes, where)
    try:
      converted = rule.to_txf(*arrays)
    except CheckpointError as error:
      raise CheckpointError(f"{where}: {error}") from None
    for path, value in zip(rule.txf, converted):
      flat[path] = np.ascontiguousarray(value)
  return flat


def to_hf(
  rules: Sequence[Rule], flat_params: Mapping[str, np.ndarray], *, where: str
) -> dict[str, np.ndarray]:
  """The HF tensors of flat txf params (every parameter must be used)."""
  needed = [path for rule in rules for path in rule.txf]
  missing = [path for path in needed if path not in flat_params]
  unexpected = set(flat_params) - set(needed)
  if missing or unexpected:
    raise CheckpointError(
      f"{where}: the params do not fit the config"
      + (f"; missing {_listing(missing)}" if missing else "")
      + (f"; unexpected {_listing(unexpected)}" if unexpected else "")
    )
  tensors = {}
  for rule in rules:
    arrays = [np.asarray(flat_params[path], np.float32) for path in rule.txf]
    _check_shapes(rule.txf, arrays, rule.txf_shapes, where)
    for name, value in zip(rule.hf, rule.to_hf(*arrays)):
      tensors[name] = np.ascontiguousarray(value)
  return tensors
