"""Sweep results from what the points' run directories hold: status, summary
rows, `results.csv` / `results.md` (their figures: txf.sweep.figures).

A point's run directory (see txf.train.loop) holds config.json and
metrics.jsonl; the sweep adds
  diverged.json       `DIVERGED_FILE`: written by `mark_diverged` when the
                      point's training diverged, {"error": "<message>"}
  extrapolation.json  `EXTRAPOLATION_FILE`: length-extrapolation losses,
                      written by the extrapolation evaluator
                      (txf.trained.extrapolate; protocols: txf.analysis.extrapolation):
      {"lengths": [128, 256, ...],             evaluation lengths in tokens
       "loss": {"non_overlapping": [...],      protocol -> loss (nats/token)
                "sliding": [...]},             per length; null where not applicable
       "applicable": [true, ..., false],       per length (false: e.g. longer
                                               than a learned position table)
       "per_position": {"length": 2048,        optional (null if no length applies):
                        "loss": [...]}}        mean loss at each window position
                                               0..length-1 of the non-overlapping
                                               windows at the longest applicable
                                               length (null: no token scored there)
      A loss is NaN (written `NaN`, as Python's json writes and reads it)
      where a scored token's loss is: a model failing at that length.
      The evaluator also records "step" (the checkpoint's), "num_tokens"
      (validation tokens evaluated) and "stride" (the sliding stride per
      length): one of another step than the point's train.steps, of other
      factors, strides or (sweep.extrapolate_tokens set) tokens than the
      sweep's evaluation (`out_of_date`: txf-extrapolate run by hand with
      other flags) is recomputed by a sweep and left out of a summary. For
      readers of the file (not read here): "train_length" (data.seq_len),
      "factors" (lengths / train_length), "scored_tokens" (protocol ->
      tokens scored per length), "reason" (per length: why it does not
      apply, or null) and "replica_loss" (protocol -> per length the list of
      each seed replica's loss, whose mean "loss" holds); null where not
      applicable.
  Every file here (and the sweep's tables and figures) is written atomically
  (txf.storage.write_files): a cut or unreadable extrapolation.json is a writer
  killed by something else; it reads as missing (one line says so) and the
  sweep recomputes it.

Replicas. A run of R seed replicas (its config's `replicas` > 1) logs each
per-replica metric as '<name>/<r>' (r = 0..R-1), e.g. 'eval_loss/0',
'eval_loss/1', next to '<name>' (their mean); a single run (R = 1) logs
'<name>' only. Summaries are mean ± sample standard deviation (ddof=1) over
the replicas; with one replica the std is None (blank in the tables).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from txf.analysis.extrapolation import DEFAULT_FACTORS, default_stride
from txf.progress import say
from txf.runconfig.run_config import to_json
from txf.rundir.checkpoint import checkpoint_directory, saved_steps
from txf.rundir.derived import EXTRAPOLATION_FILE
from txf.rundir.metrics import read_metrics
from txf.rundir.resume import CONFIG_FILE, read_run_config
from txf.storage import read_json, write_file, write_files
from txf.sweep import significance
from txf.sweep.grid import Point
from txf.train.replicas import metric_names

DIVERGED_FILE = "diverged.json"
RESULTS_CSV = "results.csv"
RESULTS_MD = "results.md"
# The metrics a summary keeps the curve of (txf.sweep.figures plots them).
CURVE_METRICS = ("eval_loss", "loss")
LOSS_UNITS = "nats/token"
# The flattening criterion: a point's validation loss has flattened when the
# last FLAT_FRACTION of its training improved it by less than FLAT_TOLERANCE
# of its value there. Relative, not zero: under a decaying learning rate the
# loss keeps creeping down, and a curve still falling faster than this means
# a longer run could reorder the points.
FLAT_FRACTION = 0.2
FLAT_TOLERANCE = 0.02
# ... or by less than FLAT_ABSOLUTE nats: near zero a relative change says
# nothing (a solved task's loss falling 0.002 -> 0.0001 is 95% but no change
# any finding could rest on).
FLAT_ABSOLUTE = 0.01
# Evaluations the last FLAT_FRACTION must hold (its last step included) for a
# verdict: with fewer, the change measured is one or two noisy evaluations
# (or a window reaching back before the last fifth), so flatness is unknown.
FLAT_MIN_EVALUATIONS = 3

Log = Callable[[str], Any]
# A loss curve: (steps [N], mean over replicas [N], std over replicas [N] or None).
Curve = tuple[np.ndarray, np.ndarray, np.ndarray | None]


@dataclasses.dataclass(frozen=True)
class Stat:
  """Mean and sample std (ddof=1) over replicas; std None for one replica."""

  mean: float
  std: float | None

  @classmethod
  def of(cls, values: Sequence[float] | np.ndarray) -> Stat:
    values_R = np.asarray(values, dtype=np.float64)
    return cls(float(values_R.mean()), float(values_R.std(ddof=1)) if len(values_R) > 1 else None)


def late_improvement(
  steps_N: Sequence[int] | np.ndarray,
  loss_N: Sequence[float] | np.ndarray,
  *,
  fraction: float = FLAT_FRACTION,
  min_evaluations: int | None = None,
) -> float | None:
  """Relative improvement of a loss curve over its last `fraction` of training.

  (L_start - L_end) / L_start, where L_end is the loss at the last step S of
  the curve and L_start the loss at the latest step at or before
  (1 - fraction) * S. Measured only when at least `min_evaluations` steps of
  the curve lie in that last fraction, (1 - fraction) * S .. S (None:
  FLAT_MIN_EVALUATIONS): how often a run evaluates must not decide the
  verdict (two evaluations, the last fifth's first and last, would measure
  the noise of two numbers).

  Args:
    steps_N: the N evaluated training steps, ascending.
    loss_N: the loss at each.

  Returns:
    The improvement (positive: the loss fell), or None (unknown) when fewer
    than `min_evaluations` steps lie in the last fraction, none at or
    before its start, or either loss is not finite.
  """
  steps_N = np.asarray(steps_N, np.float64)
  loss_N = np.asarray(loss_N, np.float64)
  needed = FLAT_MIN_EVALUATIONS if min_evaluations is None else min_evaluations
  if evaluations_in_window(steps_N, fraction=fraction) < max(needed, 1):
    return None
  early = np.flatnonzero(steps_N <= (1.0 - fraction) * steps_N[-1])
  if not early.size:
    return None
  start, end = loss_N[early[-1]], loss_N[-1]
  if not (np.isfinite(start) and np.isfinite(end)):  # no fall to measure: unknown
    return None
  return float((start - end) / start)


def evaluations_in_window(
  steps_N: Sequence[int] | np.ndarray, *, fraction: float = FLAT_FRACTION
) -> int:
  """How many of the evaluated steps lie in the last `fraction` of training
  ((1 - fraction) * S .. S, S the last step; 0 for none)."""
  steps_N = np.asarray(steps_N, np.float64)
  if not steps_N.size:
    return 0
  return int(np.sum(steps_N >= (1.0 - fraction) * steps_N[-1]))


def late_fall(improvement: float, final_loss: float) -> float:
  """The fall in nats, L_start - L_end, of a curve ending at `final_loss`
  (L_end) whose `late_improvement` is (L_start - L_end) / L_start (< 1)."""
  return final_loss * improvement / (1.0 - improvement)


def is_flat(improvement: float | None, final_loss: float) -> bool | None:
  """Whether a late_improvement meets the flattening criterion (None: unknown).

  Args:
    improvement: `late_improvement` of the curve.
    final_loss: its last loss, for the fall in nats (`late_fall`).
  """
  if improvement is None:
    return None
  if improvement < FLAT_TOLERANCE:
    return True
  return improvement < 1.0 and late_fall(improvement, final_loss) < FLAT_ABSOLUTE


def replicas_flat(steps_N: np.ndarray, loss_NxR: np.ndarray) -> bool | None:
  """Whether every replica's curve (a column of `loss_NxR`, at `steps_N`)
  meets the flattening criterion, each judged on its own final loss (None:
  unknown). Not the mean curve's verdict: a stalled seed averaged with
  seeds still falling 3-4% gives a flat mean."""
  verdicts = [
    is_flat(late_improvement(steps_N, loss_N), float(loss_N[-1])) for loss_N in loss_NxR.T
  ]
  return None if None in verdicts else all(verdicts)


def fraction_name() -> str:
  """The flattening window's share of training in words ('fifth')."""
  return "fifth" if FLAT_FRACTION == 0.2 else f"{FLAT_FRACTION:.0%}"


