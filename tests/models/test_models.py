"""Tests for txf.models: causality, padding, permutation symmetry, pooling, config
errors, learning, remat / scan_layers equivalence, and recorded attention maps.

Tolerances: outputs of two float32 computations that should agree (padding vs
none, permuted vs not, scanned vs unscanned) atol = rtol = 1e-5; gradients
atol = rtol = 1e-4 (summed over many terms). Causality is exact: masked keys
get weight exactly 0, so gradients through them are exactly 0.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from txf import decode, ops
from txf.analysis import attention_maps
from txf.layers import Embedder
from txf.layers.model_config import POSITIONS
from txf.models import ModelConfig, build
from txf.models.output_heads import pool

TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)
TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=2, max_len=12)
KEY = jax.random.PRNGKey(0)


def real_tokens(seed, batch, length, vocab=32):
  """Random non-padding tokens in [1, vocab)."""
  return jnp.asarray(
    np.random.default_rng(seed).integers(1, vocab, size=(batch, length)), jnp.int32
  )


def pad(tokens, n):
  """Appends n padding tokens (id 0) to every row."""
  return jnp.concatenate([tokens, jnp.zeros((tokens.shape[0], n), tokens.dtype)], axis=1)


# ---------------------------------------------------------------------------
# Causality.


def add_to_embedding(delta_TxD):
  """Context in which every Embedder call returns its output plus delta."""

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, Embedder) and context.method_name == "__call__":
      return out + delta_TxD
    return out

  return nn.intercept_methods(interceptor)


# Every registered position encoding Pre-LN, and Post-LN once.
@pytest.mark.parametrize(
  "position,placement", [(p, "pre") for p in POSITIONS.names()] + [("rope", "post")]
)
def test_decoder_output_ignores_later_inputs(position, placement):
  cfg = ModelConfig(**TINY, family="decoder", position=position, norm_placement=placement)
  model = build(cfg)
  T = 6
  tokens = real_tokens(0, 2, T)
  variables = model.init(KEY, tokens)
  # A random readout of the logits: a leak into any vocabulary entry shows.
  readout_V = jax.random.normal(jax.random.PRNGKey(1), (cfg.vocab_size,))

  def readout(delta_TxD):
    """[T, D] perturbation of the embedded inputs -> [T] read-out logits of row 0."""
    with add_to_embedding(delta_TxD):
      return model.apply(variables, tokens)[0] @ readout_V

  jacobian_TxTxD = jax.jacrev(readout)(jnp.zeros((T, cfg.d_model)))
  influence_TxT = np.abs(np.asarray(jacobian_TxTxD)).max(-1)  # [output t, input s]
  assert np.all(influence_TxT[np.triu_indices(T, k=1)] == 0.0), "output depends on the future"
  assert np.all(influence_TxT[np.tril_indices(T)] > 0.0), "output ignores the past"


@pytest.mark.parametrize("position", ["t5_bias", "alibi", "rope"])
def test_a_prefix_of_0_is_the_causal_decoder(position):
  """A prefix LM call attends both ways within the prefix with the same
  parameters: with an empty prefix it is the causal call. The T5 bias read
  its causal-trained buckets as bidirectional ones (logits off by 0.36):
  the two differ from distance 8 on (half the exact buckets), so 12 tokens."""
  cfg = ModelConfig(**TINY, family="decoder", position=position)
  model = build(cfg)
  tokens = real_tokens(0, 2, 12)
  variables = model.init(KEY, tokens)
  causal = model.apply(variables, tokens)
  prefix = model.apply(variables, tokens, prefix_len_B=jnp.zeros(2, jnp.int32))
  np.testing.assert_array_equal(np.asarray(prefix), np.asarray(causal))


# ---------------------------------------------------------------------------
# Encoder: padding and permutation symmetry.


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("position", ["learned", "t5_bias"])
def test_encoder_padding_does_not_change_real_positions(position):
  cfg = ModelConfig(**TINY, family="encoder", head="mlm", position=position)
  model = build(cfg)
  tokens = real_tokens(1, 2, 6)
  variables = model.init(KEY, tokens)
  logits = model.apply(variables, tokens)
  padded_logits = model.apply(variables, pad(tokens, 3))
  np.testing.assert_allclose(padded_logits[:, :6], logits, **TOL)


@pytest.mark.parametrize(
  "position,equivariant", [("none", True), ("sinusoidal", False), ("rope", False)]
)
def test_encoder_permutation_equivariance_only_without_positions(position, equivariant):
  cfg = ModelConfig(**TINY, family="encoder", head="mlm", position=position)
  model = build(cfg)
  tokens = real_tokens(2, 2, 6)
  permutation = np.random.default_rng(3).permutation(6)
  variables = model.init(KEY, tokens)
  permuted_then_run = model.apply(variables, tokens[:, permutation])
  run_then_permuted = model.apply(variables, tokens)[:, permutation]
  if equivariant:
    np.testing.assert_allclose(permuted_then_run, run_then_permuted, **TOL)
  else:
    assert np.max(np.abs(permuted_then_run - run_then_permuted)) > 1e-2


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
def test_classification_pooling_ignores_padding(pooling):
  cfg = ModelConfig(**TINY, family="encoder", head="classify", pooling=pooling, num_classes=3)
  model = build(cfg)
  tokens = real_tokens(4, 2, 6)
  variables = model.init(KEY, tokens)
  logits = model.apply(variables, tokens)
  assert logits.shape == (2, 3)
  np.testing.assert_allclose(model.apply(variables, pad(tokens, 3)), logits, **TOL)
  # Control: the same three positions holding real tokens do change the result.
  extended = jnp.concatenate([tokens, real_tokens(5, 2, 3)], axis=1)
  assert np.max(np.abs(model.apply(variables, extended) - logits)) > 1e-4


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
def test_pooling_reads_the_real_tokens_wherever_the_padding_sits(pooling):
  """Left-padded and gapped rows against a float64 reference over each
  row's real tokens: 'last' took position (real tokens - 1), a pad there."""
  x_BxTxD = jnp.asarray(np.random.default_rng(1).normal(size=(3, 5, 4)), jnp.float32)
  valid_BxT = np.array(
    [[False, False, True, True, True], [True, False, True, False, False], [True] * 5]
  )
  pooled = np.asarray(pool(x_BxTxD, jnp.asarray(valid_BxT), pooling))
  for b in range(3):
    real = np.asarray(x_BxTxD[b], np.float64)[valid_BxT[b]]
    reference = dict(mean=real.mean(0), max=real.max(0), last=real[-1])[pooling]
    np.testing.assert_allclose(pooled[b], reference, rtol=1e-6)


