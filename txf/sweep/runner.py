"""Runs a sweep: every point of a grid in turn (or one), then its results.

  run_sweep(sweep_config, "runs/pe_ln")               # every point, then results
  run_sweep(sweep_config, "runs/pe_ln", index=3)      # one point (a job array task)
  run_sweep(sweep_config, "runs/pe_ln", dry_run=True) # print the points' commands
  run_sweep(sweep_config, "runs/pe_ln", summarize_only=True)  # results from disk

The sweep config (see txf.sweep.grid) holds `base`, `grid` and `sweep`:
  sweep.run_config   the run config file `base` comes from (a path, or a
                     shipped config's name: 'base'): the dry run's
                     `txf-run` commands load it and override what
                     the point changes
  sweep.extrapolate  whether finished points get a length extrapolation
                     (default True; the `extrapolate` hook of run_sweep)
  sweep.extrapolate_tokens
                     validation tokens each point's length extrapolation
                     scores (None: those of the point's evaluator); passed
                     to the hook as `num_tokens`

Each point trains through txf.train.loop.run in `<workdir>/<point name>`, a
normal run directory, so it is one code path with `txf-run`: a
rerun resumes an interrupted point from its checkpoint (a point trained to
fewer steps than its train.steps now asks for continues; one whose final
eval row or config.json was lost gets them) and skips finished ones. A
SIGTERM (preemption) while a point trains saves it and stops the sweep; the
rerun resumes there. The sweep workdir gets results.csv, results.md and PNG
plots (see txf.sweep.results), written atomically.

Locking: a point's training holds its work directory's lock (txf.train.
workdir.WorkdirLock) and so does its extrapolation, so a second sweep on the
same directory is refused (WorkdirError) instead of training or
extrapolating a point the first is working on; `--index` job arrays, one
point each, run side by side.

Seeds per point are the run config's own field: `base.replicas` = R trains R
seeds of every point side by side in one program (txf.train.replicas), and
the tables and plots give mean ± std over them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import ml_collections
from etils import epath

from txf.analysis.extrapolation import DEFAULT_FACTORS, check_num_tokens, tokens_per_batch
from txf.checks import optional_positive_int
from txf.configs import load as load_config, resolve as resolve_config
from txf.progress import say
from txf.runconfig.run_config import RunConfig, parse
from txf.rundir.checkpoint import PreemptionGuard
from txf.rundir.console import format_duration
from txf.rundir.resume import check_resumable, config_changes, read_run_config
from txf.rundir.workdir import WorkdirError, check_reachable, check_writable, run_path
from txf.storage import is_local, remove_stale_temporaries, write_error, write_files
from txf.sweep import figures, grid, results
from txf.sweep.grid import GridError, Point
from txf.sweep.publish import publish
from txf.train import loop, sharding
from txf.train.run_setup import adding_to_run, precheck_run

SWEEP_FIELDS = ("run_config", "extrapolate", "extrapolate_tokens")

Log = Callable[[str], Any]
# (run directory, *, num_tokens, log) -> anything; writes extrapolation.json
# there, logging its progress with `log`.
Extrapolate = Callable[..., Any]


def format_sweep_progress(
  position: int, total: int, point: Point, elapsed: float, point_seconds: Sequence[float]
) -> str:
  """The line logged as the sweep reaches a point, e.g. 'sweep: 3 of 12
  points, point 2 (position=rope,norm_placement=pre) | elapsed 18m20s | eta
  1h31m' (the point named by its index, as every other line names it).

  Args:
    position: 1-based position of `point` among the `total` points this sweep runs.
    elapsed: wall seconds since the sweep started.
    point_seconds: the wall seconds of each point trained so far (skipped ones
      left out); the ETA is their mean times the points left, this one
      included, and is left out until one point has trained.
  """
  line = (
    f"sweep: {position} of {total} points, point {point.index} ({point.name}) | "
    f"elapsed {format_duration(elapsed)}"
  )
  if point_seconds:
    mean = sum(point_seconds) / len(point_seconds)
    line += f" | eta {format_duration(mean * (total - position + 1))}"
  return line


def read_sweep_settings(sweep_config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The `sweep` section with its defaults (run_config=None,
  extrapolate=True, extrapolate_tokens=None).

  Raises:
    GridError: an unknown field or a bad value, naming the field (seeds per
      point are the run config's `base.replicas`).
  """
  given = sweep_config.get("sweep") or ml_collections.ConfigDict()
  unknown = sorted(set(given.keys()) - set(SWEEP_FIELDS))
  if unknown:
    hint = "; seeds per point are base.replicas" if unknown[0] == "seeds" else ""
    raise GridError(f"sweep.{unknown[0]}: unknown field (known: {', '.join(SWEEP_FIELDS)})" + hint)
  settings = ml_collections.ConfigDict(
    {**dict(run_config=None, extrapolate=True, extrapolate_tokens=None), **given}
  )
  if not isinstance(settings.extrapolate, bool):
    raise GridError(f"sweep.extrapolate: must be True or False, got {settings.extrapolate!r}")
  try:
    optional_positive_int(settings.extrapolate_tokens, "sweep.extrapolate_tokens")
  except ValueError as error:
    raise GridError(str(error)) from None
  return settings


