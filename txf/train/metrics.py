"""Training metrics: JSON lines + TensorBoard event files, and a console line.

A run's work directory holds
  metrics.jsonl  one JSON object per `write`: {"step": 100, "loss": 2.3, ...}
  tb/            TensorBoard event files (tensorboardX; no TensorFlow needed)
  samples.txt    text sampled at each evaluation, one '=== step N ===' record each

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

import io
import json
import logging
import math
import os
import re
import tempfile
import time
import uuid
from typing import Any, Mapping

from etils import epath
import jax.numpy as jnp
import numpy as np
import tensorboardX

from txf.train.workdir import is_local, replace_text

METRICS_FILE = 'metrics.jsonl'
DROPPED_METRICS_FILE = 'metrics.dropped.jsonl'
SAMPLES_FILE = 'samples.txt'
DROPPED_SAMPLES_FILE = 'samples.dropped.txt'
TENSORBOARD_DIR = 'tb'
_SAMPLE_HEADER = re.compile(r'^=== step (\d+) ===$')

logger = logging.getLogger(__name__)


def _to_python(name: str, value: Any) -> int | float:
  """A Python int/float from a Python, numpy or jax scalar."""
  array = np.asarray(value)
  if array.shape != ():
    raise ValueError(
        f'scalars[{name!r}] must be a scalar, got shape {array.shape}.')
  if jnp.issubdtype(array.dtype, jnp.integer) or array.dtype == bool:
    return int(array)
  if jnp.issubdtype(array.dtype, jnp.floating):
    return float(array)
  raise ValueError(
      f'scalars[{name!r}] must be a number, got {value!r} ({array.dtype}).')


def _to_python_scalars(scalars: Mapping[str, Any]) -> dict[str, int | float]:
  if 'step' in scalars:
    raise ValueError("scalars must not contain 'step' (it is written from the "
                     'step argument).')
  return {name: _to_python(name, value) for name, value in scalars.items()}


class _LocalLines:
  """Appends text to a local file, line-buffered: every row reaches the OS as
  soon as it is written (a run killed at any point keeps all its rows)."""

  def __init__(self, path: epath.Path):
    # Line buffering is an OS-file feature epath's open does not offer.
    self._file = open(path, 'a', buffering=1, encoding='utf-8')

  def append(self, text: str) -> None:
    self._file.write(text)

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
    text = _read(path)
    self._chunks = [text + '\n' if text and not text.endswith('\n') else text]
    self._pending, self._uploaded = False, -math.inf

  def append(self, text: str) -> None:
    self._chunks.append(text)
    self._pending = True
    if time.monotonic() - self._uploaded >= self._interval:
      self.flush()

  def flush(self) -> None:
    if self._pending:
      _write(self._path, ''.join(self._chunks))
      self._pending, self._uploaded = False, time.monotonic()

  def close(self) -> None:
    self.flush()


def _lines_sink(path: epath.Path) -> _LocalLines | _ObjectLines:
  return _LocalLines(path) if is_local(path) else _ObjectLines(path)


class _MirroredTensorBoard:
  """TensorBoard event files for a work directory on object storage.

  tensorboardX's own Cloud Storage writer is broken (AttributeError on
  close), so the events are written to a local temporary directory and its
  files copied into `target` at flush and close, and on `add_scalar` at most
  every `interval` seconds. A copy replaces the whole file; event files of
  scalars stay small.
  """

  def __init__(self, target: epath.Path, purge_step: int | None, interval: float = 60.0):
    self._target, self._interval = target, interval
    self._local = tempfile.TemporaryDirectory(prefix='txf-tb-')
    # Event files are named by the second they start in: a unique suffix
    # keeps a quick restart from overwriting the previous session's copy.
    self._writer = tensorboardX.SummaryWriter(self._local.name, purge_step=purge_step,
                                              filename_suffix=f'.{uuid.uuid4().hex[:8]}')
    self._copied = time.monotonic()

  def add_scalar(self, name: str, value: float, global_step: int) -> None:
    self._writer.add_scalar(name, value, global_step=global_step)
    if time.monotonic() - self._copied >= self._interval:
      self.flush()

  def _copy(self) -> None:
    for file in epath.Path(self._local.name).iterdir():
      (self._target / file.name).write_bytes(file.read_bytes())
    self._copied = time.monotonic()

  def flush(self) -> None:
    self._writer.flush()
    self._copy()

  def close(self) -> None:
    self._writer.close()
    self._copy()
    self._local.cleanup()


def _tensorboard(directory: epath.Path, purge_step: int | None):
  if is_local(directory):
    return tensorboardX.SummaryWriter(os.fspath(directory), purge_step=purge_step)
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

  Args:
    workdir: the run's work directory (local or a URL such as gs://b/run).
    enabled: whether this process writes.
    start_step: the step training continues from; rows and samples logged
      after it are moved aside first (see the module docstring). None keeps
      everything (for writers that only append, e.g. evaluations).
  """

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True,
               start_step: int | None = None):
    self._enabled = enabled
    self._workdir = epath.Path(workdir)
    self._jsonl = None
    self._samples = None
    self._tensorboard = None
    self.dropped: dict[str, int] = {}
    if not enabled:
      return
    if is_local(self._workdir):  # object stores have no directories, nor cut-off rows
      self._workdir.mkdir(parents=True, exist_ok=True)
      _terminate_partial_last_line(self._workdir / METRICS_FILE)
    if start_step is not None:
      self.dropped = drop_records_after(self._workdir, start_step)
    self._jsonl = _lines_sink(self._workdir / METRICS_FILE)
    self._tensorboard = _tensorboard(
        self._workdir / TENSORBOARD_DIR,
        purge_step=None if start_step is None else start_step + 1)

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Records `scalars` (name -> Python/numpy/jax scalar) at `step`.

    Raises:
      ValueError: a non-scalar or non-numeric value (naming it), a 'step'
        key, or a negative step -- before anything is written.
    """
    if not self._enabled:
      return
    if self._jsonl is None:
      raise ValueError('MetricsWriter.write called after close().')
    step = int(step)
    if step < 0:
      raise ValueError(f'step must be >= 0, got {step}.')
    row = _to_python_scalars(scalars)
    self._jsonl.append(json.dumps({'step': step, **row}) + '\n')
    for name, value in row.items():
      self._tensorboard.add_scalar(name, value, global_step=step)

  def write_sample(self, step: int, text: str) -> None:
    """Appends a text sample taken at `step` to samples.txt."""
    if not self._enabled:
      return
    if self._jsonl is None:
      raise ValueError('MetricsWriter.write_sample called after close().')
    if self._samples is None:  # created with the first sample
      self._samples = _lines_sink(self._workdir / SAMPLES_FILE)
    self._samples.append(f'=== step {int(step)} ===\n{text}\n')

  def flush(self) -> None:
    for output in (self._jsonl, self._samples, self._tensorboard):
      if output is not None:
        output.flush()

  def close(self) -> None:
    """Flushes and closes every output; calling it again does nothing."""
    for output in (self._jsonl, self._samples, self._tensorboard):
      if output is not None:
        output.close()
    self._jsonl = self._samples = self._tensorboard = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _read(path: epath.Path) -> str:
  """The text of `path` ('' if there is none)."""
  return path.read_bytes().decode('utf-8') if path.exists() else ''


def _write(path: epath.Path, text: str) -> None:
  path.write_bytes(text.encode('utf-8'))


def _terminate_partial_last_line(path: epath.Path) -> None:
  """Ends a row of a local file cut off by a crash, so appended rows start
  on a new line."""
  if not path.exists() or path.stat().length == 0:
    return
  with open(path, 'rb+') as f:
    f.seek(-1, os.SEEK_END)
    if f.read(1) != b'\n':
      f.write(b'\n')


def _append(path: epath.Path, text: str) -> None:
  """Appends `text` to `path`; an object (no append) is rewritten whole."""
  if is_local(path):
    with path.open('a') as f:
      f.write(text)
  else:
    _write(path, _read(path) + text)


def _move_lines(path: epath.Path, dropped_path: epath.Path, keep_flags: list[bool],
                lines: list[str]) -> None:
  """Rewrites `path` with the kept lines, appending the others to
  `dropped_path` first so nothing is lost if the rewrite is interrupted."""
  _append(dropped_path, ''.join(line for line, keep in zip(lines, keep_flags) if not keep))
  replace_text(path, ''.join(line for line, keep in zip(lines, keep_flags) if keep))


def _read_lines(path: epath.Path) -> list[str]:
  """`path`'s lines with their newlines ([] if there is no file)."""
  return io.StringIO(_read(path)).readlines()


