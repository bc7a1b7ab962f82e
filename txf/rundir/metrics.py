"""Training metrics: JSON lines + TensorBoard event files (the files
themselves: txf.rundir.sinks; the console line: txf.rundir.console).

A run's work directory holds
  metrics.jsonl  one JSON object per `write`: {"step": 100, "time": 1.7e9,
                 "loss": 2.3, ...} (`time`: wall time, seconds since the epoch)
  tb/            TensorBoard event files (written here with tensorboardX's
                 protocol buffers; no TensorFlow needed): the scalars, grouped
                 by txf.runconfig.tracking.metric_tag (train/loss, eval/loss,
                 perf/tokens_per_sec, ...), each sample as preformatted text
                 ('eval/sample'), and the run's hyperparameters with its
                 final metrics for the HParams dashboard (`write_hparams`)
  samples.txt    text sampled at each evaluation, one '=== step N ===' record each
                 (control characters and backslashes as \\xNN: `read_samples`)

Experiment trackers (txf.rundir.trackers, e.g. Weights & Biases) passed as
`trackers` get every row, sample and the hyperparameters too (process 0 only).

Every file is written in the caller's thread, each record with one write to
the OS: a failed write (a full disk, ...) raises WriteError naming the file
and the reason, and the record is cut off again, so no file keeps half a
row. (tensorboardX's SummaryWriter writes from a thread of its own; when a
write there failed, the thread died and the training thread then waited for
ever on its queue.)

Only process 0 should write (`enabled=jax.process_index() == 0`). A writer
opened at `start_step` (the step a run resumes from, 0 for a fresh start)
first moves every metrics row and sample logged after that step to
`metrics.dropped.jsonl` / `samples.dropped.txt`, and tells TensorBoard to
hide events after it (`purge_step`): those steps are about to be trained
again, so each step keeps exactly one row. One opened to evaluate
`start_step` again (`evaluating_again`: a run completing its lost final
evaluation) moves that evaluation's records aside too, so the new one
replaces them.

The work directory may be local or on object storage (gs://...), through
`etils.epath`; object stores have no append, so there the files are
rewritten whole (see MetricsWriter).

A run of R > 1 seed replicas logs each replica's value of a metric as
'<name>/<r>', their mean as '<name>' and their std as '<name>_std'
(`replica_scalars`).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from etils import epath
from tensorboardX import summary as tb_summary
from tensorboardX.proto.event_pb2 import SessionLog
from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData
from tensorboardX.proto.summary_pb2 import Summary

from txf.runconfig.tracking import Tracker, metric_tag
from txf.rundir.sinks import (
  EventFile,
  LocalLines,
  MirroredTensorBoard,
  ObjectLines,
  append_bytes,
  lines_sink,
  read_bytes,
  read_events,
  tensorboard,
  terminate_partial_last_line,
  writing,
)
from txf.rundir.workdir import WorkdirError
from txf.storage import is_local, write_file

METRICS_FILE = "metrics.jsonl"
DROPPED_METRICS_FILE = "metrics.dropped.jsonl"
SAMPLES_FILE = "samples.txt"
TIME_KEY = "time"  # a metrics row's wall time: seconds since the epoch
SAMPLE_TAG = "eval/sample"  # TensorBoard's text summaries of the samples
DROPPED_SAMPLES_FILE = "samples.dropped.txt"
TENSORBOARD_DIR = "tb"
_SAMPLE_HEADER = re.compile(rb"^=== step (\d+) ===$")
# What samples.txt writes as \xNN: a backslash (so every escape reads back),
# control characters but newline and tab (a sampled \r or ESC redrew the
# terminal that showed the file, a NUL made tools call it binary), and the
# '=' that starts a text line reading as a record header.
_SAMPLE_ESCAPE = re.compile(r"[\\\x00-\x08\x0b-\x1f\x7f]|^=(?=== step \d+ ===$)", re.MULTILINE)
_SAMPLE_UNESCAPE = re.compile(r"\\x([0-9a-f]{2})")


def check_outputs(workdir: epath.Path) -> None:
  """Refuses a run directory where a file the writer appends to (or moves
  rows aside into) is not a writable file, or tb/ is not a writable
  directory: one line,
  before the run restores or trains, rather than a traceback at its first
  write.

  Raises:
    WorkdirError: naming the path.
  """
  local = is_local(workdir)
  for name in (METRICS_FILE, DROPPED_METRICS_FILE, SAMPLES_FILE, DROPPED_SAMPLES_FILE):
    path = workdir / name
    if path.exists() and not path.is_file():
      raise WorkdirError(f"{path}: exists and is not a file")
    # A link to a file not made yet is made by the first append, unless its
    # directory is gone too: then that append fails mid-run.
    target = os.path.realpath(path)
    if local and os.path.islink(path) and not os.path.isdir(os.path.dirname(target)):
      raise WorkdirError(f"{path}: a link into {os.path.dirname(target)}, which does not exist")
    if local and path.exists() and not os.access(path, os.W_OK):
      raise WorkdirError(f"{path}: not writable ({os.strerror(errno.EACCES)})")
  path = workdir / TENSORBOARD_DIR
  if path.exists() and not path.is_dir():
    raise WorkdirError(f"{path}: exists and is not a directory")
  if local and path.exists() and not os.access(path, os.W_OK | os.X_OK):
    raise WorkdirError(f"{path}: not a writable directory ({os.strerror(errno.EACCES)})")


def escape_sample(text: str) -> str:
  """`text` as samples.txt holds it (`unescape_sample` reads it back)."""
  return _SAMPLE_ESCAPE.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def unescape_sample(text: str) -> str:
  """The text `escape_sample` was given."""
  return _SAMPLE_UNESCAPE.sub(lambda match: chr(int(match.group(1), 16)), text)


logger = logging.getLogger(__name__)


def _to_python(name: str, value: Any) -> int | float:
  """A Python int/float from a Python, numpy or jax scalar."""
  array = np.asarray(value)
  if array.shape != ():
    raise ValueError(f"scalars[{name!r}] must be a scalar, got shape {array.shape}.")
  if jnp.issubdtype(array.dtype, jnp.integer) or array.dtype == bool:
    return int(array)
  if jnp.issubdtype(array.dtype, jnp.floating):
    return float(array)
  raise ValueError(f"scalars[{name!r}] must be a number, got {value!r} ({array.dtype}).")


def to_python_scalars(scalars: Mapping[str, Any]) -> dict[str, int | float]:
  if "step" in scalars:
    raise ValueError("scalars must not contain 'step' (it is written from the step argument).")
  return {name: _to_python(name, value) for name, value in scalars.items()}


class MetricsWriter:
  """Appends scalars to `workdir/metrics.jsonl` and TensorBoard `workdir/tb`.

  With `enabled=False` (non-zero processes) nothing is created or written
  and `write` does not look at its arguments, so it forces no device sync.
  Usable as a context manager (closes on exit).

  A local work directory gets every row as it is written. On object storage
  (gs://) metrics.jsonl and samples.txt are rewritten whole (at most once a
  second; pending rows at `flush` and `close`) and TensorBoard's files are
  copied in (at most once a minute, and at `flush` and `close`): see
  ObjectLines and MirroredTensorBoard.

  Every method that writes raises WriteError ('<path>: <reason>') when a
  file cannot be written; no thread is left behind.

  Args:
    workdir: the run's work directory (local or a URL such as gs://b/run).
    enabled: whether this process writes.
    start_step: the step training continues from; rows and samples logged
      after it are moved aside first (see the module docstring). None keeps
      everything (for writers that only append, e.g. evaluations).
    evaluating_again: the run evaluates `start_step` again (its final
      evaluation, lost in part, is completed): that evaluation's rows and
      samples are moved aside too (`drop_records_after`), and TensorBoard
      hides every event at `start_step`, the step's other rows (its train
      row) written to it again.
    trackers: experiment trackers (txf.rundir.trackers) that get every row,
      sample and the hyperparameters too; closed by `close` (only used
      when `enabled`).
  """

  def __init__(
    self,
    workdir: str | os.PathLike,
    *,
    enabled: bool = True,
    start_step: int | None = None,
    trackers: tuple[Tracker, ...] = (),
    evaluating_again: bool = False,
  ):
    self._enabled = enabled
    self._trackers = tuple(trackers) if enabled else ()
    self._workdir = epath.Path(workdir)
    self._jsonl: LocalLines | ObjectLines | None = None
    self._samples: LocalLines | ObjectLines | None = None
    self._tensorboard: EventFile | MirroredTensorBoard | None = None
    self.dropped: dict[str, int] = {}
    if not enabled:
      return
    try:
      if is_local(self._workdir):  # object stores have no directories, nor cut-off rows
        writing(self._workdir, lambda: self._workdir.mkdir(parents=True, exist_ok=True))
        for name in (METRICS_FILE, SAMPLES_FILE):
          terminate_partial_last_line(self._workdir / name)
      purge_step = None
      if start_step is not None:
        self.dropped = drop_records_after(self._workdir, start_step, evaluation=evaluating_again)
        purge_step = start_step if evaluating_again else start_step + 1
      self._jsonl = lines_sink(self._workdir / METRICS_FILE)
      self._tensorboard = tensorboard(self._workdir / TENSORBOARD_DIR, purge_step=purge_step)
      if evaluating_again:
        # TensorBoard's purge cannot spare the train row at the step: written again.
        for row in read_metrics(self._workdir, since=start_step):
          scalars = {name: value for name, value in row.items() if name not in ("step", TIME_KEY)}
          self._tensorboard.add_summary(int(row["step"]), _scalars_summary(scalars))
    except BaseException:
      self._close_quietly()
      raise

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `scalars` (name -> Python/numpy/jax scalar) at `step`.

    Raises:
      ValueError: a non-scalar or non-numeric value (naming it), a 'step'
        key, or a negative step -- before anything is written.
    """
    if not self._enabled:
      return
    if self._jsonl is None or self._tensorboard is None:  # set and cleared together
      raise ValueError("MetricsWriter.write called after close().")
    step = int(step)
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    row = to_python_scalars(scalars)
    if TIME_KEY in row:
      raise ValueError(f"scalars must not contain {TIME_KEY!r} (the row's wall time is added).")
    self._jsonl.append(json.dumps({"step": step, TIME_KEY: time.time(), **row}) + "\n")
    self._tensorboard.add_summary(step, _scalars_summary(row))
    for tracker in self._trackers:
      tracker.log_metrics(step, row)

  def write_sample(self, step: int, text: str) -> None:
    """Appends a text sample taken at `step` to samples.txt."""
    if not self._enabled:
      return
    if self._jsonl is None:
      raise ValueError("MetricsWriter.write_sample called after close().")
    if self._samples is None:  # created with the first sample
      self._samples = lines_sink(self._workdir / SAMPLES_FILE)
    self._samples.append(f"=== step {int(step)} ===\n{escape_sample(text)}\n")
    if self._tensorboard is not None:
      self._tensorboard.add_summary(int(step), tb_summary.text(SAMPLE_TAG, preformatted(text)))
    for tracker in self._trackers:
      tracker.log_sample(int(step), text)

  def write_hparams(
    self, step: int, hparams: Mapping[str, Any], metrics: Mapping[str, Any]
  ) -> None:
    """Records the run's hyperparameters (name -> bool, number, string; None
    and other values are written as text) with its final `metrics` (name ->
    scalar) for TensorBoard's HParams dashboard, which shows each run's
    hyperparameters beside the last value of each metric's scalars. The
    trackers get the metrics as their run's summary.

    Once per run: when the run's event files (a previous session's) hold
    these hyperparameters already, in a record TensorBoard keeps
    (`_held_hparams`), TensorBoard gets no second record."""
    if not self._enabled:
      return
    if self._tensorboard is None:
      raise ValueError("MetricsWriter.write_hparams called after close().")
    values = {name: _hparam_value(value) for name, value in hparams.items()}
    final = to_python_scalars(metrics)
    # The dashboard reads each metric's value from the scalars of its tag.
    tags = {metric_tag(name): value for name, value in final.items()}
    summaries = tb_summary.hparams(values, tags)
    self._tensorboard.flush()  # this session's file too (its purge), where it is a copy
    if _session_hparams(summaries[1]) not in _held_hparams(self._workdir / TENSORBOARD_DIR):
      for summary in summaries:
        self._tensorboard.add_summary(int(step), summary)
    for tracker in self._trackers:
      tracker.log_summary(final)

  def flush(self) -> None:
    for output in (self._jsonl, self._samples, self._tensorboard):
      if output is not None:
        output.flush()

  def close(self) -> None:
    """Flushes and closes every output and tracker (each one, also when
    another fails: the first failure is raised); calling it again does
    nothing."""
    outputs: list[Any] = [
      o for o in (self._jsonl, self._samples, self._tensorboard) if o is not None
    ]
    outputs += self._trackers
    self._jsonl = self._samples = self._tensorboard = None
    self._trackers = ()
    error = None
    for output in outputs:
      try:
        output.close()
      except Exception as failure:
        error = error or failure
    if error is not None:
      raise error

  def _close_quietly(self) -> None:
    """Closes every output, ignoring failures (an error is on its way already)."""
    with contextlib.suppress(Exception):
      self.close()

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, exc_type, *exc_info) -> None:
    if exc_type is None:
      self.close()
    else:  # the error that stopped the run is the one to report
      self._close_quietly()