def check_point_config(config: ml_collections.ConfigDict) -> RunConfig:
  """One point's run config parsed (txf.runconfig.run_config.parse: every field,
  the optimizer and schedule among them), checked without touching data or
  devices' memory: its vocabulary where known without training a tokenizer
  (txf.train.run_setup.precheck_run) and that the batch divides the device mesh.

  Raises:
    ValueError: naming the field.
  """
  run = parse(config)
  precheck_run(run)
  sharding.check_batch(run.data.batch_size, sharding.make_mesh(run.parallel))
  return run


def _check_distinct(points: Sequence[Point], runs: Sequence[RunConfig]) -> None:
  """Refuses two points that train the same run: their grid settings resolve
  to one run config (a model.options setting no entry they choose reads, a
  warmup clamped to the run's steps, a derived field given its derived
  value), so results.md would compare a run with itself.

  Raises:
    GridError: naming both points and the settings that change nothing.
  """
  first_of: dict[RunConfig, Point] = {}
  for point, run in zip(points, runs, strict=True):
    earlier = first_of.setdefault(run, point)
    if earlier is not point:
      differing = [
        path for path in point.overrides if point.overrides[path] != earlier.overrides.get(path)
      ]
      why = (
        f"{', '.join(differing)} is read by no entry they choose; zip such a setting with "
        "the choice that reads it (docs/sweeps.md)"
        if all(path.startswith("model.options.") for path in differing)
        else f"their {', '.join(differing)} resolve to the same run config"
      )
      raise GridError(
        f"point {point.index} ({point.name}) trains the same run as point {earlier.index} "
        f"({earlier.name}): {why}"
      )


def load_run_config(path: str) -> ml_collections.ConfigDict:
  """`get_config()` of a config file, as config_flags loads it: a path, or the
  bare name of a config txf ships ('base', txf.configs.resolve)."""
  path = str(resolve_config(path) or path)  # neither: the load below says so
  try:
    return load_config(path)
  except FileNotFoundError as error:
    raise GridError(f"sweep.run_config: {path}: no such file") from error


def _dry_run(
  points: Sequence[Point], workdir: epath.Path, settings: ml_collections.ConfigDict
) -> None:
  """Prints each point's txf-run command (stdout: a listing to copy, not an
  account of work, so no line is timestamped)."""
  if settings.run_config is None:
    raise GridError(
      "sweep.run_config: needed for --dry_run (the run config file `base` "
      "comes from, which each command loads)"
    )
  reference = load_run_config(settings.run_config)
  for point in points:
    print(
      f"point {point.index} ({point.name}):\n  "
      + grid.command_for(point, settings.run_config, workdir / point.name, reference=reference)
    )
  print(f"(in a checkout, python -m experiments.run takes the place of {grid.RUN_COMMAND})")


