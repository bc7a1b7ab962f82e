"""The control of sweeps/mqar_scale: the points that did not solve it, trained 3x as long.

  txf-sweep --config=sweeps/mqar_steps --workdir=runs/mqar_steps    # 2-core CPU, ~40 min

sweeps/mqar_scale compares the families after 1500 steps. A model that only
learns slower would look like one that cannot recall; this sweep trains for
4500 steps (the same task, 3 seeds that differ in initialisation and data
order) the decoders that had not solved the task (widths 32 and 128) and the
widest LSTM (128). What would overturn mqar_scale's reading: the LSTM
reaching the decoder's accuracy given the steps, or the decoders staying
where they were.
"""

import ml_collections

from txf.configs.sweeps import mqar_scale
from txf.sweep.grid import make_grid

STEPS_FACTOR = 3


def get_config() -> ml_collections.ConfigDict:
  config = mqar_scale.get_config()
  mqar_scale.train_for(config.base, STEPS_FACTOR * config.base.train.steps)
  config.grid = make_grid(
    {}, zip={"model.family": ["decoder", "decoder", "lstm"], "model.d_model": [32, 128, 128]}
  )
  return config
