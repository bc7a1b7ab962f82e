"""MQAR: the LSTM baseline by width, at four peak learning rates.

  txf-sweep --config=sweeps/mqar_lstm_lr --workdir=runs/mqar_lstm_lr     # 2-core CPU

sweeps/mqar_lr's learning rates for sweeps/mqar_scale's LSTM points (same
task, widths, seeds and batches; its 3e-3 points are mqar_scale's LSTM
configs), so the fixed-state baseline, too, is read at its best rate of the
four, as Zoology (Arora et al. 2023) reports every architecture. What would
contradict Zoology here: the LSTM at its best rate matching softmax
attention at its best.

Measured (2026-11-28, 2-core CPU, the 9 new points about 20 minutes shared
with another sweep; docs/data/mqar_lstm_lr): best rates 1e-2 / 1e-2 / 3e-3
at width 32 / 64 / 128, final validation accuracy 0.075 +- 0.022 / 0.153 +-
0.097 / 0.139 +- 0.030; 3e-2 stays at chance (0.031) at every width.
"""

import ml_collections

from txf.configs.sweeps import mqar_lr, mqar_scale
from txf.sweep.grid import make_grid


def get_config() -> ml_collections.ConfigDict:
  config = mqar_scale.get_config()
  widths = list(config.grid["model.d_model"])
  config.grid = make_grid(
    {
      "model.family": ["lstm"],
      "model.d_model": widths,
      "train.learning_rate": mqar_lr.LEARNING_RATES,
    }
  )
  return config
