"""Tests for the LSTM family (txf/models/lstm.py): config, numerics, decoding, counts.

The forward pass is compared with a float64 numpy LSTM written from the gate
equations (Hochreiter & Schmidhuber 1997, flax's parameter layout) on the
model's own parameters, atol 1e-5 on float32 logits of size O(1). Decoding
through the carry cache must reproduce the full pass (atol 1e-5: the same
float32 math, step by step). Parameter counts are exact integers. The initial
parameters are flax's LSTM initialisers, as lstm._cell_inits says: orthogonal
recurrent kernels (W^T W = I to 1e-5, float64 of the float32 values), zero
biases, LeCun-normal input kernels (std within 5 standard errors).
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import load_config
from numpy_references import normal_sample_checks, truncated_normal_std
from txf import decode
from txf.analysis import count_params, extrapolation, flops_per_token, matmul_params
from txf.layers.model_config import LSTM_FIELDS, ModelConfig
from txf.models import build
from txf.runconfig.run_config import parse
from txf.train import sharding

TINY = dict(family="lstm", vocab_size=50, d_model=12, num_layers=2, dropout_rate=0.3)
B, T = 2, 9


@functools.cache
def model_and_params(**overrides):
  cfg = ModelConfig(**{**TINY, **overrides})
  model = build(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), jnp.ones((1, 4), jnp.int32))
  return model, nn.meta.unbox(variables["params"])


def random_tokens(seed, shape):
  return jax.random.randint(jax.random.key(seed), shape, 1, TINY["vocab_size"])


@functools.partial(jax.jit, static_argnames=("model",))
def full_logits(model, params, tokens_BxT):
  return model.apply({"params": params}, tokens_BxT)


@functools.partial(jax.jit, static_argnames=("model",))
def cached_call(model, variables, tokens_BxT):
  """(logits, {'cache': ...}) of a use_cache=True call."""
  return model.apply(variables, tokens_BxT, use_cache=True, mutable=["cache"])


@functools.partial(jax.jit, static_argnames=("model",))
def dropout_logits(model, params, tokens_BxT, rng):
  return model.apply({"params": params}, tokens_BxT, deterministic=False, rngs={"dropout": rng})


# ---------------------------------------------------------------------------
# Config: the fields an LSTM reads, and the ones it refuses.


# A non-default value of each Transformer field.
INAPPLICABLE = dict(
  num_heads=8,
  num_kv_heads=2,
  head_dim=16,
  num_decoder_layers=2,
  d_ff=64,
  activation="relu",
  position="alibi",
  max_len=1024,
  norm_placement="post",
  use_bias=True,
  attention_dropout_rate=0.1,
  share_embeddings=False,
  window=8,
  num_classes=3,
  pooling="mean",
  attention_impl="xla",
  attention="linear",
  remat=True,
  scan_layers=True,
  gelu_approximate=False,
  init="gpt2",
  embed_norm=True,
  num_token_types=2,
  scale_attention=False,
)


def test_tied_logits_are_scaled_as_the_config_says():
  """scale_logits resolves to tie_embeddings, as a Transformer's; set False,
  the same parameters give logits sqrt(D) times larger (rtol 1e-5)."""
  assert ModelConfig(**TINY).scale_logits is True
  assert ModelConfig(**TINY, tie_embeddings=False).scale_logits is False
  model, params = model_and_params()
  unscaled = build(ModelConfig(**TINY, scale_logits=False))
  tokens = random_tokens(0, (2, 5))
  np.testing.assert_allclose(
    unscaled.apply({"params": params}, tokens),
    model.apply({"params": params}, tokens) * np.sqrt(TINY["d_model"]),
    rtol=1e-5,
    atol=1e-6,
  )


@pytest.mark.parametrize("field", sorted(INAPPLICABLE))
def test_inapplicable_field_is_refused_naming_it(field):
  with pytest.raises(
    ValueError,
    match=rf"^model\.{field}: does not apply to "
    r"model\.family='lstm'",
  ):
    ModelConfig(**TINY, **{field: INAPPLICABLE[field]})


@pytest.mark.parametrize("setting, value", [("rope_base", 500.0), ("rope_scale", 2.0)])
def test_a_setting_of_the_default_position_is_refused_naming_it(setting, value):
  """model.position keeps its default 'rope' on an LSTM, and so do rope's settings."""
  with pytest.raises(
    ValueError, match=rf"^model\.options\.{setting}: does not apply to model\.family='lstm'"
  ):
    ModelConfig(**TINY, options={setting: value})


