"""configs/base.py with ScaleNorm (scale_norm.py beside this file) in every block.

txf-run --config=examples/extending/scale_norm_config.py
"""

import scale_norm  # noqa: F401  (registers model.norm='scale')

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.norm = "scale"
  return config
