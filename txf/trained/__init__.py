"""What is done with a trained run, from its work directory: each function
restores the run once (txf.train.run_setup.load_run), computes with
txf.analysis's pure functions or txf.interop's mappings, and writes its files
beside the run (or, for an export, to its own directory).

  txf.trained.head_analysis.analyze_run(workdir)          attention maps, head
      scores and ablation, circuits (txf-analyze)
  txf.trained.extrapolate.extrapolate_run(workdir)  validation loss at
      multiples of the training length (txf-extrapolate; a sweep's points)
  txf.trained.export.export_run(workdir, out)      a Hugging Face model
      directory (txf-export)

`txf.analysis` takes a model, its parameters and arrays; this package is the
one that reads a run directory for it.
"""

from txf.trained.extrapolate import extrapolate_run
from txf.trained.head_analysis import analyze_run

__all__ = ["analyze_run", "extrapolate_run"]
