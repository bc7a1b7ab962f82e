"""Pre-LN vs Post-LN x learning-rate warmup x peak learning rate (Xiong et al. 2020).

  python -m experiments.sweep --config=configs/sweeps/ln_warmup.py --workdir=runs/ln_warmup

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture")
find that Post-LN needs warmup to train at a high learning rate and Pre-LN
does not. 8 points: norm placement x warmup (none, 10% of the steps) x peak
learning rate, on a deeper, narrower decoder than configs/base.py (6 layers,
d_model=64) so the effect has depth to act on. Gradient clipping is off, as in
the paper's setting: clipping would hide the early large updates that warmup
exists to tame. MEASURED
"""

import ml_collections

from configs import base
from txf.sweep.grid import make_grid

RUN_CONFIG = "configs/base.py"
STEPS = 300


def get_config() -> ml_collections.ConfigDict:
  run = base.get_config()
  run.model.update(dict(d_model=64, num_heads=4, num_layers=6))
  run.train.update(dict(steps=STEPS, grad_clip_norm=0.0, log_every=25, checkpoint_every=100))
  run.eval.update(dict(every=100))
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid({
      "model.norm_placement": ["pre", "post"],
      "train.warmup_steps": [0, STEPS // 10],
      "train.learning_rate": [1e-3, 1e-2],
  })
  config.sweep = ml_collections.ConfigDict(dict(seeds=1, run_config=RUN_CONFIG))
  return config
