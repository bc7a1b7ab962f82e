"""Logical axes of parameters, declared where each parameter is created.

Every initializer in txf's layers is wrapped in `nn.with_logical_partitioning`,
so `model.init` returns each parameter boxed (`nn.Partitioned`) with one name
per dimension: embed, heads, kv_heads, head_dim, mlp, vocab, or None for a
dimension never split; `nn.scan` over layers prepends 'layers'.
`txf.train.sharding` maps the names to mesh axes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import flax.linen as nn

Axes = Sequence[str | None]


class ProjectionInits(TypedDict):
  """The `kernel_init` and `bias_init` keyword arguments of a flax Dense layer."""

  kernel_init: Callable[..., Any]
  bias_init: Callable[..., Any]


def _reshaped(
  init: nn.initializers.Initializer, shape: tuple[int, ...] | None
) -> nn.initializers.Initializer:
  """`init` on the shape it is asked for, then reshaped to `shape` (if given)."""
  if shape is None:
    return init
  return lambda rng, asked, dtype=float: init(rng, asked, dtype).reshape(shape)


def projection_inits(
  in_axes: Axes, out_axes: Axes, kernel_shape: tuple[int, ...] | None = None
) -> ProjectionInits:
  """`kernel_init` (Glorot uniform) and `bias_init` (zeros) of a projection.

  The kernel's axes are `in_axes + out_axes` (the contracted dimensions, then
  the output ones, as in `nn.Dense` and `nn.DenseGeneral`); the bias's are
  `out_axes`.

  `kernel_shape` is required for an `nn.DenseGeneral` with several input or
  output dimensions: it asks its initializers for flattened arrays and unboxes
  them before reshaping, which under an active mesh constrains them by more
  axes than they have. Reshaped here already (same values: Glorot's fans are
  those of the flattened kernel), the boxes always fit their axes.
  """
  bias_shape = None if kernel_shape is None else tuple(kernel_shape[len(in_axes) :])
  return ProjectionInits(
    kernel_init=nn.with_logical_partitioning(
      _reshaped(nn.initializers.xavier_uniform(), kernel_shape), (*in_axes, *out_axes)
    ),
    bias_init=nn.with_logical_partitioning(
      _reshaped(nn.initializers.zeros_init(), bias_shape), tuple(out_axes)
    ),
  )