@pytest.mark.parametrize("pooling", ["mean", "max", "last"])
def test_a_row_of_padding_alone_pools_to_finite_logits(pooling):
  # max pooled finfo.min there: the classifier turned it into +-1e38 and NaN.
  x_BxTxD = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)), jnp.float32)
  valid_BxT = jnp.array([[True, True, False], [False, False, False]])
  pooled = np.asarray(pool(x_BxTxD, valid_BxT, pooling))
  real = np.asarray(x_BxTxD[0, :2], np.float64)
  reference = dict(mean=real.mean(0), max=real.max(0), last=real[-1])[pooling]
  np.testing.assert_allclose(pooled[0], reference, rtol=1e-6)
  expected_empty = np.asarray(x_BxTxD[1, 0]) if pooling == "last" else np.zeros(4)
  np.testing.assert_array_equal(pooled[1], expected_empty)
  cfg = ModelConfig(**TINY, family="encoder", head="classify", pooling=pooling, num_classes=3)
  model = build(cfg)
  tokens = jnp.concatenate([real_tokens(4, 1, 6), jnp.zeros((1, 6), jnp.int32)])
  assert np.isfinite(model.apply(model.init(KEY, tokens), tokens)).all()


@pytest.mark.parametrize("shape", [(0, 4), (4,), (1, 2, 3)])
def test_tokens_that_are_no_batch_of_rows_are_refused_naming_them(shape):
  # An empty batch divided by zero in attention; 1-D ids failed deep in the stack.
  model = build(ModelConfig(**TINY, family="decoder"))
  variables = model.init(KEY, real_tokens(4, 1, 4))
  with pytest.raises(ValueError, match=r"^tokens: expected ids \[B, T\] with B >= 1"):
    model.apply(variables, jnp.ones(shape, jnp.int32))


def test_an_encoder_decoder_refuses_source_and_target_batches_that_do_not_pair():
  """2 source rows and 4 target rows gave [4, T, V], decoder rows 0-1
  reading source row 0 (decode's grouping for beams); a 1-D source raised
  an IndexError, an empty one divided by zero."""
  model = build(ModelConfig(**TINY, family="encoder_decoder"))
  variables = model.init(KEY, real_tokens(4, 2, 5), real_tokens(5, 2, 4))
  with pytest.raises(ValueError, match=r"^EncoderDecoder: 2 source rows and 4 target rows"):
    model.apply(variables, real_tokens(4, 2, 5), real_tokens(5, 4, 4))
  for shape in [(5,), (0, 5)]:
    with pytest.raises(ValueError, match=r"^tokens: expected ids \[B, T\] with B >= 1"):
      model.apply(variables, jnp.ones(shape, jnp.int32), real_tokens(5, 2, 4))


