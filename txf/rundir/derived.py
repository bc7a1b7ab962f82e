"""What other commands derive from a run's checkpoint into its work
directory, and moving it aside when the run trains that checkpoint's step
again.

  extrapolation.json (+ its figures)  txf-extrapolate, a sweep's points (txf.trained.extrapolate)
  analysis/                           txf-analyze (txf.trained.head_analysis), analysis.json

Each records the step of the checkpoint it was computed from. A run that
trains on from an earlier step (`--resume_step`, or a newer checkpoint that
did not restore) writes other weights at the later steps, and such an
output of a later step would pass for theirs: a sweep's table put its
losses beside the new run's, and an analysis added to it kept the old
model's circuits. `derived_after` finds those, and `move_aside` moves them
as the later checkpoints and metrics rows are.
"""

from __future__ import annotations

import os

from etils import epath

from txf.rundir.checkpoint import DROPPED_SUFFIX
from txf.storage import free_path, read_json

EXTRAPOLATION_FILE = "extrapolation.json"
EXTRAPOLATION_PNG = "extrapolation.png"
PER_POSITION_PNG = "per_position_loss.png"
ANALYSIS_DIR = "analysis"
ANALYSIS_RECORD = "analysis.json"

# (the record naming the step, the files it stands for), in the directory.
_OUTPUTS = (
  (EXTRAPOLATION_FILE, (EXTRAPOLATION_FILE, EXTRAPOLATION_PNG, PER_POSITION_PNG)),
  (f"{ANALYSIS_DIR}/{ANALYSIS_RECORD}", (ANALYSIS_DIR,)),
)


def derived_after(workdir: str | os.PathLike, step: int) -> list[epath.Path]:
  """The outputs in `workdir` derived from a checkpoint after `step`, with
  the files each stands for. One whose record does not read, or names no
  step, is among them: it cannot be told to be of the weights that stay."""
  workdir = epath.Path(workdir)
  found = []
  for record, names in _OUTPUTS:
    if not (workdir / record).exists():
      continue
    try:
      of = read_json(workdir / record)
    except ValueError:
      of = None
    recorded = of.get("step") if isinstance(of, dict) else None
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded <= step:
      continue
    found += [workdir / name for name in names if (workdir / name).exists()]
  return found


def move_aside(paths: list[epath.Path]) -> list[epath.Path]:
  """Renames each of `paths` to NAME.dropped (or -2, -3, ... where that
  exists; kept, never deleted); returns where each went."""
  moved = []
  for path in paths:
    moved.append(free_path(path.parent / f"{path.name}{DROPPED_SUFFIX}"))
    path.rename(moved[-1])
  return moved