def drop_records_after(workdir: str | os.PathLike, step: int) -> dict[str, int]:
  """Moves metrics rows and samples logged after `step` aside.

  Rows go from metrics.jsonl to metrics.dropped.jsonl, samples from
  samples.txt to samples.dropped.txt (appended, so repeated restarts keep
  every history). Unparseable metrics rows are kept where they are.

  Returns:
    {file name: number of records moved}, only for files that lost any.
  """
  workdir = epath.Path(workdir)
  moved = {}
  lines = _read_lines(workdir / METRICS_FILE)
  keep = []
  for line in lines:
    try:
      keep.append(int(json.loads(line)['step']) <= step)
    except (ValueError, KeyError, TypeError):
      keep.append(True)
  if not all(keep):
    _move_lines(workdir / METRICS_FILE, workdir / DROPPED_METRICS_FILE, keep, lines)
    moved[METRICS_FILE] = keep.count(False)
  lines = _read_lines(workdir / SAMPLES_FILE)
  keep, current, records = [], True, 0
  for line in lines:
    header = _SAMPLE_HEADER.match(line.rstrip('\n'))
    if header:
      current = int(header.group(1)) <= step
      records += not current
    keep.append(current)
  if records:
    _move_lines(workdir / SAMPLES_FILE, workdir / DROPPED_SAMPLES_FILE, keep, lines)
    moved[SAMPLES_FILE] = records
  return moved


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """All rows of `workdir/metrics.jsonl` in file order ([] if there is none).

  A row that does not parse (cut off by a crash) is skipped with a warning.
  """
  path = epath.Path(workdir) / METRICS_FILE
  rows = []
  for line_number, line in enumerate(_read_lines(path), start=1):
    if not line.strip():
      continue
    try:
      rows.append(json.loads(line))
    except json.JSONDecodeError as error:
      logger.warning('Skipping unreadable line %d of %s: %s', line_number,
                     path, error)
  return rows


