"""Behaviour tests of training machinery the numeric references do not reach:
gradient accumulation, dropout, and the tied output embedding.

Tolerances: one step with k accumulated micro-batches vs one step on the whole
batch differ only in float32 summation order: atol = 1e-6, rtol = 1e-5 on the
state and metrics. Dropout expectations are checked with a bound derived from
the draws themselves: |mean - expected| <= 5 standard errors (+1e-6) per
element, so a missing 1/(1-p) rescaling (a 50% error at p = 0.5) falls far
outside it while an unbiased estimate essentially never does.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import load_config
from txf import register
from txf.data.spec import TASKS
from txf.layers import FeedForward, MultiHeadAttention, TransformerBlock
from txf.models import ModelConfig, build
from txf.runconfig.optim import make_optimizer
from txf.runconfig.run_config import TrainConfig
from txf.runconfig.tasks import cross_entropy_sums, token_inputs, token_labels
from txf.train.run_setup import train_step_for_seed
from txf.train.step import init_state, make_train_step

TOL = dict(atol=1e-6, rtol=1e-5)
TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=2, max_len=16)
DRAWS = 500
P = 0.5  # a large rate makes a scaling bug obvious


def lm_batch(seed, batch, length, vocab=32):
  """An LM batch whose rows have different numbers of real (weighted) tokens,
  so micro-batches hold different token counts."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, vocab, size=(batch, length + 1))
  weights = np.arange(length)[None] < rng.integers(1, length + 1, size=(batch, 1))
  return {
    "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
    "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
    "weights": jnp.asarray(weights, jnp.float32),
  }


def optimizer():
  """The project's optimizer (clipping + AdamW): Adam's statistics and the
  clipping norm both see the gradient's scale, not only its direction."""
  train = load_config("base").train
  train.update(dict(warmup_steps=0, decay="constant", grad_clip_norm=1e-2))
  return make_optimizer(train)


# ---------------------------------------------------------------------------
# A non-finite step.