def _scalars_summary(scalars: Mapping[str, float]) -> Summary:
  """One Summary holding every scalar of a metrics row (one Event per row),
  each under its group's tag (metric_tag)."""
  return Summary(
    value=[
      Summary.Value(tag=metric_tag(name), simple_value=value) for name, value in scalars.items()
    ]
  )


def preformatted(text: str) -> str:
  """`text` as a Markdown code block (every line indented 4 spaces):
  TensorBoard renders text summaries as Markdown, which would join the lines
  of a sample and drop their indentation (and read its '#', '*' and '<' as
  markup); a code block shows the text as it is."""
  return "\n".join("    " + line for line in text.split("\n"))


def _session_hparams(summary: Summary) -> dict[str, Any] | None:
  """{name: Value} of an hparams session_start_info summary (None: not one)."""
  for value in summary.value:
    if value.metadata.plugin_data.plugin_name == "hparams":
      data = HParamsPluginData.FromString(value.metadata.plugin_data.content)
      if data.HasField("session_start_info"):
        return dict(data.session_start_info.hparams)
  return None


def _held_hparams(directory: epath.Path) -> list[dict[str, Any]]:
  """The hyperparameters each hparams record that TensorBoard keeps of
  `directory`'s event files holds: read as TensorBoard reads them, file by
  file, a SessionLog START at step s (a resumed session's purge_step) hides
  the records written before it at steps >= s (EventAccumulator's
  _CheckForRestartAndMaybePurge), so a session that trains those steps again
  must write its record again."""
  held: list[tuple[int, dict[str, Any]]] = []
  for event in read_events(directory):
    if event.HasField("session_log") and event.session_log.status == SessionLog.START:
      held = [(step, hparams) for step, hparams in held if step < event.step]
    hparams = _session_hparams(event.summary)
    if hparams is not None:
      held.append((event.step, hparams))
  return [hparams for _, hparams in held]


