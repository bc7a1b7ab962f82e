"""Decoder LM with NTK-aware scaled RoPE (bloc97 2023).

  txf-run --config=rope_ntk

RoPE whose base, not the positions, is multiplied by rope_scale^(D/(D-2)):
the slowest pair turns rope_scale times slower, the fastest as in RoPE. The worked example of adding
an encoding (docs/positions.md).
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.position = "rope_ntk"
  config.model.options.rope_scale = 4.0
  return config
