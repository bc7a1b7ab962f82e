"""Layers and models against float64 numpy references written from the papers.

Every reference below is independent of `txf.ops`: attention (with RoPE in the
rotate-half layout, ALiBi slopes, T5 relative buckets, sliding windows and
GQA/MQA head grouping), layer / RMS norm, the FFN activations, the embedder's
positions, the blocks' residual wiring, the stacks, the heads and whole models
are re-derived here in numpy, and then fed each layer's OWN initialised
parameters (biases, norm scales and position tables perturbed away from their
0 / 1 / ~0 initial values so that a missing or swapped one shows). The aim is
to catch wiring bugs: RoPE on q only, wrong GQA grouping, causal masks off by
one, dropped residuals, swapped norm placement, the wrong mask on
cross-attention, a missing 1/sqrt(D) on tied logits, the wrong pooled token.

Layers and attributes are built through `ModelConfig` and the models where
possible, and `MultiHeadAttention` with every attribute given explicitly, so
that a change of defaults does not silently change what is tested.

Tolerances: the layers run in float32 against float64 references on O(1)
inputs, so atol = 1e-5, rtol = 1e-4 (a handful of float32 roundings per
output, amplified at most a few times by norms and softmaxes).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from numpy_references import (
  f64,
  np_attention,
  np_block,
  np_dense,
  np_embed,
  np_gelu,
  np_norm,
  np_stack,
  np_tied_logits,
)
from txf.layers import Embedder, MultiHeadAttention, TransformerBlock, TransformerStack
from txf.models import ModelConfig, build
from txf.train.step import _apply_with_logits_in

TOL = dict(atol=1e-5, rtol=1e-4)
KEY = jax.random.PRNGKey(0)
B, D = 2, 16
PAD = 0
# Parameters whose initial values (0, 1, N(0, 0.02)) would hide a swapped or
# missing use; they get N(0, 0.5) noise. Kernels and tables keep their init.
PERTURBED = ("bias", "scale", "position_table", "token_type_table")
# The small model shared by the block, stack and model tests: GQA (2 of 4
# heads), an FFN width unrelated to D, biases on, T5 buckets and distance small
# enough that T <= 6 reaches the log-spaced buckets (and no bucket boundary
# falls on an exact float value).
TINY = dict(
  vocab_size=32,
  d_model=D,
  num_heads=4,
  num_kv_heads=2,
  head_dim=4,
  d_ff=24,
  num_layers=1,
  max_len=8,
  # rope's and t5_bias' settings (each model reads its position's).
  options=dict(rope_base=100.0, rope_scale=1.0, t5_num_buckets=8, t5_max_distance=10),
  norm_eps=1e-6,
  use_bias=True,
  pad_id=PAD,
)


def rand(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def tokens_with_padding(seed, lengths, total):
  """int32 [len(lengths), total]: real tokens in [1, 32) then PAD."""
  tokens = np.random.default_rng(seed).integers(1, 32, size=(len(lengths), total))
  tokens[np.arange(total)[None, :] >= np.asarray(lengths)[:, None]] = PAD
  return jnp.asarray(tokens, jnp.int32)


def valid_keys(lengths, total):
  """bool [B, S]: key j of row b is real iff j < lengths[b]."""
  return np.arange(total)[None, :] < np.asarray(lengths)[:, None]


def own_params(module, *args, **kwargs):
  """The module's initialised params (unboxed), PERTURBED leaves shifted."""
  params = nn.meta.unbox(module.init(KEY, *args, **kwargs)["params"])
  rng = np.random.default_rng(1)

  def perturb(path, x):
    if path[-1].key in PERTURBED:
      return x + 0.5 * rng.normal(size=x.shape).astype(np.float32)
    return x

  return jax.tree_util.tree_map_with_path(perturb, params)


def hidden_states(model, params, *inputs):
  """The output of the model's one TransformerStack, [B, T, D]."""
  _, state = model.apply(
    {"params": params},
    *inputs,
    mutable=["intermediates"],
    capture_intermediates=lambda mdl, _: isinstance(mdl, TransformerStack),
  )
  # Attention layers sow their weights into the same collection: keep only
  # the captured __call__ outputs.
  captured = [
    leaf
    for path, leaf in jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
    if any(getattr(key, "key", None) == "__call__" for key in path)
  ]
  assert len(captured) == 1, "expected exactly one TransformerStack"
  return np.asarray(captured[0], np.float64)


