"""configs/base.py with the MLP output head (mlp_head.py beside this file).

txf-run --config=examples/extending/mlp_head_config.py
"""

import mlp_head  # noqa: F401  (registers model.head='mlp_lm')

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.head = "mlp_lm"
  return config
