"""A normalisation registered from outside txf.

ScaleNorm (Nguyen and Salazar 2019): x / ||x|| times one learned scalar g,
initialised to sqrt(D), so it starts as an RMS normalisation.
"""

import flax.linen as nn
import jax.numpy as jnp

from txf import register


@register.norm("scale")
def scale_norm(layer, x_BxTxD, cfg):
  """[..., D] -> [..., D]: g * x / max(||x||, eps), statistics in float32."""
  d = x_BxTxD.shape[-1]
  # Every parameter declares its logical axes (none for a scalar): txf
  # shards parameters by them (txf.train.sharding).
  init = nn.with_logical_partitioning(nn.initializers.constant(jnp.sqrt(d)), ())
  g = layer.param("g", init, (), jnp.float32)
  x = x_BxTxD.astype(jnp.float32)
  norm = jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), cfg.norm_eps)
  return (g * x / norm).astype(x_BxTxD.dtype)
