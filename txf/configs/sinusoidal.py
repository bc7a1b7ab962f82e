"""Decoder LM with fixed sinusoidal absolute positions (Vaswani et al. 2017).

  txf-run --config=sinusoidal

Adds sin/cos features of the absolute position to the token embeddings.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "sinusoidal"
  return config
