"""What every textbook experiment shares: output paths, timing, fits, tables.

An experiment's `run(out_dir, *, quick=False, ...)` returns a JSON-ready dict
with the numbers it measured, plus

  "text":    a markdown report of those numbers (what the command prints)
  "figures": the PNG paths it wrote, each named textbook_<experiment>_<what>.png
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath


def figure_path(out_dir: str | os.PathLike, experiment: str, what: str) -> epath.Path:
  """`out_dir/textbook_<experiment>_<what>.png`."""
  return epath.Path(out_dir) / f"textbook_{experiment}_{what}.png"


def median_seconds(fn: Callable[[], Any], *, repeats: int, warmup: int = 1) -> float:
  """Median wall time of `fn()` (its outputs waited for) over `repeats` calls,
  after `warmup` calls that compile and are not timed."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
  """The exponent p of the least-squares fit y = c * x^p on log-log axes."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if x.shape != y.shape or x.size < 2 or np.any(x <= 0) or np.any(y <= 0):
    raise ValueError(f"loglog_slope needs >= 2 positive (x, y) pairs, got x {x}, y {y}")
  slope, _ = np.polyfit(np.log(x), np.log(y), 1)
  return float(slope)


def _cell(value: Any) -> str:
  if isinstance(value, float):
    if math.isnan(value):
      return "n/a"
    return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
  if isinstance(value, int) and not isinstance(value, bool):
    return f"{value:,}"
  return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A markdown table; floats to 4 significant digits, ints with thousands separators."""
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
  return "\n".join(lines) + "\n"