def _hparam_value(value: Any) -> bool | int | float | str:
  """A value TensorBoard's hparams take: bools, numbers and strings as they
  are, anything else (None, tuples, ...) as its JSON (or repr)."""
  if isinstance(value, bool | str):
    return value
  if isinstance(value, int | float | np.integer | np.floating):
    return value.item() if isinstance(value, np.generic) else value
  try:
    return json.dumps(value)
  except TypeError:
    return repr(value)


def _move_lines(
  path: epath.Path,
  dropped_path: epath.Path,
  keep_flags: list[bool],
  lines: list[bytes],
  *,
  timed: bool = False,
) -> None:
  """Rewrites `path` with the kept lines, appending the others to
  `dropped_path` first so nothing is lost if the rewrite is interrupted.
  `timed` lines (metrics rows: each holds its time) that already end
  `dropped_path` are a move interrupted after its append: not appended
  again. (Samples hold no time: a resumed run samples the same text again,
  so the same lines may be a second move of their own.)"""
  moved = b"".join(line for line, keep in zip(lines, keep_flags) if not keep)
  if not (timed and read_bytes(dropped_path).endswith(moved)):
    append_bytes(dropped_path, moved)
  kept = b"".join(line for line, keep in zip(lines, keep_flags) if keep)
  writing(path, lambda: write_file(path, kept))


