"""Tests for txf.ops.norms against numpy float64 references."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops import norms, platform
from txf.ops.norms import layer_norm, rms_norm


def np_layer_norm(x, scale, bias, eps=1e-6):
  x = x.astype(np.float64)
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def np_rms_norm(x, scale, eps=1e-6):
  x = x.astype(np.float64)
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * scale


@pytest.fixture
def inputs():
  rng = np.random.default_rng(0)
  # A large common offset checks that the variance does not cancel.
  x = (rng.normal(size=(2, 5, 16)) * 3 + 20).astype(np.float32)
  scale = rng.normal(size=16).astype(np.float32)
  bias = rng.normal(size=16).astype(np.float32)
  return x, scale, bias


def test_layer_norm_matches_reference(inputs):
  x, scale, bias = inputs
  got = layer_norm(x, scale, bias, eps=1e-5)
  assert got.shape == x.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(got, np_layer_norm(x, scale, bias, 1e-5), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(layer_norm(x), np_layer_norm(x, 1.0, 0.0), rtol=1e-5, atol=1e-5)


def test_rms_norm_matches_reference(inputs):
  x, scale, _ = inputs
  got = rms_norm(x, scale, eps=1e-5)
  assert got.shape == x.shape and got.dtype == jnp.float32
  np.testing.assert_allclose(got, np_rms_norm(x, scale, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eps", [1e-6, 1e-3])
def test_norms_where_eps_matters_match_reference(eps):
  """Rows whose (mean-square / variance) statistic is 0.01x to 100x eps: there
  eps changes the output by O(1), so eps outside the square root, or a
  dropped or doubled eps, fails. The inputs above have variance ~9, where
  eps = 1e-5 moves the output by ~1e-6, below any tolerance."""
  rng = np.random.default_rng(1)
  spread = np.sqrt(eps) * np.array([0.1, 1.0, 10.0])[:, None, None]  # statistic / eps: 0.01..100
  x = (rng.normal(size=(3, 4, 16)) * spread).astype(np.float32)
  scale = rng.normal(size=16).astype(np.float32)
  bias = rng.normal(size=16).astype(np.float32)
  np.testing.assert_allclose(
    rms_norm(x, scale, eps=eps), np_rms_norm(x, scale, eps), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(
    layer_norm(x + 1.0, scale, bias, eps=eps),
    np_layer_norm(x + 1.0, scale, bias, eps),
    rtol=1e-3,
    atol=1e-3,
  )


def test_rms_norm_unit_rms(inputs):
  x, _, _ = inputs
  got = np.asarray(rms_norm(x - 20, np.ones(16, np.float32)), np.float64)
  np.testing.assert_allclose(np.sqrt((got**2).mean(-1)), 1.0, atol=1e-5)


def test_layer_norm_zero_mean_unit_variance(inputs):
  x, _, _ = inputs
  got = np.asarray(layer_norm(x), np.float64)
  np.testing.assert_allclose(got.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(got.var(-1), 1.0, atol=1e-4)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_bfloat16_uses_float32_statistics(inputs, norm):
  x, scale, bias = inputs
  x_bf16 = jnp.asarray(x, jnp.bfloat16)
  x_exact = np.asarray(x_bf16, np.float64)  # the values the function actually sees
  if norm == "layer":
    got, ref = layer_norm(x_bf16, scale, bias), np_layer_norm(x_exact, scale, bias)
  else:
    got, ref = rms_norm(x_bf16, scale), np_rms_norm(x_exact, scale)
  assert got.dtype == jnp.bfloat16
  # Only the final cast rounds: within half a bf16 ulp (2^-8 relative) of the exact
  # result. bfloat16 statistics would be off by far more around a mean of 20.
  np.testing.assert_allclose(np.asarray(got, np.float64), ref, rtol=2**-8, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transformations(inputs, dtype):
  x, scale, bias = (jnp.asarray(a, dtype) for a in inputs)
  # A few ulps: jit fuses the reductions and may sum in another order than eager.
  tol = 4 * float(jnp.finfo(dtype).eps)
  for fn, args in ((layer_norm, (scale, bias)), (rms_norm, (scale,))):
    eager = np.asarray(fn(x, *args), np.float32)
    np.testing.assert_allclose(
      np.asarray(jax.jit(fn)(x, *args), np.float32), eager, rtol=tol, atol=tol
    )
    vmapped = jax.vmap(fn, in_axes=(0,) + (None,) * len(args))(x, *args)
    np.testing.assert_allclose(np.asarray(vmapped, np.float32), eager, rtol=tol, atol=tol)
    grads = jax.grad(
      lambda x, *p, fn=fn: jnp.sum(fn(x, *p).astype(jnp.float32) ** 3),
      argnums=tuple(range(1 + len(args))),
    )(x, *args)
    for g, a in zip(grads, (x,) + args):
      assert g.dtype == dtype and g.shape == a.shape
      assert np.all(np.isfinite(np.asarray(g, np.float32)))

  # The output does not change when x is shifted and scaled, so the gradient of
  # any loss of it is orthogonal to those directions.
  grad_x = jax.grad(lambda x: jnp.sum(layer_norm(x, scale, bias).astype(jnp.float32) ** 3))(x)
  grad_x = np.asarray(grad_x, np.float64)
  x64 = np.asarray(x, np.float64)
  centred = x64 - x64.mean(-1, keepdims=True)
  scale_of_grad = np.abs(grad_x).sum(-1)
  np.testing.assert_array_less(np.abs(grad_x.sum(-1)), 0.02 * scale_of_grad + 1e-6)
  np.testing.assert_array_less(
    np.abs((grad_x * centred).sum(-1)), 0.02 * scale_of_grad * np.abs(centred).max(-1) + 1e-6
  )


def numerical_gradients(f, args, dy, step=1e-6):
  """Central differences in float64 of sum(f(*args) * dy) with respect to each arg."""
  grads = []
  for i, arg in enumerate(args):
    grad = np.zeros_like(arg)
    for index in np.ndindex(arg.shape):
      plus, minus = [list(args) for _ in range(2)]
      plus[i], minus[i] = arg.copy(), arg.copy()
      plus[i][index] += step
      minus[i][index] -= step
      grad[index] = np.sum((f(*plus) - f(*minus)) * dy) / (2 * step)
    grads.append(grad)
  return grads


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("spread", [3.0, 1e-3])
@pytest.mark.parametrize("with_params", [True, False])
@pytest.mark.parametrize("traced_for", [None, "gpu"])
def test_gradients_match_float64_central_differences(norm, spread, with_params, traced_for):
  """The hand-written backward (x, scale and bias) against numerical derivatives
  of the numpy float64 reference, on rows offset by three standard deviations
  (spread 3) and rows whose statistic is comparable to eps (spread 1e-3, eps
  1e-6), where a dropped eps in the backward shows; without parameters, x's
  gradient alone (the backward then stands in ones and zeros for them). As
  traced for a GPU too, where the parameters' gradients are one complex sum."""
  rng = np.random.default_rng(2)
  x = (rng.normal(size=(2, 3, 8)) + 3.0) * spread
  scale, bias, dy = rng.normal(size=8), rng.normal(size=8), rng.normal(size=(2, 3, 8))
  if norm == "layer":
    fn, ref, args = layer_norm, np_layer_norm, (x, scale, bias)
  else:
    fn, ref, args = rms_norm, np_rms_norm, (x, scale)
  if not with_params:
    fixed = (1.0, 0.0)[: len(args) - 1]
    fn = lambda x, fn=fn, **kw: fn(x, **kw)
    ref = lambda x, ref=ref, fixed=fixed, **kw: ref(x, *fixed, **kw)
    args = (x,)
  f32_args = [jnp.asarray(a, jnp.float32) for a in args]
  with platform.compiling_for(traced_for) if traced_for else contextlib.nullcontext():
    _, vjp = jax.vjp(lambda *a: fn(*a, eps=1e-6), *f32_args)
    got = vjp(jnp.asarray(dy, jnp.float32))
  want = numerical_gradients(lambda *a: ref(*a, eps=1e-6), args, dy, step=1e-6 * spread)
  for g, w in zip(got, want):
    assert g.dtype == jnp.float32
    # float32 statistics: a few parts in 1e4 of the largest entry.
    np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