def test_generate_takes_prompts_as_lists_as_the_ops_do():
  model = build(ModelConfig(**TINY, family="decoder"))
  params = model.init(KEY, real_tokens(4, 1, 4))["params"]
  as_array = decode.generate(model, params, jnp.array([[5, 6, 7]]), max_new_tokens=2)
  np.testing.assert_array_equal(
    decode.generate(model, params, [[5, 6, 7]], max_new_tokens=2), as_array
  )


def test_positions_past_a_learned_table_are_refused_or_clamped_never_nan():
  # jnp.take fills rows past the table with NaN: the logits were NaN.
  cfg = ModelConfig(**{**TINY, "max_len": 8}, family="decoder", position="learned")
  model = build(cfg)
  tokens = real_tokens(4, 1, 4)
  variables = model.init(KEY, tokens)
  past = jnp.array([[0, 1, 8, 9]])
  with pytest.raises(ValueError, match=r"^positions: id 9 outside the position table \[0, 8\)"):
    model.apply(variables, tokens, positions_BxT=past)
  traced = jax.jit(lambda p: model.apply(variables, tokens, positions_BxT=p))(past)
  clamped = model.apply(variables, tokens, positions_BxT=jnp.array([[0, 1, 7, 7]]))
  np.testing.assert_array_equal(traced, clamped)


# ---------------------------------------------------------------------------
# Config errors.


@pytest.mark.parametrize(
  "changes,field",
  [
    (dict(d_model=30, num_heads=4), "num_heads"),
    (dict(num_heads=4, num_kv_heads=3), "num_kv_heads"),
    (dict(d_model=12, num_heads=4, position="rope"), "position"),  # head dim 3
    (dict(not_a_field=1), "not_a_field"),
    (dict(family="decoder", head="mlm"), "head"),
    (dict(family="encoder_decoder", head="classify"), "head"),
    (dict(family="decoder", num_decoder_layers=2), "num_decoder_layers"),
    (dict(family="decoder", head="classify", pooling="cls"), "pooling"),  # sees 1 token
    # Accepted and recorded, read by nothing: one line each, as above.
    (dict(family="decoder", share_embeddings=False), "share_embeddings"),
    (dict(family="encoder", share_embeddings=False, head="mlm"), "share_embeddings"),
    (dict(family="decoder", pooling="max"), "pooling"),
    (dict(family="encoder", head="mlm", pooling="mean"), "pooling"),
    (dict(family="decoder", num_classes=7), "num_classes"),
    # cuDNN where no device runs it: every call failed naming neither field.
    (dict(attention_impl="cudnn", dtype="float32", head_dim=8), "attention_impl"),
    (dict(attention_impl="cudnn", dtype="bfloat16", head_dim=12), "attention_impl"),
    (dict(attention_impl="cudnn", dtype="bfloat16", head_dim=264), "attention_impl"),
    (
      dict(attention_impl="cudnn", dtype="bfloat16", head_dim=8, family="encoder", window=4),
      "attention_impl",
    ),
  ],
)
def test_build_rejects_bad_config_naming_the_field(changes, field):
  config = ml_collections.ConfigDict({**TINY, "family": "decoder", "position": "rope", **changes})
  with pytest.raises(ValueError, match=rf"model\.{field}\b"):
    build(config)


@pytest.mark.parametrize("head_dim", [8, 256])
def test_cudnn_takes_the_ends_of_its_head_dim_range(head_dim):
  """Multiples of 8 up to 256, both ends included (264 and 12 refused above)."""
  cfg = ModelConfig(**TINY, attention_impl="cudnn", dtype="bfloat16", head_dim=head_dim)
  assert cfg.head_dim == head_dim