def _read_lines(path: epath.Path) -> list[bytes]:
  """`path`'s lines with their newlines ([] if there is no file)."""
  return io.BytesIO(read_bytes(path)).readlines()


def _row_step(line: bytes) -> int | None:
  """The step of a metrics.jsonl line (None: not a readable row)."""
  try:
    return _step_of(json.loads(line))
  except ValueError:  # UnicodeDecodeError and JSONDecodeError too
    return None


def _step_of(row: Any) -> int | None:
  """A metrics row's step: an int (None for anything else, a row of `[1]`
  or a step of "x", which every reader indexing rows by step failed on)."""
  step = row.get("step") if isinstance(row, dict) else None
  return step if isinstance(step, int) and not isinstance(step, bool) else None


def _sample_step(line: bytes) -> int | None:
  """The step of a samples.txt record's header line (None: not a header)."""
  header = _SAMPLE_HEADER.match(line.rstrip(b"\n"))
  return int(header.group(1)) if header else None


def _tail_start(lines: list[bytes], step_of: Callable[[bytes], int | None], step: int) -> int:
  """Index of the first of `lines` after the last one at `step` or before
  (by `step_of`; 0 if there is none), looking from the end only as far as
  that line: a run's files are in step order (a restart moves what was
  logged after its step aside), so what was logged after a step is at the
  end, and reading it costs what it holds, not what the file holds."""
  for index in range(len(lines) - 1, -1, -1):
    line_step = step_of(lines[index])
    if line_step is not None and line_step <= step:
      return index + 1
  return 0


