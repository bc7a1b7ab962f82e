"""A finished sweep's raw outputs, copied without checkpoints: what a findings
table is written from and a reader recomputes it from (docs/data/<sweep>).

  publish(points, "runs/ln_warmup_long", "docs/data/ln_warmup_long")
  txf-sweep --config=sweeps/ln_warmup:long --workdir=runs/ln_warmup_long \\
    --publish=docs/data/ln_warmup_long          # the same, as a command

Each point's RAW_FILES (every logged metric per replica, the length
extrapolation, the resolved run config, the run record with its commit and
software versions; the divergence record where the point diverged) go to
<destination>/<point name>; checkpoints, samples, event files and plots stay
behind. Then results.csv and results.md are written there from the copies,
as `--summarize` would write them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from etils import epath

from txf.sweep import results
from txf.sweep.grid import Point
from txf.train.metrics import METRICS_FILE
from txf.train.record import RECORD_FILE
from txf.train.resume import CONFIG_FILE
from txf.train.workdir import WorkdirError, check_writable, run_path

RAW_FILES = (
  METRICS_FILE,
  results.EXTRAPOLATION_FILE,
  CONFIG_FILE,
  RECORD_FILE,
  results.DIVERGED_FILE,
)
FINISHED = ("done", "diverged")


def publish(
  points: Sequence[Point],
  workdir: str | epath.PathLike,
  destination: str | epath.PathLike,
  *,
  log: Callable[[str], Any] = print,
) -> list[results.PointSummary]:
  """Copies each point's RAW_FILES from `workdir` to `destination` and writes
  the results there; returns their rows.

  Raises (before anything is copied):
    WorkdirError: a point of the sweep that has not finished in `workdir`
      (naming it: a table of some points would pass for the sweep's) or was
      trained for more steps than the sweep's (results.check_trained_steps), a
      `destination` that holds anything already (nothing is replaced) or
      cannot be written.
  """
  workdir, destination = run_path(workdir), run_path(destination)
  for point in points:
    status = results.point_status(workdir / point.name, steps=point.config.train.steps)
    if status not in FINISHED:
      raise WorkdirError(
        f"{workdir}: point {point.index} ({point.name}) is {status}, not finished: "
        "nothing published"
      )
    try:
      results.check_trained_steps(point, workdir / point.name)
    except ValueError as error:
      raise WorkdirError(f"{workdir}: {error}: nothing published") from None
  if destination.exists() and any(destination.iterdir()):
    raise WorkdirError(f"{destination}: not empty: publish into a new directory")
  check_writable(destination)
  for point in points:
    (destination / point.name).mkdir(parents=True)
    for name in RAW_FILES:
      if (workdir / point.name / name).exists():
        (workdir / point.name / name).copy(destination / point.name / name)
  rows = [results.summarize_point(point, destination / point.name, log=log) for point in points]
  written = results.write_results(rows, destination)
  log(f"published {len(points)} points into {destination}: " + ", ".join(map(str, written)))
  return rows
