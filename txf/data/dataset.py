"""Dataset: the global batches of one split, read from a Source step by step,
this process's rows of each (what make_dataset returns, txf.data.pipeline)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from txf.data.spec import DataSpec, num_classes
from txf.data.tokenizers import Tokenizer


class Source(Protocol):
  """What Dataset needs: global batches as a pure function of the step. A
  source whose state changed form lists the keys of the form it had in
  `older_state_keys` (a class attribute): set_state accepts those too, and
  its step_of reads both (checkpoints of earlier runs resume)."""

  @property
  def num_batches(self) -> int | None: ...  # batches available; None: unbounded

  def batch(self, step: int, rows: range) -> dict[str, np.ndarray]: ...
  def state_at(self, step: int) -> dict[str, int]: ...
  def step_of(self, state: dict[str, int]) -> int: ...


class Dataset:
  """This process's rows of a deterministic sequence of global batches.

  Global batch `step` depends only on (data config, split, seed, step);
  process p of P gets its rows [p * B / P, (p + 1) * B / P), so the
  processes' batches concatenated in process order are the global batch.

  The training split continues from its state (`get_state` / `set_state`,
  the same JSON-serialisable dict on every process). Evaluation splits
  start over at every `iter()`, so each evaluation sees the same batches.

  Attributes:
    tokenizer: the Tokenizer of the inputs (decode samples with it).
    vocab_size: tokenizer.vocab_size.
    task: 'lm', 'mlm', 'seq2seq' or 'classify'.
    num_classes: number of labels ('classify'), else None.
    split: 'train', 'validation' or 'test'.
    batch_size: rows per batch on this process (global batch / processes).
    global_batch_size: rows per global batch.
    num_batches: batches before StopIteration; None: unbounded.
    description: what the data is (corpus, Python version, task).
  """

  def __init__(
    self,
    source: Source,
    *,
    spec: DataSpec,
    split: str,
    tokenizer: Tokenizer,
    process_index: int,
    process_count: int,
    num_batches: int | None,
    description: str,
  ):
    self._source = source
    self.tokenizer = tokenizer
    self.vocab_size = tokenizer.vocab_size
    self.task = spec.task
    self.num_classes = num_classes(spec)
    self.split = split
    self.global_batch_size = spec.batch_size
    self.batch_size = spec.batch_size // process_count
    self._rows = range(process_index * self.batch_size, (process_index + 1) * self.batch_size)
    limits = [n for n in (num_batches, source.num_batches) if n is not None]
    self.num_batches = min(limits) if limits else None
    self.description = description
    self._step = 0

  def __iter__(self) -> Dataset:
    if self.split != "train":
      self._step = 0
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.num_batches is not None and self._step >= self.num_batches:
      raise StopIteration
    batch = self._source.batch(self._step, self._rows)
    self._step += 1
    return batch

  def get_state(self) -> dict[str, int]:
    """Position of the next batch, e.g. {'epoch': 2, 'position': 64}."""
    return self._source.state_at(self._step)

  def set_state(self, state: dict[str, int]) -> None:
    """Makes the next batch the one that followed `state` when it was saved."""
    expected = set(self._source.state_at(0))
    accepted = (expected, set(getattr(self._source, "older_state_keys", expected)))
    if not isinstance(state, dict) or set(state) not in accepted:
      raise ValueError(f"state must be a dict with keys {sorted(expected)}, got {state!r}")
    for key, value in state.items():
      if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"state[{key!r}] must be an int >= 0, got {value!r}")
    self._step = self._source.step_of(state)

  def close(self) -> None:
    """Releases what reading holds (threads, worker processes); none here."""
