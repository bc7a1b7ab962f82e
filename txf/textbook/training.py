"""Training for the experiments that need a trained model: the one runner.

An experiment derives its run config from the `base_config` it is given
(configs/<name>.py's, passed by the command) with dotted overrides, trains it
with txf.train.loop.run in a work directory under the experiment's output
directory, and restores it with txf.train.run_setup.load_run. Running the
experiment again on the same directory finds the run trained and only
evaluates it; a run directory trained with other settings (e.g. the other
size) is refused by the runner, naming the field.
"""

from __future__ import annotations

import copy
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
from etils import epath

from txf.configs import set_field
from txf.progress import say
from txf.runconfig.run_config import RunConfig, parse
from txf.rundir.checkpoint import PreemptionGuard
from txf.train.loop import run as train_run
from txf.train.run_setup import TrainedRun, load_run

RUNS_DIR = "runs"


def derive_config(
  base_config: ml_collections.ConfigDict, overrides: Mapping[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of `base_config` with dotted fields set ({"model.d_model": 64, ...};
  txf.configs.set_field: ValueError naming an unknown field or a value of the
  wrong type)."""
  config = copy.deepcopy(base_config)
  for name, value in overrides.items():
    set_field(config, name, value)
  return config


def train(
  config: ml_collections.ConfigDict,
  out_dir: str | os.PathLike,
  run_name: str,
  *,
  log: Callable[[str], None] = say,
) -> tuple[TrainedRun, dict[str, float]]:
  """Trains `config` (parsed here, txf.runconfig.run_config.parse) in
  out_dir/runs/<run_name> (resuming, or only evaluating a finished run) and
  restores it; returns (the trained run, its final eval metrics)."""
  workdir = epath.Path(out_dir) / RUNS_DIR / run_name
  workdir.mkdir(parents=True, exist_ok=True)
  metrics = train_to_end(parse(config), workdir, log=log)
  return load_run(workdir), metrics


def train_to_end(
  run: RunConfig, workdir: str | os.PathLike, *, log: Callable[[str], None] = say
) -> dict[str, float]:
  """txf.train.loop.run of `run` in `workdir`; returns its final eval
  metrics. A SIGTERM or Ctrl-C saves the run, as txf-run does, and then
  stops the experiment as if the run had not caught it (the command says
  `terminated` or `interrupted`; the same command resumes): an experiment
  went on with the unfinished run's metrics (a KeyError, a traceback)."""
  with PreemptionGuard() as guard:
    metrics = train_run(run, workdir, log=log, preemption=guard)
  if guard.requested:
    if guard.interrupted:
      raise KeyboardInterrupt
    signal.raise_signal(signal.SIGTERM)
  return metrics
