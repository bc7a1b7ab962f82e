"""configs/base.py with the log-distance bias of log_distance.py beside this file.

  txf-run --config=examples/extending/log_distance_config.py
  txf-run --config=examples/extending/log_distance_config.py --config.model.options.log_bias_scale=2

Nothing in txf is edited: importing log_distance registers
model.position='log_distance' and its setting model.options.log_bias_scale.
"""

import log_distance  # noqa: F401  (registers the encoding)

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "log_distance"
  config.model.options.log_bias_scale = 1.0
  return config
