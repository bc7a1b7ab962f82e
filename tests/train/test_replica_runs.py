"""Runs of seed replicas (config `replicas`) through the real loop against
separate single runs of the same seeds.

A run of R replicas with seed s trains seeds s .. s + R - 1 on the batches of
seed s; replica r must be the single run of seed s + r with data.seed = s: per-step losses and
evaluation losses within rtol 1e-5 (the replicas batch the same float32
computation differently, so only the summation order differs). Dropout is on,
so a replica with another replica's dropout keys would be far outside that.
With data.seed_per_replica replica r reads its own batches, and must be the
single run of seed s + r with data.seed d + r.
"""

import json

import jax
import numpy as np
import pytest

from conftest import TIMING_KEYS, tiny_config
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.metrics import read_metrics
from txf.train import loop
from txf.train.run_setup import load_run, load_trained
from txf.trained.export import export_run
from txf.trained.extrapolate import extrapolate_run

REPLICAS = 2
STEPS = 6
TOL = dict(rtol=1e-5, atol=1e-6)
# Every test trains runs, or reads the module's trained runs (fixtures).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


def config_for(*, seed=0, replicas=1, steps=STEPS, data_seed=0, own_batches=False):
  config = tiny_config(
    "base",
    steps=steps,
    model__dropout_rate=0.1,
    eval__every=3,
    train__checkpoint_every=3,
    train__warmup_steps=2,
  )
  config.seed, config.replicas = seed, replicas
  config.data.seed = data_seed  # replicas share its batches unless own_batches
  config.data.seed_per_replica = own_batches
  return config


def rows(workdir, key):
  """{step: row} of the metrics rows holding `key`."""
  return {row["step"]: row for row in read_metrics(workdir) if key in row}


@pytest.fixture(scope="module")
def single_runs(tmp_path_factory):
  """seed -> the work directory of an ordinary single run of that seed."""
  workdirs = {}
  for seed in range(REPLICAS):
    workdirs[seed] = tmp_path_factory.mktemp(f"single{seed}")
    loop.run(parse(config_for(seed=seed)), workdirs[seed], log=lambda line: None)
  return workdirs


@pytest.fixture(scope="module")
def replicated_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("replicated")
  loop.run(parse(config_for(replicas=REPLICAS)), workdir, log=lambda line: None)
  return workdir


def test_each_replica_is_the_single_run_of_its_seed(single_runs, replicated_run):
  replicated_loss, replicated_eval = rows(replicated_run, "loss"), rows(replicated_run, "eval_loss")
  assert sorted(replicated_loss) == list(range(1, STEPS + 1))
  for r, workdir in single_runs.items():
    single_loss, single_eval = rows(workdir, "loss"), rows(workdir, "eval_loss")
    np.testing.assert_allclose(
      [replicated_loss[s][f"loss/{r}"] for s in single_loss],
      [row["loss"] for row in single_loss.values()],
      **TOL,
    )
    np.testing.assert_allclose(
      [replicated_eval[s][f"eval_loss/{r}"] for s in single_eval],
      [row["eval_loss"] for row in single_eval.values()],
      **TOL,
    )
  # The replicas differ (different seeds), by far more than the tolerance.
  last = replicated_loss[STEPS]
  assert abs(last["loss/0"] - last["loss/1"]) > 1e-3


@pytest.fixture(scope="module")
def own_batches_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("own_batches")
  loop.run(parse(config_for(replicas=REPLICAS, own_batches=True)), workdir, log=lambda line: None)
  return workdir


def test_with_own_batches_each_replica_is_the_single_run_of_its_seed_and_data_seed(
  single_runs, replicated_run, own_batches_run, tmp_path
):
  own = rows(own_batches_run, "loss")
  single_losses = lambda workdir: [row["loss"] for row in rows(workdir, "loss").values()]
  # Replica 0 reads data seed 0 + 0: the single run of seed 0 (data.seed 0).
  np.testing.assert_allclose([own[s]["loss/0"] for s in own], single_losses(single_runs[0]), **TOL)
  # Replica 1 reads data seed 0 + 1: the single run of seed 1 with data.seed 1 ...
  loop.run(parse(config_for(seed=1, data_seed=1)), tmp_path, log=lambda line: None)
  np.testing.assert_allclose([own[s]["loss/1"] for s in own], single_losses(tmp_path), **TOL)
  # ... not the shared-batch replica of seed 1, which read data seed 0.
  shared = rows(replicated_run, "loss")
  assert max(abs(own[s]["loss/1"] - shared[s]["loss/1"]) for s in own) > 1e-2
  assert rows(own_batches_run, "eval_loss")[STEPS]["eval_loss/1"] != pytest.approx(
    rows(replicated_run, "eval_loss")[STEPS]["eval_loss/1"], rel=1e-5
  )


