"""`Norm`: the normalisation `model.norm` names, and its registry.

An entry of `NORMS` is a function `(layer, x, cfg) -> y` over the last axis
of x ([..., D] in the compute dtype): `layer` is the calling `Norm` module,
through which the entry creates its parameters (`layer.param(...)`, float32,
logical axis 'embed'), and `cfg` the model's ModelConfig (`cfg.norm_eps`, an
option it registered). The statistics are the ops' float32 ones. A new norm
is one such function and one `txf.register.norm` call (docs/extending.md).
"""

from __future__ import annotations

from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import ops
from txf.layers.model_config import NORMS, ModelConfig


def scale_param(layer: nn.Module, name: str, d: int, init=nn.initializers.ones) -> jax.Array:
  """A float32 [D] parameter of a norm, on the logical axis 'embed'."""
  boxed = nn.with_logical_partitioning(init, ("embed",))
  # cast: flax types a boxed initializer's parameter as the box; param returns it unboxed.
  return cast(jax.Array, layer.param(name, boxed, (d,), jnp.float32))


def layer_norm(layer: nn.Module, x_BxTxD: jax.Array, cfg: ModelConfig) -> jax.Array:
  """LayerNorm: scale and bias (Ba et al. 2016)."""
  d = x_BxTxD.shape[-1]
  scale, bias = scale_param(layer, "scale", d), scale_param(layer, "bias", d, nn.initializers.zeros)
  return ops.layer_norm(x_BxTxD, scale, bias, eps=cfg.norm_eps)


def rms_norm(layer: nn.Module, x_BxTxD: jax.Array, cfg: ModelConfig) -> jax.Array:
  """RMSNorm: scale only (Zhang and Sennrich 2019)."""
  return ops.rms_norm(x_BxTxD, scale_param(layer, "scale", x_BxTxD.shape[-1]), eps=cfg.norm_eps)


NORMS.register("layer", layer_norm)
NORMS.register("rms", rms_norm)


class Norm(nn.Module):
  """The `cfg.norm` normalisation over the last axis; output in the compute dtype.

  Attributes:
    cfg: the model's config.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    """[..., D] -> [..., D] in the compute dtype."""
    return NORMS[self.cfg.norm](self, x_BxTxD.astype(jnp.dtype(self.cfg.dtype)), self.cfg)