@dataclasses.dataclass(frozen=True)
class Extrapolation:
  """The contents of extrapolation.json (format in the module docstring);
  `step` is the checkpoint's it evaluated (None in a file without one)."""

  lengths: tuple[int, ...]
  loss: Mapping[str, tuple[float | None, ...]]
  applicable: tuple[bool, ...]
  per_position_length: int | None = None
  per_position_loss: tuple[float, ...] | None = None
  step: int | None = None
  num_tokens: int | None = None
  factors: tuple[int, ...] | None = None
  stride: tuple[int | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class PointSummary:
  """One row of the results table. Losses are final values (None when the
  point has not logged one, or diverged); perplexities are exp(loss) per
  replica, then mean ± std; tokens_per_sec (examples_per_sec, a
  classifier's) is the mean over logged rows.
  late_improvement is `late_improvement` of the mean validation-loss curve
  (None: unknown, fewer than FLAT_MIN_EVALUATIONS evaluations in the last
  fifth, or the point not done: partial, diverged); flat whether every
  replica's validation loss met the flattening criterion (`replicas_flat`;
  None as late_improvement). curves holds the point's
  `loss_curve` of each metric of CURVE_METRICS, for its figures (read with
  the row: a summary reads each metrics.jsonl once)."""

  point: Point
  status: str
  replicas: int
  train_loss: Stat | None
  train_perplexity: Stat | None
  eval_loss: Stat | None
  eval_perplexity: Stat | None
  eval_accuracy: Stat | None  # of the final evaluation (a language model's: next-token)
  tokens_per_sec: float | None
  diverged: bool
  extrapolation: Extrapolation | None
  late_improvement: float | None = None
  flat: bool | None = None
  eval_losses: tuple[float, ...] | None = None  # each replica's final, for the paired test
  examples_per_sec: float | None = None  # a classifier's throughput (it logs no tokens/s)
  # config.json as the point's run holds it (None: none yet): whether two
  # points' replicas pair up is what they trained with, not the sweep's config.
  trained_config: Mapping[str, Any] | None = dataclasses.field(
    default=None, repr=False, compare=False
  )
  curves: Mapping[str, Curve] = dataclasses.field(default_factory=dict, repr=False, compare=False)


def mark_diverged(workdir: str | epath.PathLike, error: str) -> None:
  """Records in `workdir` that the point's training diverged."""
  write_file(epath.Path(workdir) / DIVERGED_FILE, json.dumps({"error": error}) + "\n")


def _merged_by_step(workdir: epath.Path) -> dict[int, dict[str, Any]]:
  """step -> all metrics logged at it; a resumed run's later rows win."""
  merged: dict[int, dict[str, Any]] = {}
  for row in read_metrics(workdir):
    merged.setdefault(row["step"], {}).update(row)
  return dict(sorted(merged.items()))


def point_status(workdir: str | epath.PathLike, steps: int | None = None) -> str:
  """'diverged' (the sweep marked it), 'done' (config.json is there,
  metrics.jsonl has an eval row at step `steps` -- None: config.json's
  train.steps -- and the run's final checkpoint is: `_saved_at`), 'partial'
  (started, not done) or 'missing'.
  A config.json that is not a JSON object raises ValueError naming it.

  A sweep passes its point's train.steps: a point trained to fewer steps
  than the sweep now asks for is not done (rerunning continues it).
  """
  workdir = epath.Path(workdir)
  if (workdir / DIVERGED_FILE).exists():
    return "diverged"
  config_path = workdir / CONFIG_FILE
  if not config_path.exists():  # a run writes it before its first step
    return "partial" if read_metrics(workdir) else "missing"
  if steps is None:
    saved = read_run_config(workdir)  # None only if deleted since the check above
    steps = None if saved is None else saved.train.steps
  if not isinstance(steps, int):
    return "partial"
  # Only the rows from `steps` on: read from the end of the file.
  done = any(
    row["step"] == steps and "eval_loss" in row for row in read_metrics(workdir, since=steps)
  )
  return "done" if done and _saved_at(workdir, steps) else "partial"


def _saved_at(workdir: epath.Path, step: int) -> bool:
  """Whether the run in `workdir` holds a finalised checkpoint at `step`.

  The final eval row is logged before the final checkpoint is written: a run
  killed between the two has the row, and a rerun must train it to the end
  (resuming from its older checkpoint) rather than skip it and extrapolate
  that older one. An unfinished save (`<step>.orbax-checkpoint-tmp...`) is
  not a checkpoint (saved_steps leaves it out). A directory without a
  checkpoints folder is a copy of the run's files (txf.sweep.publish leaves
  checkpoints behind; a training run creates the folder before its first
  step): its metrics alone say whether it finished.
  """
  if not checkpoint_directory(workdir).exists():
    return True
  return step in saved_steps(workdir)


def check_trained_steps(
  point: Point, workdir: str | epath.PathLike, *, summary: bool = False
) -> None:
  """Refuses a run in `workdir` configured for more steps than `point` asks:
  it was evaluated at the point's step count on its way, so point_status
  calls it done, and its last values would be tabulated as the point's. For
  a `summary` (txf-sweep --summarize), fewer too: its finished run would be
  tabulated as partial, replacing the results it was summarised to (a
  sweep shrunk with --config.base.train.steps, then summarised without it).

  Raises:
    ValueError: naming the point and both step counts (TrainedShorter for
      fewer).
  """
  steps = point.config.train.steps
  saved = read_run_config(epath.Path(workdir))
  trained = None if saved is None else saved.train.steps
  if trained is None or trained == steps or (trained < steps and not summary):
    return
  error = TrainedShorter if trained < steps else ValueError
  raise error(
    f"point {point.index} ({point.name}) was trained for {trained} steps, "
    f"this sweep's point for {steps}"
  )


class TrainedShorter(ValueError):
  """`check_trained_steps`' refusal of a point trained for fewer steps (a
  summary's: training it again would continue it)."""


def _replica_values(row: Mapping[str, Any], name: str, replicas: int, workdir) -> list[float]:
  keys = metric_names(name, replicas)
  missing = [key for key in keys if key not in row]
  if missing:
    raise ValueError(
      f"{workdir}: metrics row at step {row['step']} has {name!r} but not "
      f"{missing[0]!r} (replicas={replicas})"
    )
  return [float(row[key]) for key in keys]


def _final_values(
  rows: Mapping[int, Mapping[str, Any]], name: str, replicas: int, workdir
) -> list[float] | None:
  """Each replica's `name` in the last row logging it; None if none does."""
  logged = [row for row in rows.values() if name in row]
  return _replica_values(logged[-1], name, replicas, workdir) if logged else None


def _loss_stats(losses: list[float] | None) -> tuple[Stat, Stat] | tuple[None, None]:
  """(loss, perplexity) over the replicas' final `losses` (None: none logged)."""
  if losses is None:
    return None, None
  return Stat.of(losses), Stat.of(np.exp(losses))


def read_extrapolation(workdir: str | epath.PathLike) -> Extrapolation | None:
  """The point's extrapolation.json, or None if it has none.

  Raises:
    ValueError: a file not in the documented format, naming the key.
  """
  path = epath.Path(workdir) / EXTRAPOLATION_FILE
  if not path.exists():
    return None
  data = read_json(path)  # one line for a file that is no JSON or cannot be read (a directory)
  if not isinstance(data, dict) or not isinstance(data.get("loss", {}), dict):
    raise ValueError(f"{path}: not an extrapolation record (a JSON object whose 'loss' is one)")
  for key in ("lengths", "loss", "applicable"):
    if key not in data:
      raise ValueError(f"{path}: missing {key!r}")
  lengths = tuple(int(length) for length in data["lengths"])
  sized = {"applicable": data["applicable"]} | {
    f"loss.{protocol}": values for protocol, values in data["loss"].items()
  }
  for key, values in sized.items():
    if len(values) != len(lengths):
      raise ValueError(f"{path}: {key} has {len(values)} entries for {len(lengths)} lengths")
  loss = {
    protocol: tuple(None if v is None else float(v) for v in values)
    for protocol, values in data["loss"].items()
  }
  per_position = data.get("per_position")
  if per_position is not None:
    for key in ("length", "loss"):
      if key not in per_position:
        raise ValueError(f"{path}: missing 'per_position.{key}'")
    if len(per_position["loss"]) != per_position["length"]:
      raise ValueError(
        f"{path}: per_position.loss has {len(per_position['loss'])} entries "
        f"for length {per_position['length']}"
      )
  return Extrapolation(
    lengths,
    loss,
    tuple(bool(a) for a in data["applicable"]),
    per_position_length=None if per_position is None else int(per_position["length"]),
    per_position_loss=None
    if per_position is None
    else tuple(math.nan if v is None else float(v) for v in per_position["loss"]),
    step=None if data.get("step") is None else int(data["step"]),
    num_tokens=None if data.get("num_tokens") is None else int(data["num_tokens"]),
    factors=None
    if data.get("factors") is None
    else tuple(int(factor) for factor in data["factors"]),
    stride=None
    if data.get("stride") is None
    else tuple(None if v is None else int(v) for v in data["stride"]),
  )


def readable_extrapolation(workdir: str | epath.PathLike, log: Log) -> Extrapolation | None:
  """`read_extrapolation`, except that a file it cannot read is reported with
  one `log` line and read as None (missing): a sweep rerun recomputes it."""
  try:
    return read_extrapolation(workdir)
  except ValueError as error:
    log(f"{error}; read as missing (a sweep rerun recomputes it)")
    return None


def out_of_date(
  point: Point, found: Extrapolation, extrapolate_tokens: int | None = None
) -> str | None:
  """Why `found`, a point's extrapolation.json, is not the sweep's
  evaluation of the point's final model (None: it is): of another step than
  its train.steps, of other factors than DEFAULT_FACTORS or other strides
  than their defaults, or of other tokens than `extrapolate_tokens`
  (sweep.extrapolate_tokens; None: not compared, each point's evaluator
  decides). What a file does not record passes."""
  steps = point.config.train.steps
  if found.step not in (None, steps):
    return f"is of step {found.step}, the point is trained to {steps}"
  if found.factors not in (None, DEFAULT_FACTORS):
    return f"is at factors {list(found.factors)}, the sweep's are {list(DEFAULT_FACTORS)}"
  strides = [
    stride
    for stride, length, applies in zip(found.stride or (), found.lengths, found.applicable)
    if applies and stride != default_stride(length)
  ]
  if strides:
    return f"slides by {strides[0]} at some length, not the sweep's half window"
  if None not in (extrapolate_tokens, found.num_tokens) and found.num_tokens != extrapolate_tokens:
    return (
      f"scores {found.num_tokens} validation tokens, the sweep's sweep.extrapolate_tokens "
      f"is {extrapolate_tokens}"
    )
  return None


def needs_extrapolation(
  point: Point, workdir: epath.Path, log: Log, extrapolate_tokens: int | None = None
) -> bool:
  """Whether a finished point (trained to its train.steps) lacks a readable
  extrapolation.json of the sweep's evaluation (`out_of_date`: an
  unreadable or out-of-date one is to be recomputed; each logs one line)."""
  if point_status(workdir, steps=point.config.train.steps) != "done":
    return False
  found = readable_extrapolation(workdir, log)
  if found is None:
    return True
  why = out_of_date(point, found, extrapolate_tokens)
  if why is not None:
    log(f"point {point.index} ({point.name}): extrapolation.json {why}: out of date")
  return why is not None


def _final_extrapolation(
  point: Point, workdir: epath.Path, log: Log, extrapolate_tokens: int | None
) -> Extrapolation | None:
  """`readable_extrapolation`, left out (one `log` line) where it is
  `out_of_date`: its columns and plots would pass for those of the sweep's
  evaluation of the model whose final losses share its row."""
  found = readable_extrapolation(workdir, log)
  why = None if found is None else out_of_date(point, found, extrapolate_tokens)
  if why is None:
    return found
  log(
    f"point {point.index} ({point.name}): extrapolation.json {why}: left out of the summary "
    "(a sweep rerun recomputes it)"
  )
  return None


def point_replicas(point: Point) -> int:
  """R, the seed replicas the point trains (its config's `replicas`; 1 if unset)."""
  return point.config.get("replicas", 1)


def summarize_point(
  point: Point,
  workdir: str | epath.PathLike,
  *,
  replicas: int | None = None,
  extrapolate_tokens: int | None = None,
  log: Log = say,
) -> PointSummary:
  """The results row of `point`, whose run directory is `workdir`; its status
  is relative to the point's train.steps.

  Args:
    point: the grid point.
    workdir: the point's own run directory.
    replicas: R, the seed replicas the point trained (1: a single run);
      None: those its config.json records (what is on disk, whatever the
      sweep config now says), or `point_replicas(point)` without one.
    extrapolate_tokens: the sweep's sweep.extrapolate_tokens (`out_of_date`).
    log: called with the one line saying that an extrapolation.json is
      left out: unreadable, or `out_of_date` (e.g. of another step than the
      point's train.steps: the row's final losses are of that step).
  """
  workdir = epath.Path(workdir)
  saved = read_run_config(workdir)  # None without a config.json
  if replicas is None:
    replicas = point_replicas(point) if saved is None else saved.replicas
  if replicas < 1:
    raise ValueError(f"replicas must be >= 1, got {replicas}")
  status = point_status(workdir, steps=point.config.train.steps)
  rows = _merged_by_step(workdir)
  diverged = status == "diverged"
  final = lambda name: None if diverged else _final_values(rows, name, replicas, workdir)
  train_loss, train_ppl = _loss_stats(final("loss"))
  eval_losses = final("eval_loss")
  eval_loss, eval_ppl = _loss_stats(eval_losses)
  accuracies = final("eval_accuracy")
  replica_curves = {
    metric: _replica_curve(rows, metric, replicas, workdir) for metric in CURVE_METRICS
  }
  curves = {metric: _mean_curve(*curve) for metric, curve in replica_curves.items()}
  # An unfinished curve's last fifth is not the run's: no verdict on it.
  done = status == "done"
  improvement = late_improvement(*curves["eval_loss"][:2]) if done else None
  return PointSummary(
    point=point,
    status=status,
    replicas=replicas,
    train_loss=train_loss,
    train_perplexity=train_ppl,
    eval_loss=eval_loss,
    eval_perplexity=eval_ppl,
    eval_accuracy=None if accuracies is None else Stat.of(accuracies),
    tokens_per_sec=_mean_logged(rows, "tokens_per_sec"),
    diverged=diverged,
    extrapolation=_final_extrapolation(point, workdir, log, extrapolate_tokens),
    late_improvement=improvement,
    flat=replicas_flat(*replica_curves["eval_loss"]) if done else None,
    eval_losses=None if eval_losses is None else tuple(eval_losses),
    examples_per_sec=_mean_logged(rows, "examples_per_sec"),
    curves=curves,
    trained_config=None if saved is None else to_json(saved),
  )


def _mean_logged(rows: Mapping[int, Mapping[str, Any]], name: str) -> float | None:
  """The mean of `name` over the metrics rows that log it (None: none do)."""
  values = [row[name] for row in rows.values() if name in row]
  return float(np.mean(values)) if values else None


def _extrapolation_columns(rows: Sequence[PointSummary]) -> list[tuple[str, int]]:
  """(protocol, length) of every extrapolation loss any row has: protocols in
  order of appearance, lengths ascending."""
  found = [row.extrapolation for row in rows if row.extrapolation is not None]
  protocols = dict.fromkeys(protocol for e in found for protocol in e.loss)
  present = {(protocol, n) for e in found for protocol in e.loss for n in e.lengths}
  return [
    (protocol, n)
    for protocol in protocols
    for n in sorted({n for e in found for n in e.lengths})
    if (protocol, n) in present
  ]


def _extrapolated(row: PointSummary, protocol: str, length: int) -> float | str | None:
  """The row's loss at (protocol, length): a float, 'n/a', or None (not evaluated)."""
  found = row.extrapolation
  if found is None or protocol not in found.loss or length not in found.lengths:
    return None
  at = found.lengths.index(length)
  return found.loss[protocol][at] if found.applicable[at] else "n/a"


def _grid_fields(rows: Sequence[PointSummary]) -> list[str]:
  return list(dict.fromkeys(path for row in rows for path in row.point.overrides))


_STATS = (
  ("train_loss", "train_loss"),
  ("train_ppl", "train_perplexity"),
  ("eval_loss", "eval_loss"),
  ("eval_ppl", "eval_perplexity"),
  ("eval_accuracy", "eval_accuracy"),
)


def _csv_text(rows: Sequence[PointSummary]) -> str:
  # A grid over replicas is the replicas column (two columns of one name were written).
  fields = [field for field in _grid_fields(rows) if field != "replicas"]
  extrapolation = _extrapolation_columns(rows)
  header = ["point", *fields, "status", "replicas"]
  for column, _ in _STATS:
    header += [column, f"{column}_std"]
  header += [
    "late_improvement",
    "flat",
    "tokens_per_sec",
    *(["examples_per_sec"] if _classifies(rows) else []),
    *(f"{p}@{n}" for p, n in extrapolation),
    "diverged",
  ]
  blank = lambda value: "" if value is None else value
  stat_cells = lambda stat: ["", ""] if stat is None else [stat.mean, blank(stat.std)]
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(header)
  for row in rows:
    line = [
      row.point.name,
      *(blank(row.point.overrides.get(f)) for f in fields),
      row.status,
      row.replicas,
    ]
    for _, attribute in _STATS:
      line += stat_cells(getattr(row, attribute))
    line += [
      blank(row.late_improvement),
      _flat_cell(row),
      blank(row.tokens_per_sec),
      *([blank(row.examples_per_sec)] if _classifies(rows) else []),
      *(blank(_extrapolated(row, p, n)) for p, n in extrapolation),
      "yes" if row.diverged else "no",
    ]
    writer.writerow(line)
  return out.getvalue()


def _classifies(rows: Sequence[PointSummary]) -> bool:
  """Whether a point logged a classifier's throughput (an examples/s column)."""
  return any(row.examples_per_sec is not None for row in rows)


def _examples_note(rows: Sequence[PointSummary]) -> str:
  return "; examples/s: a classifier's training examples per second" if _classifies(rows) else ""


def _format_rate(value: float | None) -> str:
  return "" if value is None else f"{value:,.0f}"


def _flat_cell(row: PointSummary) -> str:
  """yes / no / unknown ('' for a point with no validation loss, or diverged)."""
  if row.flat is None:
    return "" if row.diverged or not len(row.curves["eval_loss"][0]) else "unknown"
  return "yes" if row.flat else "no"


def _format_stat(stat: Stat | None) -> str:
  if stat is None:
    return ""
  return f"{stat.mean:.4f}" if stat.std is None else f"{stat.mean:.4f} ± {stat.std:.4f}"


def _format_loss(value: float | str | None) -> str:
  return value if isinstance(value, str) else "" if value is None else f"{value:.4f}"


def _extrapolation_note(rows: Sequence[PointSummary]) -> str:
  """What the extrapolation columns hold ('' for a table without them)."""
  counts = {row.extrapolation.num_tokens for row in rows if row.extrapolation is not None}
  if not counts:
    return ""
  scored = (
    f"the first {counts.pop():,} validation tokens"
    if len(counts) == 1 and None not in counts
    else "each point's validation tokens (extrapolation.json's num_tokens)"
  )
  return (
    "Extrapolation columns: loss at that evaluation length over "
    f"{scored}, by the protocol named (n/a: not applicable); at 1x it need not equal "
    "val loss, which is over eval.num_batches batches. "
  )


def _markdown_text(rows: Sequence[PointSummary]) -> str:
  fields, extrapolation = _grid_fields(rows), _extrapolation_columns(rows)
  header = [
    "point",
    *fields,
    "status",
    "train loss",
    "train ppl",
    "val loss",
    "val ppl",
    "val accuracy",
    f"val change, last {fraction_name()}",
    "flat",
    "tokens/s",
    *(["examples/s"] if _classifies(rows) else []),
    *(f"{p} @{n}" for p, n in extrapolation),
    "diverged",
  ]
  note = (
    f"Losses in {LOSS_UNITS}, final values; mean ± sample std (ddof=1) over replicas; "
    "val accuracy: of the predictions the loss counts (a language model's next token). "
    "tokens/s: training tokens per second, each batch counted once however many "
    f"replicas train on it{_examples_note(rows)}. {_extrapolation_note(rows)}"
    "Val change: relative change of "
    f"the mean validation loss over the last {fraction_name()} of training; flat: every "
    f"replica's improved by less than {FLAT_TOLERANCE:.0%} or {FLAT_ABSOLUTE} nats there, "
    "judged only with at least "
    f"{FLAT_MIN_EVALUATIONS} evaluations in that {fraction_name()} (else unknown); flat "
    "says the curve stopped falling, not that the run trained well (a stalled run is "
    "flat too)."
  )
  lines = [note, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for row in rows:
    cells = [
      row.point.name,
      *(str(row.point.overrides.get(f, "")) for f in fields),
      row.status,
      *(_format_stat(getattr(row, a)) for _, a in _STATS),
      "" if row.late_improvement is None else f"{-100 * row.late_improvement:+.1f}%",
      _flat_cell(row),
      _format_rate(row.tokens_per_sec),
      *([_format_rate(row.examples_per_sec)] if _classifies(rows) else []),
      *(_format_loss(_extrapolated(row, p, n)) for p, n in extrapolation),
      "yes" if row.diverged else "no",
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines + _comparison_lines(rows, fields)) + "\n"


def _comparison_lines(rows: Sequence[PointSummary], fields: Sequence[str]) -> list[str]:
  """results.md's section of txf.sweep.significance's comparisons ([] if none):
  raw and Holm-adjusted p, the family being this section's pairs."""
  found = significance.comparisons(rows, fields)
  if not found:
    return []
  number = lambda value, spec: "" if value is None else format(value, spec)
  lines = [
    "",
    "Pairs of points that differ in one field, the lower validation loss first "
    "(difference: the lower mean minus the higher, nats); resolved: the t-test over "
    "seed replicas on the final validation loss (paired where the points share seeds "
    "and batches, else Welch's; `paired`), Holm-adjusted p < "
    f"{significance.ALPHA} over its {len(found)} comparisons.",
    "",
    "| field | lower | higher | difference | paired | t | df | p | Holm p | resolved |",
    "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for c in found:
    test = c.test
    cells = [
      c.field, f"{c.lower} ({c.lower_value})", f"{c.higher} ({c.higher_value})",
      f"{test.difference:+.4f}", "yes" if test.paired else "no", number(test.t, ".2f"),
      number(test.df, ".1f"),
      number(test.p, ".3g"), number(c.holm_p, ".3g"), "yes" if c.resolved else "no",
    ]  # fmt: skip
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def write_results(
  rows: Sequence[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  write: Callable[[epath.Path, str], Any] | None = None,
) -> tuple[epath.Path, epath.Path]:
  """Writes results.csv and results.md (one row per point) into the sweep
  workdir and returns their paths.

  By default both are replaced as one set, atomically (WriteError, the old
  ones intact, when that fails); `write(path, text)` puts each down instead
  (a summary collecting its files: txf.sweep.runner.summarize). CSV:
  numbers at full precision, '' where there is no value, 'n/a' for an
  extrapolation length that does not apply, std columns '' with one replica.
  """
  if not rows:
    raise ValueError("rows: no points to write")
  directory = epath.Path(sweep_workdir)
  tables = {directory / RESULTS_CSV: _csv_text(rows), directory / RESULTS_MD: _markdown_text(rows)}
  if write is None:
    write_files(tables)
  else:
    for path, text in tables.items():
      write(path, text)
  csv_path, md_path = tables
  return csv_path, md_path


def loss_curve(workdir: str | epath.PathLike, *, replicas: int, metric: str = "eval_loss") -> Curve:
  """(steps, mean `metric`, std over replicas or None) of a run's rows
  holding it ('eval_loss': evaluations, 'loss': logged training steps)."""
  return _mean_curve(*replica_curves(workdir, replicas=replicas, metric=metric))


def replica_curves(
  workdir: str | epath.PathLike, *, replicas: int, metric: str = "eval_loss"
) -> tuple[np.ndarray, np.ndarray]:
  """(steps [N], each replica's `metric` [N, R]) of a run's rows holding it,
  merged by step as a summary reads them (`replicas_flat` judges these)."""
  workdir = epath.Path(workdir)
  return _replica_curve(_merged_by_step(workdir), metric, replicas, workdir)


def _replica_curve(
  rows: Mapping[int, Mapping[str, Any]], metric: str, replicas: int, workdir
) -> tuple[np.ndarray, np.ndarray]:
  """(steps [N], each replica's `metric` [N, R]) of the merged rows of the
  run in `workdir` that hold it."""
  logged = [row for row in rows.values() if metric in row]
  values_NxR = np.array(
    [_replica_values(row, metric, replicas, workdir) for row in logged], np.float64
  ).reshape(len(logged), replicas)
  return np.array([row["step"] for row in logged]), values_NxR


def _mean_curve(steps_N: np.ndarray, values_NxR: np.ndarray) -> Curve:
  """The `loss_curve` of replica curves: their mean, and std (None for one)."""
  std_N = values_NxR.std(axis=1, ddof=1) if values_NxR.shape[1] > 1 else None
  return steps_N, values_NxR.mean(axis=1), std_N