# ---------------------------------------------------------------------------
# MultiHeadAttention.

# Every attribute, so that the layer under test never depends on a default.
ATTENTION_ATTRIBUTES = dict(
  num_heads=4,
  num_kv_heads=2,
  head_dim=4,
  position="none",
  causal=False,
  bidirectional_bias=True,
  window=None,
  rope_base=100.0,
  rope_scale=1.0,
  t5_max_distance=20,  # past the 16 exact buckets of a causal stack of 32
  use_bias=True,
  attention_dropout_rate=0.0,
  implementation=None,
  dtype=jnp.float32,
  scale=None,
  attention="softmax",
)


def attention_case(name, kv_len=None, **changes):
  """A pytest param: (MultiHeadAttention attributes, key length for cross-attention)."""
  return pytest.param({**ATTENTION_ATTRIBUTES, **changes}, kv_len, id=name)


ATTENTION_CASES = [
  # Every position kind, causal and bidirectional, GQA (2 kv heads of 4).
  *(
    attention_case(
      f"{position}-{'causal' if causal else 'bidirectional'}",
      position=position,
      causal=causal,
      bidirectional_bias=not causal,
    )
    for position in ("rope", "alibi", "t5_bias", "none")
    for causal in (False, True)
  ),
  # Non-power-of-two ALiBi slopes (6 heads, 3 kv heads).
  attention_case(
    "alibi-6-heads",
    position="alibi",
    num_heads=6,
    num_kv_heads=3,
    causal=True,
    bidirectional_bias=False,
  ),
  attention_case(
    "mqa-rope-interpolated",
    position="rope",
    num_kv_heads=1,
    causal=True,
    bidirectional_bias=False,
    rope_scale=2.0,
  ),
  attention_case("mha-t5-no-bias", position="t5_bias", num_kv_heads=4, use_bias=False),
  # Row 1's last query sees only padded keys in this window: a zero output.
  attention_case("window-bidirectional", position="alibi", window=2),
  attention_case("window-causal", position="rope", window=3, causal=True, bidirectional_bias=False),
  attention_case("cross", kv_len=6),
  attention_case("cross-mqa-no-bias", kv_len=3, num_kv_heads=1, use_bias=False),
  # As many key/value heads as query heads: the keys and values come from
  # kv, not from x, even where kv has x's shape (T = S = 5).
  attention_case("cross-mha", kv_len=6, num_kv_heads=4),
  attention_case("cross-mha-same-shape", kv_len=5, num_kv_heads=4),
  # T5: no 1/sqrt(Dh) on the scores.
  attention_case("t5-unscaled", position="t5_bias", use_bias=False, scale=1.0),
  # Linear attention: causal GQA with RoPE, a bidirectional window, cross.
  attention_case("linear-rope-causal", attention="linear", causal=True, bidirectional_bias=False),
  attention_case("linear-window-bidirectional", attention="linear", position="none", window=2),
  attention_case("linear-cross-mqa", attention="linear", kv_len=6, num_kv_heads=1),
  attention_case("linear-cross-mha", attention="linear", kv_len=5, num_kv_heads=4),
]


def attention_layer(spec, cross):
  """The MultiHeadAttention the reference's `spec` describes."""
  fields = ("num_heads", "num_kv_heads", "head_dim", "position", "window", "use_bias")
  fields += ("attention_dropout_rate", "attention")
  settings = ("rope_base", "rope_scale", "t5_max_distance")  # model.options
  cfg = ModelConfig(
    d_model=D,
    **{name: spec[name] for name in fields},
    options={name: spec[name] for name in settings},
    attention_impl=spec["implementation"],
    scale_attention=spec["scale"] is None,
  )
  assert spec["bidirectional_bias"] == (not spec["causal"]) and spec["dtype"] == jnp.float32
  return MultiHeadAttention(cfg, causal=spec["causal"], cross=cross)


