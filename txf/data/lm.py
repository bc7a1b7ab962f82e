"""Language-model batches: windows of one token stream, shuffled per epoch."""

import math
from collections.abc import Sequence

import numpy as np

from txf.data import seeding
from txf.data.masking import BertMasker
from txf.data.tokenizers import Tokenizer, encode_checked


def token_stream(documents: Sequence[str], tokenizer: Tokenizer) -> np.ndarray:
  """Documents' ids, each followed by EOS, as one int32 [N] array."""
  eos = np.array([tokenizer.eos_id], dtype=np.int32)
  return np.concatenate(
    [part for doc in documents for part in (encode_checked(tokenizer, doc), eos)]
  )


def _check_size(num_tokens: int, example_len: int, batch_size: int, split: str) -> None:
  """Raises ValueError unless `split` of num_tokens tokens gives a batch: the
  train split needs batch_size windows of example_len tokens, an evaluation
  split one (its last batch is padded)."""
  num_examples = num_tokens // example_len
  if split == "train" and num_examples < batch_size:
    raise ValueError(
      f"the train split has {num_tokens} tokens: {num_examples} examples of "
      f"{example_len} tokens, fewer than one batch of {batch_size} (lower "
      "data.batch_size or data.seq_len, or raise data.max_corpus_bytes)"
    )
  if not num_examples:
    raise ValueError(
      f"the {split} split has {num_tokens} tokens, "
      f"fewer than one example of {example_len} tokens (lower data.seq_len, "
      "or give that split more text: a larger corpus, or a higher "
      "data.max_corpus_bytes where it caps the split)"
    )


class LanguageModelSource:
  """Non-overlapping windows of `example_len` tokens of `tokens`.

  Training (split 'train'): each epoch visits the windows in an order drawn
  from (seed, epoch); the windows left over after the last full batch are
  skipped that epoch. The source never ends. State: {'epoch', 'position'},
  position = global examples already taken in the epoch.

  Evaluation (any other split): one pass in stream order, the last batch
  padded with rows of `pad_id` (the tokenizer's) of weight 0, so every
  window counts once.

  Batch (R = rows): with no masker, windows of T + 1 tokens give
    inputs: int32 [R, T], targets: int32 [R, T] (inputs shifted by one),
    weights: float32 [R, T] (0 on padding rows);
  with a masker, windows of T tokens give the masker's dict (masking.py),
  padding rows never masked.
  """

  def __init__(
    self,
    tokens: np.ndarray,
    *,
    example_len: int,
    batch_size: int,
    seed: int,
    split: str,
    masker: BertMasker | None = None,
    pad_id: int = 0,
  ):
    num_examples = len(tokens) // example_len
    _check_size(len(tokens), example_len, batch_size, split)
    self._windows = tokens[: num_examples * example_len].reshape(num_examples, example_len)
    self._batch_size = batch_size
    self._seed = seed
    self._shuffle = split == "train"
    self._masker = masker
    self._pad_id = pad_id
    if self._shuffle:
      self._batches_per_epoch = num_examples // batch_size
      self.num_batches = None
    else:
      self._batches_per_epoch = math.ceil(num_examples / batch_size)
      self.num_batches = self._batches_per_epoch
    # (epoch, its order); no epoch yet.
    self._order_cache: tuple[int | None, np.ndarray] = (None, np.empty(0, int))

  def _order(self, epoch: int) -> np.ndarray:
    """Example ids of the epoch's batches, int [batches * B]; -1 pads."""
    if self._order_cache[0] != epoch:
      size = self._batches_per_epoch * self._batch_size
      num_examples = len(self._windows)
      if self._shuffle:
        order = seeding.shuffle_rng(self._seed, epoch).permutation(num_examples)[:size]
      else:
        order = np.arange(size)
        order[order >= num_examples] = -1
      self._order_cache = (epoch, order)
    return self._order_cache[1]

  def batch(self, step: int, rows: range) -> dict[str, np.ndarray]:
    """Rows `rows` of global batch `step`."""
    epoch, index = divmod(step, self._batches_per_epoch)
    start = index * self._batch_size
    ids = self._order(epoch)[start + rows.start : start + rows.stop]
    real_RxW = np.broadcast_to((ids >= 0)[:, None], (len(ids), self._windows.shape[1]))
    windows_RxW = np.where(real_RxW, self._windows[ids], self._pad_id).astype(np.int32)
    if self._masker is not None:
      return self._masker(windows_RxW, real_RxW, step, rows, self._batch_size)
    return {
      "inputs": windows_RxW[:, :-1],
      "targets": windows_RxW[:, 1:],
      "weights": real_RxW[:, 1:].astype(np.float32),
    }

  def state_at(self, step: int) -> dict[str, int]:
    epoch, index = divmod(step, self._batches_per_epoch)
    return {"epoch": epoch, "position": index * self._batch_size}

  def step_of(self, state: dict[str, int]) -> int:
    index, remainder = divmod(state["position"], self._batch_size)
    # At the epoch's end exactly, the next one's start: a resume at a batch
    # size whose epoch drops the windows the old one had left (100 windows
    # taken 96 in batches of 4, resumed in batches of 32: 3 an epoch).
    if remainder or index > self._batches_per_epoch:
      raise ValueError(
        f"state['position']={state['position']} is not the start of one of "
        f"the {self._batches_per_epoch} batches of {self._batch_size} "
        "examples in an epoch"
      )
    return state["epoch"] * self._batches_per_epoch + index