def _train_point(
  point: Point, run: RunConfig, workdir: epath.Path, log: Log, config_file: str | None
) -> str | None:
  """Trains one point (`run`, its config parsed) unless it is done (to its
  train.steps) or diverged; records a divergence. Returns why training
  stopped where a signal stopped it ('preempted': SIGTERM, 'interrupted':
  Ctrl-C) -- the point saved, not done -- so the sweep must stop too; else
  None."""
  steps = run.train.steps
  status = results.point_status(workdir, steps=steps)
  if status in ("done", "diverged"):
    log(f"point {point.index} ({point.name}): {status}, skipped")
    return None
  log(f"point {point.index} ({point.name}): training")
  # The sweep's own guard: a SIGTERM in the run's last moments (after its
  # final save's check) is still seen here.
  with PreemptionGuard() as preemption:
    try:
      loop.run(
        run,
        workdir,
        log=log,
        preemption=preemption,
        hparams=point.overrides,
        config_file=config_file,
      )
    except loop.ConfigError as error:  # e.g. a workdir trained with another config
      raise GridError(f"point {point.index} ({point.name}): {error}") from error
    except loop.TrainingDiverged as error:
      results.mark_diverged(workdir, str(error))
      log(f"point {point.index} ({point.name}): diverged ({error}); going on")
    finally:
      # Each point compiles its own programs; drop them before the next one.
      jax.clear_caches()
  if preemption.requested:
    return preemption.reason
  # Multi-process runs learn of a preemption from JAX, not the guard: the
  # point is then saved but not done.
  return "preempted" if results.point_status(workdir, steps=steps) == "partial" else None


def _quiet(line: str) -> None:
  """A log that drops its lines: for asking a point's state again where its
  turn logs the reason."""


class _Preempted(Exception):
  """A SIGTERM stopped a point's extrapolation (_extrapolate_point)."""


def _extrapolate_point(
  point: Point,
  workdir: epath.Path,
  extrapolate: Extrapolate | None,
  num_tokens: int | None,
  log: Log,
) -> str | None:
  """Runs the extrapolation hook once for a finished point, holding the
  point's work directory (txf.train.run_setup.adding_to_run: its lock, as its
  training does): another sweep on the directory is refused instead of
  extrapolating the point at the same time, and so is a directory that
  cannot be written. Returns why, where a signal arrived meanwhile
  ('preempted', 'interrupted'; else None): the hook is then stopped at its
  next progress line (between two lengths, with nothing in flight), before
  extrapolation.json, which it writes last, so a rerun extrapolates the
  point again."""
  # A point with nothing to add is only read: a read-only one (its check
  # before the sweep let it pass) must not be locked, which writes.
  if extrapolate is None or not results.needs_extrapolation(point, workdir, _quiet, num_tokens):
    return None
  with adding_to_run(workdir):
    if not results.needs_extrapolation(point, workdir, log, num_tokens):
      return None
    log(f"point {point.index} ({point.name}): length extrapolation")
    with PreemptionGuard() as preemption:

      def log_or_stop(line: str) -> None:
        log(line)
        if preemption.requested:
          raise _Preempted

      try:
        extrapolate(workdir, num_tokens=num_tokens, log=log_or_stop)
      except _Preempted:
        pass
      except ValueError as error:  # e.g. a validation split shorter than asked: one line
        raise GridError(f"point {point.index} ({point.name}): extrapolation: {error}") from None
      finally:
        jax.clear_caches()
    return preemption.reason if preemption.requested else None


def summary_files(
  points: Sequence[Point], rows: Sequence[results.PointSummary], workdir: epath.Path
) -> dict[epath.Path, str | bytes]:
  """results.csv, results.md and the plots of `rows` (one per point),
  rendered in memory: {path in `workdir`: its contents}.

  Plots: validation and training loss curves and, when the grid sweeps
  model.position and has both placements of model.norm_placement (not when
  narrowed to one), Pre- vs Post-LN (both once any
  point has a final validation loss), and loss vs evaluation length per
  extrapolation protocol found, and loss per token position at the longest
  extrapolated length; when the grid sweeps model.d_model, the final
  validation accuracy by width.
  """
  files: dict[epath.Path, str | bytes] = {}
  put = files.__setitem__
  results.write_results(rows, workdir, write=put)
  evaluated = any(row.eval_loss is not None for row in rows)
  if evaluated:
    for metric in figures.CURVES:
      figures.plot_loss_curves(rows, workdir, metric=metric, write=put)
  protocols = dict.fromkeys(
    protocol for row in rows if row.extrapolation is not None for protocol in row.extrapolation.loss
  )
  for protocol in protocols:
    figures.plot_extrapolation(rows, workdir, protocol=protocol, write=put)
  if any(
    row.extrapolation is not None and row.extrapolation.per_position_loss is not None
    for row in rows
  ):
    figures.plot_per_position(rows, workdir, write=put)
  placements = {point.overrides.get("model.norm_placement") for point in points}
  if evaluated and "model.position" in points[0].overrides and {"pre", "post"} <= placements:
    figures.plot_pre_vs_post(rows, workdir, write=put)
  if evaluated and figures.WIDTH_FIELD in points[0].overrides:
    figures.plot_accuracy_vs_width(rows, workdir, write=put)
  return files


