"""Pure jnp functions: attention, masks, positional encodings, norms, losses.

No parameters, no state: every function maps arrays to arrays and composes
with jit, vmap, grad and sharding. Layers in `txf.layers` hold the parameters
and call these.
"""

from txf.ops.attention import apply_attention_weights, attention_weights, dot_product_attention
from txf.ops.linear_attention import linear_attention_weights
from txf.ops.losses import (
  cross_entropy,
  cross_entropy_sums,
  linear_cross_entropy_sums,
  token_cross_entropy,
)
from txf.ops.masks import (
  causal_mask,
  combine_masks,
  padding_mask,
  prefix_lm_mask,
  segment_mask,
  sliding_window_mask,
)
from txf.ops.norms import layer_norm, rms_norm
from txf.ops.positional import (
  alibi_bias,
  alibi_slopes,
  apply_ntk_rope,
  apply_rope,
  last_bucket_start,
  relative_position_bias,
  relative_position_bucket,
  sinusoidal_embedding,
)

__all__ = [
  # attention
  "dot_product_attention",
  "attention_weights",
  "apply_attention_weights",
  "linear_attention_weights",
  # masks
  "causal_mask",
  "padding_mask",
  "prefix_lm_mask",
  "segment_mask",
  "sliding_window_mask",
  "combine_masks",
  # positional encodings
  "sinusoidal_embedding",
  "apply_rope",
  "apply_ntk_rope",
  "alibi_slopes",
  "alibi_bias",
  "relative_position_bucket",
  "last_bucket_start",
  "relative_position_bias",
  # norms
  "layer_norm",
  "rms_norm",
  # losses
  "cross_entropy",
  "cross_entropy_sums",
  "token_cross_entropy",
  "linear_cross_entropy_sums",
]