@pytest.mark.parametrize(
  "call,name",
  [
    (lambda: layer_norm(np.zeros((2, 4), np.float32), np.ones(3)), "scale"),
    (lambda: layer_norm(np.zeros((2, 4), np.float32), None, np.ones((1, 4))), "bias"),
    (lambda: rms_norm(np.zeros((2, 4), np.float32), np.ones(5)), "scale"),
    (lambda: rms_norm(np.zeros((2, 4), np.int32)), "x"),
    (lambda: layer_norm(np.float32(1.0)), "x"),
    # No features to average (was a ZeroDivisionError).
    (lambda: layer_norm(np.zeros((2, 0), np.float32)), "x: a norm needs a last axis"),
    # eps is a static argument of the backward: traced, it escaped its trace.
    (lambda: jax.jit(lambda e: layer_norm(jnp.ones((2, 4)), eps=e))(1e-5), "eps must be"),
    (lambda: rms_norm(jnp.ones((2, 4)), eps=float("nan")), "eps must be"),
  ],
)
def test_bad_input_raises(call, name):
  with pytest.raises(ValueError, match=name):
    call()


# ---------------------------------------------------------------------------
# The residual stream (add, add_bias, residual) and the GPU kernels.


def np_residual(x, add, add_bias):
  s = x.astype(np.float64)
  if add is not None:
    s = s + add + (0.0 if add_bias is None else add_bias)
  return s


