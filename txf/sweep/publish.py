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

A publication appears whole or not at all: on a local disk it is made in a
temporary sibling of the destination (.NAME.<hex>.tmp) and renamed into
place once complete, so a failed write (a full disk) leaves no destination
behind and a rerun starts afresh. (An object store's destination, gs://,
has no rename: its objects are uploaded one by one.)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from typing import Any

from etils import epath

from txf.progress import say
from txf.rundir.metrics import METRICS_FILE
from txf.rundir.record import RECORD_FILE
from txf.rundir.resume import CONFIG_FILE
from txf.rundir.workdir import WorkdirError, check_writable, not_writable, run_path
from txf.storage import (
  WriteError,
  holds_current_directory,
  is_local,
  remove_stale_temporaries,
  temporary_sibling,
  write_error,
)
from txf.sweep import results
from txf.sweep.grid import Point

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
  extrapolated: bool = True,
  extrapolate_tokens: int | None = None,
  log: Callable[[str], Any] = say,
) -> list[results.PointSummary]:
  """Copies each point's RAW_FILES from `workdir` to `destination` and writes
  the results there; returns their rows.

  Args:
    extrapolated: whether the sweep extrapolates its points (sweep.extrapolate):
      then a point trained to the end is finished only with the sweep's
      extrapolation.json of its final step (`results.out_of_date`, with
      `extrapolate_tokens`, sweep.extrapolate_tokens).

  Raises (before anything is copied):
    WorkdirError: a point of the sweep that has not finished in `workdir`
      (naming it: a table of some points would pass for the sweep's) or was
      trained for more steps than the sweep's (results.check_trained_steps), a
      `destination` that is a file, holds anything already (nothing is
      replaced) or cannot be written.
  Raises (while copying):
    WriteError: '<destination>: <reason>' (a full disk); nothing is published.
  """
  workdir, destination = run_path(workdir), run_path(destination)
  if is_local(destination):  # '.' and 'X/..' name no directory to stage beside
    destination = epath.Path(os.path.abspath(destination))
    if holds_current_directory(destination):
      raise WorkdirError(
        f"{destination} holds the current directory, which publishing would replace; "
        "publish into a directory of its own (--publish=data)"
      )
  for point in points:
    _check_finished(point, workdir, extrapolated, extrapolate_tokens, log)
  if destination.exists():
    if not destination.is_dir():
      raise WorkdirError(f"{destination}: exists and is not a directory")
    if any(destination.iterdir()):
      raise WorkdirError(f"{destination}: not empty: publish into a new directory")
  if not is_local(destination):
    check_writable(destination)
    rows = _fill(points, workdir, destination, extrapolate_tokens, log)
  else:
    # A killed publish's staged copy is removed by the next (no lock guards it).
    remove_stale_temporaries(destination.parent, held=False)
    staging = temporary_sibling(destination)
    try:
      check_writable(staging)  # creates it
    except WorkdirError as error:
      # Named as the directory given: the hidden staging one is ours, not the user's.
      shutil.rmtree(staging, ignore_errors=True)
      raise not_writable(destination, error.__cause__ or error) from error
    try:
      rows = _fill(points, workdir, staging, extrapolate_tokens, log)
      os.replace(staging, destination)  # over an empty directory too (epath's refuses)
    except BaseException as error:
      shutil.rmtree(staging, ignore_errors=True)
      if isinstance(error, (OSError, WriteError)):
        # A WriteError names the staging file: the OS's reason is its cause.
        raise write_error(destination, error.__cause__ or error) from error
      raise
  tables = ", ".join(str(destination / name) for name in (results.RESULTS_CSV, results.RESULTS_MD))
  log(f"published {len(points)} points into {destination}: {tables}")
  return rows


def _check_finished(
  point: Point,
  workdir: epath.Path,
  extrapolated: bool,
  extrapolate_tokens: int | None,
  log: Callable[[str], Any],
) -> None:
  """WorkdirError naming `point` unless it finished in `workdir`: done (with
  its final extrapolation where the sweep extrapolates) or diverged, and not
  trained for more steps than the sweep's."""
  # The steps first: a point trained past the sweep's has no checkpoint of
  # the sweep's last step left, so its status reads 'partial', a wrong reason.
  try:
    results.check_trained_steps(point, workdir / point.name)
  except ValueError as error:
    raise WorkdirError(f"{workdir}: {error}: nothing published") from None
  status = results.point_status(workdir / point.name, steps=point.config.train.steps)
  if status not in FINISHED:
    raise WorkdirError(
      f"{workdir}: point {point.index} ({point.name}) is {status}, not finished: nothing published"
    )
  if extrapolated and results.needs_extrapolation(
    point, workdir / point.name, log, extrapolate_tokens
  ):
    raise WorkdirError(
      f"{workdir}: point {point.index} ({point.name}) has no {results.EXTRAPOLATION_FILE} "
      "of its final step as the sweep evaluates it, so it is not finished (rerun the "
      "sweep to extrapolate it): "
      "nothing published"
    )


def _fill(
  points: Sequence[Point],
  workdir: epath.Path,
  target: epath.Path,
  extrapolate_tokens: int | None,
  log: Callable[[str], Any],
) -> list[results.PointSummary]:
  """Copies the points' raw files into the directory `target` and writes the
  results there, as `--summarize` does (an extrapolation of other than
  `extrapolate_tokens` left out); returns their rows."""
  for point in points:
    (target / point.name).mkdir(parents=True)
    for name in RAW_FILES:
      if (workdir / point.name / name).exists():
        (workdir / point.name / name).copy(target / point.name / name)
  rows = [
    results.summarize_point(
      point, target / point.name, extrapolate_tokens=extrapolate_tokens, log=log
    )
    for point in points
  ]
  results.write_results(rows, target)
  return rows
