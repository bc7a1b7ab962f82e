"""ListOps (Nangia & Bowman 2018), as in the Long Range Arena benchmark.

An expression is a digit or a bracketed operator applied to 2..10 argument
expressions, e.g. '[MAX 2 9 [MIN 4 7 ] 0 ]' -> 9. Operators, as in LRA:
MAX, MIN, MED (the median, truncated to int: int(np.median)) and SM (sum
mod 10). The label is the value, 0..9.

Generation follows LRA's recursion (an argument is an operator with
probability 0.25, a digit otherwise; 2..10 arguments) with two changes: the
root is always an operator, and `max_depth` counts nested operators (the
root is depth 1). Expressions outside [min_len, max_len] tokens are redrawn,
so a range holding few of them is slow or fails: the config check refuses a
range below MIN_ACCEPTANCE (`acceptance`, computed exactly from the
recursion). The classifier input is BOS (a CLS position) followed by the
expression.
"""

from collections.abc import Callable, Sequence

import numpy as np

from txf.data.synthetic import GeneratedSource, pad_rows
from txf.data.tokenizers import SymbolTokenizer

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
DIGITS = tuple("0123456789")
NUM_CLASSES = 10
MAX_ARGS = 10
OPERATOR_PROBABILITY = 0.25
SHORTEST_EXPRESSION = 4  # '[OP d d ]'
_MAX_ATTEMPTS = 100_000
# Least share of draws a length range must accept: at most 100 draws per
# example on average (about as slow as LRA's 500..2000 tokens at depth 10,
# whose share is 32%), and _MAX_ATTEMPTS draws never run out (0.99**100_000).
MIN_ACCEPTANCE = 0.01
_UNIFORM_BLOCK = 4096


def _median(values: Sequence[int]) -> int:
  ordered = sorted(values)
  middle = len(ordered) // 2
  if len(ordered) % 2:
    return ordered[middle]
  # LRA's int(np.median(...)) truncates; values are >= 0, so // agrees.
  return (ordered[middle - 1] + ordered[middle]) // 2


_APPLY: dict[str, Callable[[list[int]], int]] = {
  "[MAX": max,
  "[MIN": min,
  "[MED": _median,
  "[SM": lambda values: sum(values) % 10,
}


def listops_tokenizer() -> SymbolTokenizer:
  return SymbolTokenizer(OPERATORS + (END,) + DIGITS, separator=" ")


def longest_expression(max_depth: int) -> int:
  """Length of the longest expression with `max_depth` nested operators."""
  length = 1
  for _ in range(max_depth):
    length = 2 + MAX_ARGS * length
  return length


def _operator_lengths(child_N: np.ndarray) -> np.ndarray:
  """P(an operator has n tokens), n = 0..N-1, given its children's, float [N].

  2..MAX_ARGS children (uniform) plus '[OP' and ']': the children's length
  distribution is a convolution power, taken in Fourier space with room for
  MAX_ARGS children of N - 1 tokens so that none wraps around.
  """
  size = MAX_ARGS * len(child_N)
  child_F = np.fft.rfft(child_N, size)
  children_F = sum(child_F**count for count in range(2, MAX_ARGS + 1)) / (MAX_ARGS - 1)
  operator_N = np.zeros(len(child_N))
  operator_N[2:] = np.fft.irfft(children_F, size)[: len(child_N) - 2]
  return operator_N


def length_distribution(max_depth: int, max_len: int) -> np.ndarray:
  """P(a drawn expression has n tokens) for n = 0..max_len, float [max_len + 1]
  (the rest of the mass: longer ones), from `_draw`'s recursion: below the
  root a subtree is an operator with OPERATOR_PROBABILITY above max_depth,
  else a digit (1 token)."""
  digit_N = np.zeros(max_len + 1)
  digit_N[1] = 1.0
  subtree_N = digit_N  # at max_depth + 1: always a digit
  for _ in range(max_depth - 1):  # depths max_depth .. 2
    operator_N = _operator_lengths(subtree_N)
    subtree_N = OPERATOR_PROBABILITY * operator_N + (1 - OPERATOR_PROBABILITY) * digit_N
  # The root is always an operator. Rounding leaves +-1e-16 where 0 is exact.
  return np.maximum(_operator_lengths(subtree_N), 0.0)