def is_eval_row(row: Mapping[str, Any]) -> bool:
  """Whether a metrics row is an evaluation's (a train row has no eval_loss)."""
  return "eval_loss" in row


def _kept_row(line: bytes, step: int, evaluation: bool) -> bool:
  """Whether `drop_records_after` keeps a metrics line of its tail (rows
  after the last one before `step`, or at `step` without `evaluation`)."""
  if not evaluation:
    # Logged after `step`'s rows (the file is in step order): a later step's,
    # or one cut off as it was written (it stayed mid-file, before the rows
    # trained again).
    return False
  try:
    row = json.loads(line)
  except ValueError:  # the lost evaluation's row, cut off as it was written
    return False
  return row.get("step") == step and not is_eval_row(row)


def drop_records_after(
  workdir: str | os.PathLike, step: int, *, evaluation: bool = False
) -> dict[str, int]:
  """Moves metrics rows and samples logged after `step` aside; with
  `evaluation` (`step` is evaluated again), also the evaluation's at `step`:
  its eval rows (`is_eval_row`) and samples, and any unreadable row after
  the last row before it (its row, cut off as it was written).

  Rows go from metrics.jsonl to metrics.dropped.jsonl, samples from
  samples.txt to samples.dropped.txt (appended, so repeated restarts keep
  every history). An unreadable metrics row among them (cut off by a kill)
  goes with them; one before them stays where it is. Only the records after
  the last one at `step` (before it, with `evaluation`) or before are parsed
  (`_tail_start`).

  Returns:
    {file name: number of records moved}, only for files that lost any.
  """
  workdir = epath.Path(workdir)
  moved = {}
  kept_step = step - 1 if evaluation else step  # the last step whose records all stay
  lines = _read_lines(workdir / METRICS_FILE)
  start = _tail_start(lines, _row_step, kept_step)
  keep = [True] * start + [_kept_row(line, step, evaluation) for line in lines[start:]]
  if not all(keep):
    _move_lines(workdir / METRICS_FILE, workdir / DROPPED_METRICS_FILE, keep, lines, timed=True)
    moved[METRICS_FILE] = keep.count(False)
  lines = _read_lines(workdir / SAMPLES_FILE)
  start = _tail_start(lines, _sample_step, kept_step)
  keep, current, records = [True] * start, True, 0
  for line in lines[start:]:
    if _sample_step(line) is not None:  # every header here is after `kept_step`
      current = False
      records += 1
    keep.append(current)
  if records:
    _move_lines(workdir / SAMPLES_FILE, workdir / DROPPED_SAMPLES_FILE, keep, lines)
    moved[SAMPLES_FILE] = records
  return moved


