"""The output projection of attention and of the feed-forward network:
`nn.DenseGeneral`'s parameters and product, the bias left to the caller,
and a decoding step's single row on one GPU as one kernel.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers.partitioning import Axes, projection_inits
from txf.ops import matvec_gpu


class OutputProjection(nn.Module):
  """[..., *C] -> [..., D], the bias not added: `nn.DenseGeneral`'s
  parameters (`kernel` [*C, D], `bias` [D], the same values; with one
  contracted dimension `nn.Dense`'s) and product, in the compute dtype.
  `bias` (float32 as stored, or None) is the caller's to add.

  One row (a decoding step at batch 1) on one GPU is one kernel
  (`ops.matvec_gpu`), which reads the weights as stored and rounds them to
  the compute dtype as it goes; everywhere else XLA's dot_general of the
  weights cast to it.

  Attributes:
    shape: the kernel's (*C, D): (H, Dh, D) for attention's heads, (F, D)
      for the feed-forward's hidden layer.
    in_axes: the logical axes of C.
    use_bias: whether there is a bias.
    dtype: the compute dtype.
  """

  shape: tuple[int, ...]
  in_axes: Axes
  use_bias: bool
  dtype: Any

  def setup(self):
    *contracted, d_model = self.shape
    inits = projection_inits(self.in_axes, ("embed",), self.shape)
    # Asked flat, as nn.DenseGeneral asks: the same values for the same key.
    flat = (math.prod(contracted), d_model)
    self.kernel = self.param("kernel", inits["kernel_init"], flat, jnp.float32)
    self.bias = (
      self.param("bias", inits["bias_init"], (d_model,), jnp.float32) if self.use_bias else None
    )

  def __call__(self, x: jax.Array) -> jax.Array:
    """[..., *C] -> [..., D] in the compute dtype, without the bias."""
    return matvec_gpu.contract(x.astype(self.dtype), self.kernel, dims=len(self.shape) - 1)


def stored_bias(module: nn.Module, name: str) -> jax.Array | None:
  """The bias [D] of `module`'s OutputProjection `name`, as stored (float32),
  None without one: what a sub-layer called with add_bias=False leaves to its
  caller. Read after that call (which creates it at init)."""
  projection = module.variables["params"][name]
  return nn.meta.unbox(projection["bias"]) if "bias" in projection else None
