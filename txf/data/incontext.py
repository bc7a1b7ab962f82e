"""In-context tasks for mechanistic work: repeated blocks (induction) and MQAR.

Both are language-model data (data.task='lm') over `data.num_symbols` content
ids, 3 .. num_symbols + 2 (pad 0, bos 1, eos 2 come first; the tokenizer
names symbol i 's<i>'). Each row is a sequence of seq_len + 1 tokens: inputs
are its first seq_len, targets its last seq_len, and the weights are 1 only
where the target is predictable from the context, so a run's loss and
accuracy measure in-context recall, not guessing.

  'induction'  one block of P distinct random symbols, P uniform in
               [data.min_example_len, data.max_example_len], repeated to
               fill the row. Weight 1 on every target in the second copy
               onwards (input position t >= P): the first copy is random.
               Variable P is what makes a copying model learn an induction
               circuit rather than fixed-offset positional heads.
  'mqar'       multi-query associative recall (Arora et al. 2023,
               "Zoology", after HazyResearch/zoology's multiquery_ar):
               data.num_kv_pairs pairs k_1 v_1 .. k_N v_N (keys distinct,
               from the lower half of the symbols; values distinct, from the
               upper half), then every key queried once, in random order at
               even offsets after the pairs, each followed by its value.
               Gaps follow zoology's power law (MQAR_POWER_A: short gaps
               likely). Other slots hold random symbols that are not keys of
               the row, so every later key is a query. Weight 1 where the
               input is a queried key (the target is its value). Unlike
               zoology's generator, the value also follows the query in the
               inputs, so targets are the inputs shifted by one.

Rows are drawn from generators keyed by (seed, split, step, row)
(txf.data.seeding), so batches are deterministic and splits differ.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from txf.data.spec import DataSpec, required
from txf.data.synthetic import GeneratedSource
from txf.data.tokenizers import SymbolTokenizer

# zoology's default power-law exponent of the query gaps: p(gap g) ~ g^(a - 1).
MQAR_POWER_A = 0.01


def symbol_tokenizer(num_symbols: int) -> SymbolTokenizer:
  """Symbols 's0' .. 's<num_symbols - 1>' at ids 3 .., space-separated."""
  return SymbolTokenizer([f"s{i}" for i in range(num_symbols)], separator=" ")


def first_symbol_id(tokenizer: SymbolTokenizer) -> int:
  """The id of symbol 's0'; the symbols' ids follow it."""
  return int(tokenizer.encode("s0")[0])


def induction_row(
  rng: np.random.Generator,
  length: int,
  num_symbols: int,
  min_period: int,
  max_period: int,
  low: int,
) -> tuple[np.ndarray, int]:
  """One row of repeated blocks: (int32 [length], its period P).

  The block holds P distinct ids from [low, low + num_symbols), P uniform in
  [min_period, max_period]; row[t] == row[t - P] for t >= P.
  """
  period = int(rng.integers(min_period, max_period + 1))
  block = rng.choice(num_symbols, size=period, replace=False) + low
  return np.resize(block, length).astype(np.int32), period


def mqar_row(
  rng: np.random.Generator, length: int, num_symbols: int, num_pairs: int, low: int
) -> tuple[np.ndarray, np.ndarray]:
  """One MQAR row: (int32 [length], int [num_pairs] positions of the queried keys).

  Ids from [low, low + num_symbols): keys in the lower half, values in the
  upper half, noise from every id but this row's keys.
  """
  half = num_symbols // 2
  keys = rng.choice(half, size=num_pairs, replace=False) + low
  values = rng.choice(num_symbols - half, size=num_pairs, replace=False) + low + half
  not_keys = np.setdiff1d(np.arange(low, low + num_symbols), keys)
  row = rng.choice(not_keys, size=length).astype(np.int32)
  row[0 : 2 * num_pairs : 2], row[1 : 2 * num_pairs : 2] = keys, values
  slots = (length - 2 * num_pairs) // 2  # (key, value) slots after the pairs
  p = MQAR_POWER_A * np.arange(1, slots + 1, dtype=np.float64) ** (MQAR_POWER_A - 1)
  gaps = rng.choice(slots, size=num_pairs, replace=False, p=p / p.sum())
  queries = 2 * num_pairs + 2 * gaps
  row[queries], row[queries + 1] = keys, values
  return row, queries