def read_samples(workdir: str | os.PathLike) -> list[tuple[int, str]]:
  """(step, text) of each record of `workdir/samples.txt`, in file order ([]
  if there is none)."""
  records: list[tuple[int, list[bytes]]] = []
  for line in _read_lines(epath.Path(workdir) / SAMPLES_FILE):
    step = _sample_step(line)
    if step is not None:
      records.append((step, []))
    elif records:
      records[-1][1].append(line)
  # Each record is its escaped text and the newline write_sample ends it with.
  text = lambda lines: b"".join(lines).decode("utf-8", errors="replace").removesuffix("\n")
  return [(step, unescape_sample(text(lines))) for step, lines in records]


def read_metrics(workdir: str | os.PathLike, *, since: int | None = None) -> list[dict[str, Any]]:
  """The rows of `workdir/metrics.jsonl` in file order ([] if there is none);
  with `since`, only the rows at step `since` and after, reading the file
  from its end (`_tail_start`).

  A row that does not parse (cut off by a crash, not UTF-8), or is no
  object with an int step (`[1]`, a step of "x": every reader indexed it
  by step), is skipped with a warning.
  """
  path = epath.Path(workdir) / METRICS_FILE
  lines = _read_lines(path)
  start = 0 if since is None else _tail_start(lines, _row_step, since - 1)
  rows = []
  for line_number, line in enumerate(lines[start:], start=start + 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
      logger.warning("Skipping unreadable line %d of %s: %s", line_number, path, error)
      continue
    if _step_of(row) is None:
      logger.warning("Skipping line %d of %s: not a row with an int step", line_number, path)
      continue
    rows.append(row)
  return rows


def replica_scalars(values_R: Mapping[str, Any]) -> dict[str, float]:
  """Per-replica values as metrics rows hold them.

  Each [R] array `name` becomes 'name/0' .. 'name/<R-1>' (one per replica),
  'name' (their mean) and 'name_std' (their sample std, ddof=1; 0.0 for R = 1).
  """
  scalars = {}
  for name, value in values_R.items():
    value_R = np.asarray(value, np.float64)
    if value_R.ndim != 1 or not value_R.size:
      raise ValueError(f"{name}: expected one value per replica ([R]), got shape {value_R.shape}")
    scalars.update({f"{name}/{r}": float(v) for r, v in enumerate(value_R)})
    scalars[name] = float(value_R.mean())
    scalars[f"{name}_std"] = float(value_R.std(ddof=1)) if value_R.size > 1 else 0.0
  return scalars
