"""Evaluating a trained run from its work directory: each function restores
the run once (txf.train.setup.load_run), computes with txf.analysis's pure
functions, and writes its files beside the run.

  txf.evaluate.analyze.analyze_run(workdir)          attention maps, head
      scores and ablation, circuits (txf-analyze)
  txf.evaluate.extrapolate.extrapolate_run(workdir)  validation loss at
      multiples of the training length (txf-extrapolate; a sweep's points)

`txf.analysis` takes a model, its parameters and arrays; this package is the
one that reads a run directory for it.
"""

from txf.evaluate.analyze import analyze_run
from txf.evaluate.extrapolate import extrapolate_run

__all__ = ["analyze_run", "extrapolate_run"]
