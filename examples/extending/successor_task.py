"""A generated language-model task registered from outside txf.

'successor': rows count upwards through the symbols from a random start,
wrapping around (s3 s4 s5 ... s15 s0 s1 ...); every next token is
predictable except the first, so a trained model's accuracy tends to 1.
"""

import numpy as np

from txf import register


@register.lm_task("successor")
def successor_row(rng, seq_len, num_symbols, first_id):
  """(ids int [seq_len + 1], target weights bool [seq_len])."""
  start = rng.integers(num_symbols)
  ids = first_id + (start + np.arange(seq_len + 1)) % num_symbols
  return ids, np.ones(seq_len, bool)