@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("add,add_bias", [(False, False), (True, False), (True, True)])
def test_residual_returns_the_sum_and_its_norm(norm, add, add_bias):
  """With residual, (x + add + add_bias, the norm of that), against float64;
  without residual the norm alone."""
  rng = np.random.default_rng(4)
  x, f = (rng.normal(size=(2, 3, 16)) * 3 + 2).astype(np.float32), None
  f = rng.normal(size=(2, 3, 16)).astype(np.float32) if add else None
  b = rng.normal(size=16).astype(np.float32) if add_bias else None
  scale, bias = rng.normal(size=16).astype(np.float32), rng.normal(size=16).astype(np.float32)
  s = np_residual(x, f, b)
  if norm == "layer":
    fn, want, params = layer_norm, np_layer_norm(s, scale, bias, 1e-5), (scale, bias)
  else:
    fn, want, params = rms_norm, np_rms_norm(s, scale, 1e-5), (scale,)
  got_s, got_y = fn(x, *params, eps=1e-5, add=f, add_bias=b, residual=True)
  np.testing.assert_allclose(got_s, s, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(got_y, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(fn(x, *params, eps=1e-5, add=f, add_bias=b), got_y)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_residual_gradients_match_float64_central_differences(norm):
  """Of a loss of both outputs (the stream's cotangent joins the norm's
  backward), with respect to x, add, add_bias and the parameters."""
  rng = np.random.default_rng(5)
  x, f = rng.normal(size=(2, 3, 8)) + 3.0, rng.normal(size=(2, 3, 8))
  b, scale, bias = rng.normal(size=8), rng.normal(size=8), rng.normal(size=8)
  ds, dy = rng.normal(size=(2, 3, 8)), rng.normal(size=(2, 3, 8))
  if norm == "layer":
    fn, ref, params = layer_norm, np_layer_norm, (scale, bias)
  else:
    fn, ref, params = rms_norm, np_rms_norm, (scale,)
  args = (x, f, b) + params

  def np_loss_terms(x, f, b, *params):
    s = np_residual(x, f, b)
    return np.concatenate([s, ref(s, *params, eps=1e-6)])

  def loss(x, f, b, *params):
    s, y = fn(x, *params, eps=1e-6, add=f, add_bias=b, residual=True)
    return jnp.sum(s * ds) + jnp.sum(y * dy)

  got = jax.grad(loss, argnums=tuple(range(len(args))))(
    *(jnp.asarray(a, jnp.float32) for a in args)
  )
  want = numerical_gradients(np_loss_terms, args, np.concatenate([ds, dy]))
  for g, w in zip(got, want):
    assert g.dtype == jnp.float32 and g.shape == w.shape
    np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=1e-3, atol=1e-3 * np.abs(w).max())


@pytest.mark.parametrize(
  "kwargs,name",
  [
    (dict(add=np.zeros((2, 3), np.float32)), "add"),
    (dict(add=np.zeros((2, 4), np.float16)), "add"),
    (dict(add_bias=np.zeros(4, np.float32)), "add_bias"),
    (dict(add=np.zeros((2, 4), np.float32), add_bias=np.zeros(3, np.float32)), "add_bias"),
  ],
)
def test_bad_add_raises(kwargs, name):
  with pytest.raises(ValueError, match=name):
    layer_norm(np.zeros((2, 4), np.float32), **kwargs)


def _kernel_cases():
  """(center, add, add_bias, stream's cotangent) over both norms."""
  return [
    (True, False, False, False),
    (True, True, True, True),
    (False, True, False, True),
    (False, False, False, False),
  ]


@pytest.fixture
def small_tiles(monkeypatch):
  """Tiles of 4 rows of 64 features and 3 backward instances, so that 37
  rows of 48 features make a partial last tile, masked columns and several
  tiles an instance."""
  monkeypatch.setattr(norms, "_TILE_ELEMENTS", 256)
  monkeypatch.setattr(norms, "_BACKWARD_INSTANCES", 3)


@pytest.mark.parametrize("center,add,add_bias,stream", _kernel_cases())
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_kernels_stand_in_for_the_xla_passes(small_tiles, center, add, add_bias, stream, dtype):
  """The forward and backward kernels, run by Pallas's interpreter, return
  what XLA's passes return (their types too: one program holds both), to
  float32 rounding; in bfloat16 within about one ulp of the operands (the
  kernel rounds x + add + add_bias once, XLA twice: where x and add cancel,
  the sum keeps add + add_bias's rounding, 2^-8 of |add| ~ 3)."""
  rng = np.random.default_rng(6)
  shape = (37, 48)
  x = jnp.asarray(rng.normal(size=shape) * 2 + 1, dtype)
  f = jnp.asarray(rng.normal(size=shape), dtype) if add else None
  b = jnp.asarray(rng.normal(size=48), jnp.float32) if add_bias else None
  scale, bias = (jnp.asarray(rng.normal(size=48), jnp.float32) for _ in range(2))
  dy, ds = (jnp.asarray(rng.normal(size=shape), dtype) for _ in range(2))
  ds = ds if stream else None
  tol = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=2**-7, atol=2**-5)

  def compare(got, want, **tolerance):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      assert g.dtype == w.dtype and g.shape == w.shape
      np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **tolerance)

  forward = dict(eps=1e-5, center=center)
  kernel_s, kernel_y, kernel_moments = norms._kernel_forward(
    x, f, b, scale, bias, **forward, interpret=True
  )
  xla_s, xla_y, xla_moments = norms._xla_forward(x, f, b, scale, bias, **forward, keep=True)
  compare(kernel_s, xla_s, **tol)
  compare(kernel_y, xla_y, **tol)
  compare(kernel_moments, xla_moments, **tol)  # of the sums, which may differ in bfloat16
  backward = dict(center=center, biased=add_bias)
  kernel_grads = norms._kernel_backward(
    xla_s, xla_moments, scale, dy, ds, **backward, interpret=True
  )
  xla_grads = norms._xla_backward(xla_s, xla_moments, scale, dy, ds, **backward)
  # The column sums add 37 rows in another order.
  compare(kernel_grads, xla_grads, **(tol if dtype == jnp.float32 else dict(rtol=2**-6, atol=0.1)))


