"""`TransformerBlock` and `TransformerStack`: the shared body of every model.

A block is self-attention, an optional cross-attention and a feed-forward
network, each wrapped in a residual with Pre-LN or Post-LN placement. A stack
is N blocks (a Python loop or `nn.scan`, optionally rematerialised), the
stack-wide T5 relative-bias table and, for Pre-LN, a final norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers import positions
from txf.layers.attention import HEAD_MASK, MultiHeadAttention
from txf.layers.embedding import RelativePositionTable
from txf.layers.feedforward import FeedForward
from txf.layers.model_config import ModelConfig
from txf.layers.norm import Norm

Array = jax.Array

# Logical axes of the residual stream. Under `nn.logical_axis_rules` and a mesh
# (txf.train.sharding.activation_sharding) these become sharding constraints,
# so the compiler keeps activations split like the batch; elsewhere no-ops.
ACTIVATION_AXES = ("batch", "length", "embed")


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


class TransformerBlock(nn.Module):
  """One layer. Returns `(x, None)` so the same module runs under `nn.scan`.

  Attributes:
    cfg: model hyperparameters.
    causal: self-attention is causal (decoder side).
    has_cross: add a cross-attention sub-layer over `cross_x`.
    deterministic: no dropout.
    use_cache: self-attention uses the KV cache; cross-attention keeps the
      encoder output's keys/values there (read back when `cross_x` is None).
  """

  cfg: ModelConfig
  causal: bool = False
  has_cross: bool = False
  deterministic: bool = True
  use_cache: bool = False

  @nn.compact
  def __call__(
    self,
    x_BxTxD: Array,
    q_positions_BxT: Array,
    self_mask: Array | None,
    relative_table: Array | None,
    cache_index: Array | None,
    cross_x_BxSxD: Array | None,
    cross_mask: Array | None,
  ):
    cfg = self.cfg
    attention = lambda name, causal: MultiHeadAttention(
      cfg, causal=causal, cross=name == "cross_attention", name=name
    )

    self_attention = attention("self_attention", self.causal)
    x_BxTxD = self._residual(
      "self_attention",
      x_BxTxD,
      lambda h: self_attention(
        h,
        q_positions_BxT=q_positions_BxT,
        key_mask=self_mask,
        relative_table=relative_table,
        cache_index=cache_index,
        deterministic=self.deterministic,
        use_cache=self.use_cache,
      ),
    )
    if self.has_cross:
      cross_attention = attention("cross_attention", False)
      x_BxTxD = self._residual(
        "cross_attention",
        x_BxTxD,
        lambda h: cross_attention(
          h,
          cross_x_BxSxD,
          q_positions_BxT=q_positions_BxT,
          key_mask=cross_mask,
          deterministic=self.deterministic,
          use_cache=self.use_cache,
        ),
      )
    ffn = FeedForward(cfg, name="ffn")
    x_BxTxD = self._residual("ffn", x_BxTxD, lambda h: ffn(h, deterministic=self.deterministic))
    return nn.with_logical_constraint(x_BxTxD, ACTIVATION_AXES), None

  def _residual(self, name: str, x_BxTxD: Array, sublayer: Callable[[Array], Array]) -> Array:
    """Pre-LN: x + f(norm(x)). Post-LN: norm(x + f(x))."""
    norm = Norm(self.cfg, name=f"{name}_norm")
    dropout = nn.Dropout(self.cfg.dropout_rate)
    if self.cfg.norm_placement == "pre":
      return x_BxTxD + dropout(sublayer(norm(x_BxTxD)), deterministic=self.deterministic)
    return norm(x_BxTxD + dropout(sublayer(x_BxTxD), deterministic=self.deterministic))


class TransformerStack(nn.Module):
  """`num_layers` blocks plus the stack-wide pieces.

  Attributes:
    cfg: model hyperparameters.
    num_layers: depth N; None: cfg.num_layers.
    causal: decoder-side (causal) self-attention.
    has_cross: blocks attend to an encoder output.
  """

  cfg: ModelConfig
  num_layers: int | None = None
  causal: bool = False
  has_cross: bool = False

  @nn.compact
  def __call__(
    self,
    x_BxTxD: Array,
    *,
    q_positions_BxT: Array,
    self_mask: Array | None = None,
    cache_index: Array | None = None,
    cross_x_BxSxD: Array | None = None,
    cross_mask: Array | None = None,
    deterministic: bool = True,
    use_cache: bool = False,
    causal: bool | None = None,
  ) -> Array:
    """[B, T, D] embedded inputs -> [B, T, D] final hidden states.

    Args:
      q_positions_BxT: absolute positions of the inputs ([1, T] broadcasts).
      self_mask: bool mask for self-attention, broadcastable to [B, 1, T, T]
        (key padding [B, 1, 1, T], packed documents, a prefix LM's).
      cache_index: first free KV-cache slot (use_cache only).
      cross_x_BxSxD, cross_mask: encoder output and its padding mask [B, 1, 1, S]
        (under use_cache, None reads the cross-attention keys/values from the cache).
      deterministic: no dropout.
      use_cache: self-attention reads and writes the KV cache; cross-attention
        stores or reads its keys/values there.
      causal: this call's self-attention is causal; None: the stack's. False
        on a causal stack lets `self_mask` alone decide (a prefix LM's mask,
        causal after the prefix), with the same parameters.
    """
    cfg = self.cfg
    num_layers = cfg.num_layers if self.num_layers is None else self.num_layers
    x_BxTxD = nn.with_logical_constraint(x_BxTxD, ACTIVATION_AXES)
    relative_table = None
    if positions.encoding(cfg.position).table == "relative":
      relative_table = RelativePositionTable(cfg, name="relative_position")()
    block = TransformerBlock
    if cfg.remat:
      # Inside scan, CSE cannot merge the recomputation away, so it may stay off.
      block = nn.remat(block, prevent_cse=not cfg.scan_layers)
    block_args = (
      x_BxTxD,
      q_positions_BxT,
      self_mask,
      relative_table,
      cache_index,
      cross_x_BxSxD,
      cross_mask,
    )
    block_attrs: dict[str, Any] = dict(
      cfg=cfg,
      causal=self.causal if causal is None else causal,
      has_cross=self.has_cross,
      deterministic=deterministic,
      use_cache=use_cache,
    )
    if cfg.scan_layers:
      scanned = nn.scan(
        block,
        variable_axes={"params": 0, "cache": 0, "intermediates": 0, HEAD_MASK: 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * (len(block_args) - 1),
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
      )
      x_BxTxD, _ = scanned(**block_attrs, name="blocks")(*block_args)
    else:
      for i in range(num_layers):
        x_BxTxD, _ = block(**block_attrs, name=f"block_{i}")(x_BxTxD, *block_args[1:])
    if cfg.norm_placement == "pre":
      # Pre-LN leaves the residual stream unnormalised; Post-LN already ends in a norm.
      x_BxTxD = Norm(cfg, name="final_norm")(x_BxTxD)
    return x_BxTxD
