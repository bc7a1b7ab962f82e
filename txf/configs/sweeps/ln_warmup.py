"""Pre-LN vs Post-LN x learning-rate warmup x peak learning rate (Xiong et al. 2020).

  txf-sweep --config=sweeps/ln_warmup --workdir=runs/ln_warmup
  txf-sweep --config=sweeps/ln_warmup:long --workdir=runs/ln_warmup_long   # 1200 steps

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture")
find that Post-LN needs warmup to train at a high learning rate and Pre-LN
does not. 8 points: norm placement x warmup (none, 10% of the steps) x peak
learning rate (3e-3, 1e-2), on a deeper, narrower decoder than configs/base.py
(6 layers, d_model=64; 600 steps, 1200 in `:long`) so the effect has depth
to act on, 3 seed replicas that differ in initialisation and data order.
Gradient clipping is off: clipping would hide the early large updates that
warmup exists to tame.

Expected (2026-11-28, 2-core CPU, jax 0.10.2; docs/results.md section 3),
final validation loss in nats/token, mean +- std over the 3 seeds.
`:long` (about 15.5 minutes a point on idle cores; docs/data/ln_warmup_long),
every point flat at step 1200 but Post-LN at 3e-3 without warmup (seed 0
still falling 2.3%):
  Pre-LN,  lr 3e-3: 1.522 (no warmup), 1.519 (warmup): not resolved
  Pre-LN,  lr 1e-2: 1.462 (no warmup), 1.433 (warmup)
  Post-LN, lr 3e-3: 1.584 +- 0.046 (no warmup), 1.533 (warmup): not resolved
  Post-LN, lr 1e-2: 3.252 (no warmup: all seeds stall), 1.477 (warmup: all train)
The default, 600 steps (about 7.5 minutes a point; docs/data/ln_warmup), not
yet flat at step 600:
  Pre-LN,  lr 3e-3: 1.671 (no warmup), 1.669 (warmup)
  Pre-LN,  lr 1e-2: 1.583 (no warmup), 1.527 (warmup)
  Post-LN, lr 3e-3: 1.832 +- 0.093 (no warmup), 1.699 (warmup): not resolved
  Post-LN, lr 1e-2: 3.254 (no warmup: all seeds stall), 2.155 +- 0.955
                    (warmup: two seeds train, one stalls)
"""

import ml_collections

from txf.configs import base
from txf.configs.sweeps import pick_setting
from txf.sweep.grid import make_grid

RUN_CONFIG = "base"  # the run config txf ships by that name, from any directory
# Setting -> training steps; `long` trains twice as long, to see whether the
# step-600 conclusions hold where the curves have flattened.
SETTINGS = {"cpu": 600, "long": 1200}


def get_config(setting: str | None = None) -> ml_collections.ConfigDict:
  steps = pick_setting("ln_warmup", SETTINGS, setting)
  run = base.get_config()
  run.model.update(dict(d_model=64, num_heads=4, num_layers=6))
  run.replicas = 3
  # Replica r is the single run of seed r with data seed r: the stds hold
  # data-order noise too, not only initialisation noise.
  run.data.seed_per_replica = True
  run.train.update(dict(steps=steps, grad_clip_norm=0.0, log_every=50, checkpoint_every=steps // 2))
  # Ten evaluations, three in the last fifth: enough for the flattening verdict.
  run.eval.update(dict(every=steps // 10))
  config = ml_collections.ConfigDict()
  config.base = run
  config.grid = make_grid(
    {
      "model.norm_placement": ["pre", "post"],
      "train.warmup_steps": [0, steps // 10],
      "train.learning_rate": [3e-3, 1e-2],
    }
  )
  # The question here is warmup, not length: no extrapolation.
  config.sweep = ml_collections.ConfigDict(dict(run_config=RUN_CONFIG, extrapolate=False))
  return config