def assert_bitwise_unchanged(before, after):
  """Every leaf of the state `after` a step is the one `before` it (numpy copies)."""
  for (path, old), new in zip(jax.tree.leaves_with_path(before), jax.tree.leaves(after)):
    np.testing.assert_array_equal(np.asarray(new), old, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("poison", ["weights", "params"])
def test_a_non_finite_step_leaves_the_state_bitwise_unchanged(poison):
  model = build(ModelConfig(**TINY, family="decoder"))
  opt = optimizer()
  batch = lm_batch(0, 4, 6)
  state = init_state(model, opt, batch, "lm", jax.random.key(0))
  step = jax.jit(make_train_step(model, opt, "lm", seed=0))
  if poison == "weights":  # a NaN loss
    batch = dict(batch, weights=batch["weights"].at[0, 0].set(jnp.nan))
  else:  # a NaN parameter (a NaN checkpoint, say): NaN loss and gradient
    state = state.replace(
      params=jax.tree_util.tree_map_with_path(
        lambda path, x: x.at[0].set(jnp.nan) if "ffn_norm" in jax.tree_util.keystr(path) else x,
        state.params,
      )
    )
  before = jax.tree.map(np.asarray, state)
  after, metrics = step(state, batch)
  assert int(metrics["finite"]) == 0 and int(after.step) == 0
  assert_bitwise_unchanged(before, after)
  # The same step on a clean batch and state moves it.
  clean_state = init_state(model, opt, lm_batch(0, 4, 6), "lm", jax.random.key(0))
  moved, metrics = step(clean_state, lm_batch(0, 4, 6))
  assert int(metrics["finite"]) == 1 and int(moved.step) == 1


def nan_gradient_loss_sums(logits, labels, weights, *, label_smoothing, z_loss):
  """The built-in loss plus sqrt(0 * sum(logits)): 0 in value, NaN in gradient."""
  loss_sum, count, correct = cross_entropy_sums(
    logits, labels, weights, label_smoothing=label_smoothing, z_loss=z_loss
  )
  return loss_sum + jnp.sqrt(0.0 * logits.sum()), count, correct


@pytest.mark.slow  # a compile
def test_a_step_whose_gradient_alone_is_not_finite_leaves_the_state_unchanged():
  # Both cases above make the loss NaN as well: a step that checked the loss
  # alone passed them, and would apply this NaN gradient.
  model = build(ModelConfig(**TINY, family="decoder"))
  opt = optimizer()
  batch = lm_batch(0, 4, 6)
  with TASKS.scoped():

    @register.task("nan_gradient", batches="lm")
    class NanGradient:
      model_inputs = staticmethod(token_inputs)
      labels_and_weights = staticmethod(token_labels)
      loss_sums = staticmethod(nan_gradient_loss_sums)

    state = init_state(model, opt, batch, "nan_gradient", jax.random.key(0))
    before = jax.tree.map(np.asarray, state)
    after, metrics = jax.jit(make_train_step(model, opt, "nan_gradient", seed=0))(state, batch)
  assert np.isfinite(float(metrics["loss"])) and not np.isfinite(float(metrics["grad_norm"]))
  assert int(metrics["finite"]) == 0
  assert_bitwise_unchanged(before, after)


# ---------------------------------------------------------------------------
# Gradient accumulation.


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("k", [2, 4])
def test_grad_accumulation_equals_one_big_batch(k):
  model = build(ModelConfig(**TINY, family="decoder"))
  opt = optimizer()
  batch = lm_batch(0, 8, 6)
  state = init_state(model, opt, batch, "lm", jax.random.key(0))
  whole, whole_metrics = jax.jit(make_train_step(model, opt, "lm", seed=0))(state, batch)
  accum, accum_metrics = jax.jit(make_train_step(model, opt, "lm", seed=0, grad_accum_steps=k))(
    state, batch
  )
  assert whole_metrics.keys() == accum_metrics.keys()
  for name in whole_metrics:
    np.testing.assert_allclose(accum_metrics[name], whole_metrics[name], err_msg=name, **TOL)
  assert int(accum.step) == int(whole.step) == 1
  leaves_whole, _ = jax.tree.flatten_with_path((whole.params, whole.opt_state))
  leaves_accum, tree_accum = jax.tree.flatten((accum.params, accum.opt_state))
  assert jax.tree.structure((whole.params, whole.opt_state)) == tree_accum
  for (path, a), b in zip(leaves_whole, leaves_accum):
    np.testing.assert_allclose(b, a, err_msg=jax.tree_util.keystr(path), **TOL)
  # The step moved the parameters: equal states are not two untouched copies.
  moved = jax.tree.map(
    lambda new, old: np.abs(np.asarray(new - old)).max(), whole.params, state.params
  )
  assert max(jax.tree.leaves(moved)) > 1e-4


def gradient_keeper():
  """An optimizer that changes no parameter and keeps the step's gradient as
  its state (exactly, where an SGD step's params - new params would round)."""
  return optax.GradientTransformation(
    init=lambda params: jax.tree.map(jnp.zeros_like, params),
    update=lambda grads, state, params=None: (jax.tree.map(jnp.zeros_like, grads), grads),
  )


# ---------------------------------------------------------------------------
# float16's loss scale.


def step_gradient(dtype, batch, vocab):
  """The gradient a run's train step applies for a model computing in `dtype`
  (float64 numpy leaves), and the step's metrics."""
  model = build(
    ModelConfig(**dict(TINY, vocab_size=vocab, max_len=128), family="decoder", dtype=dtype)
  )
  keeper = gradient_keeper()
  state = init_state(model, keeper, batch, "lm", jax.random.key(0))
  step = train_step_for_seed(TrainConfig(), dtype, model, keeper, "lm", False, seed=0)
  after, metrics = jax.jit(step)(state, batch)
  return [np.asarray(g, np.float64) for g in jax.tree.leaves(after.opt_state)], metrics


@pytest.mark.slow  # two compiles and 8,192 tokens of a 512-token vocabulary
def test_float16_gradients_are_float32_s_to_float16_rounding():
  # Each token's share of the mean's gradient, ~1 / (512 * 8192) = 2.4e-7,
  # is below float16's smallest normal (6e-5): unscaled, the gradient came out
  # 7% off float32's (bfloat16's 0.24%).
  vocab = 512
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, vocab, size=(64, 129))
  batch = {
    "inputs": jnp.asarray(tokens[:, :-1], jnp.int32),
    "targets": jnp.asarray(tokens[:, 1:], jnp.int32),
    "weights": jnp.ones((64, 128), jnp.float32),
  }
  reference, reference_metrics = step_gradient("float32", batch, vocab)
  grads, metrics = step_gradient("float16", batch, vocab)
  squared_error = sum(((g - r) ** 2).sum() for g, r in zip(grads, reference))
  relative_error = np.sqrt(squared_error / sum((r**2).sum() for r in reference))
  # Within 2e-3 of the gradient's norm: four units of float16's rounding
  # (2**-11), where the scale-free step was 6.8e-2 off (3.3e-4 measured).
  assert relative_error < 2e-3
  # The reported loss and accuracy are the step's means, not scaled ones.
  for name in ("loss", "accuracy"):
    np.testing.assert_allclose(metrics[name], reference_metrics[name], rtol=1e-3, err_msg=name)
  assert int(metrics["finite"]) == 1


