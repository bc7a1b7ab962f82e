"""Pre-LN vs Post-LN x learning-rate warmup x peak learning rate (Xiong et al. 2020).

  txf-sweep --config=sweeps/ln_warmup --workdir=runs/ln_warmup

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture")
find that Post-LN needs warmup to train at a high learning rate and Pre-LN
does not. 8 points: norm placement x warmup (none, 10% of the steps) x peak
learning rate (3e-3, 1e-2), on a deeper, narrower decoder than configs/base.py
(6 layers, d_model=64, 300 steps) so the effect has depth to act on. Gradient
clipping is off: clipping would hide the early large updates that warmup
exists to tame.

Measured (2026-11-23, single points on the shared 2-core CPU box; about 210 s
of CPU time per point, 5-9 minutes of wall time there under heavy sharing,
i.e. about 2-3 minutes per point and 20-30 minutes for the 8 points on two
idle cores), final validation loss in nats/token:
  Pre-LN,  no warmup, lr 1e-2:  1.76   (trains without warmup)
  Post-LN, no warmup, lr 1e-2:  3.26   (stuck near the unigram loss; no NaN)
  Post-LN, warmup 30, lr 1e-2:  3.16   (warmup does not rescue it at this rate)
  Post-LN, no warmup, lr 3e-3:  2.57   (trails ...)
  Post-LN, warmup 30, lr 3e-3:  2.06   (... the same run with warmup)
So at this scale the effect shows as trailing, not divergence: Post-LN needs
warmup at 3e-3 and fails at 1e-2 even with it, while Pre-LN trains at 1e-2
without warmup. (The lr 3e-3 points were run with txf-run and the
same fields, before the grid's rates were set to these.)
"""

import ml_collections

from txf.configs import base
from txf.sweep.grid import make_grid

RUN_CONFIG = "base"  # the run config txf ships by that name, from any directory
STEPS = 300


def get_config() -> ml_collections.ConfigDict:
  run = base.get_config()
  run.model.update(dict(d_model=64, num_heads=4, num_layers=6))
  run.replicas = 3
  run.train.update(dict(steps=STEPS, grad_clip_norm=0.0, log_every=25, checkpoint_every=100))
  run.eval.update(dict(every=100))
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid(
    {
      "model.norm_placement": ["pre", "post"],
      "train.warmup_steps": [0, STEPS // 10],
      "train.learning_rate": [3e-3, 1e-2],
    }
  )
  # The question here is warmup, not length: no extrapolation.
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate=False))
  return config
