"""Training metrics: JSON lines + TensorBoard event files, and a console line.

A run's work directory holds
  metrics.jsonl  one JSON object per `write`: {"step": 100, "time": 1.7e9,
                 "loss": 2.3, ...} (`time`: wall time, seconds since the epoch)
  tb/            TensorBoard event files (written here with tensorboardX's
                 protocol buffers; no TensorFlow needed): the scalars, grouped
                 by txf.train.trackers.metric_tag (train/loss, eval/loss,
                 perf/tokens_per_sec, ...), each sample as preformatted text
                 ('eval/sample'), and the run's hyperparameters with its
                 final metrics for the HParams dashboard (`write_hparams`)
  samples.txt    text sampled at each evaluation, one '=== step N ===' record each

Experiment trackers (txf.train.trackers, e.g. Weights & Biases) passed as
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
again, so each step keeps exactly one row.

The work directory may be local or on object storage (gs://...), through
`etils.epath`; object stores have no append, so there the files are
rewritten whole (see MetricsWriter).

A run of R > 1 seed replicas logs each replica's value of a metric as
'<name>/<r>', their mean as '<name>' and their std as '<name>_std'
(`replica_scalars`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import socket
import struct
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from etils import epath
from tensorboardX import summary as tb_summary
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c

from txf.train.trackers import Tracker, metric_tag
from txf.train.workdir import WriteError, is_local, replace_bytes, write_error

METRICS_FILE = "metrics.jsonl"
DROPPED_METRICS_FILE = "metrics.dropped.jsonl"
SAMPLES_FILE = "samples.txt"
TIME_KEY = "time"  # a metrics row's wall time: seconds since the epoch
SAMPLE_TAG = "eval/sample"  # TensorBoard's text summaries of the samples
DROPPED_SAMPLES_FILE = "samples.dropped.txt"
TENSORBOARD_DIR = "tb"
_SAMPLE_HEADER = re.compile(rb"^=== step (\d+) ===$")

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


def _to_python_scalars(scalars: Mapping[str, Any]) -> dict[str, int | float]:
  if "step" in scalars:
    raise ValueError("scalars must not contain 'step' (it is written from the step argument).")
  return {name: _to_python(name, value) for name, value in scalars.items()}


class _LocalFile:
  """Appends bytes to a local file, each append one write to the OS (nothing
  is buffered in the process: a run killed at any point keeps every record
  written). An append that fails is cut off again, so the file never ends in
  part of a record, and raises WriteError naming the file."""

  def __init__(self, path: epath.Path, *, exclusive: bool = False):
    self.path = path
    try:
      # Unbuffered: every append reaches the OS at once, or fails at once.
      self._file = open(path, "xb" if exclusive else "ab", buffering=0)
      self._size = os.fstat(self._file.fileno()).st_size
    except OSError as error:
      raise write_error(path, error) from error

  def append(self, data: bytes) -> None:
    try:
      view = memoryview(data)
      while view:
        view = view[self._file.write(view) :]
    except OSError as error:
      with contextlib.suppress(OSError):
        os.ftruncate(self._file.fileno(), self._size)
      raise write_error(self.path, error) from error
    self._size += len(data)

  def flush(self) -> None:
    pass  # every append is written already

  def close(self) -> None:
    self._file.close()


class _LocalLines:
  """Appends text (whole lines) to a local file (see _LocalFile)."""

  def __init__(self, path: epath.Path):
    self._file = _LocalFile(path)

  def append(self, text: str) -> None:
    self._file.append(text.encode("utf-8"))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class _ObjectLines:
  """Appends text to an object (gs://...): object stores have no append, so
  the text is kept in memory and the whole object rewritten -- at each
  append unless the last upload was under `interval` seconds ago (Cloud
  Storage takes about one update of an object per second), and at flush and
  close. Rows are few (one per log step), so the rewrite stays small."""

  def __init__(self, path: epath.Path, interval: float = 1.0):
    self._path, self._interval = path, interval
    data = _read(path)
    self._chunks = [data + b"\n" if data and not data.endswith(b"\n") else data]
    self._pending, self._uploaded = False, -math.inf

  def append(self, text: str) -> None:
    self._chunks.append(text.encode("utf-8"))
    self._pending = True
    if time.monotonic() - self._uploaded >= self._interval:
      self.flush()

  def flush(self) -> None:
    if self._pending:
      try:
        self._path.write_bytes(b"".join(self._chunks))
      # Remote file systems raise their own types (gcsfs's HttpError, ...).
      except Exception as error:
        raise write_error(self._path, error) from error
      self._pending, self._uploaded = False, time.monotonic()

  def close(self) -> None:
    self.flush()


def _lines_sink(path: epath.Path) -> _LocalLines | _ObjectLines:
  return _LocalLines(path) if is_local(path) else _ObjectLines(path)


def _record(data: bytes) -> bytes:
  """`data` framed as one TFRecord: length, its CRC, data, its CRC."""
  header = struct.pack("<Q", len(data))
  return (
    header
    + struct.pack("<I", masked_crc32c(header))
    + data
    + struct.pack("<I", masked_crc32c(data))
  )


class _EventFile:
  """A TensorBoard event file in a local `directory`, written in the caller's
  thread (see _LocalFile): one Event per `add_summary` call (a row's
  scalars, a sample's text, the hyperparameters).

  The file is named as TensorBoard expects (events.out.tfevents.<time>.<host>,
  then `suffix`; a new name if that one exists) and starts as tensorboardX's
  do: the file version, then, for a resumed run, a SessionLog START at
  `purge_step`, which tells TensorBoard to hide the events logged at and
  after it by the previous session.
  """

  def __init__(self, directory: epath.Path, purge_step: int | None, suffix: str = ""):
    try:
      directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
      raise write_error(directory, error) from error
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}{suffix}"
    path, n = directory / name, 1
    while True:
      try:
        self._file = _LocalFile(path, exclusive=True)
        break
      except WriteError:
        if not path.exists():
          raise
        n += 1  # two sessions within one second
        path = directory / f"{name}.{n}"
    self.path = path
    try:
      self._add(Event(wall_time=time.time(), file_version="brain.Event:2"))
      if purge_step is not None:
        self._add(
          Event(
            wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)
          )
        )
    except BaseException:
      self.close()
      raise

  def _add(self, event: Event) -> None:
    self._file.append(_record(event.SerializeToString()))

  def add_summary(self, step: int, summary: Summary) -> None:
    self._add(Event(wall_time=time.time(), step=step, summary=summary))

  def flush(self) -> None:
    pass  # every event is written already

  def close(self) -> None:
    self._file.close()


class _MirroredTensorBoard:
  """TensorBoard event files for a work directory on object storage.

  Object stores have no append: the events are written to a local temporary
  directory and its files copied into `target` at flush and close, and on
  `add_summary` at most every `interval` seconds. A copy replaces the whole
  file; event files of scalars stay small.
  """

  def __init__(self, target: epath.Path, purge_step: int | None, interval: float = 60.0):
    self._target, self._interval = target, interval
    self._local = tempfile.TemporaryDirectory(prefix="txf-tb-")
    # Event files are named by the second they start in: a unique suffix
    # keeps a quick restart (on another machine) from overwriting the
    # previous session's copy.
    self._events = _EventFile(
      epath.Path(self._local.name), purge_step, suffix=f".{uuid.uuid4().hex[:8]}"
    )
    self._copied = time.monotonic()

  def add_summary(self, step: int, summary: Summary) -> None:
    self._events.add_summary(step, summary)
    if time.monotonic() - self._copied >= self._interval:
      self.flush()

  def flush(self) -> None:
    file = self._events.path
    try:
      (self._target / file.name).write_bytes(file.read_bytes())
    # Remote file systems raise their own types (gcsfs's HttpError, ...).
    except Exception as error:
      raise write_error(self._target / file.name, error) from error
    self._copied = time.monotonic()

  def close(self) -> None:
    try:
      self._events.close()
      self.flush()
    finally:
      self._local.cleanup()


def _tensorboard(
  directory: epath.Path, purge_step: int | None
) -> _EventFile | _MirroredTensorBoard:
  if is_local(directory):
    return _EventFile(directory, purge_step)
  return _MirroredTensorBoard(directory, purge_step)


class MetricsWriter:
  """Appends scalars to `workdir/metrics.jsonl` and TensorBoard `workdir/tb`.

  With `enabled=False` (non-zero processes) nothing is created or written
  and `write` does not look at its arguments, so it forces no device sync.
  Usable as a context manager (closes on exit).

  A local work directory gets every row as it is written. On object storage
  (gs://) metrics.jsonl and samples.txt are rewritten whole (at most once a
  second; pending rows at `flush` and `close`) and TensorBoard's files are
  copied in (at most once a minute, and at `flush` and `close`): see
  _ObjectLines and _MirroredTensorBoard.

  Every method that writes raises WriteError ('<path>: <reason>') when a
  file cannot be written; no thread is left behind.

  Args:
    workdir: the run's work directory (local or a URL such as gs://b/run).
    enabled: whether this process writes.
    start_step: the step training continues from; rows and samples logged
      after it are moved aside first (see the module docstring). None keeps
      everything (for writers that only append, e.g. evaluations).
    trackers: experiment trackers (txf.train.trackers) that get every row,
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
  ):
    self._enabled = enabled
    self._trackers = tuple(trackers) if enabled else ()
    self._workdir = epath.Path(workdir)
    self._jsonl: _LocalLines | _ObjectLines | None = None
    self._samples: _LocalLines | _ObjectLines | None = None
    self._tensorboard: _EventFile | _MirroredTensorBoard | None = None
    self.dropped: dict[str, int] = {}
    if not enabled:
      return
    try:
      if is_local(self._workdir):  # object stores have no directories, nor cut-off rows
        _writing(self._workdir, lambda: self._workdir.mkdir(parents=True, exist_ok=True))
        _terminate_partial_last_line(self._workdir / METRICS_FILE)
      if start_step is not None:
        self.dropped = drop_records_after(self._workdir, start_step)
      self._jsonl = _lines_sink(self._workdir / METRICS_FILE)
      self._tensorboard = _tensorboard(
        self._workdir / TENSORBOARD_DIR, purge_step=None if start_step is None else start_step + 1
      )
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
    row = _to_python_scalars(scalars)
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
      self._samples = _lines_sink(self._workdir / SAMPLES_FILE)
    self._samples.append(f"=== step {int(step)} ===\n{text}\n")
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
    trackers get the metrics as their run's summary."""
    if not self._enabled:
      return
    if self._tensorboard is None:
      raise ValueError("MetricsWriter.write_hparams called after close().")
    values = {name: _hparam_value(value) for name, value in hparams.items()}
    final = _to_python_scalars(metrics)
    # The dashboard reads each metric's value from the scalars of its tag.
    tags = {metric_tag(name): value for name, value in final.items()}
    for summary in tb_summary.hparams(values, tags):
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


def _read(path: epath.Path) -> bytes:
  """The bytes of `path` (b'' if there is none): read as bytes, so that a
  line that is not UTF-8 is one unreadable row, not an unreadable file."""
  return path.read_bytes() if path.exists() else b""


def _writing(path: epath.Path, action):
  """Runs `action()`, raising WriteError naming `path` if it fails."""
  try:
    return action()
  except WriteError:
    raise
  # Remote file systems raise their own types (gcsfs's HttpError, ...).
  except Exception as error:
    raise write_error(path, error) from error


def _terminate_partial_last_line(path: epath.Path) -> None:
  """Ends a row of a local file cut off by a crash, so appended rows start
  on a new line."""
  if not path.exists() or path.stat().length == 0:
    return
  with open(path, "rb") as f:
    f.seek(-1, os.SEEK_END)
    ended = f.read(1) == b"\n"
  if not ended:
    file = _LocalFile(path)
    try:
      file.append(b"\n")
    finally:
      file.close()


def _append(path: epath.Path, data: bytes) -> None:
  """Appends `data` to `path`; an object (no append) is rewritten whole."""
  if is_local(path):
    file = _LocalFile(path)
    try:
      file.append(data)
    finally:
      file.close()
  else:
    _writing(path, lambda: path.write_bytes(_read(path) + data))


def _move_lines(
  path: epath.Path, dropped_path: epath.Path, keep_flags: list[bool], lines: list[bytes]
) -> None:
  """Rewrites `path` with the kept lines, appending the others to
  `dropped_path` first so nothing is lost if the rewrite is interrupted."""
  _append(dropped_path, b"".join(line for line, keep in zip(lines, keep_flags) if not keep))
  kept = b"".join(line for line, keep in zip(lines, keep_flags) if keep)
  _writing(path, lambda: replace_bytes(path, kept))


def _read_lines(path: epath.Path) -> list[bytes]:
  """`path`'s lines with their newlines ([] if there is no file)."""
  return io.BytesIO(_read(path)).readlines()


def _row_step(line: bytes) -> int | None:
  """The step of a metrics.jsonl line (None: not a readable row)."""
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError too
    return None


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


def drop_records_after(workdir: str | os.PathLike, step: int) -> dict[str, int]:
  """Moves metrics rows and samples logged after `step` aside.

  Rows go from metrics.jsonl to metrics.dropped.jsonl, samples from
  samples.txt to samples.dropped.txt (appended, so repeated restarts keep
  every history). Unreadable metrics rows are kept where they are. Only the
  records after the last one at `step` or before are parsed (`_tail_start`).

  Returns:
    {file name: number of records moved}, only for files that lost any.
  """
  workdir = epath.Path(workdir)
  moved = {}
  lines = _read_lines(workdir / METRICS_FILE)
  start = _tail_start(lines, _row_step, step)
  keep = [True] * start + [_row_step(line) is None for line in lines[start:]]
  if not all(keep):
    _move_lines(workdir / METRICS_FILE, workdir / DROPPED_METRICS_FILE, keep, lines)
    moved[METRICS_FILE] = keep.count(False)
  lines = _read_lines(workdir / SAMPLES_FILE)
  start = _tail_start(lines, _sample_step, step)
  keep, current, records = [True] * start, True, 0
  for line in lines[start:]:
    if _sample_step(line) is not None:  # every header here is after `step`
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
  # Each record is its text and the newline write_sample ends it with.
  return [
    (step, b"".join(lines).decode("utf-8", errors="replace").removesuffix("\n"))
    for step, lines in records
  ]


def read_metrics(workdir: str | os.PathLike, *, since: int | None = None) -> list[dict[str, Any]]:
  """The rows of `workdir/metrics.jsonl` in file order ([] if there is none);
  with `since`, only the rows at step `since` and after, reading the file
  from its end (`_tail_start`).

  A row that does not parse (cut off by a crash, not UTF-8) is skipped with
  a warning.
  """
  path = epath.Path(workdir) / METRICS_FILE
  lines = _read_lines(path)
  start = 0 if since is None else _tail_start(lines, _row_step, since - 1)
  rows = []
  for line_number, line in enumerate(lines[start:], start=start + 1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
      logger.warning("Skipping unreadable line %d of %s: %s", line_number, path, error)
  return rows


def format_duration(seconds: float) -> str:
  """A duration as progress lines print it: '45s', '7m05s', '1h02m' ('?' if not finite)."""
  if not math.isfinite(seconds):
    return "?"
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  if hours:
    return f"{hours}h{minutes:02d}m"
  if minutes:
    return f"{minutes}m{secs:02d}s"
  return f"{secs}s"


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


def format_progress(
  step: int,
  total: int,
  scalars: Mapping[str, Any],
  *,
  elapsed: float | None = None,
  steps_run: int = 0,
  timed: tuple[float, int] | None = None,
) -> str:
  """One console line, e.g.
  'step 120/1000 (12.0%) | loss 2.3456 | lr 3.000e-04 | 51,234 tok/s |
  mfu 41.2% | elapsed 1m05s | eta 7m20s'.

  Reads the optional keys 'loss', 'learning_rate', 'tokens_per_sec', 'mfu'
  and 'steps_per_sec'; missing ones are left out, others ignored.
  `elapsed`: wall seconds this process has trained, evaluations and
  compilation included, over `steps_run` steps. With both, the ETA is the
  remaining steps at that wall time per step, so it counts the evaluations
  still to come; otherwise it is the remaining steps at 'steps_per_sec'.
  `timed`: (seconds, steps) to take that wall time per step from instead,
  e.g. those since the first step compiled (the loop's: a compilation is not
  repeated, and right after a resume it would dominate a few steps' time).
  """
  if total <= 0:
    raise ValueError(f"total must be positive, got {total}.")
  known = ("loss", "learning_rate", "tokens_per_sec", "mfu", "steps_per_sec")
  values = _to_python_scalars({k: scalars[k] for k in known if k in scalars})
  parts = [f"step {step}/{total} ({100 * step / total:.1f}%)"]
  if "loss" in values:
    parts.append(f"loss {values['loss']:.4f}")
  if "learning_rate" in values:
    parts.append(f"lr {values['learning_rate']:.3e}")
  if "tokens_per_sec" in values:
    parts.append(f"{values['tokens_per_sec']:,.0f} tok/s")
  if "mfu" in values:
    parts.append(f"mfu {values['mfu']:.1%}")
  remaining = max(total - step, 0)
  if elapsed is not None:
    parts.append(f"elapsed {format_duration(elapsed)}")
  seconds, steps = timed if timed is not None else (elapsed, steps_run)
  if seconds is not None and steps > 0:
    parts.append(f"eta {format_duration(remaining * seconds / steps)}")
  elif values.get("steps_per_sec", 0) > 0:
    parts.append(f"eta {format_duration(remaining / values['steps_per_sec'])}")
  return " | ".join(parts)
