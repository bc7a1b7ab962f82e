"""Tests for txf.ops.norms against numpy float64 references."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops import platform
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
  ],
)
def test_bad_input_raises(call, name):
  with pytest.raises(ValueError, match=name):
    call()
