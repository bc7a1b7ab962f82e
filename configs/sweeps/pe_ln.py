"""Positional encodings x Pre-/Post-LN: the six encodings x two norm placements.

  python -m experiments.sweep --config=configs/sweeps/pe_ln.py --workdir=runs/pe_ln

12 points, each configs/base.py (byte-level decoder LM on the Python standard
library, d_model=128, 2 layers, seq_len=128, batch 32) shortened to 300 steps
so the whole grid fits a 2-core CPU. Measured (2026-11-23, point 3,
position=learned,norm_placement=post): 110 s of CPU time on the 2-core CPU
box (424 s wall only because ~10 other processes shared the cores), i.e. about
1-2 minutes per point on two idle cores and 15-25 minutes for the grid with
one seed; it reached validation loss 2.27 nats/token (2.44 at step 150).
Each point's run directory is runs/pe_ln/<point name>, e.g.
runs/pe_ln/position=rope,norm_placement=pre; results.csv, results.md,
loss_curves.png and pre_vs_post.png land in runs/pe_ln. Results of the whole
grid: not run yet (docs/results.md will hold them).
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
