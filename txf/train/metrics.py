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

A run of R > 1 seed replicas logs each replica's value of a metric as
'<name>/<r>', their mean as '<name>' and their std as '<name>_std'
(`replica_scalars`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import tensorboardX

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


class MetricsWriter:
  """Appends scalars to `workdir/metrics.jsonl` and TensorBoard `workdir/tb`.

  With `enabled=False` (non-zero processes) nothing is created or written
  and `write` does not look at its arguments, so it forces no device sync.
  Usable as a context manager (closes on exit).

  Args:
    workdir: the run's work directory.
    enabled: whether this process writes.
    start_step: the step training continues from; rows and samples logged
      after it are moved aside first (see the module docstring). None keeps
      everything (for writers that only append, e.g. evaluations).
  """

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True,
               start_step: int | None = None):
    self._enabled = enabled
    self._workdir = workdir
    self._jsonl = None
    self._tensorboard = None
    self.dropped: dict[str, int] = {}
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, METRICS_FILE)
    _terminate_partial_last_line(path)
    if start_step is not None:
      self.dropped = drop_records_after(workdir, start_step)
    # Line-buffered, so every row reaches the OS as soon as it is written.
    self._jsonl = open(path, 'a', buffering=1, encoding='utf-8')
    self._tensorboard = tensorboardX.SummaryWriter(
        os.path.join(workdir, TENSORBOARD_DIR),
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
    self._jsonl.write(json.dumps({'step': step, **row}) + '\n')
    for name, value in row.items():
      self._tensorboard.add_scalar(name, value, global_step=step)

  def write_sample(self, step: int, text: str) -> None:
    """Appends a text sample taken at `step` to samples.txt."""
    if not self._enabled:
      return
    with open(os.path.join(self._workdir, SAMPLES_FILE), 'a', encoding='utf-8') as f:
      f.write(f'=== step {int(step)} ===\n{text}\n')

  def flush(self) -> None:
    if self._jsonl is not None:
      self._jsonl.flush()
      self._tensorboard.flush()

  def close(self) -> None:
    """Flushes and closes both outputs; calling it again does nothing."""
    if self._jsonl is not None:
      self._jsonl.close()
      self._tensorboard.close()
      self._jsonl = None
      self._tensorboard = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _terminate_partial_last_line(path: str) -> None:
  """Ends a row cut off by a crash, so appended rows start on a new line."""
  if not os.path.exists(path) or os.path.getsize(path) == 0:
    return
  with open(path, 'rb+') as f:
    f.seek(-1, os.SEEK_END)
    if f.read(1) != b'\n':
      f.write(b'\n')


def _move_lines(path: str, dropped_path: str, keep_flags: list[bool],
                lines: list[str]) -> None:
  """Rewrites `path` with the kept lines (atomically), appending the others
  to `dropped_path` first so nothing is lost if the rewrite is interrupted."""
  with open(dropped_path, 'a', encoding='utf-8') as f:
    f.writelines(line for line, keep in zip(lines, keep_flags) if not keep)
  tmp = path + '.tmp'
  with open(tmp, 'w', encoding='utf-8') as f:
    f.writelines(line for line, keep in zip(lines, keep_flags) if keep)
  os.replace(tmp, path)


def drop_records_after(workdir: str | os.PathLike, step: int) -> dict[str, int]:
  """Moves metrics rows and samples logged after `step` aside.

  Rows go from metrics.jsonl to metrics.dropped.jsonl, samples from
  samples.txt to samples.dropped.txt (appended, so repeated restarts keep
  every history). Unparseable metrics rows are kept where they are.

  Returns:
    {file name: number of records moved}, only for files that lost any.
  """
  moved = {}
  path = os.path.join(workdir, METRICS_FILE)
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      lines = f.readlines()
    keep = []
    for line in lines:
      try:
        keep.append(int(json.loads(line)['step']) <= step)
      except (ValueError, KeyError, TypeError):
        keep.append(True)
    if not all(keep):
      _move_lines(path, os.path.join(workdir, DROPPED_METRICS_FILE), keep, lines)
      moved[METRICS_FILE] = keep.count(False)
  path = os.path.join(workdir, SAMPLES_FILE)
  if os.path.exists(path):
    with open(path, encoding='utf-8') as f:
      lines = f.readlines()
    keep, current, records = [], True, 0
    for line in lines:
      header = _SAMPLE_HEADER.match(line.rstrip('\n'))
      if header:
        current = int(header.group(1)) <= step
        records += not current
      keep.append(current)
    if records:
      _move_lines(path, os.path.join(workdir, DROPPED_SAMPLES_FILE), keep, lines)
      moved[SAMPLES_FILE] = records
  return moved


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
  """All rows of `workdir/metrics.jsonl` in file order ([] if there is none).

  A row that does not parse (cut off by a crash) is skipped with a warning.
  """
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  rows = []
  with open(path, encoding='utf-8') as f:
    for line_number, line in enumerate(f, start=1):
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