# Every file a summary may write into the sweep directory, besides one
# extrapolation_<protocol>.png per protocol (EXTRAPOLATION_PNGS).
SUMMARY_FILES = (
  results.RESULTS_CSV,
  results.RESULTS_MD,
  *(png for png, _ in figures.CURVES.values()),
  figures.PER_POSITION_PNG,
  figures.PRE_VS_POST_PNG,
  figures.ACCURACY_VS_WIDTH_PNG,
)
EXTRAPOLATION_PNGS = "extrapolation_*.png"


def stale_summary_files(
  workdir: epath.Path, files: Mapping[epath.Path, str | bytes]
) -> list[epath.Path]:
  """The files an earlier summary left in `workdir` that this one (`files`,
  `summary_files`') does not write: a plot it no longer draws (no point
  extrapolated now, a grid narrowed to one placement) would otherwise sit
  beside tables of other runs."""
  known = [workdir / name for name in SUMMARY_FILES] + list(workdir.glob(EXTRAPOLATION_PNGS))
  return sorted(path for path in known if path not in files and path.is_file())


def summarize(
  points: Sequence[Point],
  workdir: str | epath.PathLike,
  *,
  extrapolate_tokens: int | None = None,
  log: Log = say,
  preemption: PreemptionGuard | None = None,
) -> list[results.PointSummary] | None:
  """Writes results.csv, results.md and the plots (`summary_files`) into the
  sweep workdir from what the points' run directories hold; returns the rows.

  The summary is written whole or not at all, so tables and plots always
  describe the same runs: every file is rendered in memory first, then all
  are written as one set (txf.storage.write_files: a full disk
  replaces none), and then the files of an earlier summary that this one
  does not write (`stale_summary_files`: a plot it no longer draws) are
  removed, one line naming them. A SIGTERM that `preemption` (installed by the caller)
  caught before the write is over stops it before anything is written:
  one line says to rerun, and None is returned. One during the write
  (short: renames, once the bytes are down) leaves the set whole. A point's
  extrapolation.json that is not the sweep's (`results.out_of_date`, with
  `extrapolate_tokens`, sweep.extrapolate_tokens) is left out, one line each.

  Raises:
    WriteError: a file could not be written (one line naming it); every
      file of the summary is as it was. Or a stale file could not be
      removed (naming it; the new summary is written).
  """
  workdir = epath.Path(workdir)
  try:
    rows = [
      results.summarize_point(
        point, workdir / point.name, extrapolate_tokens=extrapolate_tokens, log=log
      )
      for point in points
    ]
  except ValueError as error:  # a point's files not as a run writes them, named
    raise WorkdirError(str(error)) from None
  files = summary_files(points, rows, workdir)
  if preemption is not None and preemption.requested:
    _stopped(
      preemption.reason,
      "before its results were written (results.csv, results.md and the plots are as "
      "they were); rerun the same command to write them",
      log,
    )
    return None
  if is_local(workdir):  # a killed summary's temporaries (no lock guards the sweep's directory)
    remove_stale_temporaries(workdir, held=False)
  write_files(files)
  log("wrote " + ", ".join(str(path) for path in files))
  unfinished = [f"{row.point.index} ({row.point.name})" for row in rows if row.status == "partial"]
  if unfinished:  # a summary taken while points train, or of points stopped
    log(
      f"not finished: point {', '.join(unfinished)}: their rows hold the last values they "
      "logged, with no flat verdict, and they take part in no comparison"
    )
  # Right after the set: until then the old files are the last whole summary.
  stale = stale_summary_files(workdir, files)
  for path in stale:
    try:
      path.unlink()
    except OSError as error:
      raise write_error(path, error) from error
  if stale:
    log(
      "removed "
      + ", ".join(str(path) for path in stale)
      + " (an earlier summary's: this one has no such plot)"
    )
  return rows


