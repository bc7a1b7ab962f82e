"""The LSTM language model: the recurrent baseline family (model.family='lstm').

  tokens [B, T] -> Embedder (no positions) -> dropout
               -> L x (LSTM layer -> dropout) -> Norm -> the head (lm) -> logits [B, T, V]

Each layer is flax's `nn.OptimizedLSTMCell` (the gate equations are in its
docstring; Hochreiter & Schmidhuber 1997) run over the time axis by `nn.RNN`
(a linen scan), d_model units wide. Dropout acts on the non-recurrent
connections only (Zaremba et al. 2014). Embedding, final norm and head are
the Pre-LN Transformer decoder's own: the logits are tied to the token table
(scaled by 1/sqrt(D)) unless model.tie_embeddings is False. The norm matters
more here than there: an LSTM's outputs lie in (-1, 1), so without it tied
logits could not exceed sqrt(D) in size (2 layers of d_model 38, 100 steps
of 8 x 32 bytes of the corpus: validation loss 3.89 without the norm, 3.33
with it; a 2-layer d_model 32 Transformer of about as many parameters
3.33). `txf.layers.model_config.LSTM_FIELDS` lists the fields read here; the
others must keep their defaults.

Decoding follows the protocol of `txf.decode`: with use_cache=True each layer
starts from its carry (c, h), each [B, D] float32, in the 'cache' collection
and leaves its last carry there, so feeding a sequence in pieces gives the
logits of one full pass. Creating the cache (`init(..., use_cache=True)`)
leaves it at zeros, the carry a full pass starts from. Unlike a KV cache it
does not grow with the length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

import flax.linen as nn
import jax

from txf.layers import Embedder, Norm
from txf.layers.block import compute_dtype
from txf.layers.model_config import HEADS, ModelConfig

Array = jax.Array


class _CellInits(TypedDict):
  """The initializer keyword arguments of nn.OptimizedLSTMCell."""

  kernel_init: Callable[..., Any]
  recurrent_kernel_init: Callable[..., Any]
  bias_init: Callable[..., Any]


def _cell_inits() -> _CellInits:
  """flax's LSTM initializers (LeCun normal inputs, orthogonal recurrence, zero
  biases) with logical axes: kernels [in, D] are (embed, mlp), biases (mlp,)."""
  axes = ("embed", "mlp")
  return _CellInits(
    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes),
    recurrent_kernel_init=nn.with_logical_partitioning(nn.initializers.orthogonal(), axes),
    bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)),
  )


class LSTMLayer(nn.Module):
  """One LSTM layer over a sequence: [B, T, D_in] -> [B, T, D]."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: Array, *, use_cache: bool = False) -> Array:
    """[B, T, D_in] -> [B, T, D] (D = model.d_model).

    Args:
      x_BxTxD: the layer's inputs.
      use_cache: start from the carry in the 'cache' collection and store
        the last one there (decoding one step at a time).
    """
    cell = nn.OptimizedLSTMCell(
      self.cfg.d_model, dtype=compute_dtype(self.cfg), **_cell_inits(), name="cell"
    )
    carry = None  # None: nn.RNN starts from the cell's zero carry
    if use_cache:
      cached = self.variable(
        "cache", "carry", cell.initialize_carry, jax.random.key(0), x_BxTxD[:, 0].shape
      )
      carry = cached.value
    new_carry, y_BxTxD = nn.RNN(cell)(x_BxTxD, initial_carry=carry, return_carry=True)
    if use_cache and not self.is_initializing():
      cached.value = new_carry
    return y_BxTxD


class LSTMLanguageModel(nn.Module):
  """LSTM LM with the same call as `Decoder`: tokens [B, T] -> logits [B, T, V]."""

  cfg: ModelConfig

  @nn.compact
  def __call__(
    self, tokens_BxT: Array, *, deterministic: bool = True, use_cache: bool = False
  ) -> Array:
    """tokens [B, T] -> float32 logits [B, T, V].

    Args:
      tokens_BxT: int token ids [B, T].
      deterministic: False applies dropout (needs a 'dropout' rng).
      use_cache: continue from the layers' (c, h) carries in the 'cache'
        collection (see `txf.decode`).
    """
    cfg = self.cfg
    embedder = Embedder(cfg, name="embedder")
    dropout = nn.Dropout(cfg.dropout_rate)
    x_BxTxD = dropout(embedder(tokens_BxT, None), deterministic=deterministic)
    for i in range(cfg.num_layers):
      x_BxTxD = LSTMLayer(cfg, name=f"layer_{i}")(x_BxTxD, use_cache=use_cache)
      x_BxTxD = dropout(x_BxTxD, deterministic=deterministic)
    x_BxTxD = Norm(cfg, name="final_norm")(x_BxTxD)
    return HEADS[cfg.head].module(cfg, name="head")(x_BxTxD, tokens_BxT, embedder)