def test_each_accumulated_micro_batch_draws_its_own_dropout_masks():
  """Four identical rows, two micro-batches, dropout on: each row weighted
  alone gives the step another loss and gradient. Every row sits in one
  micro-batch at one place (whichever way the batch is split), so rows in
  the same place of the two micro-batches differ only by their micro-batch's
  key: a key shared by all micro-batches would make them agree exactly.
  With all four weighted, the step's loss and gradient are the mean of the
  four (accumulation adds each micro-batch's own, masks included)."""
  model = build(ModelConfig(**{**TINY, "num_layers": 1}, **DROPOUT))  # one layer: a faster compile
  row = lm_batch(0, 1, 6)
  batch = {name: jnp.tile(x, (4, 1)) for name, x in row.items()}
  keeper = gradient_keeper()
  state = init_state(model, keeper, batch, "lm", jax.random.key(0))
  step = jax.jit(make_train_step(model, keeper, "lm", seed=0, grad_accum_steps=2))

  def loss_and_grads(weighted_B):
    new, metrics = step(state, dict(batch, weights=batch["weights"] * weighted_B[:, None]))
    return float(metrics["loss"]), new.opt_state

  alone = [loss_and_grads(jnp.arange(4) == r) for r in range(4)]
  for i in range(4):
    for j in range(i):
      (loss_i, grads_i), (loss_j, grads_j) = alone[i], alone[j]
      assert abs(loss_i - loss_j) > 1e-3, f"rows {j} and {i} share their masks"
      gap = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), grads_i, grads_j)
      assert max(jax.tree.leaves(gap)) > 1e-3, f"rows {j} and {i} share their masks"
  loss, grads = loss_and_grads(jnp.ones(4))
  np.testing.assert_allclose(loss, np.mean([row_loss for row_loss, _ in alone]), **TOL)
  mean_grads = jax.tree.map(lambda *g: sum(g) / 4, *[grads for _, grads in alone])
  jax.tree_util.tree_map_with_path(
    lambda path, a, b: np.testing.assert_allclose(a, b, err_msg=jax.tree_util.keystr(path), **TOL),
    grads,
    mean_grads,
  )


# ---------------------------------------------------------------------------
# Dropout: off when deterministic, on otherwise, unbiased, fresh masks.


DROPOUT = dict(dropout_rate=P, attention_dropout_rate=P)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("family", ["decoder", "encoder_decoder"])
def test_deterministic_model_ignores_dropout_rates(family):
  """deterministic=True gives exactly the dropout-free model's output;
  deterministic=False changes it."""
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, size=(2, 6)), jnp.int32)
  inputs = (tokens, tokens) if family == "encoder_decoder" else (tokens,)
  plain = build(ModelConfig(**TINY, family=family))
  dropped = build(ModelConfig(**TINY, family=family, **DROPOUT))
  params = plain.init(jax.random.key(0), *inputs)["params"]
  expected = plain.apply({"params": params}, *inputs)
  np.testing.assert_array_equal(dropped.apply({"params": params}, *inputs), expected)
  noisy = dropped.apply(
    {"params": params}, *inputs, deterministic=False, rngs={"dropout": jax.random.key(1)}
  )
  assert np.abs(np.asarray(noisy - expected)).max() > 1e-2