@pytest.mark.parametrize("spec,kv_len", ATTENTION_CASES)
def test_attention_matches_numpy(spec, kv_len):
  T = 5
  layer = attention_layer(spec, cross=kv_len is not None)
  x = rand(2, B, T, D)
  kv = None if kv_len is None else rand(3, B, kv_len, D)
  S = T if kv_len is None else kv_len
  key_valid = valid_keys([S, S - 2], S)  # row 1's last two keys are padding
  table = rand(4, 8, spec["num_heads"]) if spec["position"] == "t5_bias" else None
  call = dict(
    q_positions_BxT=jnp.arange(T)[None],
    key_mask=jnp.asarray(key_valid)[:, None, None],
    relative_table=table,
    deterministic=True,
  )
  params = own_params(layer, x, kv, **call)
  assert params["key"]["kernel"].shape == (D, spec["num_kv_heads"], spec["head_dim"])
  x64 = x.astype(np.float64)
  expected = np_attention(
    f64(params),
    x64,
    x64 if kv is None else kv.astype(np.float64),
    key_valid,
    spec,
    None if table is None else table.astype(np.float64),
  )
  np.testing.assert_allclose(layer.apply({"params": params}, x, kv, **call), expected, **TOL)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_cross_attention_to_an_input_of_another_width_and_length_matches_numpy(num_kv_heads):
  """Keys and values projected from kv [B, 7, 12], queries from x [B, 5, 16]:
  each projection's kernel takes its own input's width."""
  spec = {**ATTENTION_ATTRIBUTES, "num_kv_heads": num_kv_heads}
  layer = attention_layer(spec, cross=True)
  x, kv = rand(2, B, 5, D), rand(3, B, 7, 12)
  key_valid = valid_keys([7, 4], 7)
  call = dict(q_positions_BxT=jnp.arange(5)[None], key_mask=jnp.asarray(key_valid)[:, None, None])
  params = own_params(layer, x, kv, **call)
  assert params["query"]["kernel"].shape == (D, 4, 4)
  assert params["key"]["kernel"].shape == params["value"]["kernel"].shape == (12, num_kv_heads, 4)
  expected = np_attention(f64(params), x.astype(np.float64), kv.astype(np.float64), key_valid, spec)
  np.testing.assert_allclose(layer.apply({"params": params}, x, kv, **call), expected, **TOL)


def test_cross_attention_ignores_the_configs_window():
  """model.window is the self-attention's: a cross-attention layer of a
  windowed config attends every unpadded source position (window 1 would
  leave query t the source position t alone)."""
  spec = {**ATTENTION_ATTRIBUTES, "window": 1}
  layer = attention_layer(spec, cross=True)
  x, kv = rand(2, B, 5, D), rand(3, B, 6, D)
  key_valid = valid_keys([6, 4], 6)
  call = dict(q_positions_BxT=jnp.arange(5)[None], key_mask=jnp.asarray(key_valid)[:, None, None])
  # Jitted: eager, each operation compiles on its own (a second or two).
  params = nn.meta.unbox(jax.jit(layer.init)(KEY, x, kv, **call)["params"])
  got = jax.jit(layer.apply)({"params": params}, x, kv, **call)
  x64, kv64 = x.astype(np.float64), kv.astype(np.float64)
  expected = np_attention(f64(params), x64, kv64, key_valid, {**spec, "window": None})
  np.testing.assert_allclose(got, expected, **TOL)


def test_attention_dropout_drops_in_training_only():
  """attention_dropout_rate 0.5: a deterministic call (evaluation, decoding)
  gives the reference's output with no dropout rng; a training call drops
  weights, so its output is another."""
  spec = {**ATTENTION_ATTRIBUTES, "attention_dropout_rate": 0.5}
  layer = attention_layer(spec, cross=False)
  x = rand(2, B, 5, D)
  call = dict(q_positions_BxT=jnp.arange(5)[None])
  params = nn.meta.unbox(jax.jit(layer.init)(KEY, x, **call)["params"])
  x64 = x.astype(np.float64)
  expected = np_attention(f64(params), x64, x64, np.ones((B, 5), bool), spec)
  apply = jax.jit(layer.apply, static_argnames="deterministic")
  evaluated = apply({"params": params}, x, **call, deterministic=True)
  np.testing.assert_allclose(evaluated, expected, **TOL)
  rngs = {"dropout": jax.random.key(1)}
  trained = apply({"params": params}, x, **call, deterministic=False, rngs=rngs)
  assert np.max(np.abs(trained - expected)) > 0.1


