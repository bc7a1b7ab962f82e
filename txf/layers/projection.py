"""The output projection of attention and of the feed-forward network:
`nn.DenseGeneral`'s parameters and product, its bias and the residual
stream added where the caller asks, and a decoding step's single row on one
GPU as one kernel (the additions in it).
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
  """[..., *C] -> [..., D]: `nn.DenseGeneral`'s parameters (`kernel` [*C, D],
  `bias` [D], the same values; with one contracted dimension `nn.Dense`'s)
  and product, in the compute dtype; the bias added where the call asks
  (`bias`, float32 as stored, or None, is otherwise the caller's to add),
  and a residual stream.

  One row (a decoding step at batch 1) on one GPU is one kernel
  (`ops.matvec_gpu`, where `adds_in_kernel`) over the weights cast to the
  compute dtype, which adds the bias and the residual; everywhere else
  XLA's dot_general of the weights cast to it and XLA's additions. (A
  decoding loop casts float32 weights once, before it: `txf.decode.casting`.)

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

  def __call__(
    self, x: jax.Array, *, add_bias: bool = False, residual: jax.Array | None = None
  ) -> jax.Array:
    """[..., *C] -> [..., D]: the product in the compute dtype, plus the bias
    where `add_bias` (in that dtype), then added to `residual` [..., D]
    where given (the sum's dtype as jnp's addition promotes)."""
    return matvec_gpu.contract(
      x.astype(self.dtype),
      self.kernel,
      dims=len(self.shape) - 1,
      bias=self.bias if add_bias else None,
      residual=residual,
    )


def adds_in_kernel(rows: int) -> bool:
  """Whether an OutputProjection of `rows` rows (the product of its input's
  leading axes) is one kernel that adds the bias and a residual itself
  (`ops.matvec_gpu`: one row on one GPU), so that a Pre-LN block has it add
  the stream (`txf.layers.block`) instead of XLA."""
  return matvec_gpu.applies(rows)


def with_bias(y: jax.Array, bias: jax.Array | None) -> jax.Array:
  """y + bias in y's dtype (a projection's output and its bias, as stored or
  cast); y where bias is None."""
  return y if bias is None else y + bias.astype(y.dtype)


def stored_bias(module: nn.Module, name: str) -> jax.Array | None:
  """The bias [D] of `module`'s OutputProjection `name`, as stored (float32),
  None without one: what a sub-layer called with add_bias=False leaves to its
  caller. Read after that call (which creates it at init)."""
  projection = module.variables["params"][name]
  return nn.meta.unbox(projection["bias"]) if "bias" in projection else None