@pytest.mark.parametrize("center", [True, False])
def test_gpu_kernels_match_float64(small_tiles, center):
  """The kernels' float32 outputs against numpy float64: the forward's sum,
  norm and moments; the backward's input gradient with the stream's added,
  the parameters' and the added bias's gradients."""
  rng = np.random.default_rng(7)
  x, f = rng.normal(size=(37, 48)) * 3 + 5, rng.normal(size=(37, 48))
  b, scale, bias = rng.normal(size=48), rng.normal(size=48), rng.normal(size=48)
  dy, ds = rng.normal(size=(37, 48)), rng.normal(size=(37, 48))
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  s, y, (mean, rstd) = norms._kernel_forward(
    f32(x), f32(f), f32(b), f32(scale), f32(bias), eps=1e-5, center=center, interpret=True
  )
  s64 = x + f + b
  centred = s64 - s64.mean(-1, keepdims=True) if center else s64
  rstd64 = 1 / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(s, s64, rtol=1e-6, atol=1e-5)
  np.testing.assert_allclose(y, centred * rstd64 * scale + bias, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(rstd, rstd64, rtol=1e-5)
  if center:
    np.testing.assert_allclose(mean, s64.mean(-1, keepdims=True), rtol=1e-5, atol=1e-5)
  else:
    assert mean is None
  dx, dscale, dbias, dadd_bias = norms._kernel_backward(
    s, (mean, rstd), f32(scale), f32(dy), f32(ds), center=center, biased=True, interpret=True
  )
  x_hat, g = centred * rstd64, dy * scale
  want_dx = g - x_hat * (g * x_hat).mean(-1, keepdims=True)
  if center:
    want_dx = want_dx - g.mean(-1, keepdims=True)
  want_dx = want_dx * rstd64 + ds
  for got, want in (
    (dx, want_dx),
    (dscale, (dy * x_hat).sum(0)),
    (dbias, dy.sum(0)),
    (dadd_bias, want_dx.sum(0)),
  ):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("center", [True, False])
def test_gpu_kernels_forward_where_eps_matters(small_tiles, center):
  """The forward kernel's eps, where it changes the output by O(1): rows whose
  variance (mean square) is 0.01x to 100x eps, as for XLA's passes above
  (the inputs of the kernel tests above have variance ~9, where eps = 1e-5
  moves the output by ~1e-6, below their tolerance). Their shapes and eps:
  the kernel compiled there runs again."""
  eps = 1e-5
  rng = np.random.default_rng(8)
  spread = np.sqrt(eps) * np.geomspace(0.1, 10.0, 37)[:, None]  # statistic / eps: 0.01..100
  x = rng.normal(size=(37, 48)) * spread + (1.0 if center else 0.0)
  scale, bias = rng.normal(size=48), rng.normal(size=48) if center else np.zeros(48)
  f32 = lambda a: jnp.asarray(a, jnp.float32)
  _, y, (_, rstd) = norms._kernel_forward(
    f32(x), None, None, f32(scale), f32(bias), eps=eps, center=center, interpret=True
  )
  want = np_layer_norm(x, scale, bias, eps) if center else np_rms_norm(x, scale, eps)
  np.testing.assert_allclose(y, want, rtol=1e-3, atol=1e-3)
  centred = x - x.mean(-1, keepdims=True) if center else x
  want_rstd = 1 / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)
  np.testing.assert_allclose(rstd, want_rstd, rtol=1e-3)