def test_a_head_mask_scales_each_heads_output():
  """A 'head_mask' collection's mask [H] (txf.analysis.ablation) scales head
  h's output by entry h before the output projection: the reference with
  the output kernel's rows of head h scaled alike (GQA, 4 heads; an
  asymmetric mask, so that another head order shows)."""
  layer = attention_layer(ATTENTION_ATTRIBUTES, cross=False)
  x = rand(2, B, 5, D)
  call = dict(q_positions_BxT=jnp.arange(5)[None])
  params = nn.meta.unbox(jax.jit(layer.init)(KEY, x, **call)["params"])
  mask_H = np.array([1.0, 0.0, 0.5, 0.0], np.float32)
  got = jax.jit(layer.apply)({"params": params, "head_mask": {"mask": mask_H}}, x, **call)
  p = f64(params)
  p["out"]["kernel"] = p["out"]["kernel"] * mask_H[:, None, None]
  x64 = x.astype(np.float64)
  expected = np_attention(p, x64, x64, np.ones((B, 5), bool), ATTENTION_ATTRIBUTES)
  np.testing.assert_allclose(got, expected, **TOL)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_projections_of_different_inputs_are_each_their_own_inputs(num_kv_heads):
  """`project` of three different arrays (path patching feeds it so) with
  as many heads or fewer: each of q, k, v is its own input's projection,
  whichever projections share a head count (float32 against float64, TOL)."""
  layer = attention_layer({**ATTENTION_ATTRIBUTES, "num_kv_heads": num_kv_heads}, cross=False)
  x = rand(2, B, 5, D)
  call = dict(q_positions_BxT=jnp.arange(5)[None])
  params = own_params(layer, x, **call)
  inputs = [rand(seed, B, 5, D) for seed in (4, 5, 6)]  # same shapes: only the values differ
  projected = []

  def feed_inputs(next_fun, args, kwargs, context):
    """Self-attention's project(x, x, x) made project(*inputs), as path patching does."""
    if context.method_name != "project":
      return next_fun(*args, **kwargs)
    projected.extend(next_fun(*inputs))
    return tuple(projected)

  with nn.intercept_methods(feed_inputs):
    layer.apply({"params": params}, x, **call)
  assert len(projected) == 3
  for name, x_BxTxD, y_BxTxNxDh in zip(("query", "key", "value"), inputs, projected):
    expected = np_dense(x_BxTxD.astype(np.float64), f64(params)[name])
    np.testing.assert_allclose(y_BxTxNxDh, expected, **TOL, err_msg=name)


# ---------------------------------------------------------------------------
# TransformerBlock.

# The full product of placement x norm x cross-attention, each activation
# appearing under both placements.
BLOCK_CASES = [
  ("pre", "layer", False, "relu"),
  ("pre", "rms", True, "gelu"),
  ("pre", "layer", True, "swiglu"),
  ("pre", "rms", False, "geglu"),
  ("post", "rms", False, "relu"),
  ("post", "layer", True, "gelu"),
  ("post", "rms", True, "swiglu"),
  ("post", "layer", False, "geglu"),
]


def make_block(cfg, *, causal, has_cross):
  return TransformerBlock(
    cfg=cfg, causal=causal, has_cross=has_cross, deterministic=True, use_cache=False
  )


@pytest.mark.parametrize("placement,norm,has_cross,activation", BLOCK_CASES)
def test_block_matches_numpy(placement, norm, has_cross, activation):
  """A decoder-side block (causal, attending to a padded source) with
  cross-attention, an encoder-side block (bidirectional, padded) without."""
  cfg = ModelConfig(
    **TINY, position="rope", norm=norm, norm_placement=placement, activation=activation
  )
  T, S = 5, 6
  x = 2.0 * rand(5, B, T, D) + 1.0  # far from normalised, so a missing norm shows
  if has_cross:
    self_valid, self_mask = np.ones((B, T), bool), None
    cross, cross_valid = rand(6, B, S, D), valid_keys([S, 4], S)
    cross_mask = jnp.asarray(cross_valid)[:, None, None]
  else:
    self_valid, cross, cross_valid, cross_mask = valid_keys([T, 3], T), None, None, None
    self_mask = jnp.asarray(self_valid)[:, None, None]
  block = make_block(cfg, causal=has_cross, has_cross=has_cross)
  args = (x, jnp.arange(T)[None], self_mask, None, None, cross, cross_mask)
  params = own_params(block, *args)
  out, _ = block.apply({"params": params}, *args)
  expected = np_block(
    f64(params),
    x.astype(np.float64),
    cfg,
    causal=has_cross,
    self_valid=self_valid,
    cross=None if cross is None else cross.astype(np.float64),
    cross_valid=cross_valid,
  )
  np.testing.assert_allclose(out, expected, **TOL)


