"""Tests for txf.runconfig.optim: schedule shapes (train.decay's registry, a
decay registered from user code), masked weight decay, clipping."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from conftest import tiny_config
from txf import register
from txf.runconfig import optim
from txf.runconfig.run_config import parse

PEAK = 3e-3
WARMUP = 10
STEPS = 110
END_FRACTION = 0.1


def train_config(**overrides):
  config = ml_collections.ConfigDict(
    dict(
      learning_rate=PEAK,
      warmup_steps=WARMUP,
      decay="cosine",
      steps=STEPS,
      end_lr_fraction=END_FRACTION,
      weight_decay=0.1,
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      grad_clip_norm=1.0,
    )
  )
  config.update(overrides)
  return config


def expected_lr(step, decay):
  """The schedule written out independently of optax."""
  if step < WARMUP:
    return PEAK * step / WARMUP
  end = PEAK * END_FRACTION
  progress = min(step - WARMUP, STEPS - WARMUP) / (STEPS - WARMUP)
  if decay == "cosine":
    return end + (PEAK - end) * 0.5 * (1 + math.cos(math.pi * progress))
  if decay == "linear":
    return PEAK + (end - PEAK) * progress
  if decay == "constant":
    return PEAK
  return PEAK * math.sqrt(WARMUP / step)


@pytest.mark.parametrize("decay", optim.DECAYS.names())
def test_schedule_matches_formula(decay):
  schedule = optim.make_schedule(train_config(decay=decay))
  # Warmup start and middle, peak, early/mid/late decay, end, past the end.
  for step in (0, 5, WARMUP, WARMUP + 1, 35, 60, 100, STEPS, STEPS + 50):
    np.testing.assert_allclose(
      float(schedule(step)), expected_lr(step, decay), rtol=1e-5, err_msg=f"{decay} at step {step}"
    )


def chained_schedule(config):
  """make_schedule as it was before train.decay became a registry: the if-chain
  the registry's entries must reproduce bit for bit."""
  peak, warmup, end_fraction = config.learning_rate, config.warmup_steps, config.end_lr_fraction
  warmup = min(warmup, config.steps)
  decay_steps = max(config.steps - warmup, 1)
  if config.decay == "cosine":
    after_warmup = optax.cosine_decay_schedule(peak, decay_steps, alpha=end_fraction)
  elif config.decay == "linear":
    after_warmup = optax.linear_schedule(peak, peak * end_fraction, decay_steps)
  elif config.decay == "constant":
    after_warmup = optax.constant_schedule(peak)
  else:

    def after_warmup(s):
      return peak * jax.lax.rsqrt(jnp.maximum(s, 0) / warmup + 1.0)

  if warmup == 0:
    return after_warmup
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after_warmup], [warmup])


DEFAULT_DECAYS = ("cosine", "linear", "constant", "rsqrt")
# Schedules around train_config's: other peak and end, no warmup (rsqrt needs
# one), a warmup longer than the run.
SCHEDULE_CHANGES = {
  "default": {},
  "peak_1_end_0": dict(learning_rate=1.0, end_lr_fraction=0.0),
  "no_warmup": dict(warmup_steps=0),
  "long_warmup": dict(warmup_steps=200),
}


@pytest.mark.parametrize(
  "decay, changes",
  [
    (decay, name)
    for decay in DEFAULT_DECAYS
    for name in SCHEDULE_CHANGES
    if (decay, name) != ("rsqrt", "no_warmup")
  ],
)
def test_the_default_decays_give_bitwise_the_learning_rates_they_gave(decay, changes):
  config = train_config(decay=decay, **SCHEDULE_CHANGES[changes])
  steps = jnp.arange(STEPS + 20)
  got = np.asarray(optim.make_schedule(config)(steps))
  np.testing.assert_array_equal(got, np.asarray(chained_schedule(config)(steps)), strict=True)
  # One step at a time, as a resume reads the rate of its next update (a Python int).
  for step in (0, WARMUP, STEPS):
    assert float(optim.make_schedule(config)(step)) == float(chained_schedule(config)(step))


@pytest.mark.parametrize("decay", DEFAULT_DECAYS)
def test_the_default_decays_at_their_ends_against_float64(decay):
  """Step 0 (the first update: lr 0), the end of warmup (the peak) and the
  last step (cosine, linear: end_lr_fraction of the peak; rsqrt: P sqrt(W / T))."""
  schedule = optim.make_schedule(train_config(decay=decay))
  peak, end = np.float64(PEAK), np.float64(PEAK) * END_FRACTION
  last = {
    "cosine": end,
    "linear": end,
    "constant": peak,
    "rsqrt": peak * np.sqrt(np.float64(WARMUP) / STEPS),
  }
  for step, want in ((0, 0.0), (WARMUP, peak), (STEPS, last[decay])):
    np.testing.assert_allclose(float(schedule(step)), want, rtol=2e-7, err_msg=f"step {step}")


