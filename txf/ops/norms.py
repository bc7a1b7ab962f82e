"""Normalisation over the last (feature) axis: LayerNorm and RMSNorm.

Statistics and the affine transform are computed in float32 whatever the
input dtype, because bfloat16 sums over D features lose too many bits; the
result is cast back to the input dtype. Both share one normalisation with its
own backward (the statistics kept from the forward pass, as PyTorch's
LayerNorm keeps them), checked against float64 central differences.
"""

import functools

import jax
import jax.numpy as jnp

from txf.ops import platform

__all__ = ["layer_norm", "rms_norm"]


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


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _normalize(x, scale, bias, eps, center):
  """(x - mean) * rstd * scale + bias in float32, cast to x's dtype.

  scale and bias are float `[D]` (ones and zeros stand for absent ones);
  without `center` the mean is 0 (RMSNorm). Differentiated by the backward
  below, which keeps only the float32 row statistics `[..., 1]` beside x.
  """
  return _scaled(x, _moments(_row_statistics(x, center), eps), scale, bias)


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


def _normalize_forward(x, scale, bias, eps, center):
  # The barrier makes the statistics buffers of their own, which the backward
  # reads; without it XLA recomputes them inside the backward's kernels.
  statistics = jax.lax.optimization_barrier(_row_statistics(x, center))
  return _scaled(x, _moments(statistics, eps), scale, bias), (x, statistics, scale, bias)


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


def _normalize_backward(eps, center, residuals, dy):
  # Keeping the statistics lets XLA fuse the parameters' gradients (column
  # sums of dy * x_hat and dy) into reductions that read x and dy: autodiff of
  # the forward keeps x alone, and on a GPU its backward wrote dy * x_hat in
  # float32 per norm to sum it after, about 0.2 GB a norm at gpt2_small's size.
  x, statistics, scale, bias = residuals
  moments = _moments(statistics, eps)
  x_hat = _normalized(x, moments)
  dy32 = dy.astype(jnp.float32)
  dscale, dbias = _column_sums(dy32 * x_hat, dy32)
  g = dy32 * scale.astype(jnp.float32)
  inverse_d = 1.0 / x.shape[-1]
  dx = g - x_hat * jnp.sum(g * x_hat * inverse_d, axis=-1, keepdims=True)
  if center:
    dx = dx - jnp.sum(g * inverse_d, axis=-1, keepdims=True)
  return (dx * moments[1]).astype(x.dtype), dscale.astype(scale.dtype), dbias.astype(bias.dtype)


_normalize.defvjp(_normalize_forward, _normalize_backward)


def _parameter(param, d, fill):
  """param as an array, or a float32 `[d]` of `fill` where it is None."""
  if param is None:
    return jnp.full((d,), fill, jnp.float32)
  return jnp.asarray(param)


def layer_norm(x, scale=None, bias=None, eps=1e-6):
  """LayerNorm (Ba et al., 2016): (x - mean) / sqrt(var + eps) * scale + bias.

  Args:
    x: float `[..., D]`.
    scale: `[D]` or None (no scaling).
    bias: `[D]` or None (no shift).
    eps: added to the variance.

  Returns:
    `[..., D]` in x's dtype.
  """
  x = jnp.asarray(x)
  _check_input(x, {"scale": scale, "bias": bias})
  d = x.shape[-1]
  return _normalize(x, _parameter(scale, d, 1.0), _parameter(bias, d, 0.0), eps, True)


def rms_norm(x, scale=None, eps=1e-6):
  """RMSNorm (Zhang & Sennrich, 2019): x / sqrt(mean(x^2) + eps) * scale.

  Args:
    x: float `[..., D]`.
    scale: `[D]` or None (no scaling).
    eps: added to the mean square.

  Returns:
    `[..., D]` in x's dtype.
  """
  x = jnp.asarray(x)
  _check_input(x, {"scale": scale})
  d = x.shape[-1]
  return _normalize(x, _parameter(scale, d, 1.0), _parameter(None, d, 0.0), eps, False)