# ---------------------------------------------------------------------------
# TransformerStack.


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_stack_matches_numpy(placement):
  """Two padded encoder blocks sharing one T5 table; Pre-LN adds the final norm."""
  cfg = ModelConfig(**TINY, position="t5_bias", norm_placement=placement)
  T = 6
  stack = TransformerStack(cfg=cfg, num_layers=2, causal=False, has_cross=False)
  x = rand(7, B, T, D)
  valid = valid_keys([T, 4], T)
  call = dict(q_positions_BxT=jnp.arange(T)[None], self_mask=jnp.asarray(valid)[:, None, None])
  params = own_params(stack, x, **call)
  assert ("final_norm" in params) == (placement == "pre")
  expected = np_stack(f64(params), x.astype(np.float64), cfg, 2, causal=False, self_valid=valid)
  np.testing.assert_allclose(stack.apply({"params": params}, x, **call), expected, **TOL)


# ---------------------------------------------------------------------------
# Embedder.


@pytest.mark.parametrize(
  "position,bert_style",
  [("learned", False), ("sinusoidal", False), ("none", False), ("learned", True)],
)
def test_embedder_and_tied_logits_match_numpy(position, bert_style):
  """bert_style: token types, a LayerNorm on the sum and unscaled tied logits."""
  extra = dict(
    family="encoder", head="mlm", num_token_types=3, embed_norm=True, norm="layer",
    norm_eps=1e-12, scale_logits=False,
  )  # fmt: skip
  embedder = Embedder(
    ModelConfig(
      vocab_size=32, d_model=D, num_heads=2, position=position, max_len=8,
      **(extra if bert_style else {}),
    )
  )  # fmt: skip
  tokens = tokens_with_padding(8, [5, 3], 5)
  positions = np.arange(2, 7)  # not 0..T-1: the positions given must be the ones used
  types = (
    jnp.asarray(np.random.default_rng(8).integers(0, 3, size=tokens.shape)) if bert_style else None
  )
  params = own_params(embedder, tokens, jnp.asarray(positions)[None], types)
  p = f64(params)
  embedded = embedder.apply({"params": params}, tokens, jnp.asarray(positions)[None], types)
  norm = dict(norm="layer", eps=1e-12) if bert_style else {}
  np.testing.assert_allclose(
    embedded, np_embed(p, tokens, positions, position, types, **norm), **TOL
  )
  x = rand(9, B, 5, D)
  np.testing.assert_allclose(
    embedder.apply({"params": params}, x, method=Embedder.attend),
    np_tied_logits(p, x.astype(np.float64), scaled=not bert_style),
    **TOL,
  )


def test_bfloat16_embedder_accumulates_the_token_gradient_in_float32():
  """A bf16 model's token-table gradient sums each id's rows in float32: on
  text's few frequent ids a bf16 sum would be off by about 1% (and, on a
  GPU, slow). Reference: the float64 sum of the bf16 cotangent's rows."""
  embedder = Embedder(
    ModelConfig(vocab_size=32, d_model=D, num_heads=2, position="none", dtype="bfloat16")
  )
  rng = np.random.default_rng(10)
  tokens = jnp.asarray(rng.choice([3, 7, 11], size=(8, 256), p=[0.7, 0.2, 0.1]))
  cotangent = jnp.asarray(rng.normal(size=(8, 256, D)), jnp.bfloat16)
  params = own_params(embedder, tokens, None)
  _, pull = jax.vjp(lambda p: embedder.apply({"params": p}, tokens, None), params)
  (grad,) = pull(cotangent)
  expected = np.zeros((32, D))
  rows = np.asarray(cotangent, np.float64).reshape(-1, D)
  np.add.at(expected, np.asarray(tokens).reshape(-1), rows)
  assert grad["token"]["embedding"].dtype == jnp.float32
  np.testing.assert_allclose(grad["token"]["embedding"], expected, rtol=1e-5, atol=1e-4)


# ---------------------------------------------------------------------------
# Whole models.


