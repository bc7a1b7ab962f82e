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
from txf.layers.projection import OutputProjection, stored_bias, with_bias


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


class _Projection(nn.Module):
  """`nn.Dense` without adding its bias: x W and the bias [F] (or None).

  The same parameters (`kernel` [D, F], `bias` [F]) and the same product as
  `nn.Dense`; the caller adds the bias inside the activation's recomputed
  region.

  Attributes:
    features: F.
    use_bias: whether there is a bias.
    dtype: the compute dtype.
  """

  features: int
  use_bias: bool
  dtype: jnp.dtype

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """[B, T, D] -> ([B, T, F], [F] or None), both in the compute dtype."""
    inits = projection_inits(("embed",), ("mlp",))
    kernel = self.param("kernel", inits["kernel_init"], (x_BxTxD.shape[-1], self.features))
    bias = self.param("bias", inits["bias_init"], (self.features,)) if self.use_bias else None
    y_BxTxF = jnp.dot(x_BxTxD.astype(self.dtype), kernel.astype(self.dtype))
    return y_BxTxF, None if bias is None else bias.astype(self.dtype)


class FeedForward(nn.Module):
  """`out(act(x W_in))`, or `out(act(x W_gate) * (x W_in))` when gated.

  Attributes:
    cfg: the model's config: its d_ff, activation,
      use_bias, dropout_rate and compute dtype.
  """

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self,
    x_BxTxD: jax.Array,
    *,
    deterministic: bool = True,
    add_bias: bool = True,
    residual_BxTxD: jax.Array | None = None,
  ) -> jax.Array:
    """[B, T, D] -> [B, T, D].

    add_bias: add the output projection's bias; False: leave it to the
    caller (`output_bias`; a Pre-LN block adds it in its next norm).
    residual_BxTxD: None, or the residual stream to add the output to (the
    output projection's kernel adds it at batch 1 on a GPU:
    `projection.adds_in_kernel`).
    """
    cfg = self.cfg
    activation = ACTIVATIONS[cfg.activation]
    dtype = jnp.dtype(cfg.dtype)
    d_ff = derived(cfg.d_ff)
    into_hidden = lambda name: _Projection(d_ff, cfg.use_bias, dtype, name=name)(x_BxTxD)

    # The hidden layer from the projections' products (bias included) is
    # recomputed in the backward pass instead of saving its output and
    # intermediates: elementwise, so the recompute costs a read, where keeping
    # it costs [B, T, F] per layer of memory. The biases are added inside, so
    # that only the GEMMs' outputs are kept: a biased copy kept for the
    # backward was one more [B, T, F] write per layer.
    def hidden(wi, gate):
      h_BxTxF = with_bias(*wi)
      if gate is None:
        return activation.fn(h_BxTxF, cfg)
      return activation.fn(with_bias(*gate), cfg) * h_BxTxF

    wi = into_hidden("wi")
    gate = into_hidden("gate") if activation.gated else None
    h_BxTxF = jax.checkpoint(hidden)(wi, gate)
    # Dropout on the hidden layer as in T5; the block adds residual dropout.
    h_BxTxF = nn.Dropout(cfg.dropout_rate)(h_BxTxF, deterministic=deterministic)
    # nn.Dense's parameters and sum; at batch 1 on a GPU one kernel, additions included.
    wo_shape = (h_BxTxF.shape[-1], x_BxTxD.shape[-1])
    wo = OutputProjection(wo_shape, ("mlp",), cfg.use_bias, dtype, name="wo")
    return wo(h_BxTxF, add_bias=add_bias, residual=residual_BxTxD)

  def output_bias(self) -> jax.Array | None:
    """The output projection's bias [D] as stored (float32), None without
    one: what a call with add_bias=False leaves out. Read after that call
    (which creates it at init)."""
    return stored_bias(self, "wo")