def test_every_field_is_either_read_or_refused():
  fields = set(ModelConfig.__dataclass_fields__)
  assert set(LSTM_FIELDS) <= fields
  # The hand-written table above covers every Transformer field of today.
  assert set(INAPPLICABLE) | set(LSTM_FIELDS) == fields


def test_lstm_fields_are_free_of_transformer_constraints():
  # 38 units: no head count divides it, and the derived Transformer fields stay None.
  cfg = ModelConfig(
    **{**TINY, "d_model": 38, "dropout_rate": 0.1},
    norm="rms",
    norm_eps=1e-5,
    tie_embeddings=False,
    pad_id=3,
    dtype="bfloat16",
  )
  assert (cfg.d_model, cfg.num_kv_heads, cfg.head_dim, cfg.d_ff) == (38, None, None, None)


@pytest.mark.parametrize(
  "fields, named",
  [
    (dict(head="classify"), "model.head"),
    (dict(head="mlm"), "model.head"),
    (dict(dropout_rate=1.0), "model.dropout_rate"),
    (dict(pad_id=50), "model.pad_id"),
    (dict(d_model=0), "model.d_model"),
  ],
)
def test_bad_lstm_values_are_refused(fields, named):
  with pytest.raises(ValueError, match=rf"^{named}\b"):
    ModelConfig(**{**TINY, **fields})


def test_run_config_trains_lstm_on_lm_only():
  config = load_config("lstm")
  assert parse(config).model.family == "lstm"
  config.data.task = "mlm"
  with pytest.raises(ValueError, match=r"^model\.family: 'lstm' cannot train data\.task='mlm'"):
    parse(config)


# ---------------------------------------------------------------------------
# Parameters: logical axes, numerics against numpy.


def test_every_param_carries_logical_axes_and_shards():
  model = build(ModelConfig(**TINY))
  boxed = jax.eval_shape(model.init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  leaves = jax.tree_util.tree_leaves_with_path(
    boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)
  )
  assert len(leaves) == 2 * 12 + 3  # 8 kernels + 4 biases per layer; table, norm scale, bias
  for path, box in leaves:
    assert isinstance(box, nn.Partitioned) and len(box.names) == box.value.ndim, path
  kernel = boxed["layer_1"]["cell"]["hi"]["kernel"]
  assert tuple(kernel.names) == ("embed", "mlp")
  mesh = sharding.make_mesh(
    ml_collections.ConfigDict(dict(data=1, fsdp=1, tensor=1)), jax.devices()[:1]
  )
  sharding.param_shardings(boxed, mesh)  # raises for a parameter without axes


GATES = ("i", "f", "g", "o")  # flax's names: input, forget, cell candidate, output


def test_recurrent_kernels_are_orthogonal_per_gate():
  """Each gate's recurrent kernel h{i,f,g,o} [D, D] of each layer is drawn
  orthogonal on its own (flax's OptimizedLSTMCell draws one per gate, as
  LSTMCell does): W^T W = W W^T = I to 1e-5 in float64 of the float32 values,
  so the recurrence neither grows nor shrinks the carry at the start."""
  _, params = model_and_params()
  d = TINY["d_model"]
  for i in range(TINY["num_layers"]):
    for gate in GATES:
      kernel = np.asarray(params[f"layer_{i}"]["cell"][f"h{gate}"]["kernel"], np.float64)
      assert kernel.shape == (d, d)
      np.testing.assert_allclose(kernel.T @ kernel, np.eye(d), atol=1e-5, err_msg=f"{i} {gate}")
      np.testing.assert_allclose(kernel @ kernel.T, np.eye(d), atol=1e-5, err_msg=f"{i} {gate}")


def test_biases_start_at_zero_the_forget_gate_included():
  """Every gate's bias, the forget gate's included, is 0: lstm._cell_inits
  states flax's zero biases (not the forget-gate bias of 1 of Gers et al.
  2000 / Jozefowicz et al. 2015); the input kernels i{i,f,g,o} have none."""
  _, params = model_and_params()
  for i in range(TINY["num_layers"]):
    cell = params[f"layer_{i}"]["cell"]
    for gate in GATES:
      np.testing.assert_array_equal(cell[f"h{gate}"]["bias"], 0.0, err_msg=f"{i} {gate}")
      assert set(cell[f"i{gate}"]) == {"kernel"}


