"""Every public linen layer takes the model's ModelConfig and no field that
repeats it: built alone from a config, it holds the parameters the same
layer holds inside a model built from that config, and computes the same
output from them."""

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
)
from txf.layers.model_config import ModelConfig
from txf.models import build

CFG = ModelConfig(vocab_size=64, d_model=32, num_heads=4, num_layers=1, position="learned")
B, T = 2, 5
X = jax.random.normal(jax.random.key(1), (B, T, CFG.d_model))
POSITIONS_1xT = jnp.arange(T)[None]
TOKENS = jax.random.randint(jax.random.key(2), (B, T), 0, CFG.vocab_size)
BLOCK_ARGS = (X, POSITIONS_1xT, None, None, None, None, None)
NAMES = ("attention", "feedforward", "norm", "embedder", "block")


@pytest.fixture(scope="module")
def cases():
  """name -> (the layer alone, call args, kwargs, its parameters inside the
  model); a fixture, so collecting the tests builds no model."""
  model_params = nn.meta.unbox(build(CFG).init(jax.random.key(0), TOKENS)["params"])
  block = model_params["stack"]["block_0"]
  return {
    "attention": (
      MultiHeadAttention(CFG, causal=True),
      (X,),
      dict(q_positions_BxT=POSITIONS_1xT),
      block["self_attention"],
    ),
    "feedforward": (FeedForward(CFG), (X,), {}, block["ffn"]),
    "norm": (Norm(CFG), (3.0 * X + 1.0,), {}, block["ffn_norm"]),
    "embedder": (Embedder(CFG), (TOKENS, POSITIONS_1xT), {}, model_params["embedder"]),
    "block": (TransformerBlock(cfg=CFG, causal=True), BLOCK_ARGS, {}, block),
  }


@pytest.mark.parametrize("name", NAMES)
def test_a_layer_alone_holds_and_uses_the_models_parameters(name, cases):
  layer, args, kwargs, in_model = cases[name]
  alone = nn.meta.unbox(layer.init(jax.random.key(0), *args, **kwargs)["params"])
  assert jax.tree.map(jnp.shape, alone) == jax.tree.map(jnp.shape, in_model)
  # The model's own values in the layer alone: a function of them alone.
  first = layer.apply({"params": in_model}, *args, **kwargs)
  again = layer.apply({"params": jax.tree.map(jnp.copy, in_model)}, *args, **kwargs)
  for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(again), strict=True):
    np.testing.assert_array_equal(a, b)


def test_t5_table_has_the_configs_buckets_and_heads():
  cfg = CFG.replace(position="t5_bias", options=dict(t5_num_buckets=12))
  params = nn.meta.unbox(RelativePositionTable(cfg).init(jax.random.key(0))["params"])
  assert params["table"].shape == (12, cfg.num_heads)


def test_attention_kv_heads_follow_the_config():
  """num_kv_heads None means one key/value head per query head (MHA)."""
  mha = MultiHeadAttention(CFG.replace(num_heads=8, head_dim=8))
  params = nn.meta.unbox(mha.init(jax.random.key(0), X, q_positions_BxT=POSITIONS_1xT)["params"])
  assert params["key"]["kernel"].shape == (CFG.d_model, 8, 8)
  gqa = MultiHeadAttention(CFG.replace(num_heads=8, head_dim=8, num_kv_heads=2))
  params = nn.meta.unbox(gqa.init(jax.random.key(0), X, q_positions_BxT=POSITIONS_1xT)["params"])
  assert params["key"]["kernel"].shape == (CFG.d_model, 2, 8)
