"""Generated seq2seq tasks: copy, reverse, sort and addition.

Every example is drawn from its own generator keyed by (seed, split, step,
row), so a batch, or one process's rows of it, is recomputed from its step
alone: the state of a generated dataset is {'step': n}. Splits draw from
disjoint keys: validation examples are drawn independently of training ones,
which does not make them unseen where the task has few distinct examples
(short lengths: copy over lengths 1..6, 800 steps of 32 rows, trains on 52 of
128 validation sources; at the default lengths 600 steps train on 7 of
addition's 256 and 1 of copy's, reverse's and sort's; docs/data.md).

Sources are strings over a small alphabet (digits and '+' for addition), of
length uniform in [data.min_example_len, data.max_example_len]; each task has
its own tokenizer (pad 0, bos 1, eos 2, then its symbols).
"""

import abc
from collections.abc import Sequence

import numpy as np

from txf.data import seeding
from txf.data.tokenizers import SymbolTokenizer, Tokenizer

ALPHABET = "abcdefghijklmnop"
DIGITS = "0123456789"
_TRANSFORMS = {
  "copy": lambda word: word,
  "reverse": lambda word: word[::-1],
  "sort": lambda word: "".join(sorted(word)),
}


def seq2seq_tokenizer(task: str) -> SymbolTokenizer:
  return SymbolTokenizer(DIGITS + "+" if task == "addition" else ALPHABET)


def _random_string(rng: np.random.Generator, length: int, symbols: str) -> str:
  return "".join(symbols[i] for i in rng.integers(len(symbols), size=length))


def _random_number(rng: np.random.Generator, num_digits: int) -> str:
  """A decimal of exactly `num_digits` digits (no leading zero unless 1)."""
  first = DIGITS[rng.integers(1 if num_digits > 1 else 0, 10)]
  return first + _random_string(rng, num_digits - 1, DIGITS)


def make_example(
  task: str, rng: np.random.Generator, min_len: int, max_len: int
) -> tuple[str, str]:
  """Returns (source, target) text, len(source) uniform in [min_len, max_len].

  'addition' sources are 'a+b' (min_len >= 3) and targets str(a + b).
  """
  length = int(rng.integers(min_len, max_len + 1))
  if task == "addition":
    left_digits = int(rng.integers(1, length - 1))
    left = _random_number(rng, left_digits)
    right = _random_number(rng, length - 1 - left_digits)
    return f"{left}+{right}", str(int(left) + int(right))
  word = _random_string(rng, length, ALPHABET)
  return word, _TRANSFORMS[task](word)


def pad_rows(rows: Sequence[np.ndarray], length: int, pad_id: int = 0) -> np.ndarray:
  """Stacks int sequences into int32 [len(rows), length], padded with pad_id."""
  out = np.full((len(rows), length), pad_id, dtype=np.int32)
  for i, row in enumerate(rows):
    out[i, : len(row)] = row
  return out


def seq2seq_arrays(
  pairs: Sequence[tuple[np.ndarray, np.ndarray]], *, tokenizer: Tokenizer, seq_len: int
) -> dict[str, np.ndarray]:
  """The seq2seq batch of (source ids, target ids) pairs, padded with the
  tokenizer's pad_id (the id an encoder-decoder masks, model.pad_id).

  Sources must have at most seq_len ids, targets at most seq_len - 1 (EOS is
  appended). Returns (R = len(pairs), S = T = seq_len):
    encoder_inputs: int32 [R, S], the source.
    decoder_inputs: int32 [R, T], BOS + target (teacher forcing).
    targets: int32 [R, T], target + EOS.
    weights: float32 [R, T], 1 on the len(target) + 1 real target tokens
      (counted, not read off the ids: a tokenizer's id 0 may be a real token).
  """
  targets = [np.append(target, tokenizer.eos_id) for _, target in pairs]
  starts = [np.insert(t[:-1], 0, tokenizer.bos_id) for t in targets]
  lengths_R = np.array([len(t) for t in targets], dtype=np.int32)
  pad_id = tokenizer.pad_id
  return {
    "encoder_inputs": pad_rows([source for source, _ in pairs], seq_len, pad_id),
    "decoder_inputs": pad_rows(starts, seq_len, pad_id),
    "targets": pad_rows(targets, seq_len, pad_id),
    "weights": (np.arange(seq_len) < lengths_R[:, None]).astype(np.float32),
  }


class GeneratedSource(abc.ABC):
  """Batches built row by row from per-row generators; state {'step': n}.

  Subclasses define `example(rng)` and `collate(examples)`.
  """

  num_batches = None  # unbounded

  def __init__(self, *, seed: int, split: str):
    self._seed = seed
    self._split = split

  @abc.abstractmethod
  def example(self, rng: np.random.Generator):
    """Returns one example drawn from `rng`."""

  @abc.abstractmethod
  def collate(self, examples: list) -> dict[str, np.ndarray]:
    """Returns the batch dict of `examples`."""

  def batch(self, step: int, rows: range) -> dict[str, np.ndarray]:
    """Rows `rows` of global batch `step`."""
    return self.collate(
      [self.example(seeding.example_rng(self._seed, self._split, step, row)) for row in rows]
    )

  def state_at(self, step: int) -> dict[str, int]:
    return {"step": step}

  def step_of(self, state: dict[str, int]) -> int:
    return state["step"]


class Seq2SeqSource(GeneratedSource):
  """Batches of a seq2seq task, every array padded to seq_len (`seq2seq_arrays`).

  Batch (R = rows, S = T = seq_len):
    encoder_inputs: int32 [R, S], the source.
    decoder_inputs: int32 [R, T], BOS + target (teacher forcing).
    targets: int32 [R, T], target + EOS.
    weights: float32 [R, T], 1 on the len(target) + 1 real target tokens.
  """

  def __init__(self, task: str, *, seed: int, split: str, seq_len: int, min_len: int, max_len: int):
    super().__init__(seed=seed, split=split)
    self._task = task
    self._seq_len = seq_len
    self._lengths = (min_len, max_len)
    self.tokenizer = seq2seq_tokenizer(task)

  def example(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    source, target = make_example(self._task, rng, *self._lengths)
    return self.tokenizer.encode(source), self.tokenizer.encode(target)

  def collate(self, examples: list) -> dict[str, np.ndarray]:
    return seq2seq_arrays(examples, tokenizer=self.tokenizer, seq_len=self._seq_len)
