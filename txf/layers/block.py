"""`TransformerBlock` and `TransformerStack`: the shared body of every model.

A block is self-attention, an optional cross-attention and a feed-forward
network, each wrapped in a residual with Pre-LN or Post-LN placement. A stack
is N blocks (a Python loop or `nn.scan`, optionally rematerialised), the
stack-wide T5 relative-bias table and, for Pre-LN, a final norm.
"""

from __future__ import annotations

import math
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
from txf.layers.norm import Norm, stream_sum
from txf.layers.projection import adds_in_kernel, with_bias

Array = jax.Array

# Logical axes of the residual stream. Under `nn.logical_axis_rules` and a mesh
# (txf.train.sharding.activation_sharding) these become sharding constraints,
# so the compiler keeps activations split like the batch; elsewhere no-ops.
ACTIVATION_AXES = ("batch", "length", "embed")
# A sub-layer: its input h [B, T, D] -> (its output [B, T, D], the bias [D]
# of its output projection not yet added (float32, as stored), or None);
# called with residual_BxTxD=x -> (x + the output with its bias, None).
Sublayer = Callable[..., tuple[Array, Array | None]]
# A Pre-LN sub-layer's (output, bias) not yet added to the residual stream.
# Between unscanned blocks the last one is handed to the next block's first
# norm: the add is then part of that norm's kernel (forward and backward on
# a GPU) instead of an elementwise pass and a bias reduction of its own.
Pending = tuple[Array, Array | None]


def compute_dtype(cfg: ModelConfig):
  return jnp.dtype(cfg.dtype)


class TransformerBlock(nn.Module):
  """One layer. Returns `(x, None)` so the same module runs under `nn.scan`;
  with `hand_over`, `(x, pending)` (see `Pending`).

  Attributes:
    cfg: model hyperparameters.
    causal: self-attention is causal (decoder side).
    causal_positions: relative positions are a causal model's (None:
      `causal`; see MultiHeadAttention).
    has_cross: add a cross-attention sub-layer over `cross_x`.
    deterministic: no dropout.
    use_cache: self-attention uses the KV cache; cross-attention keeps the
      encoder output's keys/values there (read back when `cross_x` is None).
    hand_over: Pre-LN only: return the last sub-layer's output not yet added
      to the stream, for the next block's first norm (or the stack's final
      norm) to add (`pending`).
  """

  cfg: ModelConfig
  causal: bool = False
  causal_positions: bool | None = None
  has_cross: bool = False
  deterministic: bool = True
  use_cache: bool = False
  hand_over: bool = False

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
    pending: Pending | None = None,
  ):
    """`pending`: the previous block's handed-over output (Pre-LN), added to
    x by this block's first norm."""
    cfg = self.cfg
    attention = lambda name, causal: MultiHeadAttention(
      cfg,
      causal=causal,
      causal_positions=self.causal_positions,
      cross=name == "cross_attention",
      name=name,
    )

    # Each sub-layer as h -> (its output, the bias of its output projection
    # not yet added, or None): a Pre-LN block adds the two in the next norm.
    self_attention = attention("self_attention", self.causal)
    sublayers: list[tuple[str, Sublayer]] = [
      (
        "self_attention",
        lambda h, **stream: _bias_apart(
          self_attention,
          h,
          q_positions_BxT=q_positions_BxT,
          key_mask=self_mask,
          relative_table=relative_table,
          cache_index=cache_index,
          deterministic=self.deterministic,
          use_cache=self.use_cache,
          **stream,
        ),
      )
    ]
    if self.has_cross:
      cross_attention = attention("cross_attention", False)
      sublayers.append(
        (
          "cross_attention",
          lambda h, **stream: _bias_apart(
            cross_attention,
            h,
            cross_x_BxSxD,
            q_positions_BxT=q_positions_BxT,
            key_mask=cross_mask,
            deterministic=self.deterministic,
            use_cache=self.use_cache,
            **stream,
          ),
        )
      )
    ffn = FeedForward(cfg, name="ffn")
    sublayers.append(
      ("ffn", lambda h, **stream: _bias_apart(ffn, h, deterministic=self.deterministic, **stream))
    )
    if cfg.norm_placement == "pre":
      x_BxTxD, pending = self._pre_ln(x_BxTxD, pending, sublayers)
      if pending is not None and self.hand_over:
        f_BxTxD, bias_D = pending
        return _constrained(x_BxTxD), (_constrained(f_BxTxD), bias_D)
      if pending is not None:
        x_BxTxD = stream_sum(x_BxTxD, *pending)
    else:
      for name, sublayer in sublayers:
        x_BxTxD = self._post_ln(name, x_BxTxD, sublayer)
    return _constrained(x_BxTxD), None

  @property
  def _drops_residual(self) -> bool:
    """Whether residual dropout drops anything in this call."""
    return self.cfg.dropout_rate != 0.0 and not self.deterministic

  def _dropout(self, output: tuple[Array, Array | None]) -> tuple[Array, Array | None]:
    """Residual dropout on a sub-layer's (output, bias): the bias added first
    where the dropout drops anything."""
    f_BxTxD, bias_D = output
    if not self._drops_residual:
      return f_BxTxD, bias_D
    dropout = nn.Dropout(self.cfg.dropout_rate)
    return dropout(with_bias(f_BxTxD, bias_D), deterministic=False), None

  def _pre_ln(
    self, x_BxTxD: Array, pending: Pending | None, sublayers: list[tuple[str, Sublayer]]
  ) -> tuple[Array, Pending | None]:
    """x + f(norm(x)) for each sub-layer f in turn: (x, the last f's output
    and bias, not yet added), or (x with it added, None).

    Each output (the previous block's too, `pending`) is added to the stream
    by the next norm, which returns the sum with its norm (`Norm`'s add: on a
    GPU one kernel forward, and one backward that adds the stream's gradient
    too and sums the bias's). Where the output projections add a residual
    in their own kernel (`projection.adds_in_kernel`: a decoding step at
    batch 1 on a GPU) and no dropout applies, each sub-layer adds its output
    to the stream there instead, and the block hands nothing over: the same
    additions in the same order; the self-attention then takes its norm
    with the stream, for its kernel to compute where it can. Path patching
    (txf.analysis.patching) intercepts the first norm's call (never in such
    a decoding step, where the kernel may compute that norm instead).
    """
    rows = math.prod(x_BxTxD.shape[:-1])
    in_projection = adds_in_kernel(rows) and not self._drops_residual
    for name, sublayer in sublayers:
      norm = Norm(self.cfg, name=f"{name}_norm")
      if in_projection and pending is None and name == "self_attention":
        # Its GPU kernel may compute the norm too (MultiHeadAttention's `norm`).
        x_BxTxD = sublayer(x_BxTxD, norm=norm, residual_BxTxD=x_BxTxD)[0]
        continue
      if pending is None:
        h_BxTxD = norm(x_BxTxD)
      else:
        f_BxTxD, bias_D = pending
        x_BxTxD, h_BxTxD = norm(x_BxTxD, add=f_BxTxD, add_bias=bias_D, residual=True)
      if in_projection:
        x_BxTxD, pending = sublayer(h_BxTxD, residual_BxTxD=x_BxTxD)[0], None
      else:
        pending = self._dropout(sublayer(h_BxTxD))
    return x_BxTxD, pending

  def _post_ln(self, name: str, x_BxTxD: Array, sublayer: Sublayer) -> Array:
    """norm(x + f(x))."""
    norm = Norm(self.cfg, name=f"{name}_norm")
    return norm(x_BxTxD + with_bias(*self._dropout(sublayer(x_BxTxD))))


