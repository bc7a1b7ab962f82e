"""Position-wise feed-forward network: ReLU / GELU, or gated SwiGLU / GeGLU."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers.config import DEFAULTS, GATED_ACTIVATIONS
from txf.layers.partitioning import projection_inits

_ACTIVATIONS = {
  "relu": jax.nn.relu,
  "gelu": jax.nn.gelu,
  "swiglu": jax.nn.silu,
  "geglu": jax.nn.gelu,
}


class FeedForward(nn.Module):
  """`out(act(x W_in))`, or `out(act(x W_gate) * (x W_in))` when gated (Shazeer 2020).

  Only d_ff is required; the others default to ModelConfig's defaults.

  Attributes:
    d_ff: hidden width F.
    activation: relu | gelu | swiglu | geglu.
    gelu_approximate: gelu / geglu use GELU's tanh form (jax.nn.gelu's
      default); False: the exact erf form.
  """

  d_ff: int
  activation: str = DEFAULTS.activation
  use_bias: bool = DEFAULTS.use_bias
  dropout_rate: float = DEFAULTS.dropout_rate
  dtype: Any = jnp.dtype(DEFAULTS.dtype)
  gelu_approximate: bool = DEFAULTS.gelu_approximate

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, *, deterministic: bool = True) -> jax.Array:
    """[B, T, D] -> [B, T, D]."""
    if self.activation not in _ACTIVATIONS:
      raise ValueError(f"FeedForward.activation: {self.activation!r} not in {tuple(_ACTIVATIONS)}")
    dense = lambda features, axes, name: nn.Dense(
      features, use_bias=self.use_bias, dtype=self.dtype, **projection_inits(*axes), name=name
    )
    act = _ACTIVATIONS[self.activation]
    if act is jax.nn.gelu:
      act = functools.partial(jax.nn.gelu, approximate=self.gelu_approximate)
    # Recomputed in the backward pass from its input (saved anyway) instead
    # of saving its output and intermediates: elementwise, so the recompute
    # costs a read, where keeping it costs [B, T, F] per layer of memory.
    act = jax.checkpoint(act)
    into_hidden = (("embed",), ("mlp",))
    h_BxTxF = dense(self.d_ff, into_hidden, "wi")(x_BxTxD)
    if self.activation in GATED_ACTIVATIONS:
      h_BxTxF = act(dense(self.d_ff, into_hidden, "gate")(x_BxTxD)) * h_BxTxF
    else:
      h_BxTxF = act(h_BxTxF)
    # Dropout on the hidden layer as in T5; the block adds residual dropout.
    h_BxTxF = nn.Dropout(self.dropout_rate)(h_BxTxF, deterministic=deterministic)
    return dense(x_BxTxD.shape[-1], (("mlp",), ("embed",)), "wo")(h_BxTxF)
