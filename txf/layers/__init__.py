"""Flax linen layers: parameters around the pure functions in `txf.ops`."""

from txf.layers.attention import MultiHeadAttention
from txf.layers.block import TransformerBlock, TransformerStack
from txf.layers.embedding import Embedder, RelativePositionTable
from txf.layers.feedforward import FeedForward
from txf.layers.inits import apply_init
from txf.layers.norm import Norm

__all__ = [
  "MultiHeadAttention",
  "TransformerBlock",
  "TransformerStack",
  "Embedder",
  "RelativePositionTable",
  "FeedForward",
  "apply_init",
  "Norm",
]