def test_gpu_kernels_under_vmap(small_tiles):
  """Seed replicas vmap the train step: the kernels' instances then span
  the replicas too."""
  rng = np.random.default_rng(8)
  x = jnp.asarray(rng.normal(size=(2, 37, 48)), jnp.float32)
  scale, bias = jnp.ones(48), jnp.zeros(48)
  forward = lambda x: norms._kernel_forward(
    x, None, None, scale, bias, eps=1e-5, center=True, interpret=True
  )[1]
  np.testing.assert_allclose(jax.vmap(forward)(x), layer_norm(x, eps=1e-5), rtol=1e-5, atol=1e-5)
  dy = jnp.asarray(rng.normal(size=(2, 37, 48)), jnp.float32)
  backward = lambda x, dy: norms._kernel_backward(
    x,
    norms._xla_forward(x, None, None, scale, bias, eps=1e-5, center=True, keep=True)[2],
    scale,
    dy,
    None,
    center=True,
    biased=False,
    interpret=True,
  )[0]
  _, vjp = jax.vjp(lambda x: layer_norm(x, eps=1e-5), x)
  np.testing.assert_allclose(jax.vmap(backward)(x, dy), vjp(dy)[0], rtol=1e-5, atol=1e-5)


def _jaxpr_of_grad(x):
  def loss(x, f):
    s, y = layer_norm(x, add=f, residual=True)
    return jnp.sum(s) + jnp.sum(y)

  return str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, x))


def test_the_kernels_are_traced_for_one_gpu_only(monkeypatch):
  """Traced for a GPU, the norms of 1,024 rows or more hold the kernels
  (behind the GPU branch of `jax.lax.platform_dependent`: a CPU lowering of
  the same trace runs XLA's passes, see
  test_gradients_match_float64_central_differences); not on the CPU, not
  for fewer rows (decoding's), not on a mesh of several devices, not where
  jax cannot lower them."""
  x = jnp.zeros((2, 512, 64), jnp.bfloat16)
  assert "pallas_call" not in _jaxpr_of_grad(x)
  with platform.compiling_for("gpu"):
    text = _jaxpr_of_grad(x)
    assert "norm_forward" in text and "norm_backward" in text
    assert "pallas_call" not in _jaxpr_of_grad(x[:, :511])
    mesh = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
      assert "pallas_call" not in _jaxpr_of_grad(x)
    monkeypatch.setattr(norms, "KERNEL_AVAILABLE", False)
    assert "pallas_call" not in _jaxpr_of_grad(x)