def _format_duration(seconds: float) -> str:
  if not math.isfinite(seconds):
    return '?'
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  if hours:
    return f'{hours}h{minutes:02d}m'
  if minutes:
    return f'{minutes}m{secs:02d}s'
  return f'{secs}s'


def replica_scalars(values_R: Mapping[str, Any]) -> dict[str, float]:
  """Per-replica values as metrics rows hold them.

  Each [R] array `name` becomes 'name/0' .. 'name/<R-1>' (one per replica),
  'name' (their mean) and 'name_std' (their sample std, ddof=1; 0.0 for R = 1).
  """
  scalars = {}
  for name, value in values_R.items():
    value_R = np.asarray(value, np.float64)
    if value_R.ndim != 1 or not value_R.size:
      raise ValueError(f'{name}: expected one value per replica ([R]), got shape '
                       f'{value_R.shape}')
    scalars.update({f'{name}/{r}': float(v) for r, v in enumerate(value_R)})
    scalars[name] = float(value_R.mean())
    scalars[f'{name}_std'] = float(value_R.std(ddof=1)) if value_R.size > 1 else 0.0
  return scalars


def format_progress(step: int, total: int, scalars: Mapping[str, Any]) -> str:
  """One console line, e.g.
  'step 120/1000 (12.0%) | loss 2.3456 | lr 3.000e-04 | 51,234 tok/s |
  mfu 41.2% | eta 7m20s'.

  Reads the optional keys 'loss', 'learning_rate', 'tokens_per_sec', 'mfu'
  and 'steps_per_sec' (for the ETA); missing ones are left out, others
  ignored.
  """
  if total <= 0:
    raise ValueError(f'total must be positive, got {total}.')
  known = ('loss', 'learning_rate', 'tokens_per_sec', 'mfu', 'steps_per_sec')
  values = _to_python_scalars({k: scalars[k] for k in known if k in scalars})
  parts = [f'step {step}/{total} ({100 * step / total:.1f}%)']
  if 'loss' in values:
    parts.append(f'loss {values["loss"]:.4f}')
  if 'learning_rate' in values:
    parts.append(f'lr {values["learning_rate"]:.3e}')
  if 'tokens_per_sec' in values:
    parts.append(f'{values["tokens_per_sec"]:,.0f} tok/s')
  if 'mfu' in values:
    parts.append(f'mfu {values["mfu"]:.1%}')
  if values.get('steps_per_sec', 0) > 0:
    remaining = max(total - step, 0) / values['steps_per_sec']
    parts.append(f'eta {_format_duration(remaining)}')
  return ' | '.join(parts)
