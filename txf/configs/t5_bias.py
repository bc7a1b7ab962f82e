"""Decoder LM with T5's learned relative-position bias (Raffel et al. 2020).

  txf-run --config=t5_bias

Offsets are bucketed (exact when small, log-spaced up to
model.options.t5_max_distance, into model.options.t5_num_buckets buckets);
one table per stack is shared by all layers.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "t5_bias"
  return config