def _bias_apart(
  sublayer: MultiHeadAttention | FeedForward,
  *args,
  residual_BxTxD: Array | None = None,
  **kwargs,
) -> tuple[Array, Array | None]:
  """A sub-layer's (output without its output projection's bias, that bias
  or None); with `residual_BxTxD`, (that stream + the output with its bias,
  None)."""
  if residual_BxTxD is not None:
    return sublayer(*args, **kwargs, residual_BxTxD=residual_BxTxD), None
  return sublayer(*args, **kwargs, add_bias=False), sublayer.output_bias()


def _constrained(x_BxTxD: Array) -> Array:
  """x sharded as the residual stream (ACTIVATION_AXES) where a mesh is set."""
  return nn.with_logical_constraint(x_BxTxD, ACTIVATION_AXES)


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
      causal_positions=self.causal,  # the parameters' kind, whatever this call's mask
      has_cross=self.has_cross,
      deterministic=deterministic,
      use_cache=use_cache,
    )
    pending: Pending | None = None
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
      # Pre-LN blocks hand their last output over (`Pending`).
      hand_over = cfg.norm_placement == "pre"
      for i in range(num_layers):
        x_BxTxD, pending = block(**block_attrs, hand_over=hand_over, name=f"block_{i}")(
          x_BxTxD, *block_args[1:], pending
        )
    if cfg.norm_placement == "pre":
      # Pre-LN leaves the residual stream unnormalised; Post-LN already ends in a norm.
      f_BxTxD, bias_D = pending or (None, None)
      x_BxTxD = Norm(cfg, name="final_norm")(x_BxTxD, add=f_BxTxD, add_bias=bias_D)
    return x_BxTxD
