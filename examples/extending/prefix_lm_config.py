"""configs/base.py trained as the prefix LM of prefix_lm.py beside this file.

  txf-run --config=examples/extending/prefix_lm_config.py

A decoder on pystdlib's lm batches, each row's prefix read both ways and
its suffix predicted (data.task='prefix_lm'); no samples (the decoder
samples causally, which is not what it was trained for).
"""

import prefix_lm  # noqa: F401  (registers data.task='prefix_lm')

from txf.configs import base


def get_config():
  config = base.get_config()
  config.data.task = "prefix_lm"
  config.eval.sample_tokens = 0
  return config
