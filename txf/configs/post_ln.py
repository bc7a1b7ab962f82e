"""Decoder LM with Post-LN residual blocks (the original Transformer).

  txf-run --config=post_ln

norm(x + f(x)) instead of the default Pre-LN x + f(norm(x)); Post-LN typically
needs learning-rate warmup to train stably.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.norm_placement = "post"
  return config