@pytest.mark.parametrize(
  "position,tied,attention",
  [
    *(
      (position, True, "softmax")
      for position in ("sinusoidal", "learned", "rope", "alibi", "t5_bias", "none")
    ),
    ("rope", False, "softmax"),
    ("rope", True, "linear"),
  ],
)
def test_decoder_matches_numpy(position, tied, attention):
  """Embedding -> causal stack -> logits; padding is an ordinary token to a decoder."""
  cfg = ModelConfig(
    **TINY, family="decoder", position=position, tie_embeddings=tied, attention=attention
  )
  model = build(cfg)
  tokens = tokens_with_padding(10, [6, 4], 6)
  params = own_params(model, tokens)
  p = f64(params)
  positions = np.arange(6)
  x = np_stack(
    p["stack"],
    np_embed(p["embedder"], tokens, positions, position),
    cfg,
    cfg.num_layers,
    causal=True,
  )
  if tied:
    assert "head" not in p
    expected = np_tied_logits(p["embedder"], x)
  else:
    expected = x @ p["head"]["logits"]["kernel"]
  np.testing.assert_allclose(model.apply({"params": params}, tokens), expected, **TOL)


def test_an_untied_head_scales_its_logits_as_the_config_says():
  # Every untied reference case was unscaled: a head ignoring scale_logits
  # there passed (and the fused loss, which scales, disagreed with it).
  cfg = ModelConfig(
    **TINY, family="decoder", position="rope", tie_embeddings=False, scale_logits=True
  )
  model = build(cfg)
  tokens = tokens_with_padding(15, [6, 4], 6)
  params = own_params(model, tokens)
  p = f64(params)
  x = np_stack(
    p["stack"], np_embed(p["embedder"], tokens, np.arange(6), "rope"), cfg, cfg.num_layers,
    causal=True,
  )  # fmt: skip
  expected = x @ p["head"]["logits"]["kernel"] / np.sqrt(cfg.d_model)
  np.testing.assert_allclose(model.apply({"params": params}, tokens), expected, **TOL)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("scale_logits", [True, False])
def test_lm_head_gives_logits_in_the_compute_dtype_when_asked(tied, scale_logits):
  """The logits the train step's GPU loss kernel reads (the LM head's dtype,
  set by the step's interceptor): bf16, and without scale_logits the float32
  logits' own bf16 values (the head's GEMM output before its upcast); with
  it, within bf16 rounding (x / sqrt(D) is rounded to bf16 before the
  projection instead of the float32 logits divided; exact here, where
  sqrt(D) = 4): 2^-7 of the largest."""
  cfg = ModelConfig(
    **TINY, family="decoder", tie_embeddings=tied, scale_logits=scale_logits, dtype="bfloat16"
  )
  model = build(cfg)
  tokens = tokens_with_padding(11, [6, 4], 6)
  params = own_params(model, tokens)
  logits = model.apply({"params": params}, tokens)
  compute = _apply_with_logits_in(jnp.bfloat16, model.apply, {"params": params}, tokens)
  assert logits.dtype == jnp.float32 and compute.dtype == jnp.bfloat16
  got, want = np.asarray(compute, np.float64), np.asarray(logits, np.float64)
  if scale_logits:
    np.testing.assert_allclose(got, want, atol=2.0**-7 * np.abs(want).max())
  else:
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("style", ["tied", "t5_v1_1", "unshared"])
def test_encoder_decoder_matches_numpy(style):
  """Padded source through the encoder; the causal decoder cross-attends to it
  under the source's padding mask; one shared embedding table and a tied
  output; or T5 v1.1's options: unscaled attention, RMS norm, gated tanh-GELU
  FFN, an untied output without scaling; or a table each ('unshared'), the
  decoder's tied to the output (its head read the encoder's unnoticed)."""
  t5_v1_1 = dict(
    use_bias=False, norm="rms", activation="geglu", scale_attention=False, tie_embeddings=False
  )
  cfg = ModelConfig(
    **{**TINY, **(t5_v1_1 if style == "t5_v1_1" else {})},
    family="encoder_decoder",
    position="t5_bias",
    share_embeddings=style != "unshared",
  )
  assert cfg.scale_logits == (style != "t5_v1_1")
  target_table = "decoder_embedder" if style == "unshared" else "encoder_embedder"
  model = build(cfg)
  source = tokens_with_padding(11, [6, 3], 6)
  target = tokens_with_padding(12, [4, 4], 4)
  params = own_params(model, source, target)
  p = f64(params)
  source_valid = np.asarray(source) != PAD
  encoded = np_stack(
    p["encoder"],
    np_embed(p["encoder_embedder"], source, np.arange(6), "none"),
    cfg,
    cfg.num_layers,
    causal=False,
    self_valid=source_valid,
  )
  decoded = np_stack(
    p["decoder"],
    np_embed(p[target_table], target, np.arange(4), "none"),
    cfg,
    cfg.num_layers,
    causal=True,
    cross=encoded,
    cross_valid=source_valid,
  )
  expected = (
    np_tied_logits(p[target_table], decoded)
    if cfg.tie_embeddings
    else decoded @ p["head"]["logits"]["kernel"]
  )
  np.testing.assert_allclose(model.apply({"params": params}, source, target), expected, **TOL)