def acceptance(*, min_len: int, max_len: int, max_depth: int) -> float:
  """The share of `_draw`'s expressions that `generate` keeps: those of
  min_len..max_len tokens."""
  return float(length_distribution(max_depth, max_len)[min_len:].sum())


def evaluate(tokens: Sequence[str]) -> int:
  """Value of an expression given as its tokens; ValueError if malformed."""
  arguments: list[list[int]] = [[]]  # values gathered at each open level; [0]: the top level
  operators: list[str] = []
  for token in tokens:
    if token in _APPLY:
      operators.append(token)
      arguments.append([])
    elif token == END and operators and arguments[-1]:
      value = _APPLY[operators.pop()](arguments.pop())
      arguments[-1].append(value)
    elif token in DIGITS:
      arguments[-1].append(int(token))
    else:
      raise ValueError(f"bad token {token!r} in expression {tokens!r}")
  if operators or len(arguments[0]) != 1:
    raise ValueError(f"not one complete expression: {tokens!r}")
  return arguments[0][0]


class _Uniforms:
  """Uniform [0, 1) floats from `rng`, drawn in blocks.

  Generation needs thousands of scalar draws per example; one numpy call per
  draw costs about a microsecond, a block draw a few nanoseconds per value.
  """

  def __init__(self, rng: np.random.Generator):
    self._rng = rng
    self._values = iter(())

  def __call__(self) -> float:
    value = next(self._values, None)
    if value is None:
      self._values = iter(self._rng.random(_UNIFORM_BLOCK).tolist())
      value = next(self._values)
    return value


class _TooLong(Exception):
  pass


def _draw(uniform: Callable[[], float], max_depth: int, max_len: int) -> list[str]:
  """One expression by LRA's recursion; raises _TooLong past max_len tokens."""
  tokens = []

  def emit(token):
    tokens.append(token)
    if len(tokens) > max_len:
      raise _TooLong

  def expression(depth):
    if depth > 1 and (depth > max_depth or uniform() >= OPERATOR_PROBABILITY):
      emit(DIGITS[int(uniform() * len(DIGITS))])
      return
    emit(OPERATORS[int(uniform() * len(OPERATORS))])
    for _ in range(2 + int(uniform() * (MAX_ARGS - 1))):
      expression(depth + 1)
    emit(END)

  expression(1)
  return tokens


def generate(rng: np.random.Generator, *, min_len: int, max_len: int, max_depth: int) -> list[str]:
  """Tokens of a random expression of min_len..max_len tokens."""
  uniform = _Uniforms(rng)
  for _ in range(_MAX_ATTEMPTS):
    try:
      tokens = _draw(uniform, max_depth, max_len)
    except _TooLong:
      continue
    if len(tokens) >= min_len:
      return tokens
  raise RuntimeError(
    f"no expression of {min_len}..{max_len} tokens in {_MAX_ATTEMPTS} "
    f"draws at max_depth={max_depth}; widen the length range"
  )


class ListOpsSource(GeneratedSource):
  """ListOps classification batches.

  Batch (R = rows, T = seq_len):
    inputs: int32 [R, T], BOS + expression tokens, padded with 0.
    labels: int32 [R], the expression's value 0..9.
  """

  def __init__(
    self, *, seed: int, split: str, seq_len: int, min_len: int, max_len: int, max_depth: int
  ):
    super().__init__(seed=seed, split=split)
    self._seq_len = seq_len
    self._limits = dict(min_len=min_len, max_len=max_len, max_depth=max_depth)
    self.tokenizer = listops_tokenizer()

  def example(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    tokens = generate(rng, **self._limits)
    ids = self.tokenizer.encode(" ".join(tokens))
    return np.insert(ids, 0, self.tokenizer.bos_id), evaluate(tokens)

  def collate(self, examples: list) -> dict[str, np.ndarray]:
    return {
      "inputs": pad_rows([ids for ids, _ in examples], self._seq_len),
      "labels": np.array([label for _, label in examples], dtype=np.int32),
    }
