"""Positional encodings x Pre-/Post-LN: the six encodings x two norm placements.

  python -m experiments.sweep --config=configs/sweeps/pe_ln.py --workdir=runs/pe_ln

12 points, each configs/base.py (byte-level decoder LM on the Python standard
library, d_model=128, 2 layers, seq_len=128, batch 32) trained for 250 steps
with 3 seed replicas (seeds 0, 1, 2 side by side in one program), then
evaluated at 1x-16x its training length on 12,288 validation tokens.
Each point's run directory is runs/pe_ln/<point name>, e.g.
runs/pe_ln/position=rope,norm_placement=pre; results.csv, results.md and the
plots land in runs/pe_ln.

Measured (2026-11-23, 2-core CPU): the whole sweep took 47m55s of wall time
(about 3.5 min of training and 1 min of extrapolation per point). Final
validation loss, nats/token, mean ± std over the 3 seeds (Pre-LN / Post-LN):
  rope        1.941 ± 0.007 / 1.869 ± 0.009
  alibi       2.110 ± 0.018 / 2.030 ± 0.005
  sinusoidal  2.235 ± 0.008 / 2.129 ± 0.006
  t5_bias     2.376 ± 0.027 / 2.312 ± 0.013
  learned     2.396 ± 0.012 / 2.335 ± 0.007
  none        2.406 ± 0.007 / 2.362 ± 0.004
and at 16x the training length (non-overlapping windows) only ALiBi does not
degrade (-0.02 nats; RoPE +0.86, sinusoidal +0.65 / +0.86). docs/results.md
has the tables, plots and what they show.
"""

import ml_collections

from configs import base
from txf.sweep.grid import make_grid

RUN_CONFIG = "configs/base.py"


def get_config() -> ml_collections.ConfigDict:
  run = base.get_config()
  run.replicas = 3
  run.train.update(dict(steps=250, warmup_steps=25, log_every=50, checkpoint_every=125))
  run.eval.update(dict(every=125))
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid({
      "model.position": ["sinusoidal", "learned", "rope", "alibi", "t5_bias", "none"],
      "model.norm_placement": ["pre", "post"],
  })
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate_tokens=12_288))
  return config
