"""The control of sweeps/mqar_scale: its narrowest decoder and widest LSTM trained 4x as long.

  txf-sweep --config=sweeps/mqar_steps --workdir=runs/mqar_steps    # 2-core CPU

sweeps/mqar_scale compares the families after 1500 steps. A family that only
learns slower would look like one that cannot recall; this sweep trains the
points that decide the comparison for 6000 steps (the same task, 3 seeds that
differ in initialisation and data order): the decoder at width 32 (where
attention is slowest to form its recall) and the LSTM at width 256 (its
widest). What would overturn mqar_scale's reading: the LSTM reaching the
decoder's accuracy given the steps.
"""

import ml_collections

from txf.configs.sweeps import mqar_scale
from txf.sweep.grid import make_grid

STEPS_FACTOR = 4


def get_config() -> ml_collections.ConfigDict:
  config = mqar_scale.get_config()
  mqar_scale.train_for(config.base, STEPS_FACTOR * config.base.train.steps)
  config.grid = make_grid(
    {}, zip={"model.family": ["decoder", "decoder", "lstm"], "model.d_model": [32, 128, 256]}
  )
  return config