def rsqrt_cooldown(phase):
  """docs/extending.md's decay: P sqrt(W / t), then a straight line to 0 over
  the last tenth of the decay."""
  if phase.warmup == 0:
    raise ValueError("train.warmup_steps: 'rsqrt_cooldown' needs a warmup")
  cooldown = max(phase.steps // 10, 1)

  def schedule(s):
    s = jnp.maximum(s, 0)
    rsqrt = jnp.sqrt(phase.warmup / (phase.warmup + s))
    return phase.peak * rsqrt * jnp.clip((phase.steps - s) / cooldown, 0.0, 1.0)

  return schedule


def rsqrt_cooldown_float64(step, peak, warmup, steps):
  """rsqrt_cooldown's rates at `step` (warmup before it), written out in float64."""
  t = np.asarray(step, np.float64)
  cooldown = max((steps - warmup) // 10, 1)
  after = peak * np.sqrt(warmup / np.maximum(t, warmup)) * np.clip((steps - t) / cooldown, 0, 1)
  return np.where(t < warmup, peak * t / warmup, after)


def test_a_registered_decay_is_a_runs_schedule():
  with optim.DECAYS.scoped():
    register.decay("rsqrt_cooldown")(rsqrt_cooldown)
    schedule = optim.make_schedule(train_config(decay="rsqrt_cooldown"))
    run = parse(tiny_config(steps=40, train__decay="rsqrt_cooldown"))
    with pytest.raises(ValueError, match=r"^train\.warmup_steps: 'rsqrt_cooldown' needs"):
      optim.make_schedule(train_config(decay="rsqrt_cooldown", warmup_steps=0))
  assert "rsqrt_cooldown" not in optim.DECAYS  # scoped: undone
  steps = np.arange(STEPS + 5)
  want = rsqrt_cooldown_float64(steps, PEAK, WARMUP, STEPS)
  np.testing.assert_allclose(np.asarray(schedule(jnp.asarray(steps))), want, rtol=1e-6, atol=0)
  assert float(schedule(STEPS - 10)) > 0 and float(schedule(STEPS)) == 0.0  # its cooldown
  peak, warmup = run.train.learning_rate, run.train.warmup_steps
  np.testing.assert_allclose(
    np.asarray(run.schedule(jnp.arange(45))),
    rsqrt_cooldown_float64(np.arange(45), peak, warmup, 40),
    rtol=1e-6,
  )


def test_an_unknown_decay_lists_the_registered_ones():
  with optim.DECAYS.scoped():
    register.decay("rsqrt_cooldown")(rsqrt_cooldown)
    with pytest.raises(ValueError) as raised:
      optim.make_optimizer(train_config(decay="exponential"))
  assert str(raised.value) == (
    "train.decay: 'exponential' is not one of "
    "('cosine', 'linear', 'constant', 'rsqrt', 'rsqrt_cooldown')"
  )


@pytest.mark.parametrize("decay", ["cosine", "linear"])
@pytest.mark.parametrize("fraction", [0.0, 1.0])
def test_end_lr_fraction_takes_both_ends_of_its_range(decay, fraction):
  """0: the decay ends at 0; 1: it stays at the peak (both accepted),
  against the formula in float64."""
  schedule = optim.make_schedule(train_config(decay=decay, end_lr_fraction=fraction))
  middle = WARMUP + (STEPS - WARMUP) // 2  # cosine and linear: halfway from P to E
  for step, want in ((middle, PEAK * (1 + fraction) / 2), (STEPS, PEAK * fraction)):
    np.testing.assert_allclose(float(schedule(step)), want, rtol=1e-6, atol=1e-12)


def test_schedule_without_warmup_starts_at_peak():
  schedule = optim.make_schedule(train_config(warmup_steps=0, decay="linear"))
  np.testing.assert_allclose(float(schedule(0)), PEAK, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(STEPS)), PEAK * END_FRACTION, rtol=1e-5)


@pytest.mark.parametrize("decay", optim.DECAYS.names())
def test_a_warmup_longer_than_the_run_is_clamped_to_it(decay):
  steps = 30
  clamped = optim.make_schedule(train_config(decay=decay, steps=steps, warmup_steps=60))
  whole = optim.make_schedule(train_config(decay=decay, steps=steps, warmup_steps=steps))
  lrs = [float(clamped(t)) for t in range(steps + 1)]
  assert lrs == [float(whole(t)) for t in range(steps + 1)]
  np.testing.assert_allclose(lrs[:steps], [PEAK * t / steps for t in range(steps)], rtol=1e-6)
  assert optim.fitted_warmup(60, steps) == steps and optim.fitted_warmup(7, steps) == 7


def test_schedule_is_jittable():
  schedule = optim.make_schedule(train_config())
  np.testing.assert_allclose(
    float(jax.jit(schedule)(jnp.int32(60))), expected_lr(60, "cosine"), rtol=1e-5
  )


def params_tree():
  return {
    "embed": {"embedding": jnp.full((5, 4), 2.0)},
    "dense": {"kernel": jnp.full((4, 3), -1.5), "bias": jnp.full((3,), 0.7)},
    "norm": {"scale": jnp.ones((4,))},
  }


def test_weight_decay_only_touches_matrices():
  config = train_config(warmup_steps=0, decay="constant")
  tx = optim.make_optimizer(config)
  params = params_tree()
  # Zero gradients: Adam's direction is 0, so only weight decay moves params.
  grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  for path, update in jax.tree_util.tree_leaves_with_path(updates):
    param = params
    for key in path:
      param = param[key.key]
    if param.ndim >= 2:
      np.testing.assert_allclose(
        update, -PEAK * config.weight_decay * param, rtol=1e-6, err_msg=str(path)
      )
    else:
      np.testing.assert_array_equal(update, 0.0, err_msg=str(path))


@pytest.mark.parametrize("layout", [dict(scan_layers=True), dict(use_bias=True)])
def test_weight_decay_leaves_every_bias_and_norm_scale_of_a_model_alone(layout):
  """A scanned stack's norm scales and biases are [L, D] and attention's
  biases [H, Dh]: decayed when ndim >= 2 chose (gpt2_small has biases, and
  scan_layers, documented as a compile-time option, changed what trained)."""
  from flax.traverse_util import flatten_dict

  from txf import models
  from txf.models import ModelConfig

  cfg = ModelConfig(vocab_size=50, d_model=32, num_heads=4, num_layers=2, max_len=16, **layout)
  params = nn.meta.unbox(models.build(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32)))
  params = jax.tree.map(jnp.ones_like, params["params"])  # biases start at 0: decay moves none
  tx = optim.make_optimizer(train_config(warmup_steps=0, decay="constant"))
  updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
  decayed = {path[-1] for path, u in flatten_dict(updates).items() if np.any(np.asarray(u))}
  kept = {path[-1] for path, u in flatten_dict(updates).items() if not np.any(np.asarray(u))}
  assert decayed == {"kernel", "embedding"}
  assert kept == {"bias", "scale"} and any(
    np.ndim(p) >= 2 for path, p in flatten_dict(params).items() if path[-1] in kept
  )


