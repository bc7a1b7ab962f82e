"""Decoder LM with a learned absolute position table (GPT-2 / BERT style).

  txf-run --config=learned

The table has model.max_len rows; longer sequences are rejected before compute.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "learned"
  return config
