"""Random generators keyed by integers: any batch is recomputable from its key.

Each kind of draw has its own key layout. numpy's SeedSequence pads short
keys with zeros, so the last word of the mask, example and Grain keys is a
nonzero tag that keeps them apart from each other and from the shuffle key.
"""

import numpy as np

SPLIT_INDEX = {"train": 0, "validation": 1, "test": 2}
_MASK_TAG = 1
_EXAMPLE_TAG = 2
_GRAIN_TAG = 3


def shuffle_rng(seed: int, epoch: int) -> np.random.Generator:
  """Generator for the example order of one epoch."""
  return np.random.default_rng((seed, epoch))


def mask_rng(seed: int, step: int) -> np.random.Generator:
  """Generator for the MLM masking draws of one global batch."""
  return np.random.default_rng((seed, step, _MASK_TAG))


def example_rng(seed: int, split: str, step: int, row: int) -> np.random.Generator:
  """Generator for one row of one global batch of a generated task."""
  return np.random.default_rng((seed, SPLIT_INDEX[split], step, row, _EXAMPLE_TAG))


def grain_seed(seed: int) -> int:
  """The 32-bit seed of a Grain `shuffle(seed).repeat()` for data seed `seed`.

  Grain shuffles epoch e with seed + e, so passing data seeds through would
  make seed s + 1's first epoch seed s's second; a hash of the seed keeps
  the runs' epoch orders apart.
  """
  # The mask key's layout, (seed, step 0, tag): (seed, tag) would be the
  # shuffle key of epoch `tag`.
  return int(np.random.SeedSequence((seed, 0, _GRAIN_TAG)).generate_state(1)[0])
