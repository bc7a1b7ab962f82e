"""BERT masking for masked language modelling (Devlin et al. 2019)."""

from collections.abc import Iterable

import numpy as np

from txf.data import seeding

# Of the selected positions: 80% become the mask token, 10% a random token,
# 10% stay unchanged (so the model cannot trust unmasked inputs blindly).
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1


def bert_mask(
  tokens: np.ndarray,
  real: np.ndarray,
  uniforms: np.ndarray,
  random_tokens: np.ndarray,
  *,
  probability: float,
  mask_id: int,
  special_ids: Iterable[int],
) -> dict[str, np.ndarray]:
  """Masks `tokens` given the random draws (a pure function).

  Args:
    tokens: int32 [B, T].
    real: bool [B, T], False on padding: never selected (padding's id may be
      a real token's, 0 of a Hugging Face vocabulary).
    uniforms: float [2, B, T] in [0, 1): [0] selects positions (below
      `probability`), [1] picks mask / random / unchanged.
    random_tokens: int32 [B, T], replacements for the 'random' positions.
    probability: chance that a non-special position is selected.
    mask_id: the mask token.
    special_ids: ids never selected (pad, bos, eos, ...).

  Returns:
    {'inputs': int32 [B, T] masked tokens, 'targets': int32 [B, T] the
     original tokens, 'weights': float32 [B, T], 1 at selected positions}.
  """
  selected = (uniforms[0] < probability) & real & ~np.isin(tokens, list(special_ids))
  action = uniforms[1]
  inputs = np.where(selected & (action < MASK_FRACTION), mask_id, tokens)
  use_random = selected & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
  inputs = np.where(use_random, random_tokens, inputs)
  return {
    "inputs": inputs.astype(np.int32),
    "targets": tokens,
    "weights": selected.astype(np.float32),
  }


class BertMasker:
  """Applies bert_mask with draws keyed by (seed, step).

  The draws cover the whole global batch and each process takes its rows,
  so the processes' masks together equal the single-process mask.
  """

  def __init__(
    self,
    *,
    probability: float,
    mask_id: int,
    vocab_size: int,
    special_ids: Iterable[int],
    seed: int,
  ):
    self._probability = probability
    self._mask_id = mask_id
    self._special_ids = sorted(special_ids)
    self._replacements = np.setdiff1d(np.arange(vocab_size, dtype=np.int32), self._special_ids)
    self._seed = seed

  def __call__(
    self, tokens: np.ndarray, real: np.ndarray, step: int, rows: range, batch_size: int
  ) -> dict[str, np.ndarray]:
    """Masks `tokens` int32 [len(rows), T] (real: bool, False on padding):
    rows `rows` of global batch `step`.

    batch_size is the global batch size, the shape of the draws.
    """
    rng = seeding.mask_rng(self._seed, step)
    shape = (batch_size, tokens.shape[1])
    uniforms = rng.random((2, *shape))[:, rows.start : rows.stop]
    choices = rng.integers(len(self._replacements), size=shape)
    return bert_mask(
      tokens,
      real,
      uniforms,
      self._replacements[choices[rows.start : rows.stop]],
      probability=self._probability,
      mask_id=self._mask_id,
      special_ids=self._special_ids,
    )