def reference_adamw(params, grads_per_step, config, clip):
  """Clipping + AdamW written out in numpy (optax's conventions)."""
  schedule = optim.make_schedule(config)
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in params.items()}
  nu = {k: np.zeros_like(v) for k, v in params.items()}
  for t, grads in enumerate(grads_per_step):
    norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads.values()))
    factor = min(1.0, clip / norm) if clip else 1.0
    lr = float(schedule(t))
    for k, p in params.items():
      g = np.asarray(grads[k], np.float64) * factor
      mu[k] = config.b1 * mu[k] + (1 - config.b1) * g
      nu[k] = config.b2 * nu[k] + (1 - config.b2) * g * g
      mu_hat = mu[k] / (1 - config.b1 ** (t + 1))
      nu_hat = nu[k] / (1 - config.b2 ** (t + 1))
      direction = mu_hat / (np.sqrt(nu_hat) + config.eps)
      if p.ndim >= 2:
        direction = direction + config.weight_decay * p
      params[k] = p - lr * direction
  return params


# Not TrainConfig's defaults (b1 0.9, b2 0.95, eps 1e-8, weight decay 0.1),
# which train_config() holds: an optimizer ignoring a setting for its default
# matched the reference.
OTHER_ADAMW = dict(b1=0.8, b2=0.99, eps=1e-2, weight_decay=0.3)