def _check_extrapolates(
  points: Sequence[Point], runs: Sequence[RunConfig], num_tokens: int | None
) -> None:
  """Every point must be a run length extrapolation scores
  (RunConfig.check_extrapolates), and sweep.extrapolate_tokens (None: each
  point's evaluation tokens, eval.num_batches x data.batch_size x
  (data.seq_len + 1)) must hold a window at 16x every point's seq_len:
  found after training, either would stop the sweep with a point trained."""
  for point, run in zip(points, runs):
    try:
      run.check_extrapolates("the point")
    except ValueError as error:
      raise GridError(
        f"point {point.index} ({point.name}): {error} (sweep.extrapolate=False, or "
        "--noextrapolate, sweeps it without)"
      ) from None
  for point in points:
    data = point.config.data
    per_batch = tokens_per_batch(data.batch_size, data.seq_len)
    tokens = point.config.eval.num_batches * per_batch if num_tokens is None else num_tokens
    try:
      check_num_tokens(tokens, data.seq_len)
    except ValueError as error:
      if num_tokens is not None:
        raise GridError(
          f"sweep.extrapolate_tokens: point {point.index} ({point.name}): {error}"
        ) from None
      longest = max(DEFAULT_FACTORS) * data.seq_len + 1
      raise GridError(
        f"eval.num_batches: point {point.index} ({point.name}): its {tokens} evaluation "
        f"tokens hold no window of {longest} to extrapolate on; give "
        f"{math.ceil(longest / per_batch)} batches, or set sweep.extrapolate_tokens"
      ) from None


