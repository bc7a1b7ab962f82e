"""Seed replicas (txf.train.replicas) against separate single runs.

The reference is the existing single-run step (txf.train.step) run once per
seed; replicas batch the same float32 computation differently, so they agree
up to summation order: per-step losses within rtol 1e-5, states within
rtol 1e-5 / atol 1e-6. Dropout is on, so a replica that used another
replica's dropout key (or the same key for all) would drift far outside that.
"""

import jax
import numpy as np
import pytest
from test_training_behaviour import TINY, lm_batch, optimizer

from txf.models import ModelConfig, build
from txf.train.replicas import (
  STRATEGIES,
  default_strategy,
  init_replicas,
  make_replicated_train_step,
  replica,
)
from txf.train.step import init_state, make_train_step

SEEDS = (3, 11)
STEPS = 3
# Adam divides by sqrt(v): where a gradient is near 0, the vmapped program's
# own reduction order moves an update by a sliver of the step (seen: 2.3e-6
# after 3 steps). atol is 1% of one step (learning rate 3e-3); a replica
# with another seed, batch or dropout key is off by a whole step or more.
TOL = dict(rtol=1e-5, atol=3e-5)


@pytest.fixture(scope="module")
def parts():
  model = build(ModelConfig(**TINY, family="decoder", dropout_rate=0.2))
  opt = optimizer()
  batches = [lm_batch(i, 4, 8) for i in range(STEPS)]
  init_fn = lambda key: init_state(model, opt, batches[0], "lm", key)
  step_for_seed = lambda seed: make_train_step(model, opt, "lm", seed=seed)
  return init_fn, step_for_seed, batches


@pytest.fixture(scope="module")
def single_runs(parts):
  """Per seed: (losses per step, final state) of an ordinary single run."""
  init_fn, step_for_seed, batches = parts
  runs = []
  for seed in SEEDS:
    state, step = init_fn(jax.random.key(seed)), jax.jit(step_for_seed(seed))
    losses = []
    for batch in batches:
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
    runs.append((np.array(losses), state))
  return runs


@pytest.fixture(scope="module")
def replicated_steps(parts):
  """strategy -> the jitted replicated step."""
  _, step_for_seed, _ = parts
  return {
    strategy: jax.jit(make_replicated_train_step(step_for_seed, SEEDS, strategy=strategy))
    for strategy in STRATEGIES
  }


@pytest.fixture(scope="module")
def replicated_runs(parts, replicated_steps):
  """strategy -> (losses [STEPS, R], final stacked state)."""
  init_fn, _, batches = parts
  runs = {}
  for strategy, step in replicated_steps.items():
    state_R, losses = init_replicas(init_fn, SEEDS), []
    for batch in batches:
      state_R, metrics_R = step(state_R, batch)
      assert metrics_R["loss"].shape == (len(SEEDS),)
      losses.append(np.asarray(metrics_R["loss"]))
    runs[strategy] = (np.stack(losses), state_R)
  return runs


def assert_trees_close(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  paths, _ = jax.tree.flatten_with_path(expected)
  for (path, b), a in zip(paths, jax.tree.leaves(actual)):
    np.testing.assert_allclose(
      np.asarray(a), np.asarray(b), err_msg=jax.tree_util.keystr(path), **TOL
    )


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_initial_replicas_are_the_single_runs_initial_states(parts):
  init_fn, _, _ = parts
  state_R = init_replicas(init_fn, SEEDS)
  assert all(leaf.shape[0] == len(SEEDS) for leaf in jax.tree.leaves(state_R))
  for r, seed in enumerate(SEEDS):
    assert_trees_close(replica(state_R, r), init_fn(jax.random.key(seed)))


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_replicas_equal_separate_runs(replicated_runs, single_runs, strategy):
  losses_R, state_R = replicated_runs[strategy]
  for r, (losses, state) in enumerate(single_runs):
    np.testing.assert_allclose(losses_R[:, r], losses, rtol=1e-5, err_msg=f"replica {r}")
    assert int(replica(state_R, r).step) == STEPS
    assert_trees_close(replica(state_R, r), state)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_map_equals_vmap(replicated_runs):
  np.testing.assert_allclose(replicated_runs["map"][0], replicated_runs["vmap"][0], rtol=1e-5)
  assert_trees_close(replicated_runs["map"][1], replicated_runs["vmap"][1])


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_replicas_differ(single_runs):
  """The seeds make different runs: equality above is not R copies of one."""
  losses = np.stack([run[0] for run in single_runs])
  assert np.abs(losses[0] - losses[1]).max() > 1e-3


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_dropout_keys_differ_per_replica(parts, replicated_steps):
  """Every replica from the same initial state: only the dropout keys (the
  seeds) can make their first losses differ."""
  init_fn, _, batches = parts
  state = init_fn(jax.random.key(0))
  state_R = jax.tree.map(lambda leaf: np.stack([leaf] * len(SEEDS)), state)
  _, metrics_R = replicated_steps["vmap"](state_R, batches[0])
  losses = np.asarray(metrics_R["loss"])
  assert np.abs(losses[:, None] - losses[None, :]).max() > 1e-3
  assert len(set(np.round(losses, 4))) == len(SEEDS)


@pytest.mark.parametrize(
  "seeds, strategy, field",
  [((), "vmap", "seeds"), ((1, 1), "vmap", "seeds"), ((1, 2), "pmap", "strategy")],
)
def test_bad_arguments_name_the_argument(parts, seeds, strategy, field):
  _, step_for_seed, _ = parts
  with pytest.raises(ValueError, match=f"^{field}:"):
    make_replicated_train_step(step_for_seed, seeds, strategy=strategy)


def test_default_strategy_per_backend():
  assert default_strategy("gpu") == default_strategy("tpu") == "vmap"
  assert default_strategy("cpu") == "map"  # measured: see txf.train.replicas


# Seed replicas of an LSTM initialised in one program: under jax.vmap its
# orthogonal initialiser's batched QR deadlocked jaxlib 0.10's CPU thread
# pool on 2 cores (every try: width 64, 3 replicas), so this runs in a child
# process that is killed if it does not finish.
_LSTM_INIT = """
import jax, numpy as np, optax
from txf.models import ModelConfig, build
from txf.train.replicas import init_replicas, replica
from txf.train.step import init_state
model = build(ModelConfig(family="lstm", d_model=64, num_layers=2, vocab_size=67))
batch = {name: np.zeros((32, 64), np.int32) for name in ("inputs", "targets")}
batch["weights"] = np.ones((32, 64), np.float32)
init_fn = lambda key: init_state(model, optax.adamw(1e-3), batch, "lm", key)
state_R = jax.jit(lambda: init_replicas(init_fn, (0, 1, 2)))()
single = init_fn(jax.random.key(2))
same = jax.tree.map(lambda a, b: bool((a == b).all()), replica(state_R.params, 2), single.params)
print("replica 2 is seed 2:", all(jax.tree.leaves(same)))
"""


@pytest.mark.slow  # a child process: about 10 s
def test_replicas_of_an_lstm_initialise_without_deadlock_and_as_single_runs():
  import subprocess
  import sys

  done = subprocess.run(
    [sys.executable, "-c", _LSTM_INIT], capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert "replica 2 is seed 2: True" in done.stdout
