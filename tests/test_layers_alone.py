"""Every public linen layer built from its essential sizes alone equals the
same layer built through ModelConfig (its defaults are ModelConfig's):
same attributes, and the same outputs from the same params and inputs."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.layers import (
  Embedder,
  FeedForward,
  MultiHeadAttention,
  Norm,
  RelativePositionTable,
  TransformerBlock,
  TransformerStack,
)
from txf.layers.block import compute_dtype
from txf.layers.config import ModelConfig

CFG = ModelConfig()
B, T = 2, 5
X = jax.random.normal(jax.random.key(1), (B, T, CFG.d_model))
POSITIONS_1xT = jnp.arange(T)[None]
TOKENS = jax.random.randint(jax.random.key(2), (B, T), 0, CFG.vocab_size)
BLOCK_ARGS = (X, POSITIONS_1xT, None, None, None, None, None)

# name -> (layer from its essential sizes, the layer through ModelConfig, call args, kwargs)
CASES = {
  "attention": (
    MultiHeadAttention(num_heads=CFG.num_heads, head_dim=CFG.head_dim),
    MultiHeadAttention(
      num_heads=CFG.num_heads,
      num_kv_heads=CFG.num_kv_heads,
      head_dim=CFG.head_dim,
      position=CFG.position,
      window=CFG.window,
      rope_base=CFG.rope_base,
      rope_scale=CFG.rope_scale,
      t5_max_distance=CFG.t5_max_distance,
      use_bias=CFG.use_bias,
      attention_dropout_rate=CFG.attention_dropout_rate,
      implementation=CFG.attention_impl,
      dtype=compute_dtype(CFG),
    ),
    (X,),
    dict(q_positions_BxT=POSITIONS_1xT),
  ),
  "feedforward": (
    FeedForward(d_ff=CFG.d_ff),
    FeedForward(
      CFG.d_ff,
      CFG.activation,
      use_bias=CFG.use_bias,
      dropout_rate=CFG.dropout_rate,
      dtype=compute_dtype(CFG),
      gelu_approximate=CFG.gelu_approximate,
    ),
    (X,),
    {},
  ),
  "norm": (Norm(), Norm(CFG.norm, CFG.norm_eps, compute_dtype(CFG)), (3.0 * X + 1.0,), {}),
  "embedder": (
    Embedder(vocab_size=CFG.vocab_size, d_model=CFG.d_model),
    Embedder(
      CFG.vocab_size,
      CFG.d_model,
      position=CFG.position,
      max_len=CFG.max_len,
      dtype=compute_dtype(CFG),
      num_token_types=CFG.num_token_types,
      norm=CFG.norm if CFG.embed_norm else None,
      norm_eps=CFG.norm_eps,
      scale_logits=CFG.scale_logits,
    ),
    (TOKENS, POSITIONS_1xT),
    {},
  ),
  "relative_table": (
    RelativePositionTable(num_heads=CFG.num_heads),
    RelativePositionTable(num_heads=CFG.num_heads, num_buckets=CFG.t5_num_buckets),
    (),
    {},
  ),
  "block": (TransformerBlock(), TransformerBlock(cfg=CFG, causal=False), BLOCK_ARGS, {}),
  "stack": (
    TransformerStack(),
    TransformerStack(cfg=CFG, num_layers=CFG.num_layers, causal=False),
    (X,),
    dict(q_positions_BxT=POSITIONS_1xT),
  ),
}


# None in a layer built alone: derived from its other sizes (tested below).
DERIVED = ("num_kv_heads", "num_layers")


def attributes(layer):
  """The layer's attributes, without flax's parent and name and the derived ones."""
  return {
    f.name: getattr(layer, f.name)
    for f in dataclasses.fields(layer)
    if f.name not in ("parent", "name") + DERIVED
  }


@pytest.mark.parametrize("name", CASES)
def test_layer_from_essential_sizes_matches_config_built_layer(name):
  alone, through_config, args, kwargs = CASES[name]
  assert attributes(alone) == attributes(through_config)
  variables = alone.init(jax.random.key(0), *args, **kwargs)
  shapes = lambda tree: jax.tree.map(jnp.shape, nn.meta.unbox(tree))
  assert shapes(through_config.init(jax.random.key(0), *args, **kwargs)) == shapes(variables)
  out = jax.tree.leaves(alone.apply(variables, *args, **kwargs))
  expected = jax.tree.leaves(through_config.apply(variables, *args, **kwargs))
  for got, want in zip(out, expected, strict=True):
    np.testing.assert_array_equal(got, want)


def test_stack_depth_defaults_to_the_config():
  params = TransformerStack(cfg=CFG.replace(num_layers=3)).init(
    jax.random.key(0), X, q_positions_BxT=POSITIONS_1xT
  )["params"]
  assert sorted(k for k in params if k.startswith("block_")) == ["block_0", "block_1", "block_2"]


def test_attention_kv_heads_default_to_query_heads():
  """num_kv_heads=None means one key/value head per query head (MHA)."""
  layer = MultiHeadAttention(num_heads=8, head_dim=8)
  params = layer.init(jax.random.key(0), X, q_positions_BxT=POSITIONS_1xT)["params"]
  assert nn.meta.unbox(params)["key"]["kernel"].shape == (CFG.d_model, 8, 8)
  gqa = MultiHeadAttention(num_heads=8, head_dim=8, num_kv_heads=2)
  gqa_params = gqa.init(jax.random.key(0), X, q_positions_BxT=POSITIONS_1xT)["params"]
  assert nn.meta.unbox(gqa_params)["key"]["kernel"].shape == (CFG.d_model, 2, 8)
