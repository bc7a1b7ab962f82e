"""Normalisation over the last (feature) axis: LayerNorm and RMSNorm.

Statistics and the affine transform are computed in float32 whatever the
input dtype, because bfloat16 sums over D features lose too many bits; the
result is cast back to the input dtype. Both share one normalisation with its
own backward (the statistics kept from the forward pass, as PyTorch's
LayerNorm keeps them), checked against float64 central differences.

A Pre-LN block's norm can also take the residual stream's update: with
`add` (and `add_bias`) it normalises x + add + add_bias, and with
`residual=True` it returns that sum, the stream, beside its norm.

On one GPU, for 1,024 rows or more, the forward and backward are each one
kernel (Pallas, lowered to Triton; `uses_gpu_kernel`). The forward reads x
(and add) and writes the norm (and the sum) with the row statistics; the
backward reads the sum, dy (and the stream's gradient) and writes the
input's gradient with partial column sums of the parameters' (and
add_bias's) gradients, which one small kernel then reduces. XLA compiles
the same work as two reductions and an elementwise pass forward and two
passes backward, reading the sum and dy twice, and cannot fuse the stream's
addition into a kernel of its own: so there the op adds and returns the
stream itself (docs/benchmarks.md). Elsewhere (a CPU or TPU, a mesh of
devices: XLA does not split a Pallas call, decoding's few rows) XLA's passes
run, with the stream's addition XLA's own before the norm, and the program
is the one it was before the kernels.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from txf.ops import platform

# Whether this jax can lower the GPU kernels (jaxlib's Triton bindings).
try:
  from jax.experimental.pallas import triton as plgpu

  KERNEL_AVAILABLE = True
except ImportError:
  KERNEL_AVAILABLE = False

__all__ = ["layer_norm", "rms_norm"]

# The kernels hold a row in registers: at most this many features.
_KERNEL_MAX_FEATURES = 8192
# Below this many rows (decoding's, one a sequence) a norm moves too few
# bytes for its own kernel to pay: XLA fuses it with its neighbours into
# fewer launches (gpt2_small's decoding, deviceless H100: 113 kernels a
# generated token with XLA's passes, 169 with the kernels).
_KERNEL_MIN_ROWS = 1024
# Elements of the tile each kernel instance loads at once (rows x the
# features rounded up to a power of 2), its warps, and the backward's
# instances (each sums its rows' column partials): Triton's usual choices
# for row-wise kernels, not tuned on a GPU.
_TILE_ELEMENTS = 2048
_NUM_WARPS = 4
_BACKWARD_INSTANCES = 512


def _check_input(x, params):
  """Validates x `[..., D]` and each named parameter (None or `[D]`)."""
  if x.ndim < 1 or not jnp.issubdtype(x.dtype, jnp.floating):
    raise ValueError(f"x must be a floating array [..., D], got shape {x.shape} dtype {x.dtype}")
  for name, param in params.items():
    if param is not None and jnp.shape(param) != x.shape[-1:]:
      raise ValueError(
        f"{name} must have shape (D,) = {x.shape[-1:]} for x of shape {x.shape}, "
        f"got shape {jnp.shape(param)}"
      )


def uses_gpu_kernel(x) -> bool:
  """Whether a norm of x `[..., D]` runs the GPU kernels when its program is
  lowered for a GPU (`jax.lax.platform_dependent`: a CPU or TPU program
  runs XLA's passes even when traced with `platform.compiling_for('gpu')`):
  traced for a GPU, the program on one device, where this jax can lower
  them, a row fits and there are enough rows."""
  return (
    KERNEL_AVAILABLE
    and platform.backend() == "gpu"
    and jax.sharding.get_abstract_mesh().size <= 1
    and x.shape[-1] <= _KERNEL_MAX_FEATURES
    and math.prod(x.shape[:-1]) >= _KERNEL_MIN_ROWS
  )


class _Options(NamedTuple):
  """What a normalisation is, fixed when it is traced.

  Attributes:
    eps: added to the variance (mean square).
    center: LayerNorm (subtract the mean); False: RMSNorm.
    residual: return s = x + add + add_bias with its norm.
    kernel: the GPU kernels where the program is lowered for a GPU.
    added: whether add is given.
  """

  eps: float
  center: bool
  residual: bool
  kernel: bool
  added: bool


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _normalize(x, add, add_bias, scale, bias, options):
  """The normalisation of s = x (+ add + add_bias): (s - mean) * rstd * scale
  + bias in float32, cast to x's dtype; with `options.residual`, (s, that).

  scale and bias are float `[D]` (ones and zeros stand for absent ones).
  Differentiated by the backward below, which keeps only s and its float32
  row moments `[..., 1]`.
  """
  s, y, _ = _forward(x, add, add_bias, scale, bias, options, keep=False)
  return (s, y) if options.residual else y


def _forward(x, add, add_bias, scale, bias, options, *, keep):
  """(s, y, moments): the kernel's where `options.kernel` and the program
  is lowered for a GPU, XLA's otherwise; `keep`: the moments are kept for
  the backward."""
  forward = functools.partial(_xla_forward, eps=options.eps, center=options.center, keep=keep)
  if not options.kernel:
    return forward(x, add, add_bias, scale, bias)
  kernel = functools.partial(_kernel_forward, eps=options.eps, center=options.center)
  return jax.lax.platform_dependent(x, add, add_bias, scale, bias, cuda=kernel, default=forward)


def _normalize_forward(x, add, add_bias, scale, bias, options):
  s, y, moments = _forward(x, add, add_bias, scale, bias, options, keep=True)
  return ((s, y) if options.residual else y), (s, moments, scale, bias, add_bias)


def _normalize_backward(options, kept, cotangent):
  s, moments, scale, bias, add_bias = kept
  ds, dy = cotangent if options.residual else (None, cotangent)
  static = dict(center=options.center, biased=add_bias is not None)
  backward = functools.partial(_xla_backward, **static)
  if options.kernel:
    kernel = functools.partial(_kernel_backward, **static)
    backward = functools.partial(jax.lax.platform_dependent, cuda=kernel, default=backward)
  ds, dscale, dbias, dadd_bias = backward(s, moments, scale, dy, ds)
  # s = x + add + add_bias: each takes s's gradient (add_bias summed over rows).
  return (
    ds,
    ds if options.added else None,
    None if add_bias is None else dadd_bias.astype(add_bias.dtype),
    dscale.astype(scale.dtype),
    dbias.astype(bias.dtype),
  )


_normalize.defvjp(_normalize_forward, _normalize_backward)


# XLA's passes.


def _stream_sum(x, add, add_bias):
  """x + (add + add_bias) in x's dtype, as a block adds a sub-layer's output
  (its projection's bias first); x without add."""
  if add is None:
    return x
  return x + (add if add_bias is None else add + add_bias.astype(x.dtype))


def _row_statistics(x, center):
  """(mean or None, mean of squared deviations from it): float32 `[..., 1]`.

  Each a sum of terms already divided by D, so that it is one reduction
  kernel's output with no division after it.
  """
  x32 = x.astype(jnp.float32)
  inverse_d = 1.0 / x.shape[-1]
  if not center:
    return None, jnp.sum(jnp.square(x32) * inverse_d, axis=-1, keepdims=True)
  mean = jnp.sum(x32 * inverse_d, axis=-1, keepdims=True)
  # Two-pass variance: E[x^2] - E[x]^2 cancels badly when |mean| >> std.
  return mean, jnp.sum(jnp.square(x32 - mean) * inverse_d, axis=-1, keepdims=True)


def _moments(statistics, eps):
  """(mean or None, rstd = 1 / sqrt(var + eps)) from `_row_statistics`."""
  mean, var = statistics
  return mean, jax.lax.rsqrt(var + eps)


def _normalized(x, moments):
  """x_hat = (x - mean) * rstd in float32."""
  mean, rstd = moments
  x32 = x.astype(jnp.float32)
  return (x32 if mean is None else x32 - mean) * rstd


def _scaled(x, moments, scale, bias):
  """x_hat * scale + bias, in x's dtype."""
  y = _normalized(x, moments) * scale.astype(jnp.float32) + bias.astype(jnp.float32)
  return y.astype(x.dtype)


def _xla_forward(x, add, add_bias, scale, bias, *, eps, center, keep):
  """(s = x + (add + add_bias) (without the absent ones), y, the row moments
  (mean or None, rstd) float32 `[..., 1]`); `keep`: for the backward, which
  reads the moments."""
  s = _stream_sum(x, add, add_bias)
  moments = _moments(_row_statistics(s, center), eps)
  if keep:
    # The barrier makes the moments buffers of their own, which the backward
    # reads; without it XLA recomputes them inside the backward's kernels.
    moments = jax.lax.optimization_barrier(moments)
  return s, _scaled(s, moments, scale, bias), moments


def _column_sums(a, b):
  """(sum of a, sum of b) over every axis but the last, float32 `[D]` each."""
  leading = tuple(range(a.ndim - 1))
  if platform.backend() != "gpu":
    return jnp.sum(a, axis=leading), jnp.sum(b, axis=leading)
  # On a GPU, one reduction, so that what a and b share (dy) is read once:
  # as two sums XLA gives each its own kernel (1.2 GB a step at gpt2_small's
  # size). The sum of the complex numbers a + i b, not a variadic lax.reduce
  # of the pair: a plain sum is all-reduced across a sharded batch, the
  # variadic one all-gathered. (A TPU all-gathers a complex sum too.)
  sums = jnp.sum(jax.lax.complex(a, b), axis=leading)
  return jnp.real(sums), jnp.imag(sums)


def _xla_backward(x, moments, scale, dy, dres, *, center, biased):
  """(dx in x's dtype, plus dres (the stream's gradient) where given;
  float32 dscale, dbias `[D]`; where `biased`, dx summed over the rows,
  else None)."""
  # Keeping the moments lets XLA fuse the parameters' gradients (column sums
  # of dy * x_hat and dy) into reductions that read x and dy: autodiff of the
  # forward keeps x alone, and on a GPU its backward wrote dy * x_hat in
  # float32 per norm to sum it after, about 0.2 GB a norm at gpt2_small's size.
  x_hat = _normalized(x, moments)
  dy32 = dy.astype(jnp.float32)
  dscale, dbias = _column_sums(dy32 * x_hat, dy32)
  g = dy32 * scale.astype(jnp.float32)
  inverse_d = 1.0 / x.shape[-1]
  dx = g - x_hat * jnp.sum(g * x_hat * inverse_d, axis=-1, keepdims=True)
  if center:
    dx = dx - jnp.sum(g * inverse_d, axis=-1, keepdims=True)
  dx = (dx * moments[1]).astype(x.dtype)
  dx = dx if dres is None else dres + dx
  # The bias's gradient summed in x's dtype, as autodiff of its addition sums it.
  dadd_bias = jnp.sum(dx, axis=tuple(range(x.ndim - 1))).astype(jnp.float32) if biased else None
  return dx, dscale, dbias, dadd_bias


# The GPU kernels: x as rows [N, D], each kernel instance a tile of rows.


def _tile(d):
  """(rows a tile, the features rounded up to a power of 2, as Triton's
  arrays are)."""
  block = pl.next_power_of_2(d)
  return max(1, _TILE_ELEMENTS // block), block


def _tile_indices(ref, first_row, rows, block):
  """(row indices [rows], column indices [block], whether each is inside
  ref [N, D], the tile's mask [rows, block])."""
  n, d = ref.shape
  r, c = first_row + jnp.arange(rows), jnp.arange(block)
  row_ok, col_ok = r < n, c < d
  return r, c, row_ok, col_ok, row_ok[:, None] & col_ok[None, :]


def _forward_kernel(*refs, eps, center, added, biased, rows, block):
  """A tile of rows: s = x + add + add_bias (where given), y = the
  normalised s, and the rows' mean and rstd."""
  x_ref, *refs = refs
  add_ref = refs.pop(0) if added else None
  add_bias_ref = refs.pop(0) if biased else None
  scale_ref, bias_ref, y_ref, *refs = refs
  s_ref = refs.pop(0) if added else None
  mean_ref = refs.pop(0) if center else None
  (rstd_ref,) = refs
  r, c, row_ok, col_ok, mask = _tile_indices(x_ref, pl.program_id(0) * rows, rows, block)
  tile = lambda ref: ref.at[r[:, None], c[None, :]]
  column = lambda ref: plgpu.load(ref.at[c], mask=col_ok, other=0.0).astype(jnp.float32)
  x = plgpu.load(tile(x_ref), mask=mask, other=0.0)
  if added:
    s = x.astype(jnp.float32) + plgpu.load(tile(add_ref), mask=mask, other=0.0)
    if biased:
      s = s + column(add_bias_ref)[None, :]
    # Rounded to x's dtype as the stream holds it, then normalised as read back.
    x = s.astype(x.dtype)
    plgpu.store(tile(s_ref), x, mask=mask)
  x = x.astype(jnp.float32)
  inverse_d = 1.0 / x_ref.shape[1]
  if center:
    mean = jnp.sum(x, axis=1) * inverse_d
    x = jnp.where(mask, x - mean[:, None], 0.0)  # two-pass variance, as `_row_statistics`
    plgpu.store(mean_ref.at[r], mean, mask=row_ok)
  rstd = jax.lax.rsqrt(jnp.sum(x * x, axis=1) * inverse_d + eps)
  plgpu.store(rstd_ref.at[r], rstd, mask=row_ok)
  y = x * rstd[:, None] * column(scale_ref)[None, :] + column(bias_ref)[None, :]
  plgpu.store(tile(y_ref), y.astype(y_ref.dtype), mask=mask)


def _kernel_forward(x, add, add_bias, scale, bias, *, eps, center, interpret=False):
  """`_xla_forward` as one kernel: (s, y, (mean or None, rstd))."""
  flat = lambda a: a.reshape(-1, a.shape[-1])
  x_NxD = flat(x)
  n, d = x_NxD.shape
  rows, block = _tile(d)
  added, biased = add is not None, add_bias is not None
  inputs = [x_NxD] + ([flat(add)] if added else []) + ([add_bias] if biased else [])
  rows_out = jax.ShapeDtypeStruct((n, d), x.dtype)
  row_moment = jax.ShapeDtypeStruct((n,), jnp.float32)
  outputs = pl.pallas_call(
    functools.partial(
      _forward_kernel,
      eps=float(eps),
      center=center,
      added=added,
      biased=biased,
      rows=rows,
      block=block,
    ),
    grid=(pl.cdiv(n, rows),),
    out_shape=(rows_out,) * (1 + added) + (row_moment,) * (1 + center),
    compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
    interpret=interpret,
    name="norm_forward",
  )(*inputs, scale, bias)
  y_NxD, outputs = outputs[0], list(outputs[1:])
  s = outputs.pop(0).reshape(x.shape) if added else x
  moment = lambda m_N: m_N.reshape(x.shape[:-1] + (1,))
  mean = moment(outputs.pop(0)) if center else None
  return s, y_NxD.reshape(x.shape), (mean, moment(outputs.pop(0)))


def _backward_kernel(*refs, center, residual, biased, rows, tiles, block):
  """`tiles` tiles of rows: dx (plus the stream's gradient), and the
  instance's column sums of dy * x_hat, dy and (where `biased`) dx."""
  x_ref, dy_ref, *refs = refs
  dres_ref = refs.pop(0) if residual else None
  mean_ref = refs.pop(0) if center else None
  rstd_ref, scale_ref, dx_ref, partial_ref = refs
  instance = pl.program_id(0)
  inverse_d = 1.0 / x_ref.shape[1]
  c = jnp.arange(block)
  col_ok = c < x_ref.shape[1]
  scale = plgpu.load(scale_ref.at[c], mask=col_ok, other=0.0).astype(jnp.float32)

  def tile(t, sums):
    first = (instance * tiles + t) * rows
    r, _, row_ok, _, mask = _tile_indices(x_ref, first, rows, block)
    at = lambda ref: ref.at[r[:, None], c[None, :]]
    load = lambda ref: plgpu.load(at(ref), mask=mask, other=0.0).astype(jnp.float32)
    x, dy = load(x_ref), load(dy_ref)
    if center:
      x = x - plgpu.load(mean_ref.at[r], mask=row_ok, other=0.0)[:, None]
    rstd = plgpu.load(rstd_ref.at[r], mask=row_ok, other=0.0)[:, None]
    x_hat = jnp.where(mask, x * rstd, 0.0)
    g = dy * scale[None, :]
    dx = g - x_hat * (jnp.sum(g * x_hat, axis=1) * inverse_d)[:, None]
    if center:
      dx = dx - (jnp.sum(g, axis=1) * inverse_d)[:, None]
    dx = dx * rstd
    if residual:
      dx = dx + load(dres_ref)
    plgpu.store(at(dx_ref), dx.astype(dx_ref.dtype), mask=mask)
    columns = (dy * x_hat, dy) + ((dx,) if biased else ())
    return tuple(total + jnp.sum(a, axis=0) for total, a in zip(sums, columns))

  zeros = (jnp.zeros((block,), jnp.float32),) * (3 if biased else 2)
  for i, total in enumerate(jax.lax.fori_loop(0, tiles, tile, zeros)):
    plgpu.store(partial_ref.at[i, instance, c], total, mask=col_ok)


def _kernel_backward(x, moments, scale, dy, dres, *, center, biased, interpret=False):
  """`_xla_backward` as one kernel and one reduction of its instances'
  column partials [2 or 3, instances, D]: (dx, dscale, dbias, dx summed
  over the rows or None)."""
  flat = lambda a: a.reshape(-1, a.shape[-1])
  x_NxD = flat(x)
  n, d = x_NxD.shape
  rows, block = _tile(d)
  tiles = pl.cdiv(pl.cdiv(n, rows), _BACKWARD_INSTANCES)
  instances = pl.cdiv(n, rows * tiles)
  mean, rstd = moments
  inputs = [x_NxD, flat(dy)]
  inputs += [] if dres is None else [flat(dres)]
  inputs += [] if mean is None else [mean.reshape(n)]
  dx_NxD, partial_KxIxD = pl.pallas_call(
    functools.partial(
      _backward_kernel,
      center=center,
      residual=dres is not None,
      biased=biased,
      rows=rows,
      tiles=tiles,
      block=block,
    ),
    grid=(instances,),
    out_shape=(
      jax.ShapeDtypeStruct((n, d), x.dtype),
      jax.ShapeDtypeStruct((3 if biased else 2, instances, d), jnp.float32),
    ),
    compiler_params=plgpu.CompilerParams(num_warps=_NUM_WARPS, num_stages=1),
    interpret=interpret,
    name="norm_backward",
  )(*inputs, rstd.reshape(n), scale)
  dscale, dbias, *dadd_bias = jnp.sum(partial_KxIxD, axis=1)
  return dx_NxD.reshape(x.shape), dscale, dbias, dadd_bias[0] if biased else None


def _parameter(param, d, fill):
  """param as an array, or a float32 `[d]` of `fill` where it is None."""
  if param is None:
    return jnp.full((d,), fill, jnp.float32)
  return jnp.asarray(param)


def _check_add(x, add, add_bias):
  """Validates `add` (None or x's shape and dtype) and `add_bias` (None, or
  a float `[D]` beside an add)."""
  if add is not None and (jnp.shape(add) != x.shape or jnp.result_type(add) != x.dtype):
    raise ValueError(
      f"add must have x's shape {x.shape} and dtype {x.dtype}, "
      f"got shape {jnp.shape(add)} dtype {jnp.result_type(add)}"
    )
  if add_bias is not None:
    if add is None:
      raise ValueError("add_bias goes with add (the output it is the bias of)")
    if jnp.shape(add_bias) != x.shape[-1:] or not jnp.issubdtype(
      jnp.result_type(add_bias), jnp.floating
    ):
      raise ValueError(
        f"add_bias must be a float array of shape {x.shape[-1:]}, "
        f"got shape {jnp.shape(add_bias)} dtype {jnp.result_type(add_bias)}"
      )


def _options(x, add, add_bias, eps, center, residual):
  """The `_Options` of a call (x's width, eps, add and add_bias validated)."""
  if not jnp.shape(x) or not jnp.shape(x)[-1]:
    raise ValueError(f"x: a norm needs a last axis of one feature or more, got {jnp.shape(x)}")
  # A static argument of the backward: a traced eps escaped its trace.
  if isinstance(eps, jax.core.Tracer) or jnp.ndim(eps) or not 0 <= float(eps) < math.inf:
    raise ValueError(f"eps must be a finite float >= 0 given outside jit, got {eps!r}")
  _check_add(x, add, add_bias)
  return _Options(float(eps), center, residual, uses_gpu_kernel(x), add is not None)


def _normalize_stream(x, add, add_bias, scale, bias, options):
  """`_normalize`, with the residual stream's add and return inside it
  where the kernels run; elsewhere the sum is XLA's addition before a plain
  norm, the graph XLA fused well before (the stream's gradient and the
  bias's column sum fused into the norm's backward passes)."""
  if options.kernel or (add is None and not options.residual):
    return _normalize(x, add, add_bias, scale, bias, options)
  s = _stream_sum(x, add, add_bias)
  y = _normalize(s, None, None, scale, bias, options._replace(residual=False, added=False))
  return (s, y) if options.residual else y


def layer_norm(x, scale=None, bias=None, eps=1e-6, *, add=None, add_bias=None, residual=False):
  """LayerNorm (Ba et al., 2016): (x - mean) / sqrt(var + eps) * scale + bias.

  Args:
    x: float `[..., D]`.
    scale: `[D]` or None (no scaling).
    bias: `[D]` or None (no shift).
    eps: added to the variance.
    add: None, or `[..., D]` in x's dtype added to x first (a sub-layer's
      output into the residual stream): the sum is normalised.
    add_bias: None, or add's bias, a float `[D]` (a parameter as stored),
      added with it: in x's dtype as a projection adds its bias, except in
      the GPU kernel, which adds it in float32 and rounds the sum once.
    residual: also return the sum (x itself without add), as a Pre-LN
      block's residual stream (see the module docstring).

  Returns:
    `[..., D]` in x's dtype; with residual, (the sum, that).
  """
  x = jnp.asarray(x)
  _check_input(x, {"scale": scale, "bias": bias})
  d = x.shape[-1]
  scale, bias = _parameter(scale, d, 1.0), _parameter(bias, d, 0.0)
  return _normalize_stream(
    x, add, add_bias, scale, bias, _options(x, add, add_bias, eps, True, residual)
  )


def rms_norm(x, scale=None, eps=1e-6, *, add=None, add_bias=None, residual=False):
  """RMSNorm (Zhang & Sennrich, 2019): x / sqrt(mean(x^2) + eps) * scale.

  Args:
    x: float `[..., D]`.
    scale: `[D]` or None (no scaling).
    eps: added to the mean square.
    add, add_bias, residual: as `layer_norm`'s.

  Returns:
    `[..., D]` in x's dtype; with residual, (the sum, that).
  """
  x = jnp.asarray(x)
  _check_input(x, {"scale": scale})
  d = x.shape[-1]
  scale, bias = _parameter(scale, d, 1.0), _parameter(None, d, 0.0)
  return _normalize_stream(
    x, add, add_bias, scale, bias, _options(x, add, add_bias, eps, False, residual)
  )
