"""MQAR: softmax against linear attention by width, at four peak learning rates.

  txf-sweep --config=sweeps/mqar_lr --workdir=runs/mqar_lr     # 2-core CPU

Zoology (Arora et al. 2023) reports each architecture and width at its best
learning rate of a sweep, so a point that fails at one rate is not read as
the architecture's limit. sweeps/mqar_linear trained every point at
configs/mqar.py's 3e-3 and found softmax attention at width 128 (0.233)
below width 64 (1.000): a learning-rate effect or a width effect? This sweep
is mqar_linear's grid (same task, decoders, widths, seeds and batches) times
train.learning_rate 1e-3, 3e-3, 1e-2, 3e-2; its 3e-3 points are mqar_linear's
configs. What would contradict Zoology here: linear attention matching
softmax attention at the best rate of each.

Measured (2026-11-28, 2-core CPU, the 18 new points about 70 minutes shared
with another sweep; docs/data/mqar_lr, docs/results.md section 4): final
validation accuracy at each width's best rate, softmax 0.442 +- 0.482
(3e-3) / 1.000 +- 0.000 (1e-3) / 1.000 +- 0.000 (1e-3) at width 32 / 64 /
128, linear 0.242 +- 0.006 / 0.309 +- 0.004 / 0.335 +- 0.004 (1e-2 at
each); softmax ahead at 64 and 128, 32 not resolved.
"""

import ml_collections

from txf.configs.sweeps import mqar_linear
from txf.sweep.grid import make_grid

LEARNING_RATES = [1e-3, 3e-3, 1e-2, 3e-2]


def get_config() -> ml_collections.ConfigDict:
  config = mqar_linear.get_config()
  grid = dict(config.grid)
  grid["train.learning_rate"] = LEARNING_RATES
  config.grid = make_grid(grid)
  return config
