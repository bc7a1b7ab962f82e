"""Training metrics: JSON lines + TensorBoard event files, and a console line.

A run's work directory holds
  metrics.jsonl  one JSON object per `write`: {"step": 100, "loss": 2.3, ...}
  tb/            TensorBoard event files (tensorboardX; no TensorFlow needed)

Only process 0 should write (`enabled=jax.process_index() == 0`). Reopening
the writer on resume appends to metrics.jsonl and starts a new event file;
if the run resumes from a checkpoint older than the last logged step, the
steps in between appear twice in file order (the later rows are the resumed
run's).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import tensorboardX

METRICS_FILE = 'metrics.jsonl'
TENSORBOARD_DIR = 'tb'

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
  """

  def __init__(self, workdir: str | os.PathLike, *, enabled: bool = True):
    self._enabled = enabled
    self._jsonl = None
    self._tensorboard = None
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, METRICS_FILE)
    _terminate_partial_last_line(path)
    # Line-buffered, so every row reaches the OS as soon as it is written.
    self._jsonl = open(path, 'a', buffering=1, encoding='utf-8')
    self._tensorboard = tensorboardX.SummaryWriter(
        os.path.join(workdir, TENSORBOARD_DIR))

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