def test_resume_with_own_batches_continues_each_replicas_data(own_batches_run, tmp_path):
  """The checkpoint holds every replica's data position: training to step 3,
  then on to 6, gives the uninterrupted run's rows."""
  config = lambda steps: config_for(replicas=REPLICAS, steps=steps, own_batches=True)
  loop.run(parse(config(3)), tmp_path, log=lambda line: None)
  loop.run(parse(config(STEPS)), tmp_path, log=lambda line: None)
  strip = lambda table: {
    step: {k: v for k, v in row.items() if k not in TIMING_KEYS} for step, row in table.items()
  }
  assert strip(rows(tmp_path, "loss")) == strip(rows(own_batches_run, "loss"))
  with pytest.raises(ConfigError, match="data.seed_per_replica"):
    loop.run(
      parse(config_for(replicas=REPLICAS, own_batches=False)), tmp_path, log=lambda line: None
    )


def test_rows_hold_the_mean_and_sample_std_of_the_replicas(replicated_run):
  for key in ("loss", "eval_loss", "eval_perplexity"):
    for row in rows(replicated_run, key).values():
      values = [row[f"{key}/{r}"] for r in range(REPLICAS)]
      np.testing.assert_allclose(row[key], np.mean(values), rtol=1e-12)
      np.testing.assert_allclose(row[f"{key}_std"], np.std(values, ddof=1), rtol=1e-9)


def test_load_run_holds_every_replica_and_each_is_the_single_runs(single_runs, replicated_run):
  trained = load_run(replicated_run)
  for r, workdir in single_runs.items():
    single = load_run(workdir)
    for got, want in zip(
      jax.tree.leaves(trained.setup.replica_params(trained.params, r)),
      jax.tree.leaves(single.params),
    ):
      np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="replica: 2"):
    trained.setup.replica_params(trained.params, REPLICAS)


def test_a_command_reading_a_replicated_run_says_it_reads_the_first_replica(
  single_runs, replicated_run, tmp_path
):
  """txf-export, txf-generate and txf-embed take replica 0 (the single run
  of seed 0); they did so without a word. The export's line and the
  commands' stderr line come from replica_read; a single run has none."""
  trained = load_trained(replicated_run)
  assert trained.replica_read == f"its first of {REPLICAS} seed replicas (seed 0)"
  single = load_trained(single_runs[0])
  assert single.replica_read is None
  for got, want in zip(
    jax.tree.leaves(trained.pretrained.params), jax.tree.leaves(single.pretrained.params)
  ):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  assert export_run(replicated_run, tmp_path / "export").replica == trained.replica_read


def test_resume_of_a_replicated_run_is_exact(tmp_path, replicated_run):
  """Training to step 3, then on to 6, gives the uninterrupted run's rows."""
  loop.run(parse(config_for(replicas=REPLICAS, steps=3)), tmp_path, log=lambda line: None)
  loop.run(parse(config_for(replicas=REPLICAS)), tmp_path, log=lambda line: None)
  strip = lambda table: {
    step: {k: v for k, v in row.items() if k not in TIMING_KEYS} for step, row in table.items()
  }
  assert strip(rows(tmp_path, "loss")) == strip(rows(replicated_run, "loss"))
  assert (
    strip(rows(tmp_path, "eval_loss"))[STEPS] == strip(rows(replicated_run, "eval_loss"))[STEPS]
  )


def test_replicas_is_a_field_the_checkpoints_depend_on(replicated_run, tmp_path):
  with pytest.raises(ConfigError, match="replicas: differs"):
    loop.run(parse(config_for(replicas=3)), replicated_run, log=lambda line: None)
  with pytest.raises(ConfigError, match="replicas"):
    loop.run(parse(config_for(replicas=0)), tmp_path / "zero", log=lambda line: None)
  saved = json.loads((replicated_run / "config.json").read_text())
  assert saved["replicas"] == REPLICAS


def test_extrapolation_of_a_replicated_run_is_each_replicas(single_runs, replicated_run):
  """extrapolate_run scores every replica: its per-replica losses are the
  single runs' (within 1e-4: the parameters agree to rtol 1e-4), "loss" is
  their mean, and at 1x the mean is the run's own final eval_loss."""
  record = extrapolate_run(replicated_run, factors=(1, 2))
  singles = [extrapolate_run(workdir, factors=(1, 2)) for workdir in single_runs.values()]
  for protocol, by_length in record["replica_loss"].items():
    for at, values in enumerate(by_length):
      assert len(values) == REPLICAS
      np.testing.assert_allclose(
        values, [single["loss"][protocol][at] for single in singles], rtol=1e-4
      )
      np.testing.assert_allclose(record["loss"][protocol][at], np.mean(values), rtol=1e-12)
  final_eval = rows(replicated_run, "eval_loss")[STEPS]["eval_loss"]
  np.testing.assert_allclose(record["loss"]["non_overlapping"][0], final_eval, rtol=1e-5)
  assert len(record["per_position"]["loss"]) == 2 * record["train_length"]
  # The replicas' mean at each position (replica 0's alone passed the length check).
  np.testing.assert_allclose(
    record["per_position"]["loss"],
    np.mean([single["per_position"]["loss"] for single in singles], axis=0),
    rtol=1e-4,
  )
