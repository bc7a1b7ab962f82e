"""Position-wise feed-forward network and the activation registry.

An entry of `ACTIVATIONS` is an `Activation`: a function `(x, cfg) -> y`
(elementwise; `cfg` the model's ModelConfig, e.g. `cfg.gelu_approximate`)
and whether it gates: a gated activation's FFN is `out(act(x W_gate) * (x
W_in))` (Shazeer 2020), with d_ff derived as 8/3 D. A new activation is one
`txf.register.activation` call (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers.model_config import ACTIVATIONS, ModelConfig, derived
from txf.layers.partitioning import projection_inits


@dataclasses.dataclass(frozen=True)
class Activation:
  """One `model.activation` choice.

  Attributes:
    fn: (x, cfg) -> act(x), elementwise.
    gated: the FFN multiplies act(x W_gate) by x W_in.
    gelu: a GELU (model.gelu_approximate chooses its form).
  """

  fn: Callable[[jax.Array, ModelConfig], jax.Array]
  gated: bool = False
  gelu: bool = False


def _gelu(x: jax.Array, cfg: ModelConfig) -> jax.Array:
  return jax.nn.gelu(x, approximate=cfg.gelu_approximate)


ACTIVATIONS.register("relu", Activation(lambda x, cfg: jax.nn.relu(x)))
ACTIVATIONS.register("gelu", Activation(_gelu, gelu=True))
ACTIVATIONS.register("swiglu", Activation(lambda x, cfg: jax.nn.silu(x), gated=True))
ACTIVATIONS.register("geglu", Activation(_gelu, gated=True, gelu=True))


class FeedForward(nn.Module):
  """`out(act(x W_in))`, or `out(act(x W_gate) * (x W_in))` when gated.

  Attributes:
    cfg: the model's config: its d_ff, activation,
      use_bias, dropout_rate and compute dtype.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    cfg = self.cfg
    activation = ACTIVATIONS[cfg.activation]
    dense = lambda features, axes, name: nn.Dense(
      features,
      use_bias=cfg.use_bias,
      dtype=jnp.dtype(cfg.dtype),
      **projection_inits(*axes),
      name=name,
    )
    # Recomputed in the backward pass from its input (saved anyway) instead
    # of saving its output and intermediates: elementwise, so the recompute
    # costs a read, where keeping it costs [B, T, F] per layer of memory.
    act = jax.checkpoint(lambda h: activation.fn(h, cfg))
    d_ff = derived(cfg.d_ff)
    into_hidden = (("embed",), ("mlp",))
    h_BxTxF = dense(d_ff, into_hidden, "wi")(x_BxTxD)
    if activation.gated:
      h_BxTxF = act(dense(d_ff, into_hidden, "gate")(x_BxTxD)) * h_BxTxF
    else:
      h_BxTxF = act(h_BxTxF)
    # Dropout on the hidden layer as in T5; the block adds residual dropout.
    h_BxTxF = nn.Dropout(cfg.dropout_rate)(h_BxTxF, deterministic=deterministic)
    return dense(x_BxTxD.shape[-1], (("mlp",), ("embed",)), "wo")(h_BxTxF)
