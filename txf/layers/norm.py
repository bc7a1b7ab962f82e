"""`Norm`: the normalisation `model.norm` names, and its registry.

An entry of `NORMS` is a function `(layer, x, cfg) -> y` over the last axis
of x ([..., D] in the compute dtype): `layer` is the calling `Norm` module,
through which the entry creates its parameters (`layer.param(...)`, float32,
logical axis 'embed'), and `cfg` the model's ModelConfig (`cfg.norm_eps`, an
option it registered). The statistics are the ops' float32 ones. A new norm
is one such function and one `txf.register.norm` call (docs/extending.md).

A Pre-LN block hands its norms the residual stream and the previous
sub-layer's output (and its bias) to add to it, and takes the sum back with
the normalised sum (`Norm(...)(x, add=f, add_bias=b, residual=True)`): the
built-in entries do that in the op (`ops.layer_norm(..., add=f, ...)`: one
GPU kernel forward, one backward that adds the stream's gradient too and
sums the bias's); for another entry the layer adds them and normalises the
sum with the entry.
"""

from __future__ import annotations

from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import ops
from txf.layers.model_config import NORMS, ModelConfig
from txf.layers.projection import with_bias


def scale_param(layer: nn.Module, name: str, d: int, init=nn.initializers.ones) -> jax.Array:
  """A float32 [D] parameter of a norm, on the logical axis 'embed'."""
  boxed = nn.with_logical_partitioning(init, ("embed",))
  # cast: flax types a boxed initializer's parameter as the box; param returns it unboxed.
  return cast(jax.Array, layer.param(name, boxed, (d,), jnp.float32))


def layer_norm(layer: nn.Module, x_BxTxD: jax.Array, cfg: ModelConfig, **stream) -> Any:
  """LayerNorm: scale and bias (Ba et al. 2016). `stream`: ops.layer_norm's
  add, add_bias and residual."""
  d = x_BxTxD.shape[-1]
  scale, bias = scale_param(layer, "scale", d), scale_param(layer, "bias", d, nn.initializers.zeros)
  return ops.layer_norm(x_BxTxD, scale, bias, eps=cfg.norm_eps, **stream)


def rms_norm(layer: nn.Module, x_BxTxD: jax.Array, cfg: ModelConfig, **stream) -> Any:
  """RMSNorm: scale only (Zhang and Sennrich 2019). `stream`: ops.rms_norm's
  add, add_bias and residual."""
  scale = scale_param(layer, "scale", x_BxTxD.shape[-1])
  return ops.rms_norm(x_BxTxD, scale, eps=cfg.norm_eps, **stream)


NORMS.register("layer", layer_norm)
NORMS.register("rms", rms_norm)
# The entries the ops compute (with a stream's add, or inside a kernel).
_BUILT_IN = (layer_norm, rms_norm)


def stream_sum(x_BxTxD: jax.Array, add: jax.Array, add_bias: jax.Array | None) -> jax.Array:
  """x + (add + add_bias): the sum `Norm`'s add normalises, by XLA's adds."""
  return x_BxTxD + with_bias(add, add_bias)


class Norm(nn.Module):
  """The `cfg.norm` normalisation over the last axis; output in the compute dtype.

  Attributes:
    cfg: the model's config.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    x_BxTxD: jax.Array,
    *,
    add: jax.Array | None = None,
    add_bias: jax.Array | None = None,
    residual: bool = False,
  ) -> Any:
    """[..., D] -> the norm of x (+ add + add_bias) [..., D] in the compute
    dtype; with residual, (the sum, that).

    Args:
      x_BxTxD: the input, or with residual the residual stream.
      add: None, or a sub-layer's output [..., D] to add to x first.
      add_bias: None, or add's bias [D] as stored (the sub-layer left it to
        the norm), added in add's dtype as its projection adds it.
      residual: return the sum too (see the module docstring).
    """
    entry, dtype = NORMS[self.cfg.norm], jnp.dtype(self.cfg.dtype)
    if entry in _BUILT_IN and all(a is None or a.dtype == dtype for a in (x_BxTxD, add)):
      return entry(self, x_BxTxD, self.cfg, add=add, add_bias=add_bias, residual=residual)
    if add is not None:
      x_BxTxD = stream_sum(x_BxTxD, add, add_bias)
    y_BxTxD = entry(self, x_BxTxD.astype(dtype), self.cfg)
    return (x_BxTxD, y_BxTxD) if residual else y_BxTxD

  def in_kernel(self, x_BxTxD: jax.Array) -> tuple[jax.Array, jax.Array | None, float] | None:
    """(scale [D], bias [D] or None for RMSNorm, eps): what a kernel needs to
    compute this norm of x as `ops.layer_norm` / `ops.rms_norm` compute it
    (`ops.cache_attention_gpu.normalize_project_and_attend`), the parameters
    float32 as stored. None where the ops do not compute it: an entry of
    one's own, x in another dtype than the compute dtype, or parameters not
    created yet (at init)."""
    entry = NORMS[self.cfg.norm]
    if (
      entry not in _BUILT_IN
      or x_BxTxD.dtype != jnp.dtype(self.cfg.dtype)
      or not self.has_variable("params", "scale")
    ):
      return None
    params = nn.meta.unbox(self.variables["params"])
    return params["scale"], params.get("bias"), self.cfg.norm_eps
