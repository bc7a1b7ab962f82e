"""The control of sweeps/mqar_linear: its widest linear attention, trained 3x as long.

  txf-sweep --config=sweeps/mqar_linear_steps --workdir=runs/mqar_linear_steps

sweeps/mqar_steps found the softmax decoder at width 128 solving the task
with 3x the steps (and the warmup that scales with them) where 1500 steps
left it at 0.233. This gives linear attention at width 128 the same
schedule, seeds and batches, so the two compare at a schedule under which
softmax attention recalls. What would contradict Zoology: linear attention
solving the task too.

Measured (2026-11-28, 2-core CPU shared with another sweep, 38 minutes;
docs/data/mqar_linear_steps): final validation accuracy 0.436 +- 0.130
(seeds 0.582, 0.333, 0.393), still rising; softmax attention with this
schedule: 1.000 +- 0.000 (sweeps/mqar_steps).
"""

import ml_collections

from txf.configs.sweeps import mqar_linear, mqar_scale, mqar_steps
from txf.sweep.grid import make_grid


def get_config() -> ml_collections.ConfigDict:
  config = mqar_linear.get_config()
  mqar_scale.train_for(config.base, mqar_steps.STEPS_FACTOR * config.base.train.steps)
  config.grid = make_grid({"model.attention": ["linear"], "model.d_model": [128]})
  return config
