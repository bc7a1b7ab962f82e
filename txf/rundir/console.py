"""The training loop's console: a progress line per logged step and durations."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from txf.rundir.metrics import to_python_scalars


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

  Reads the optional keys 'loss', 'learning_rate', 'tokens_per_sec' (or
  'examples_per_sec'), 'mfu'
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
  known = ("loss", "learning_rate", "tokens_per_sec", "examples_per_sec", "mfu", "steps_per_sec")
  values = to_python_scalars({k: scalars[k] for k in known if k in scalars})
  parts = [f"step {step}/{total} ({100 * step / total:.1f}%)"]
  if "loss" in values:
    parts.append(f"loss {values['loss']:.4f}")
  if "learning_rate" in values:
    parts.append(f"lr {values['learning_rate']:.3e}")
  if "tokens_per_sec" in values:
    parts.append(f"{values['tokens_per_sec']:,.0f} tok/s")
  if "examples_per_sec" in values:
    parts.append(f"{values['examples_per_sec']:,.0f} ex/s")
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