@pytest.mark.parametrize(
  "changes,resolved",
  [
    # d_model=48, num_heads=4, num_layers=3: head_dim 48/4; d_ff 4*48, or
    # 8/3*48 = 128 (a multiple of 8 already) when gated.
    (dict(), dict(num_kv_heads=4, head_dim=12, d_ff=192, num_decoder_layers=None)),
    (dict(activation="swiglu"), dict(d_ff=128)),
    (dict(d_model=40, activation="geglu"), dict(head_dim=10, d_ff=112)),  # 106.7 -> 112
    (dict(family="encoder_decoder"), dict(num_decoder_layers=3)),
    (
      dict(num_kv_heads=2, head_dim=6, d_ff=50, family="encoder_decoder", num_decoder_layers=1),
      dict(num_kv_heads=2, head_dim=6, d_ff=50, num_decoder_layers=1),
    ),
  ],
)
def test_model_config_resolves_unset_fields_once(changes, resolved):
  """None fields take their derived values at construction; set ones stay."""
  cfg = ModelConfig(**{**dict(vocab_size=32, d_model=48, num_heads=4, num_layers=3), **changes})
  assert {name: getattr(cfg, name) for name in resolved} == resolved
  assert cfg.replace(use_bias=True).d_ff == cfg.d_ff  # resolved values survive a copy


def test_model_config_replace_rederives_unset_fields():
  """replace(d_model=256) of a config that left head_dim and d_ff to be
  derived derives them again; fields given explicitly, then or now, stay."""
  cfg = ModelConfig(d_model=128, num_heads=4, family="encoder_decoder")
  wider = cfg.replace(d_model=256, num_layers=3)
  assert (wider.head_dim, wider.d_ff, wider.num_decoder_layers) == (64, 1024, 3)
  assert wider == ModelConfig(d_model=256, num_heads=4, num_layers=3, family="encoder_decoder")
  assert cfg.replace(activation="swiglu").d_ff == 344  # 8/3 x 128, up to a multiple of 8
  pinned = ModelConfig(d_model=128, num_heads=4, head_dim=16, d_ff=300)
  assert (pinned.replace(d_model=256).head_dim, pinned.replace(d_model=256).d_ff) == (16, 300)
  assert pinned.replace(d_model=256, d_ff=None).d_ff == 1024
  assert cfg.replace(d_ff=100).replace(d_model=256).d_ff == 100


# ---------------------------------------------------------------------------
# Learning: each family fits a fixed toy batch. Batches are [2, 6] like the
# other tests', so eager `init` reuses JAX's cache of compiled ops.

ONE_LAYER = dict(TINY, num_layers=1)  # depth does not matter here; compile time does


def train_losses(
  model: nn.Module, inputs: tuple, loss_fn, steps: int = 30, learning_rate: float = 1e-2
) -> list[float]:
  """Adam on loss_fn(params) for `steps` steps, one jitted step; returns the losses."""
  params = model.init(KEY, *inputs)["params"]
  optimizer = optax.adam(learning_rate)
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  losses = []
  for _ in range(steps):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  return losses


def repeating_pattern(batch, length, period=5):
  """Rows of 1, 2, ..., period, 1, 2, ... each starting at a different phase."""
  phase = np.arange(batch)[:, None] + np.arange(length)[None]
  return jnp.asarray(1 + phase % period, jnp.int32)


def test_decoder_learns_repeating_pattern():
  model = build(ModelConfig(**ONE_LAYER, family="decoder"))
  tokens = repeating_pattern(2, 7)
  inputs, targets = tokens[:, :-1], tokens[:, 1:]
  loss_fn = lambda p: ops.cross_entropy(model.apply({"params": p}, inputs), targets)[0]
  losses = train_losses(model, (inputs,), loss_fn)
  assert losses[-1] < 0.7 * losses[0], losses


def test_encoder_learns_masked_lm():
  cfg = ModelConfig(**ONE_LAYER, family="encoder", head="mlm")
  model = build(cfg)
  targets = repeating_pattern(2, 6)
  masked = np.zeros(targets.shape, bool)
  masked[:, 1::3] = True
  mask_id = cfg.vocab_size - 1
  inputs = jnp.where(masked, mask_id, targets)
  loss_fn = lambda p: ops.cross_entropy(
    model.apply({"params": p}, inputs), targets, weights=masked
  )[0]
  losses = train_losses(model, (inputs,), loss_fn)
  assert losses[-1] < 0.7 * losses[0], losses


def test_encoder_decoder_learns_copy():
  model = build(ModelConfig(**ONE_LAYER, family="encoder_decoder"))
  source = real_tokens(6, 2, 6)
  bos = jnp.ones((2, 1), jnp.int32)
  decoder_inputs = jnp.concatenate([bos, source[:, :-1]], axis=1)  # teacher forcing
  loss_fn = lambda p: ops.cross_entropy(model.apply({"params": p}, source, decoder_inputs), source)[
    0
  ]
  losses = train_losses(model, (source, decoder_inputs), loss_fn)
  assert losses[-1] < 0.7 * losses[0], losses


# ---------------------------------------------------------------------------
# remat and scan_layers compute the same function as the plain loop.