def assert_unbiased(draws, expected):
  """The mean of `draws` [N, ...] matches `expected` within 5 standard errors."""
  draws = np.asarray(draws, np.float64)
  bound = 5 * draws.std(0) / np.sqrt(len(draws)) + 1e-6
  error = np.abs(draws.mean(0) - np.asarray(expected, np.float64))
  assert np.all(error <= bound), f"max error / bound {np.max(error / bound):.2f}"
  assert draws.std(0).max() > 1e-3, "the draws do not vary: dropout is off"


def mean_matches_deterministic(module, variables, *args, **kwargs):
  """Applies `module` with DRAWS dropout keys; asserts their mean is the
  deterministic output (valid where the output is linear in the masks)."""

  def draw(key):
    return module.apply(variables, *args, deterministic=False, rngs={"dropout": key}, **kwargs)

  # One compiled program: vmapped eagerly, each operation is dispatched alone.
  draws = jax.jit(jax.vmap(draw))(jax.random.split(jax.random.key(1), DRAWS))
  assert_unbiased(draws, module.apply(variables, *args, deterministic=True, **kwargs))


def test_feedforward_hidden_dropout_is_unbiased():
  """The output projection is linear in the dropped hidden layer."""
  ffn = FeedForward(ModelConfig(d_model=8, d_ff=32, activation="gelu", dropout_rate=P))
  x = jax.random.normal(jax.random.key(0), (2, 3, 8))
  mean_matches_deterministic(ffn, ffn.init(jax.random.key(2), x), x)


def test_attention_weight_dropout_is_unbiased():
  """The output is linear in the dropped attention weights."""
  cfg = ModelConfig(
    d_model=8, num_heads=4, num_kv_heads=2, head_dim=4, position="none", attention_dropout_rate=P
  )
  attention = MultiHeadAttention(cfg, causal=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  call = dict(q_positions_BxT=jnp.arange(5)[None])
  mean_matches_deterministic(attention, attention.init(jax.random.key(2), x, **call), x, **call)


def zero_output_of(module_type):
  """Context in which every `module_type` call returns zeros: with one
  sub-layer silenced, a block's output is linear in the other's masks."""

  def interceptor(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if isinstance(context.module, module_type) and context.method_name == "__call__":
      return jnp.zeros_like(out)
    return out

  return nn.intercept_methods(interceptor)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("silenced", [FeedForward, MultiHeadAttention])
def test_residual_dropout_is_unbiased(silenced):
  """Pre-LN block x + drop(f(norm(x))) with the other sub-layer silenced: the
  mean over draws is the deterministic block (residual dropout composed with
  the attention-weight or FFN-hidden dropout inside f)."""
  cfg = ModelConfig(**TINY, **DROPOUT)

  class Block(nn.Module):
    @nn.compact
    def __call__(self, x, *, deterministic):
      block = TransformerBlock(cfg, causal=True, deterministic=deterministic)
      return block(x, jnp.arange(x.shape[1])[None], None, None, None, None, None)[0]

  x = jax.random.normal(jax.random.key(0), (2, 5, cfg.d_model))
  block = Block()
  with zero_output_of(silenced):
    variables = block.init(jax.random.key(2), x, deterministic=True)
    mean_matches_deterministic(block, variables, x)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_embedding_dropout_is_unbiased():
  """The stack's input (the dropped embedding) averages to the embedding."""
  model = build(ModelConfig(**TINY, **DROPOUT))
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, size=(2, 6)), jnp.int32)
  params = model.init(jax.random.key(0), tokens)["params"]

  def stack_input(key):
    captured = []

    def interceptor(next_fun, args, kwargs, context):
      if type(context.module).__name__ == "TransformerStack":
        captured.append(args[0])
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(interceptor):
      model.apply(
        {"params": params},
        tokens,
        deterministic=key is None,
        rngs={} if key is None else {"dropout": key},
      )
    return captured[0]

  draws = jax.jit(jax.vmap(stack_input))(jax.random.split(jax.random.key(1), DRAWS))
  assert_unbiased(draws, stack_input(None))


