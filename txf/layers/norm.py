"""`Norm`: LayerNorm or RMSNorm parameters around `txf.ops` norms."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import ops
from txf.layers.config import DEFAULTS


class Norm(nn.Module):
  """LayerNorm (scale and bias) or RMSNorm (scale only) over the last axis.

  Statistics are computed in float32 by the ops; the output is in `dtype`.
  Every attribute defaults to ModelConfig's (norm, norm_eps, dtype).
  """

  kind: str = DEFAULTS.norm  # layer | rms
  eps: float = DEFAULTS.norm_eps
  dtype: Any = jnp.dtype(DEFAULTS.dtype)

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    """[..., D] -> [..., D] in the compute dtype."""
    d = x_BxTxD.shape[-1]
    scale = self.param(
      "scale", nn.with_logical_partitioning(nn.initializers.ones, ("embed",)), (d,), jnp.float32
    )
    x_BxTxD = x_BxTxD.astype(self.dtype)
    if self.kind == "layer":
      bias = self.param(
        "bias", nn.with_logical_partitioning(nn.initializers.zeros, ("embed",)), (d,), jnp.float32
      )
      return ops.layer_norm(x_BxTxD, scale, bias, eps=self.eps)
    if self.kind == "rms":
      return ops.rms_norm(x_BxTxD, scale, eps=self.eps)
    raise ValueError(f"Norm.kind: {self.kind!r} is not 'layer' or 'rms'")
