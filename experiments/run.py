"""Train and evaluate one config: the main job.

  python -m experiments.run --config=configs/rope.py [--workdir=DIR] [--config.train.steps=200]

The work directory defaults to workdirs/<config name>. Rerunning the same
command on the same work directory resumes from its latest checkpoint.
A config error stops the run before any compute with one line naming the
field (exit status 2); a diverged run exits 1 and keeps its last good
checkpoint; a preempted run (SIGTERM) saves and exits 0.
"""

from __future__ import annotations

import pathlib
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments.cli import parse_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a config file (file.py[:arg]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None,
                               "Run directory (default: workdirs/<config file stem>).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None,
    "host:port of process 0, for multi-process runs outside SLURM/MPI/Cloud TPU "
    "(which are detected automatically).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")
flags.mark_flag_as_required("config")


def default_workdir(config_path: str) -> pathlib.Path:
  stem = pathlib.Path(config_path.split(":")[0]).stem
  arg = config_path.partition(":")[2]
  return pathlib.Path("workdirs") / (f"{stem}_{arg}" if arg else stem)


def main(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from txf.train import distributed
  from txf.train.loop import ConfigError, TrainingDiverged, run  # after flag parsing: fast --help
  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  workdir = _WORKDIR.value or default_workdir(flags.FLAGS["config"].config_filename)
  try:
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  except ValueError as error:
    print(f"flag error: {error}", file=sys.stderr)
    sys.exit(2)
  try:
    run(_CONFIG.value, workdir)
  except ConfigError as error:
    print(f"config error: {error}", file=sys.stderr)
    sys.exit(2)
  except TrainingDiverged as error:
    print(f"diverged: {error}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