def test_dropout_masks_differ_across_rows():
  """Identical rows get different masks (each row, and so each data-parallel
  replica's share of the batch, draws its own)."""
  model = build(ModelConfig(**TINY, **DROPOUT))
  tokens = jnp.tile(jnp.arange(1, 7, dtype=jnp.int32)[None], (4, 1))
  params = model.init(jax.random.key(0), tokens)["params"]
  logits = np.asarray(
    model.apply(
      {"params": params}, tokens, deterministic=False, rngs={"dropout": jax.random.key(1)}
    )
  )
  for i in range(1, 4):
    assert np.abs(logits[i] - logits[0]).max() > 1e-2, f"rows 0 and {i} share a mask"


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_train_step_draws_a_new_mask_each_step_and_repeats_a_step_exactly():
  """The train step folds the step number into the dropout key: the same
  params and batch at another step give another loss, the same step the same
  loss (so a resumed run replays its masks); without dropout the step number
  does not matter."""
  batch = lm_batch(0, 4, 6)
  opt = optimizer()

  def losses(cfg):
    model = build(cfg)
    state = init_state(model, opt, batch, "lm", jax.random.key(0))
    step = jax.jit(make_train_step(model, opt, "lm", seed=0))
    at = lambda n: float(step(state.replace(step=jnp.int32(n)), batch)[1]["loss"])
    return at(0), at(0), at(1)

  first, again, later = losses(ModelConfig(**TINY, **DROPOUT))
  assert first == again
  assert abs(first - later) > 1e-3
  first, _, later = losses(ModelConfig(**TINY))
  assert first == later


# ---------------------------------------------------------------------------
# Tied output embedding.


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("tied", [True, False])
def test_tied_output_trains_the_embedding_of_unseen_tokens(tied):
  """Tokens absent from the input reach the embedding table only through the
  tied output projection: their rows get a gradient iff the head is tied, and
  a tied model has no separate output matrix."""
  model = build(ModelConfig(**TINY, tie_embeddings=tied))
  batch = lm_batch(0, 2, 6, vocab=16)  # inputs and targets use ids < 16 only
  params = nn.meta.unbox(model.init(jax.random.key(0), batch["inputs"])["params"])
  assert ("logits" in params.get("head", {})) == (not tied)

  def loss(params):
    logits = model.apply({"params": params}, batch["inputs"])
    return -jnp.mean(
      jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)
    )

  grad_unseen = np.asarray(jax.grad(loss)(params)["embedder"]["token"]["embedding"][16:])
  if tied:
    assert np.all(np.abs(grad_unseen).max(-1) > 0)
  else:
    np.testing.assert_array_equal(grad_unseen, 0.0)


# ---------------------------------------------------------------------------
# Padding in the train step.


def test_train_step_ignores_padded_targets():
  """Targets under weight 0 change neither the loss nor the update, and the
  step counts only weighted tokens."""
  model = build(ModelConfig(**TINY))
  opt = optimizer()
  batch = lm_batch(0, 4, 6)
  state = init_state(model, opt, batch, "lm", jax.random.key(0))
  step = jax.jit(make_train_step(model, opt, "lm", seed=0))
  scrambled = dict(
    batch, targets=jnp.where(batch["weights"] > 0, batch["targets"], (batch["targets"] + 7) % 32)
  )
  assert np.any(np.asarray(scrambled["targets"] != batch["targets"]))
  (new, metrics), (new_scrambled, metrics_scrambled) = step(state, batch), step(state, scrambled)
  assert float(metrics["tokens"]) == float(jnp.sum(batch["weights"]))
  np.testing.assert_allclose(metrics_scrambled["loss"], metrics["loss"], **TOL)
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(new_scrambled.params)):
    np.testing.assert_allclose(b, a, **TOL)
