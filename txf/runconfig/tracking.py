"""What the metrics writer and the experiment trackers share: the `Tracker`
interface and the names dashboards show metrics under (`metric_tag`).

Its own module, below both txf.rundir.metrics (which hands every row to the
trackers) and txf.rundir.trackers (the trackers, which read the samples back
from the metrics files), so that neither imports the other at call time.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Protocol

# Metrics of the hardware's speed, not of the model: grouped under perf/.
PERF_METRICS = frozenset(
  {"tokens_per_sec", "examples_per_sec", "steps_per_sec", "step_time", "mfu"}
)
METRIC_GROUPS = ("train", "eval", "perf")


def metric_tag(name: str) -> str:
  """The name a dashboard (TensorBoard, wandb) shows a metrics.jsonl field
  under, grouped by what it measures: 'eval_<x>' -> 'eval/<x>' (eval_loss ->
  eval/loss, eval_loss/0 -> eval/loss/0), throughput -> 'perf/<name>'
  (tokens_per_sec, steps_per_sec, step_time, mfu), any other -> 'train/<name>'
  (loss, loss_std, accuracy, grad_norm, learning_rate). A name already in a
  group ('eval/...') is kept."""
  if name.split("/", 1)[0] in METRIC_GROUPS:
    return name
  if name.startswith("eval_"):
    return "eval/" + name.removeprefix("eval_")
  return ("perf/" if name in PERF_METRICS else "train/") + name


class Tracker(Protocol):
  """What MetricsWriter and the loop call on a tracker."""

  def log_config(self, config: Mapping[str, Any]) -> None:
    """The run's resolved config (nested dicts of JSON values)."""

  def log_metrics(self, step: int, scalars: Mapping[str, int | float]) -> None:
    """One metrics row (as metrics.jsonl holds it, without step and time)."""

  def log_sample(self, step: int, text: str) -> None:
    """Text sampled at an evaluation."""

  def log_summary(self, metrics: Mapping[str, int | float]) -> None:
    """The run's final metrics."""

  def close(self) -> None:
    """Finishes the tracker's run (uploads what is pending)."""


# What MetricsWriter and the loop call on a tracker, each method with the
# arguments they pass it by position: `Tracker`'s own.
TRACKER_ARGUMENTS: dict[str, tuple[str, ...]] = {
  name: tuple(inspect.signature(getattr(Tracker, name)).parameters)[1:]
  for name in ("log_config", "log_metrics", "log_sample", "log_summary", "close")
}
