"""Textbook experiments: the numbers and figures a Transformer course claims,
measured with txf's own ops and models.

Each experiment is one module with `run(out_dir, *, quick=False, ...)`, which
computes its numbers (a `compute` function returning a dict), draws its
figures into `out_dir` (a `plot` function) and returns a JSON-ready dict of
the numbers with "text" (a markdown report) and "figures" (the PNG paths);
`quick=True` is the toy size the tests use. Experiments that train go through
the one run setup and loop (txf.train.loop.run) with a config derived from
the `base_config` they are given (the command passes configs/<config>.py's),
never a loop of their own. The command is txf-textbook (txf.commands.textbook;
`python -m experiments.textbook` in a checkout):

  txf-textbook NAME | all | --list

This package sits above txf.train, txf.decode and txf.sweep (like
txf.sweep above txf.train); nothing below it imports it. The modules load
only when an experiment runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Any


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One registered experiment.

  Attributes:
    name: the command's NAME.
    item: its number: `--list` shows it and docs/textbook.md's sections follow it.
    title: one line saying what it shows.
    module: the module holding its `run`.
    config: configs/<config>.py the experiment trains from (passed to `run`
      as `base_config`), or None for one that trains nothing.
  """

  name: str
  item: int
  title: str
  module: str
  config: str | None = None

  def run(
    self, out_dir: str | os.PathLike, *, quick: bool = False, **kwargs: Any
  ) -> dict[str, Any]:
    """Runs the experiment (its module's `run`), writing figures into `out_dir`."""
    return importlib.import_module(self.module).run(out_dir, quick=quick, **kwargs)


EXPERIMENTS: dict[str, Experiment] = {
  experiment.name: experiment
  for experiment in (
    Experiment(
      "scaling",
      1,
      "why scores are divided by sqrt(d_k): variance, entropy, gradient",
      "txf.textbook.scaling",
    ),
    Experiment(
      "masks",
      2,
      "causal and padding masks; cross-attention alignment of a trained encoder-decoder",
      "txf.textbook.masks",
      config="seq2seq",
    ),
    Experiment(
      "positions",
      3,
      "sinusoidal encodings as rotations, RoPE's relative property, ALiBi biases",
      "txf.textbook.positions",
    ),
    Experiment(
      "quadratic",
      4,
      "time and memory of attention vs length, materialised and chunked",
      "txf.textbook.quadratic",
    ),
    Experiment(
      "kv_cache",
      5,
      "time per generated token with and without the KV cache",
      "txf.textbook.kv_cache",
    ),
    Experiment(
      "param_counts",
      6,
      "parameter counts by component against closed forms",
      "txf.textbook.param_counts",
    ),
    Experiment(
      "lstm_vs_transformer",
      7,
      "a Transformer LM against an LSTM LM of about the same size, trained alike",
      "txf.textbook.lstm_vs_transformer",
      config="base",
    ),
    Experiment(
      "heads",
      8,
      "previous-token and induction heads in a trained LM",
      "txf.textbook.heads",
      config="base",
    ),
  )
}


def get(name: str) -> Experiment:
  """The experiment called `name`; ValueError listing the names otherwise."""
  if name not in EXPERIMENTS:
    raise ValueError(
      f"no textbook experiment {name!r}; choose from {', '.join(EXPERIMENTS)} (or 'all')"
    )
  return EXPERIMENTS[name]