def test_input_kernels_are_lecun_normal():
  """The input kernels i{i,f,g,o} [D_in, D] of both layers (D_in = d_model:
  the embedding's width, then the layer below's) are LeCun normal, flax's
  variance_scaling(1, 'fan_in', 'truncated_normal'): std 1 / sqrt(D_in),
  no entry beyond 2 / sqrt(D_in) / (the truncated unit normal's std), and
  (unlike a uniform of that std) some beyond sqrt(3 / D_in). The 8 kernels
  pooled: 8 D^2 entries, the std measured to 5 standard errors (10 %)."""
  _, params = model_and_params()
  kernels = [
    np.asarray(params[f"layer_{i}"]["cell"][f"i{gate}"]["kernel"], np.float64)
    for i in range(TINY["num_layers"])
    for gate in GATES
  ]
  d = TINY["d_model"]
  assert all(kernel.shape == (d, d) for kernel in kernels)
  values = np.concatenate([np.ravel(kernel) for kernel in kernels])
  std = 1 / np.sqrt(d)
  normal_sample_checks(values, std, "input kernels")
  assert np.abs(values).max() <= 2 * std / truncated_normal_std(2.0) * (1 + 1e-6)
  assert np.abs(values).max() > np.sqrt(3) * std


def numpy_lstm_logits(params, cfg, tokens_BxT):
  """float64 reference: embedding, L LSTM layers, LayerNorm, tied logits / sqrt(D)."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  sigmoid = lambda z: 1 / (1 + np.exp(-z))
  table_VxD = p["embedder"]["token"]["embedding"]
  x_BxTxD = table_VxD[np.asarray(tokens_BxT)]
  for i in range(cfg.num_layers):
    cell = p[f"layer_{i}"]["cell"]
    gate = lambda name, x_BxD, h_BxD, cell=cell: (
      x_BxD @ cell[f"i{name}"]["kernel"]
      + h_BxD @ cell[f"h{name}"]["kernel"]
      + cell[f"h{name}"]["bias"]
    )
    c_BxD = h_BxD = np.zeros((x_BxTxD.shape[0], cfg.d_model))
    outputs = []
    for t in range(x_BxTxD.shape[1]):
      x_BxD = x_BxTxD[:, t]
      i, f = sigmoid(gate("i", x_BxD, h_BxD)), sigmoid(gate("f", x_BxD, h_BxD))
      g, o = np.tanh(gate("g", x_BxD, h_BxD)), sigmoid(gate("o", x_BxD, h_BxD))
      c_BxD = f * c_BxD + i * g
      h_BxD = o * np.tanh(c_BxD)
      outputs.append(h_BxD)
    x_BxTxD = np.stack(outputs, axis=1)
  mean = x_BxTxD.mean(-1, keepdims=True)
  var = ((x_BxTxD - mean) ** 2).mean(-1, keepdims=True)
  norm = p["final_norm"]
  y_BxTxD = (x_BxTxD - mean) / np.sqrt(var + cfg.norm_eps) * norm["scale"] + norm["bias"]
  return y_BxTxD @ table_VxD.T / np.sqrt(cfg.d_model)


def test_forward_matches_numpy_reference():
  model, params = model_and_params()
  tokens = random_tokens(0, (B, T))
  logits = full_logits(model, params, tokens)
  assert logits.shape == (B, T, TINY["vocab_size"]) and logits.dtype == jnp.float32
  reference = numpy_lstm_logits(params, model.cfg, tokens)
  assert np.abs(reference).max() > 0.5  # not a trivially small comparison
  np.testing.assert_allclose(logits, reference, atol=1e-5)


def test_dropout_only_in_training():
  model, params = model_and_params()
  tokens = random_tokens(1, (B, T))
  eval_a = full_logits(model, params, tokens)
  train = lambda seed: dropout_logits(model, params, tokens, jax.random.key(seed))
  assert not np.allclose(train(0), eval_a)
  np.testing.assert_array_equal(train(0), train(0))
  assert not np.allclose(train(0), train(1))


# ---------------------------------------------------------------------------
# Decoding: the carry is the cache.


def test_cache_is_the_carry_and_does_not_grow():
  model, _ = model_and_params()
  for length in (4, 40):
    cache = decode.init_cache(model, B, length)
    assert jax.tree.map(jnp.shape, cache) == {
      f"layer_{i}": {"carry": ((B, 12), (B, 12))} for i in range(2)
    }
    assert all(not np.any(leaf) for leaf in jax.tree.leaves(cache))
  assert jax.tree.leaves(decode.cache_batch_axes(model, 4)) == [0] * 4


@functools.partial(jax.jit, static_argnames=("model",))
def stepwise_logits(model, params, tokens_BxT):
  """Logits [B, T, V] from feeding the tokens one at a time through the cache."""
  tokens_to_logits = decode.make_tokens_to_logits(model, params)
  step = lambda cache, token_B: tokens_to_logits(token_B[:, None], cache)[::-1]
  cache = decode.init_cache(model, tokens_BxT.shape[0], tokens_BxT.shape[1])
  _, logits_TxBxV = jax.lax.scan(step, cache, tokens_BxT.T)
  return logits_TxBxV.transpose(1, 0, 2)


def test_cached_decoding_matches_full_pass():
  model, params = model_and_params()
  tokens = random_tokens(2, (B, T))
  np.testing.assert_allclose(
    stepwise_logits(model, params, tokens), full_logits(model, params, tokens), atol=1e-5
  )


def test_prefill_then_steps_match_full_pass():
  model, params = model_and_params()
  tokens = random_tokens(3, (B, T))
  variables = {"params": params, "cache": decode.init_cache(model, B, T)}
  pieces = []
  for start, stop in ((0, 4), (4, 5), (5, T)):  # two shapes: two compilations
    logits, cache = cached_call(model, variables, tokens[:, start:stop])
    variables = {"params": params, **cache}
    pieces.append(logits)
  np.testing.assert_allclose(
    jnp.concatenate(pieces, axis=1), full_logits(model, params, tokens), atol=1e-5
  )


def test_greedy_generation_matches_uncached_argmax():
  model, params = model_and_params()
  prompt = random_tokens(4, (B, 3))
  generated = decode.generate(model, params, prompt, max_new_tokens=T + 1 - 3)
  np.testing.assert_array_equal(generated[:, :3], prompt)
  # Token t is the argmax at position t - 1 of a full pass: a causal model's
  # logits there depend only on tokens 0..t-1.
  logits = full_logits(model, params, generated[:, :-1])
  np.testing.assert_array_equal(generated[:, 3:], jnp.argmax(logits[:, 2:], axis=-1))


def test_window_losses_score_an_lstm():
  # The extrapolation protocol takes any causal LM; an LSTM has no length limit.
  model, params = model_and_params()
  tokens = random_tokens(5, (1, 25))
  losses = extrapolation.window_losses(model, params, tokens, seq_len=8)
  logits = full_logits(model, params, tokens[:, :8])
  expected = -jax.nn.log_softmax(logits)[0, jnp.arange(8), tokens[0, 1:9]]
  np.testing.assert_allclose(losses.loss_BxN[0, 1:9], expected, rtol=1e-5)


# ---------------------------------------------------------------------------
# Parameter and FLOP counts.


@pytest.mark.parametrize(
  "overrides",
  [{}, dict(tie_embeddings=False, norm="rms", num_layers=3)],
  ids=["tied", "untied_rms"],
)
def test_counts_match_closed_form(overrides):
  cfg = ModelConfig(**{**TINY, **overrides})
  params = jax.eval_shape(build(cfg).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))
  D, V, L = cfg.d_model, cfg.vocab_size, cfg.num_layers
  per_layer = 4 * (D * D + D * D + D)  # per gate: input kernel, recurrent kernel, bias
  expected = {
    "embedding": V * D,
    "recurrent": L * per_layer,
    "norm": 2 * D if cfg.norm == "layer" else D,
    "head": 0 if cfg.tie_embeddings else D * V,
  }
  expected["total"] = sum(expected.values())
  assert count_params(params, cfg) == expected
  assert matmul_params(cfg) == L * 8 * D * D + D * V
  assert flops_per_token(cfg, 128) == flops_per_token(cfg, 4096) == 6.0 * (L * 8 * D * D + D * V)