def run_sweep(
  sweep_config: ml_collections.ConfigDict,
  workdir: str | epath.PathLike,
  *,
  index: int | None = None,
  dry_run: bool = False,
  summarize_only: bool = False,
  publish_to: str | epath.PathLike | None = None,
  log: Log = say,
  extrapolate: Extrapolate | None = None,
  config_file: str | None = None,
) -> list[results.PointSummary] | None:
  """Runs the sweep `sweep_config` in `workdir`.

  Every point is expanded and checked before any trains. Then, by mode:
    default          trains every point in turn (finished and diverged ones
                     are skipped, an interrupted one resumes), then writes
                     the results and plots
    index=N          trains point N only (None: $SLURM_ARRAY_TASK_ID picks
                     it when set, else every point); no results are written,
                     since other points may still be training elsewhere
    dry_run          prints each point and its exact txf-run command
    summarize_only   writes the results and plots from what is on disk (at
                     least one point must have been run in `workdir`)
    publish_to       copies every finished point's raw outputs there and
                     writes the results from the copies (txf.sweep.publish)

  A point that diverges is recorded (txf.sweep.results.mark_diverged) and the
  sweep goes on. A point preempted (SIGTERM) while it trains saves, and the
  sweep stops there: it logs so and returns None (a rerun resumes); a
  SIGTERM during a point's extrapolation stops it too, at the hook's next
  progress line (a rerun computes again what it had not written); one
  between points stops it before the next, and one before the summary is
  written stops it with the summary unwritten (`summarize`): each logs a
  line saying to rerun the same command and returns None. Only one point's
  model is in memory at a time.

  Args:
    sweep_config: base, grid and sweep sections (module docstring).
    workdir: the sweep's directory; point N trains in workdir/<its name>.
    index: the one point to run, or None.
    dry_run, summarize_only, publish_to: the modes above (at most one).
    log: called with each progress line (the loop's included).
    extrapolate: called as `extrapolate(run_dir, num_tokens=sweep.extrapolate_tokens, log=log)`
      for a finished point whose run directory has no extrapolation.json
      yet, to write one (e.g. txf.trained.extrapolate.extrapolate_run); None
      (or sweep.extrapolate False): no extrapolation.
    config_file: the sweep config file loaded, for each point's run_record.json.

  Returns:
    The results rows where results are written, else None (also when
    preempted).

  Raises:
    GridError: a bad grid, sweep setting or point (naming the point and the
      field) before anything trains, or a point's workdir that its config
      cannot resume (one trained for more steps than the point asks, or,
      to summarize, for other steps: before anything trains or is
      summarised).
    WorkdirError: `workdir` on a file system that is not installed (a gs://
      one needs the `gcs` extra), that cannot be reached or written (a
      read-only file system), or where no point has been run (summarize_only),
      or a point's existing work directory that the sweep would train or
      extrapolate in and cannot write, before anything trains or is
      written; a point's work directory in use (another sweep trains or
      extrapolates it).
    WriteError: a results file, plot or extrapolation record could not
      be written (one line naming it; its previous version is intact, and
      so is every other file of the summary).
  """
  modes = [
    name
    for name, on in (
      ("dry_run", dry_run),
      ("summarize_only", summarize_only),
      ("publish_to", publish_to is not None),
    )
    if on
  ]
  if len(modes) > 1:
    raise ValueError(f"{' and '.join(modes)}: choose one mode")
  # Summarizing and publishing read what the points trained, and train nothing.
  reads_only = summarize_only or publish_to is not None
  reading = "publish" if publish_to is not None else "summarize"
  workdir = run_path(workdir)
  settings = read_sweep_settings(sweep_config)
  if not settings.extrapolate:
    extrapolate = None
  points = grid.expand(sweep_config)
  runs = grid.validate(points, check_point_config)
  if not reads_only:  # what such a sweep trained before can still be summarised
    _check_distinct(points, runs)
    if extrapolate is not None:  # a summary extrapolates nothing
      _check_extrapolates(points, runs, settings.extrapolate_tokens)
  # A summary reads every point (an array job's index is the training's).
  selected = points if reads_only else grid.select(points, index)
  if dry_run:
    _dry_run(selected, workdir, settings)
    return None
  check_reachable(workdir)
  # A mistyped --workdir: say so rather than write a table of missing points.
  # (At the points' steps: a status needs no config.json read, which check_trained_steps does.)
  if reads_only and all(
    results.point_status(workdir / p.name, steps=p.config.train.steps) == "missing" for p in points
  ):
    raise WorkdirError(f"{workdir}: no point of this sweep has run there: nothing to {reading}")
  # A changed field the points' checkpoints depend on: what the refusal advises.
  advice = f"{reading} with the overrides it trained with" if reads_only else "use a new --workdir"
  for point in points:
    point_dir = workdir / point.name
    try:
      results.check_trained_steps(point, point_dir, summary=reads_only)
    except results.TrainedShorter as error:  # a summary only: training would go on
      raise GridError(f"{error} ({point_dir}): {advice}, or train it on first") from None
    except ValueError as error:
      raise GridError(f"{error} ({point_dir}): {advice}") from None
    # As txf-run refuses it: a finished point is skipped, so its run alone
    # would never compare its config.json with the point's changed one; and
    # a summary's tables would name runs other than those its points trained.
    saved = read_run_config(point_dir)
    try:
      check_resumable(runs[point.index], saved, point_dir, advice=advice)
    except ValueError as error:
      raise GridError(f"point {point.index} ({point.name}): {error}") from None
    _say_trained_otherwise(point, runs[point.index], saved, point_dir, log)
  if publish_to is not None:  # the results go to the copies: the sweep may be read-only
    return publish(
      points,
      workdir,
      publish_to,
      extrapolated=extrapolate is not None,
      extrapolate_tokens=settings.extrapolate_tokens,
      log=log,
    )
  check_writable(workdir)  # where the results go: a read-only sweep stops here
  if not summarize_only:
    for point in selected:
      _check_point_writable(
        point, runs[point.index], workdir / point.name, extrapolate, settings.extrapolate_tokens
      )
  # From here on a SIGTERM (preemption) anywhere stops the sweep with a line
  # and a clean return: training and extrapolation install their own guards
  # (the point is saved; the extrapolation stops between lengths), and this
  # one catches it between them and while the summary is made.
  with PreemptionGuard() as preemption:
    if not summarize_only and not _run_points(
      [(point, runs[point.index]) for point in selected],
      workdir,
      extrapolate,
      settings.extrapolate_tokens,
      log,
      config_file,
      preemption,
    ):
      return None
    if len(selected) < len(points):
      return None
    return summarize(
      points,
      workdir,
      extrapolate_tokens=settings.extrapolate_tokens,
      log=log,
      preemption=preemption,
    )