def to_scanned(tree: Any) -> Any:
  """Maps an unscanned param tree to the scanned layout: at every depth,
  `block_0 .. block_{n-1}` become one `blocks` subtree with a leading [n] axis."""
  if not isinstance(tree, Mapping):
    return tree
  blocks = sorted((k for k in tree if k.startswith("block_")), key=lambda k: int(k[6:]))
  out = {k: to_scanned(v) for k, v in tree.items() if not k.startswith("block_")}
  if blocks:
    out["blocks"] = jax.tree_util.tree_map(
      lambda *layers: jnp.stack(layers), *[tree[k] for k in blocks]
    )
  return out


def variant_params(base: ModelConfig, changes: dict, plain_params, inputs):
  """The variant's config and the plain params in its layout (checked against its init)."""
  cfg = base.replace(**changes)
  params = to_scanned(plain_params) if cfg.scan_layers else plain_params
  own_layout = nn.meta.unbox(jax.eval_shape(build(cfg).init, KEY, *inputs)["params"])
  shape_of = lambda tree: jax.tree_util.tree_map(lambda x: (x.shape, x.dtype), tree)
  assert shape_of(params) == shape_of(own_layout)
  return cfg, params


def decoder_logits_and_grads(cfg: ModelConfig, params):
  """Logits [2, 6, V] and loss gradients of a decoder on a fixed batch."""
  model = build(cfg)
  tokens, targets = real_tokens(7, 2, 6), real_tokens(8, 2, 6)

  def loss_fn(p):
    logits = model.apply({"params": p}, tokens)
    return ops.cross_entropy(logits, targets)[0], logits

  (_, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  return logits, grads


@pytest.fixture(scope="module")
def plain_decoder():
  """(config, params, logits, grads) of the unscanned, non-remat decoder."""
  cfg = ModelConfig(**TINY, family="decoder")
  params = nn.meta.unbox(build(cfg).init(KEY, real_tokens(7, 2, 6))["params"])
  return (cfg, params, *decoder_logits_and_grads(cfg, params))


@pytest.mark.parametrize(
  "changes",
  [dict(remat=True), dict(remat=True, scan_layers=True)],
  ids=lambda changes: "+".join(changes),
)
@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_remat_and_scan_match_plain_decoder(changes, plain_decoder):
  """Same logits and gradients from the same parameters in either layout
  (remat changes only the backward pass, so logits alone would not do).
  scan_layers without remat is checked on the encoder-decoder below."""
  base, plain_params, expected_logits, expected_grads = plain_decoder
  cfg, params = variant_params(base, changes, plain_params, (real_tokens(7, 2, 6),))
  logits, grads = decoder_logits_and_grads(cfg, params)
  np.testing.assert_allclose(logits, expected_logits, **TOL)
  expected_grads = to_scanned(expected_grads) if cfg.scan_layers else expected_grads
  jax.tree_util.tree_map(
    lambda a, b: np.testing.assert_allclose(a, b, **GRAD_TOL), grads, expected_grads
  )


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_scan_matches_plain_encoder_decoder():
  # Two stacks, cross-attention inputs and a per-stack T5 table broadcast into
  # the scan: the encoder-decoder's logits are the same in both layouts.
  base = ModelConfig(**TINY, family="encoder_decoder", position="t5_bias")
  tokens = real_tokens(7, 2, 6)
  inputs = (tokens, pad(tokens[:, :4], 2))
  plain_params = nn.meta.unbox(build(base).init(KEY, *inputs)["params"])
  cfg, params = variant_params(base, dict(scan_layers=True), plain_params, inputs)
  np.testing.assert_allclose(
    build(cfg).apply({"params": params}, *inputs),
    build(base).apply({"params": plain_params}, *inputs),
    **TOL,
  )


# ---------------------------------------------------------------------------
# scan_layers' and remat's own random draws: the equivalence tests above copy
# the plain model's parameters and run without dropout, so they cannot see
# how a scanned stack draws its parameters and masks, nor remat's masks.

DROPOUT = dict(dropout_rate=0.5, attention_dropout_rate=0.5)  # a large rate: masks far apart


def test_scanned_layers_draw_their_own_initial_parameters():
  """A scanned stack's own init (nn.scan splitting the 'params' rng per layer)
  gives every layer its own draw: each leaf the unscanned model draws
  differently per layer differs between every two scanned layers, at the
  unscanned initializer's scale (over all layers, n values each, the two
  stds agree within 5 / sqrt(n) relative: 5 standard errors of the
  difference of two sample stds). The leaves the unscanned model draws
  alike in every layer (norm scales, zero offsets) are the same constants
  in the scanned stack. Three layers, so every pair is compared."""
  layers = 3
  base = ModelConfig(**{**TINY, "d_model": 32, "num_layers": layers}, family="decoder")
  tokens = real_tokens(7, 2, 6)
  init = lambda cfg: nn.meta.unbox(jax.jit(build(cfg).init)(KEY, tokens)["params"])
  plain, scanned = init(base)["stack"], init(base.replace(scan_layers=True))["stack"]
  blocks = [jax.tree_util.tree_leaves_with_path(plain[f"block_{i}"]) for i in range(layers)]
  per_layer_LxN = {
    jax.tree_util.keystr(path): np.stack([np.ravel(block[k][1]) for block in blocks])
    for k, (path, _) in enumerate(blocks[0])
  }
  scanned_LxN = {
    jax.tree_util.keystr(path): np.reshape(x, (layers, -1))
    for path, x in jax.tree_util.tree_leaves_with_path(scanned["blocks"])
  }
  assert scanned_LxN.keys() == per_layer_LxN.keys()
  drawn = 0
  for name, plain_LxN in per_layer_LxN.items():
    stack_LxN = scanned_LxN[name]
    if all(np.array_equal(plain_LxN[0], row) for row in plain_LxN[1:]):  # a constant init
      np.testing.assert_array_equal(stack_LxN, plain_LxN, err_msg=name)
      continue
    drawn += 1
    for i in range(layers):
      for j in range(i):
        assert not np.array_equal(stack_LxN[i], stack_LxN[j]), f"{name}: layers {j}, {i} alike"
    tolerance = 5 / np.sqrt(plain_LxN.size)
    assert stack_LxN.std() == pytest.approx(plain_LxN.std(), rel=tolerance), name
  assert drawn >= 6  # attention's four kernels and the FFN's two at least


def test_scanned_layers_draw_their_own_dropout_masks():
  """In train mode each scanned layer drops other entries (nn.scan splitting
  the 'dropout' rng per layer): every dropout module of the scanned block
  (residual, attention weights, FFN hidden) zeroes a different set of entries
  in each layer. The modules' outputs are captured per layer, stacked by the
  scan; an output is 0 exactly where it was dropped (or causally masked,
  the same in every layer)."""
  cfg = ModelConfig(**TINY, family="decoder", scan_layers=True, **DROPOUT)
  tokens = real_tokens(7, 2, 8)
  model = build(cfg)
  params = nn.meta.unbox(jax.jit(model.init)(KEY, tokens)["params"])
  apply = lambda params, key: model.apply(
    {"params": params},
    tokens,
    deterministic=False,
    rngs={"dropout": key},
    capture_intermediates=lambda module, method: isinstance(module, nn.Dropout),
    mutable=["intermediates"],
  )
  _, state = jax.jit(apply)(params, jax.random.key(1))  # one compile, not op by op
  outputs = {
    jax.tree_util.keystr(path): np.asarray(x)
    for path, x in jax.tree_util.tree_leaves_with_path(state["intermediates"]["stack"]["blocks"])
    if "Dropout" in jax.tree_util.keystr(path)
  }
  assert len(outputs) == 4, sorted(outputs)  # two residual, attention weights, FFN hidden
  for name, out_LxN in outputs.items():
    dropped_LxN = out_LxN.reshape(cfg.num_layers, -1) == 0
    assert dropped_LxN.any(1).all(), f"{name}: a layer drops nothing"
    assert not np.array_equal(dropped_LxN[0], dropped_LxN[1]), f"{name}: layers share a mask"


# Either layout catches both mutants (dropout off under remat, another mask
# recomputed): the unscanned one runs in the slow suite only.
@pytest.mark.parametrize(
  "layout",
  [pytest.param(dict(), marks=pytest.mark.slow), dict(scan_layers=True)],
  ids=["loop", "scan"],
)
def test_remat_keeps_dropout_and_recomputes_the_forward_masks(layout):
  """In train mode with dropout, remat gives the loss and gradients of the
  same model without remat (same parameters, same dropout key), to the
  tolerances above: the backward pass recomputes the block with the masks
  of the forward pass (another mask there would change the gradients only),
  and remat leaves every dropout on (the loss also differs from the
  deterministic one, so dropout acted). One layer: remat wraps each block
  alike."""
  cfg = ModelConfig(**{**TINY, "num_layers": 1}, family="decoder", **layout, **DROPOUT)
  tokens, targets = real_tokens(7, 2, 8), real_tokens(8, 2, 8)

  def loss_fn(cfg, deterministic=False):
    model = build(cfg)
    rngs = {"dropout": jax.random.key(1)}
    return lambda params: ops.cross_entropy(
      model.apply({"params": params}, tokens, deterministic=deterministic, rngs=rngs), targets
    )[0]

  def compute(key):  # one compile for all three (each costs about a second on 2 cores)
    params = nn.meta.unbox(build(cfg).init(key, tokens)["params"])
    return (
      jax.value_and_grad(loss_fn(cfg))(params),
      jax.value_and_grad(loss_fn(cfg.replace(remat=True)))(params),
      loss_fn(cfg, deterministic=True)(params),
    )

  (loss, grads), (remat_loss, remat_grads), deterministic_loss = jax.jit(compute)(KEY)
  np.testing.assert_allclose(remat_loss, loss, **TOL)
  jax.tree_util.tree_map_with_path(
    lambda path, a, b: np.testing.assert_allclose(
      a, b, err_msg=jax.tree_util.keystr(path), **GRAD_TOL
    ),
    remat_grads,
    grads,
  )
  assert abs(float(remat_loss) - float(deterministic_loss)) > 1e-2


# ---------------------------------------------------------------------------
# Attention maps: the weights each attention layer records are the ones it uses.

MAP_FAMILIES = {  # with MQA heads; learned positions leave q.k untouched
  "decoder": dict(family="decoder"),
  "encoder": dict(family="encoder", head="mlm"),
  "encoder_decoder": dict(family="encoder_decoder"),
}


def map_setup(family):
  """Config, unscanned plain params and inputs (encoder inputs padded)."""
  cfg = ModelConfig(**TINY, **MAP_FAMILIES[family], num_kv_heads=1, position="learned")
  source = pad(real_tokens(9, 2, 4), 2)
  inputs = {
    "decoder": (real_tokens(10, 2, 5),),
    "encoder": (source,),
    "encoder_decoder": (source, real_tokens(10, 2, 5)),
  }[family]
  return cfg, nn.meta.unbox(build(cfg).init(KEY, *inputs)["params"]), inputs


def np_softmax_weights(q, k, allowed):
  """float64 softmax(q.k / sqrt(Dh)) over allowed keys: [B, H, T, S]."""
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  k = np.repeat(k, q.shape[2] // k.shape[2], axis=2)
  scores = np.where(allowed, np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1]), -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_attention_maps_are_softmax_of_each_layers_queries_and_keys(family):
  cfg, params, inputs = map_setup(family)
  model = build(cfg)
  out, state = model.apply(
    {"params": params},
    *inputs,
    mutable=["intermediates"],
    capture_intermediates=lambda m, method: method == "project",
  )
  np.testing.assert_allclose(out, model.apply({"params": params}, *inputs), atol=1e-6)
  maps = attention_maps(model, params, *inputs)
  stacks = {"decoder": ["stack"], "encoder": ["stack"], "encoder_decoder": ["encoder", "decoder"]}[
    family
  ]
  kinds = lambda stack: ["self_attention"] + (["cross_attention"] if stack == "decoder" else [])
  assert set(maps) == {
    f"{stack}/block_{i}/{kind}"
    for stack in stacks
    for i in range(cfg.num_layers)
    for kind in kinds(stack)
  }
  source_valid = np.asarray(inputs[0] != cfg.pad_id)[:, None, None, :]
  for path, weights in maps.items():
    node = state["intermediates"]
    for name in path.split("/"):
      node = node[name]
    ((q, k, _),) = node["project"]
    causal = cfg.family == "decoder" or (path.startswith("decoder/") and "self" in path)
    T, S = q.shape[1], k.shape[1]
    allowed = np.tril(np.ones((T, S), bool)) if causal else source_valid
    np.testing.assert_allclose(weights, np_softmax_weights(q, k, allowed), **TOL)
    np.testing.assert_allclose(np.sum(weights, -1), 1.0, atol=1e-6)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("family", MAP_FAMILIES)
def test_attention_maps_of_scanned_stacks_match_unscanned(family):
  base, plain_params, inputs = map_setup(family)
  cfg, params = variant_params(base, dict(scan_layers=True, remat=True), plain_params, inputs)
  model = build(cfg)
  out, _ = model.apply({"params": params}, *inputs, mutable=["intermediates"])
  np.testing.assert_allclose(out, model.apply({"params": params}, *inputs), atol=1e-6)
  maps, plain_maps = (
    attention_maps(model, params, *inputs),
    attention_maps(build(base), plain_params, *inputs),
  )
  assert maps.keys() == plain_maps.keys()
  for path, weights in plain_maps.items():
    np.testing.assert_allclose(maps[path], weights, **TOL)


# ---------------------------------------------------------------------------
# Initialisation schemes (model.init).


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_gpt2_init_draws_each_group_at_gpt2s_scale():
  """N(0, 0.02) projections and token rows, N(0, 0.01) positions,
  N(0, 0.02 / sqrt(2 L)) residual outputs, zero biases, unit norms."""
  layers = 4
  cfg = ModelConfig(
    vocab_size=512, d_model=256, num_heads=4, num_layers=layers, max_len=256,
    position="learned", use_bias=True, init="gpt2",
  )  # fmt: skip
  params = nn.meta.unbox(build(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
  groups: dict[str, list] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params["params"]):
    names = [str(getattr(p, "key", p)) for p in path]
    group = (
      "token" if names[-2] == "token" else
      "position" if names[-1] == "position_table" else
      "residual" if names[-1] == "kernel" and names[-2] in ("out", "wo") else
      "kernel" if names[-1] == "kernel" else
      "norm_scale" if names[-1] == "scale" else "zero"
    )  # fmt: skip
    groups.setdefault(group, []).append(np.ravel(leaf))
  values = {name: np.concatenate(leaves) for name, leaves in groups.items()}
  expected_std = {
    "token": 0.02, "position": 0.01, "kernel": 0.02, "residual": 0.02 / np.sqrt(2 * layers)
  }  # fmt: skip
  for name, std in expected_std.items():
    assert abs(values[name].mean()) < 0.1 * std, name
    assert values[name].std() == pytest.approx(std, rel=0.03), name
  np.testing.assert_array_equal(values["norm_scale"], 1.0)
  np.testing.assert_array_equal(values["zero"], 0.0)  # biases, norm offsets


def test_gpt2_init_scales_each_stack_by_its_own_depth():
  """An encoder-decoder's decoder residual outputs at 0.02 / sqrt(2 * its
  num_decoder_layers): scaled by the encoder's depth, 1 here, they came out
  at 0.0141 where 0.005 is due. A T5 bias table, which GPT-2 has no
  counterpart of, keeps its own draw (the txf scheme's, bit for bit)."""
  cfg = ModelConfig(
    family="encoder_decoder", vocab_size=64, d_model=256, num_heads=4, num_layers=1,
    num_decoder_layers=8, position="t5_bias", max_len=32, init="gpt2",
  )  # fmt: skip
  tokens = jnp.ones((1, 8), jnp.int32)
  params = nn.meta.unbox(build(cfg).init(jax.random.key(0), tokens, tokens))["params"]
  for stack, layers in (("encoder", 1), ("decoder", 8)):
    residual = np.concatenate([
      np.ravel(leaf)
      for path, leaf in jax.tree_util.tree_leaves_with_path(params[stack])
      if str(getattr(path[-2], "key", path[-2])) in ("out", "wo")
    ])  # fmt: skip
    assert residual.std() == pytest.approx(0.02 / np.sqrt(2 * layers), rel=0.03), stack
  plain = nn.meta.unbox(
    build(dataclasses.replace(cfg, init="txf")).init(jax.random.key(0), tokens, tokens)
  )["params"]
  np.testing.assert_array_equal(
    params["decoder"]["relative_position"]["table"], plain["decoder"]["relative_position"]["table"]
  )


def test_init_schemes_are_deterministic_and_txf_is_flaxs_own():
  cfg = ModelConfig(vocab_size=64, d_model=32, num_heads=2, num_layers=1)
  tokens = jnp.ones((1, 8), jnp.int32)
  gpt2 = build(dataclasses.replace(cfg, init="gpt2"))
  first, again = (gpt2.init(jax.random.key(3), tokens) for _ in range(2))
  jax.tree.map(np.testing.assert_array_equal, first, again)
  plain = nn.Module.init(build(cfg), jax.random.key(3), tokens)  # flax's, no scheme
  jax.tree.map(np.testing.assert_array_equal, build(cfg).init(jax.random.key(3), tokens), plain)


@pytest.mark.parametrize("changes", [dict(head_dim=8), dict(head_dim=256), dict(window=4)])
def test_cudnn_is_accepted_where_a_gpu_would_run_it(changes):
  """The ends of what cuDNN takes: head dims 8 and 256 in bfloat16, a causal window."""
  config = {**TINY, "family": "decoder", "attention_impl": "cudnn", "dtype": "bfloat16"}
  assert build(ml_collections.ConfigDict({**config, **changes})).cfg.attention_impl == "cudnn"
