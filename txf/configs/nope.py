"""Decoder LM with no positional encoding (NoPE; Kazemnejad et al. 2023).

  txf-run --config=nope

Only the causal mask tells positions apart.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "none"
  return config
