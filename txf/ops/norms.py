"""Normalisation over the last (feature) axis: LayerNorm and RMSNorm.

Statistics and the affine transform are computed in float32 whatever the
input dtype, because bfloat16 sums over D features lose too many bits; the
result is cast back to the input dtype.
"""

import jax
import jax.numpy as jnp

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


def _affine(y, scale, bias):
  """y * scale + bias in float32, skipping the parameters that are None."""
  if scale is not None:
    y = y * jnp.asarray(scale, jnp.float32)
  if bias is not None:
    y = y + jnp.asarray(bias, jnp.float32)
  return y


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
  x32 = x.astype(jnp.float32)
  mean = jnp.mean(x32, axis=-1, keepdims=True)
  # Two-pass variance: E[x^2] - E[x]^2 cancels badly when |mean| >> std.
  var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
  y = (x32 - mean) * jax.lax.rsqrt(var + eps)
  return _affine(y, scale, bias).astype(x.dtype)


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
  x32 = x.astype(jnp.float32)
  mean_square = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(mean_square + eps)
  return _affine(y, scale, None).astype(x.dtype)
