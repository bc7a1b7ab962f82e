"""Logical axes of parameters, declared where each parameter is created.

Every initializer in txf's layers is wrapped in `nn.with_logical_partitioning`,
so `model.init` returns each parameter boxed (`nn.Partitioned`) with one name
per dimension: embed, heads, kv_heads, head_dim, mlp, vocab, or None for a
dimension never split; `nn.scan` over layers prepends 'layers'.
`txf.train.sharding` maps the names to mesh axes.
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn

Axes = Sequence[str | None]


def projection_inits(in_axes: Axes, out_axes: Axes) -> dict[str, nn.initializers.Initializer]:
  """`kernel_init` (Glorot uniform) and `bias_init` (zeros) of a projection.

  The kernel's axes are `in_axes + out_axes` (the contracted dimensions, then
  the output ones, as in `nn.Dense` and `nn.DenseGeneral`); the bias's are
  `out_axes`.
  """
  return dict(
      kernel_init=nn.with_logical_partitioning(nn.initializers.xavier_uniform(),
                                               (*in_axes, *out_axes)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(out_axes)))