def np_pool(h, valid, pooling):
  """[B, T, D] hidden states, valid bool [B, T] -> [B, D] over real tokens."""
  if pooling == "cls":
    return h[:, 0]
  if pooling == "last":
    return np.stack([h[b, np.flatnonzero(valid[b])[-1]] for b in range(h.shape[0])])
  rows = [h[b, valid[b]] for b in range(h.shape[0])]
  reduce = np.mean if pooling == "mean" else np.max
  return np.stack([reduce(row, axis=0) for row in rows])


@pytest.mark.parametrize(
  "family,pooling",
  [
    ("encoder", "cls"),
    ("encoder", "mean"),
    ("encoder", "max"),
    ("encoder", "last"),
    ("decoder", "last"),
  ],
)
def test_classification_head_matches_numpy(family, pooling):
  """Pooling of the stack's hidden states over the real tokens, then the dense classifier."""
  cfg = ModelConfig(**TINY, family=family, head="classify", pooling=pooling, num_classes=3)
  model = build(cfg)
  tokens = tokens_with_padding(13, [6, 4], 6)
  params = own_params(model, tokens)
  p = f64(params)
  h = hidden_states(model, params, tokens)
  valid = np.asarray(tokens) != PAD
  pooled = {kind: np_pool(h, valid, kind) for kind in ("cls", "mean", "max", "last")}
  for other, reference in pooled.items():
    if other != pooling:  # the references themselves tell the poolings apart
      assert np.max(np.abs(reference - pooled[pooling])) > 1e-3, other
  expected = np_dense(pooled[pooling], p["head"]["classifier"])
  np.testing.assert_allclose(model.apply({"params": params}, tokens), expected, **TOL)


def np_mlm_head(p, x, cfg, p_embedder):
  """BERT's MLM head: dense, GELU, norm, then the tied projection plus a bias."""
  h = np_gelu(np_dense(x, p["transform"]), cfg.gelu_approximate)
  h = np_norm(p["norm"], h, cfg.norm, cfg.norm_eps)
  return np_tied_logits(p_embedder, h, scaled=cfg.scale_logits) + p["bias"]


@pytest.mark.parametrize("head, scale_logits", [("mlm", False), ("none", False), ("mlm", True)])
def test_bert_style_encoder_matches_numpy(head, scale_logits):
  """The options BERT needs, together: token types, a LayerNorm on the
  embedding, Post-LN, exact-erf GELU, unscaled tied logits; head='none'
  returns the hidden states; scaled tied logits, an encoder's default (an
  MLM head that never scaled passed)."""
  cfg = ModelConfig(
    **{**TINY, "norm_eps": 1e-12},
    family="encoder",
    head=head,
    position="learned",
    norm_placement="post",
    embed_norm=True,
    num_token_types=2,
    gelu_approximate=False,
    scale_logits=scale_logits,
  )
  model = build(cfg)
  tokens = tokens_with_padding(14, [6, 4], 6)
  types = jnp.asarray([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]], jnp.int32)
  params = own_params(model, tokens, token_types_BxS=types)
  p = f64(params)
  valid = np.asarray(tokens) != PAD
  x = np_stack(
    p["stack"],
    np_embed(p["embedder"], tokens, np.arange(6), "learned", types, norm="layer", eps=1e-12),
    cfg,
    cfg.num_layers,
    causal=False,
    self_valid=valid,
  )
  expected = x if head == "none" else np_mlm_head(p["head"], x, cfg, p["embedder"])
  out = model.apply({"params": params}, tokens, token_types_BxS=types)
  np.testing.assert_allclose(out, expected, **TOL)
  if head == "mlm":  # the segments matter: type 0 everywhere gives other logits
    assert np.max(np.abs(model.apply({"params": params}, tokens) - out)) > 1e-3