def lm_arrays(rows: Sequence[np.ndarray], weights: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
  """The lm batch of rows int [seq_len + 1] and their target weights [seq_len].

  Returns inputs, targets int32 [R, seq_len] and weights float32 [R, seq_len].
  """
  rows_RxL = np.stack(rows)
  return {
    "inputs": rows_RxL[:, :-1],
    "targets": rows_RxL[:, 1:],
    "weights": np.stack(weights).astype(np.float32),
  }


class InductionSource(GeneratedSource):
  """Batches of data.name='induction' (module docstring): lm arrays [R, seq_len]."""

  def __init__(
    self, *, seed: int, split: str, seq_len: int, num_symbols: int, min_period: int, max_period: int
  ):
    super().__init__(seed=seed, split=split)
    self._seq_len, self._num_symbols = seq_len, num_symbols
    self._periods = (min_period, max_period)
    self.tokenizer = symbol_tokenizer(num_symbols)

  def example(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    row, period = induction_row(
      rng, self._seq_len + 1, self._num_symbols, *self._periods, low=first_symbol_id(self.tokenizer)
    )
    # Input t predicts row[t + 1], known once t is in the second copy.
    return row, np.arange(self._seq_len) >= period

  def collate(self, examples: list) -> dict[str, np.ndarray]:
    return lm_arrays(*zip(*examples))


class MQARSource(GeneratedSource):
  """Batches of data.name='mqar' (module docstring): lm arrays [R, seq_len]."""

  def __init__(self, *, seed: int, split: str, seq_len: int, num_symbols: int, num_pairs: int):
    super().__init__(seed=seed, split=split)
    self._seq_len, self._num_symbols, self._num_pairs = seq_len, num_symbols, num_pairs
    self.tokenizer = symbol_tokenizer(num_symbols)

  def example(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    row, queries = mqar_row(
      rng,
      self._seq_len + 1,
      self._num_symbols,
      self._num_pairs,
      low=first_symbol_id(self.tokenizer),
    )
    weights = np.zeros(self._seq_len, bool)
    weights[queries] = True  # input: the queried key; target: its value
    return row, weights

  def collate(self, examples: list) -> dict[str, np.ndarray]:
    return lm_arrays(*zip(*examples))


def repeat_periods(spec: DataSpec) -> tuple[int, ...]:
  """The periods the data of `spec` repeats with, ascending: for 'induction'
  each block length P in data.min_example_len .. data.max_example_len and
  every multiple of one that a row holds (a block tiled to fill the row
  repeats with 2 P, 3 P, ... too: 24 for blocks of 4, 6, 8 and 12 in 48
  tokens); none for any other dataset. An induction probe must avoid them."""
  if spec.name != "induction":
    return ()
  # A row of seq_len + 1 tokens (inputs and targets) repeats with q <= seq_len.
  blocks = range(required(spec.min_example_len), required(spec.max_example_len) + 1)
  return tuple(sorted({q for p in blocks for q in range(p, spec.seq_len + 1, p)}))


class RowSource(GeneratedSource):
  """Batches of a task registered from a row function (txf.register.lm_task,
  txf.data.generated.RowTask): lm arrays [R, seq_len] of the rows it draws."""

  def __init__(
    self,
    name: str,
    row: Callable[..., Any],
    *,
    seed: int,
    split: str,
    seq_len: int,
    num_symbols: int,
  ):
    super().__init__(seed=seed, split=split)
    self._row = row
    self._name, self._seq_len, self._num_symbols = name, seq_len, num_symbols
    self.tokenizer = symbol_tokenizer(num_symbols)

  def example(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    low = first_symbol_id(self.tokenizer)
    ids, weights = map(np.asarray, self._row(rng, self._seq_len, self._num_symbols, low))
    if not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(f"data.name={self._name!r}: its row function gave {ids.dtype} ids, not ints")
    # Weights mark the targets the loss reads: a 0.25 read as True, silently.
    if weights.dtype != bool and not np.isin(weights, (0, 1)).all():
      raise ValueError(
        f"data.name={self._name!r}: its row function gave weights other than 0 and 1 "
        "(they mark which targets the loss reads)"
      )
    ids, weights = ids.astype(np.int32), weights.astype(bool)
    if ids.shape != (self._seq_len + 1,) or weights.shape != (self._seq_len,):
      raise ValueError(
        f"data.name={self._name!r}: its row function gave ids {ids.shape} and weights "
        f"{weights.shape}, not ({self._seq_len + 1},) and ({self._seq_len},)"
      )
    if ids.min() < low or ids.max() >= low + self._num_symbols:
      raise ValueError(
        f"data.name={self._name!r}: ids outside [{low}, {low + self._num_symbols}) "
        "(first_id + data.num_symbols)"
      )
    return ids, weights

  def collate(self, examples: list) -> dict[str, np.ndarray]:
    return lm_arrays(*zip(*examples))