def _say_trained_otherwise(
  point: Point, run: RunConfig, saved: RunConfig | None, point_dir: epath.Path, log: Log
) -> None:
  """One line naming the fields a finished point's config.json holds
  otherwise than the sweep's point (those its checkpoints do not depend on:
  e.g. a learning rate changed with --resume_step). The sweep skips such a
  point, and its row is that run's: nothing else would say so. A point that
  trains on says it itself (txf-run's changed fields)."""
  if results.point_status(point_dir, steps=point.config.train.steps) not in ("done", "diverged"):
    return
  changes = config_changes(run, saved)
  if changes:
    fields = ", ".join(f"{name} {old!r} (the sweep's {new!r})" for name, old, new in changes)
    log(f"point {point.index} ({point.name}): trained with {fields}: its row is that run's")


def _check_point_writable(
  point: Point,
  run: RunConfig,
  point_dir: epath.Path,
  extrapolate: Extrapolate | None,
  num_tokens: int | None,
) -> None:
  """Refuses (WorkdirError, one line naming it) an existing point directory
  that the sweep would train or extrapolate in but cannot write, before any
  point runs: found when its turn came, it stopped the sweep after the
  points before it had trained. (A new one is made in the sweep directory,
  checked already.)"""
  if not point_dir.exists():
    return
  trains = results.point_status(point_dir, steps=run.train.steps) not in ("done", "diverged")
  # Quiet: the point's turn logs why its extrapolation is recomputed.
  stale = extrapolate is not None and results.needs_extrapolation(
    point, point_dir, _quiet, num_tokens
  )
  if trains or stale:
    check_writable(point_dir)


def _stopped(reason: str, where: str, log: Log) -> bool:
  """Logs 'sweep <reason> <where>' for a sweep a signal stopped and returns
  False; after a Ctrl-C ('interrupted') raises KeyboardInterrupt instead,
  the point saved, so that txf-sweep exits 130 as txf-run does (a SIGTERM,
  a preemption, exits 0)."""
  log(f"sweep {reason} {where}")
  if reason == "interrupted":
    raise KeyboardInterrupt
  return False


def _run_points(
  selected: Sequence[tuple[Point, RunConfig]],
  workdir: epath.Path,
  extrapolate: Extrapolate | None,
  num_tokens: int | None,
  log: Log,
  config_file: str | None,
  preemption: PreemptionGuard,
) -> bool:
  """Trains and extrapolates each point of `selected` (with its parsed
  config) in turn; returns False when a SIGTERM stopped the sweep (logging
  which point to rerun from; a Ctrl-C raises KeyboardInterrupt, `_stopped`)."""
  began, point_seconds = time.perf_counter(), list[float]()
  for position, (point, run) in enumerate(selected, 1):
    if preemption.requested:
      return _stopped(
        preemption.reason,
        f"before point {point.index} ({point.name}); rerun the same command to resume",
        log,
      )
    point_dir = workdir / point.name
    log(
      format_sweep_progress(
        position, len(selected), point, time.perf_counter() - began, point_seconds
      )
    )
    point_began = time.perf_counter()
    trains = results.point_status(point_dir, steps=run.train.steps) not in ("done", "diverged")
    reason = _train_point(point, run, point_dir, log, config_file)
    if reason is not None:
      # A signal while the point set up stopped it before it wrote anything.
      missing = results.point_status(point_dir) == "missing"
      what = "before it trained (nothing of it saved)" if missing else "which is saved"
      return _stopped(
        reason,
        f"in point {point.index} ({point.name}), {what}; rerun the same command to resume",
        log,
      )
    reason = _extrapolate_point(point, point_dir, extrapolate, num_tokens, log)
    if reason is not None:
      return _stopped(
        reason,
        f"in point {point.index} ({point.name})'s length extrapolation; rerun the same "
        "command to resume (an extrapolation cut short is computed again)",
        log,
      )
    if trains:
      point_seconds.append(time.perf_counter() - point_began)
  return True
