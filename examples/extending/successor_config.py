"""configs/base.py on the 'successor' task of successor_task.py beside this file.

  txf-run --config=examples/extending/successor_config.py

Expected: eval accuracy near 1 by the first evaluation (the task is trivial;
the example shows the wiring, not a finding).
"""

import successor_task  # noqa: F401  (registers data.name='successor')

from txf.configs import base


def get_config():
  config = base.get_config()
  config.data.name = "successor"
  config.data.num_symbols = 16
  config.data.seq_len = 32
  config.eval.sample_tokens = 0
  return config
