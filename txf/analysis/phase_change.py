"""Scores over training: a run's checkpoints as a CSV file, and when its circuit forms.

`txf.trained.head_analysis.analyze_run(checkpoints=True)` scores every checkpoint a
run kept (validation loss and accuracy, each head's previous-token and
induction score, the K-composition of consecutive layers' heads) and writes
them with `write_training_csv`; `read_training_csv` reads them back as
arrays. `phase_change` finds where each curve changes fastest between
consecutive checkpoints (`steepest_fall`): a phase change located without a
threshold.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from txf.analysis.ablation import head_name
from txf.storage import write_file

# Per-head scores of the CSV, [N, L, H] each, in its column order.
HEAD_SCORES = ("previous_token", "induction")


def steepest_fall(steps: Any, values: Any) -> tuple[int, int, float]:
  """Where a curve falls fastest: (step before, step after, fall per step).

  The largest (values[i] - values[i + 1]) / (steps[i + 1] - steps[i]) over
  consecutive points, a definition of a loss curve's phase change that
  needs no threshold. Ties go to the earliest.

  Args:
    steps: increasing ints, at least two.
    values: floats, one per step.
  """
  steps_N, values_N = np.asarray(steps, np.float64), np.asarray(values, np.float64)
  if steps_N.ndim != 1 or steps_N.shape != values_N.shape or steps_N.size < 2:
    raise ValueError(
      f"steps and values must be 1-D of one length >= 2, got {steps_N.shape} and {values_N.shape}"
    )
  if np.any(np.diff(steps_N) <= 0):
    raise ValueError("steps must increase")
  slopes = -np.diff(values_N) / np.diff(steps_N)
  at = int(np.argmax(slopes))
  return int(steps_N[at]), int(steps_N[at + 1]), float(slopes[at])


def training_columns(num_layers: int, num_heads: int) -> list[str]:
  """The columns of `write_training_csv`: step, eval_loss, eval_accuracy, then
  'previous_token/L0H0', ..., 'induction/L0H0', ..., 'k_composition/L0H0>L1H0', ..."""
  heads = [head_name(layer, head) for layer in range(num_layers) for head in range(num_heads)]
  pairs = [
    f"{head_name(layer, h1)}>{head_name(layer + 1, h2)}"
    for layer in range(num_layers - 1)
    for h1 in range(num_heads)
    for h2 in range(num_heads)
  ]
  return [
    "step",
    "eval_loss",
    "eval_accuracy",
    *(f"{name}/{head}" for name in HEAD_SCORES for head in heads),
    *(f"k_composition/{pair}" for pair in pairs),
  ]


def write_training_csv(training: Mapping[str, Any], path: str | os.PathLike) -> epath.Path:
  """Writes scores over training (as `read_training_csv` returns them) as a
  CSV file, full precision (`training_csv`); returns its path."""
  return write_file(path, training_csv(training))  # atomic: a full disk leaves no cut file


def training_csv(training: Mapping[str, Any]) -> str:
  """The text of `write_training_csv`'s file."""
  previous_NxLxH = np.asarray(training["previous_token"], np.float64)
  _, num_layers, num_heads = previous_NxLxH.shape
  values_NxC = np.concatenate(
    [
      np.asarray(training["loss"], np.float64)[:, None],
      np.asarray(training["accuracy"], np.float64)[:, None],
      previous_NxLxH.reshape(len(previous_NxLxH), -1),
      np.asarray(training["induction"], np.float64).reshape(len(previous_NxLxH), -1),
      np.asarray(training["k_composition"], np.float64).reshape(len(previous_NxLxH), -1),
    ],
    axis=1,
  )
  rows = [",".join(training_columns(num_layers, num_heads))]
  for step, values_C in zip(np.asarray(training["steps"]), values_NxC):
    rows.append(",".join([str(int(step)), *(repr(float(value)) for value in values_C)]))
  return "\n".join(rows) + "\n"


def read_training_csv(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Scores over training from `write_training_csv`'s file.

  Returns:
    {"steps": int [N], "loss": [N] validation loss (nats/token), "accuracy":
     [N], "previous_token": [N, L, H], "induction": [N, L, H] (the lowest over
     the probe periods), "k_composition": [N, L - 1, H, H]}.
  """
  lines = epath.Path(path).read_text().splitlines()
  header = lines[0].split(",")
  values_NxC = np.array([[float(cell) for cell in line.split(",")] for line in lines[1:]])
  heads = {column.split("/")[1] for column in header if column.startswith("induction/")}
  num_layers = len({head.split("H")[0] for head in heads})
  num_heads = len(heads) // max(num_layers, 1)
  if not heads or header != training_columns(num_layers, num_heads):
    raise ValueError(f"{path}: not a training scores file (its columns differ)")
  at = 3
  shaped: dict[str, np.ndarray] = {}
  for name, shape in (
    ("previous_token", (num_layers, num_heads)),
    ("induction", (num_layers, num_heads)),
    ("k_composition", (num_layers - 1, num_heads, num_heads)),
  ):
    size = int(np.prod(shape))
    shaped[name] = values_NxC[:, at : at + size].reshape((-1, *shape))
    at += size
  return {
    "steps": values_NxC[:, 0].astype(np.int64),
    "loss": values_NxC[:, 1],
    "accuracy": values_NxC[:, 2],
    **shaped,
  }


def phase_change(training: Mapping[str, Any]) -> dict[str, Any]:
  """When the circuit forms, by steepest change between checkpoints (no threshold).

  The validation accuracy's steepest rise marks the phase change: the loss
  also falls fast at the very start (from uniform to the token frequencies),
  when nothing is copied yet, so its steepest fall is not the one to time.

  Args:
    training: as `read_training_csv` returns it (at least two steps and two layers).

  Returns:
    {"accuracy": the steepest rise of the validation accuracy, "loss": the
     validation loss at the same two steps, "induction": the steepest rise of
     the mean induction score of the last layer's heads, "previous_token": of
     the previous-token score of the first layer's head that scores highest
     at the last step (named in "previous_token_head"), "k_composition": of
     that head's mean K-composition into the next layer}; each {"steps":
     [before, after], "values": [at before, at after]}.
  """
  steps_N = np.asarray(training["steps"])
  previous_NxLxH = np.asarray(training["previous_token"], np.float64)
  if previous_NxLxH.ndim != 3 or previous_NxLxH.shape[1] < 2:
    raise ValueError("phase_change needs a model of two or more layers")
  top = int(np.argmax(previous_NxLxH[-1, 0]))
  curves_N = {
    "accuracy": np.asarray(training["accuracy"], np.float64),
    "induction": np.asarray(training["induction"], np.float64)[:, -1].mean(axis=1),
    "previous_token": previous_NxLxH[:, 0, top],
    "k_composition": np.asarray(training["k_composition"], np.float64)[:, 0, top].mean(axis=1),
  }
  at = lambda values_N, steps: [float(values_N[np.searchsorted(steps_N, step)]) for step in steps]
  result: dict[str, Any] = {"previous_token_head": head_name(0, top)}
  for name, curve_N in curves_N.items():
    before, after, _ = steepest_fall(steps_N, -curve_N)  # the steepest rise
    result[name] = {"steps": [before, after], "values": at(curve_N, (before, after))}
  steps = result["accuracy"]["steps"]
  result["loss"] = {"steps": steps, "values": at(np.asarray(training["loss"], np.float64), steps)}
  return result
