"""One row times a weight matrix, x [K] @ W [K, N], as one GPU kernel
(Pallas, lowered to Triton), with the projection's bias and the residual
stream added in the same kernel: the attention's output projection and the
feed-forward's second projection of a decoding step at batch 1
(`txf.layers.projection.OutputProjection`, where `applies` says so).

Why a kernel: XLA rewrites a dot of one row by a matrix of fewer than 10M
elements into a multiply and a reduction (its GPU algebraic simplifier's
"too small for a GEMM"), and for these two projections it writes the
product, as large as the weights, to memory before reducing it: two
kernels a projection and the weights' bytes read, written and read again
(gpt2_small, deviceless H100: 2 x 1.2 MB and 2 x 4.7 MB more a layer than
the weights' one read; docs/benchmarks.md, "Decoding"). Here each kernel
instance reads the whole row and a block of `_BLOCK_N` columns of W, a
block of rows at a time, and sums the products in float32 registers: the
weights are read once, in one launch.

Why the bias and the stream in it too: XLA cannot fuse an addition into a
custom call, so a Pre-LN block left them to the next norm, whose GEMM
prologue XLA then made recompute the stream's whole chain of additions
from the embedding on, until a fusion grew too large and it wrote the
stream out in a kernel of its own (gpt2_small, deviceless H100: three a
token). Added here, the stream leaves each projection summed, and each
norm reads one array (`txf.layers.block`).

Numerics: the products and their sum in float32, the result rounded to x's
dtype once, as XLA's reduction does; the order of the sum differs, so a
bfloat16 result can differ from XLA's by a unit in its last place. The
bias (rounded to x's dtype) and then the residual are added to that
rounded result, each sum rounded, as XLA's additions of the same dtypes.

The block sizes are Triton's usual choices for a row-wise kernel (16 columns
are a 32-byte sector of bfloat16 per row of W), not tuned on a GPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from txf.ops import platform

# Whether this jax can lower the kernel (the layers use XLA's dot where not):
# it needs jaxlib's Triton bindings, and txf imports without them.
try:
  from jax.experimental.pallas import triton as plgpu

  AVAILABLE = True
except ImportError:
  AVAILABLE = False

__all__ = ["AVAILABLE", "applies", "contract", "matvec"]

_NUM_WARPS = 4
# Columns of W each kernel instance computes, and products held at once
# (rows of W a step x _BLOCK_N) in its float32 registers.
_BLOCK_N = 16
_BLOCK_ELEMENTS = 4096


def applies(rows: int) -> bool:
  """Whether a projection of `rows` rows takes the kernel: traced for one
  GPU (the program on one device), one row (a decoding step at batch 1;
  more rows make a GEMM of XLA's), where this jax can lower it."""
  return (
    AVAILABLE
    and rows == 1
    and platform.backend() == "gpu"
    and jax.sharding.get_abstract_mesh().size <= 1
  )


def _kernel(x_ref, w_ref, *refs, block_k, has_bias, has_residual):
  """Columns [n0, n0 + _BLOCK_N) of y = residual + (x @ W + bias), n0 this
  instance's block. `refs`: the bias where has_bias, the residual where
  has_residual, then y."""
  *added, y_ref = refs
  k_total, n_total = w_ref.shape
  cols_N = pl.program_id(0) * _BLOCK_N + jnp.arange(_BLOCK_N)
  col_ok_N = cols_N < n_total

  def step(i, acc_KxN):
    rows_K = i * block_k + jnp.arange(block_k)
    row_ok_K = rows_K < k_total
    x_K = plgpu.load(x_ref.at[rows_K], mask=row_ok_K, other=0.0).astype(jnp.float32)
    w_KxN = plgpu.load(
      w_ref.at[rows_K[:, None], cols_N[None, :]],
      mask=row_ok_K[:, None] & col_ok_N[None, :],
      other=0.0,
    )
    w_KxN = w_KxN.astype(jnp.float32)
    return acc_KxN + x_K[:, None] * w_KxN

  # Summed over the rows once, at the end: a sum across threads every step
  # would cost more than the products.
  acc_KxN = jax.lax.fori_loop(
    0, pl.cdiv(k_total, block_k), step, jnp.zeros((block_k, _BLOCK_N), jnp.float32)
  )
  y_N = jnp.sum(acc_KxN, axis=0).astype(x_ref.dtype)
  load = lambda ref: plgpu.load(ref.at[cols_N], mask=col_ok_N, other=0.0)
  if has_bias:
    y_N = y_N + load(added.pop(0)).astype(y_N.dtype)
  if has_residual:
    y_N = load(added.pop(0)).astype(y_ref.dtype) + y_N.astype(y_ref.dtype)
  plgpu.store(y_ref.at[cols_N], y_N, mask=col_ok_N)


def matvec(
  x_K: jax.Array,
  w_KxN: jax.Array,
  *,
  bias_N: jax.Array | None = None,
  residual_N: jax.Array | None = None,
  interpret: bool = False,
) -> jax.Array:
  """residual + (x [K] @ W [K, N] + bias) -> [N], the sum of products in
  float32 (module docstring). In x's dtype, or with a residual the dtype
  of residual + (that), as jnp's addition promotes.

  Args:
    bias_N: None, or [N] added to the product in x's dtype (a projection's
      bias as stored, rounded to it).
    residual_N: None, or [N]: the residual stream the result is added to.
    interpret: Pallas's interpreter (any platform; tests).

  Raises:
    ValueError: x not a vector, its length not W's rows, or a bias or
      residual not of W's columns.
  """
  if x_K.ndim != 1 or w_KxN.ndim != 2 or x_K.shape[0] != w_KxN.shape[0]:
    raise ValueError(f"matvec takes x [K] and W [K, N], got {x_K.shape} and {w_KxN.shape}")
  k_total, n_total = w_KxN.shape
  added = {"bias_N": bias_N, "residual_N": residual_N}
  for name, value in added.items():
    if value is not None and value.shape != (n_total,):
      raise ValueError(f"matvec's {name} must be [N] = ({n_total},), got {value.shape}")
  block_k = min(_BLOCK_ELEMENTS // _BLOCK_N, pl.next_power_of_2(k_total))
  out_dtype = x_K.dtype if residual_N is None else jnp.result_type(residual_N, x_K)
  return pl.pallas_call(
    functools.partial(
      _kernel,
      block_k=block_k,
      has_bias=bias_N is not None,
      has_residual=residual_N is not None,
    ),
    out_shape=jax.ShapeDtypeStruct((n_total,), out_dtype),
    grid=(pl.cdiv(n_total, _BLOCK_N),),
    compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
    interpret=interpret,
    name="matvec",
  )(x_K, w_KxN, *(value for value in added.values() if value is not None))


def contract(
  x: jax.Array,
  kernel: jax.Array,
  dims: int,
  *,
  bias: jax.Array | None = None,
  residual: jax.Array | None = None,
) -> jax.Array:
  """residual + (the last `dims` axes of x against the first `dims` of
  `kernel` cast to x's dtype + bias): `nn.DenseGeneral`'s product, [..., *C]
  x [*C, *F] -> [..., *F], its bias [*F] (None: none) added in x's dtype and
  then `residual` [..., *F] (None: none). One kernel where `applies` (one
  row; the additions in it), XLA's dot_general and additions otherwise. The
  kernel and the bias are cast to x's dtype by XLA, outside the kernel, on
  both paths: where they are a decoding loop's float32 weights, the loop
  casts them once instead (`txf.decode.casting`)."""
  kernel = kernel.astype(x.dtype)
  bias = None if bias is None else bias.astype(x.dtype)
  rows = x.shape[: x.ndim - dims]
  features = kernel.shape[dims:]
  if applies(math.prod(rows)):
    y_N = matvec(
      x.reshape(-1),
      kernel.reshape(-1, math.prod(features)),
      bias_N=None if bias is None else bias.reshape(-1),
      residual_N=None if residual is None else residual.reshape(-1),
    )
    return y_N.reshape(rows + features)
  contracting = (tuple(range(x.ndim - dims, x.ndim)), tuple(range(dims)))
  y = jax.lax.dot_general(x, kernel, (contracting, ((), ())))
  if bias is not None:
    y = y + bias
  return y if residual is None else residual + y
