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
from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
from etils import epath

from txf.configs import set_field
from txf.runconfig.run_config import parse
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
  log: Callable[[str], None] = print,
) -> tuple[TrainedRun, dict[str, float]]:
  """Trains `config` (parsed here, txf.runconfig.run_config.parse) in
  out_dir/runs/<run_name> (resuming, or only evaluating a finished run) and
  restores it; returns (the trained run, its final eval metrics)."""
  workdir = epath.Path(out_dir) / RUNS_DIR / run_name
  workdir.mkdir(parents=True, exist_ok=True)
  metrics = train_run(parse(config), workdir, log=log)
  return load_run(workdir), metrics