@pytest.mark.parametrize(
  "clip, settings, norm_given",
  [
    (0.0, {}, False),
    (0.5, {}, False),
    (0.5, {}, True),  # the train step's call: the norm it computed, given
    (0.5, OTHER_ADAMW, True),
    (0.0, OTHER_ADAMW, False),
  ],
  ids=["no_clip", "clip", "clip_norm_given", "other_settings_clip", "other_settings"],
)
def test_two_steps_match_reference(clip, settings, norm_given):
  config = train_config(warmup_steps=0, decay="linear", grad_clip_norm=clip, **settings)
  tx = optax.with_extra_args_support(optim.make_optimizer(config))
  rng = np.random.default_rng(0)
  params = {
    "kernel": jnp.asarray(rng.normal(size=(4, 3)), jnp.float32),
    "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
  }
  # A large gradient (clipped when clip > 0) followed by a small one: the
  # clip factor differs between steps, which Adam's scale invariance
  # would otherwise hide.
  grads_per_step = [
    jax.tree.map(lambda p: 50.0 * jnp.asarray(rng.normal(size=p.shape), jnp.float32), params),
    jax.tree.map(lambda p: 0.01 * jnp.asarray(rng.normal(size=p.shape), jnp.float32), params),
  ]
  state = tx.init(params)
  got = params
  for grads in grads_per_step:
    norm = {"grad_norm": optim.global_norm(grads)} if norm_given else {}
    updates, state = tx.update(grads, state, got, **norm)
    got = jax.tree.map(lambda p, u: p + u, got, updates)
  want = reference_adamw(params, grads_per_step, config, clip)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
  if clip:
    unclipped = reference_adamw(params, grads_per_step, config, 0.0)
    assert not np.allclose(unclipped["kernel"], want["kernel"], rtol=1e-4)
  # Each setting read as its default would miss the reference by more than
  # the tolerance above.
  for name in settings:
    read_as_default = dict(config, **{name: train_config()[name]})
    missed = reference_adamw(params, grads_per_step, train_config(**read_as_default), clip)
    assert not np.allclose(missed["kernel"], want["kernel"], rtol=1e-5, atol=1e-7), name


@pytest.mark.parametrize(
  "overrides, field",
  [
    (dict(decay="exponential"), "train.decay"),
    (dict(warmup_steps=-1), "train.warmup_steps"),
    (dict(warmup_steps=0, decay="rsqrt"), "train.warmup_steps"),
    (dict(learning_rate=-1e-3), "train.learning_rate"),
    (dict(learning_rate=float("nan")), "train.learning_rate"),
    (dict(steps=0), "train.steps"),
    (dict(steps=10.5), "train.steps"),
    (dict(end_lr_fraction=1.5), "train.end_lr_fraction"),
    (dict(weight_decay=-0.1), "train.weight_decay"),
    (dict(b1=1.0), "train.b1"),
    (dict(b2=-0.1), "train.b2"),
    (dict(eps=0.0), "train.eps"),
    (dict(grad_clip_norm=-1.0), "train.grad_clip_norm"),
  ],
)
def test_bad_fields_name_the_field(overrides, field):
  config = train_config()
  for key, value in overrides.items():
    # ConfigDict.update would refuse a type change (steps=10.5); bypass it.
    config.unlock()
    del config[key]
    config[key] = value
  # As every field's check words it: 'train.eps: must be ...' (this one's
  # said 'train.eps must be ...' with a trailing period).
  with pytest.raises(ValueError, match="^" + field.replace(".", r"\.") + ": "):
    optim.make_optimizer(config)


@pytest.mark.parametrize(
  "overrides",
  [
    dict(warmup_steps=0),
    dict(warmup_steps=STEPS),
    dict(weight_decay=0.0, grad_clip_norm=0.0, b1=0.0, b2=0.0),
    dict(eps=1e-30),
  ],
)
def test_the_ends_of_each_fields_range_are_taken(overrides):
  """Each value at its range's end is taken, not refused (end_lr_fraction's
  ends: test_end_lr_fraction_takes_both_ends_of_its_range)."""
  optim.make_optimizer(train_config(**overrides))


def test_missing_field_is_named():
  config = train_config()
  del config["b2"]
  with pytest.raises(ValueError, match=r"train\.b2"):
    optim.make_optimizer(config)


@pytest.mark.parametrize("concatenated", [True, False])
def test_global_norm_over_mixed_leaves_matches_float64(concatenated):
  """optim.global_norm (the small leaves concatenated, or every leaf reduced
  on its own as for sharded leaves) against numpy's float64 norm, with bf16
  and f32 leaves of several ranks, one over `CONCATENATED_BELOW` and an
  empty one; rtol 1e-6 (sums of up to 66,000 squares in float32)."""
  rng = np.random.default_rng(1)
  tree = {
    "large": jnp.asarray(rng.normal(size=(optim.CONCATENATED_BELOW + 7,)), jnp.float32),
    "kernel": jnp.asarray(rng.normal(size=(30, 40)), jnp.float32),
    "bias": jnp.asarray(rng.normal(size=(40,)), jnp.bfloat16),
    "nested": {"table": jnp.asarray(rng.normal(size=(2, 3, 133)), jnp.float32)},
    "empty": jnp.zeros((0,), jnp.float32),
  }
  want = math.sqrt(
    sum(float(np.sum(np.square(np.asarray(leaf, np.float64)))) for leaf in jax.tree.leaves(tree))
  )
  norm = jax.jit(functools.partial(optim.global_norm, concatenated=concatenated))(tree)
  np.testing.assert_allclose(float(norm), want, rtol=1e-6)
