"""Decoder LM with ALiBi attention biases (Press et al. 2022).

  txf-run --config=alibi

No position embedding: each head adds -slope * distance to its attention scores.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "alibi"
  return config
