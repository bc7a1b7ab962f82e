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
from test_behaviour import TINY, lm_batch, optimizer

from txf.models import ModelConfig, build
from txf.train.replicas import (default_strategy, init_replicas, make_replicated_train_step,
                                replica)
from txf.train.step import init_state, make_train_step

SEEDS = (3, 5, 11)
STEPS = 3
TOL = dict(rtol=1e-5, atol=1e-6)


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


@pytest.fixture(scope="module", params=["vmap", "map"])
def replicated_run(request, parts):
  """(losses [STEPS, R], final stacked state) of the replicated step."""
  init_fn, step_for_seed, batches = parts
  step = jax.jit(make_replicated_train_step(step_for_seed, SEEDS, strategy=request.param))
  state_R, losses = init_replicas(init_fn, SEEDS), []
  for batch in batches:
    state_R, metrics_R = step(state_R, batch)
    assert metrics_R["loss"].shape == (len(SEEDS),)
    losses.append(np.asarray(metrics_R["loss"]))
  return np.stack(losses), state_R


def assert_trees_close(actual, expected):
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  paths, _ = jax.tree.flatten_with_path(expected)
  for (path, b), a in zip(paths, jax.tree.leaves(actual)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                               err_msg=jax.tree_util.keystr(path), **TOL)


def test_initial_replicas_are_the_single_runs_initial_states(parts):
  init_fn, _, _ = parts
  state_R = init_replicas(init_fn, SEEDS)
  assert all(leaf.shape[0] == len(SEEDS) for leaf in jax.tree.leaves(state_R))
  for r, seed in enumerate(SEEDS):
    assert_trees_close(replica(state_R, r), init_fn(jax.random.key(seed)))


def test_replicas_equal_separate_runs(replicated_run, single_runs):
  losses_R, state_R = replicated_run
  for r, (losses, state) in enumerate(single_runs):
    np.testing.assert_allclose(losses_R[:, r], losses, rtol=1e-5, err_msg=f"replica {r}")
    assert int(replica(state_R, r).step) == STEPS
    assert_trees_close(replica(state_R, r), state)


def test_replicas_differ(single_runs):
  """The seeds make different runs: equality above is not R copies of one."""
  losses = np.stack([run[0] for run in single_runs])
  assert np.abs(losses[0] - losses[1]).max() > 1e-3


def test_dropout_keys_differ_per_replica(parts):
  """Same initial state for every replica: only the dropout keys (the seeds)
  can make their first steps differ."""
  init_fn, step_for_seed, batches = parts
  state = init_fn(jax.random.key(0))
  state_R = jax.tree.map(lambda leaf: np.stack([leaf] * len(SEEDS)), state)
  step = jax.jit(make_replicated_train_step(step_for_seed, SEEDS, strategy="vmap"))
  _, metrics_R = step(state_R, batches[0])
  expected = [float(jax.jit(step_for_seed(seed))(state, batches[0])[1]["loss"])
              for seed in SEEDS]
  np.testing.assert_allclose(metrics_R["loss"], expected, rtol=1e-5)
  assert len(set(np.round(expected, 5))) == len(SEEDS)


def test_map_equals_vmap(parts):
  init_fn, step_for_seed, batches = parts
  state_R = init_replicas(init_fn, SEEDS)
  outs = [jax.jit(make_replicated_train_step(step_for_seed, SEEDS, strategy=s))(
      state_R, batches[0]) for s in ("vmap", "map")]
  assert_trees_close(outs[1], outs[0])


@pytest.mark.parametrize("seeds, strategy, field", [
    ((), "vmap", "seeds"), ((1, 1), "vmap", "seeds"), ((1, 2), "pmap", "strategy")])
def test_bad_arguments_name_the_argument(parts, seeds, strategy, field):
  _, step_for_seed, _ = parts
  with pytest.raises(ValueError, match=f"^{field}:"):
    make_replicated_train_step(step_for_seed, seeds, strategy=strategy)


def test_default_strategy_per_backend():
  assert default_strategy("gpu") == default_strategy("tpu") == "vmap"
  assert default_strategy("cpu") == "map"  # measured: see txf.train.replicas
