"""Reads and checks the `data` config section; its fields are read only here.

Fields are read by attribute, so an ml_collections ConfigDict and any plain
object (types.SimpleNamespace, a dataclass) both work. Only the fields the
dataset uses are required (see the table in txf/data/__init__.py).
"""

import dataclasses
import operator
from typing import Any

from txf.data import listops
from txf.data.tokenizers import SentencePieceTokenizer

# data.name -> the data.task values it supports; the first is its natural one.
TASKS = {
    'pystdlib': ('lm', 'mlm'),
    'copy': ('seq2seq',),
    'reverse': ('seq2seq',),
    'sort': ('seq2seq',),
    'addition': ('seq2seq',),
    'listops': ('classify',),
}
TOKENIZERS = ('bytes', 'sentencepiece')
# Shortest source each seq2seq task can generate ('addition': 'd+d').
_MIN_SOURCE_LEN = {'copy': 1, 'reverse': 1, 'sort': 1, 'addition': 3}


@dataclasses.dataclass(frozen=True)
class DataSpec:
  """Checked fields of a `data` section; None where the dataset needs none."""
  name: str
  task: str
  seq_len: int
  batch_size: int
  tokenizer: str | None = None
  sp_vocab_size: int | None = None
  max_corpus_bytes: int | None = None
  mlm_probability: float | None = None
  min_len: int | None = None
  max_len: int | None = None
  listops_max_depth: int | None = None


def _get(data: Any, field: str) -> Any:
  try:
    return getattr(data, field)
  except AttributeError:
    raise ValueError(f'data.{field} is required for data.name='
                     f'{getattr(data, "name", None)!r}') from None


def check_int(value: Any, name: str, minimum: int) -> int:
  """Returns `value` as an int >= minimum; ValueError naming `name` if not."""
  try:
    if isinstance(value, bool):
      raise TypeError
    value = operator.index(value)
  except TypeError:
    raise ValueError(f'{name} must be an int, got {value!r}') from None
  if value < minimum:
    raise ValueError(f'{name} must be >= {minimum}, got {value}')
  return value


def _int(data: Any, field: str, minimum: int) -> int:
  return check_int(_get(data, field), f'data.{field}', minimum)


def _choice(data: Any, field: str, choices: tuple[str, ...]) -> str:
  value = _get(data, field)
  if value not in choices:
    raise ValueError(f'data.{field}={value!r} is not one of {choices}')
  return value


def read_data_config(data: Any) -> DataSpec:
  """Returns the checked DataSpec of `data`; ValueError names a bad field."""
  name = _choice(data, 'name', tuple(TASKS))
  task = _get(data, 'task')
  if task not in TASKS[name]:
    raise ValueError(f'data.task={task!r} does not fit data.name={name!r}; '
                     f'expected one of {TASKS[name]}')
  spec = DataSpec(name=name, task=task, seq_len=_int(data, 'seq_len', 2),
                  batch_size=_int(data, 'batch_size', 1))
  if name == 'pystdlib':
    return _corpus_fields(data, spec)
  return _synthetic_fields(data, spec)


def _corpus_fields(data: Any, spec: DataSpec) -> DataSpec:
  tokenizer = _choice(data, 'tokenizer', TOKENIZERS)
  sp_vocab_size = None
  if tokenizer == 'sentencepiece':
    sp_vocab_size = _int(data, 'sp_vocab_size',
                         SentencePieceTokenizer.RESERVED_IDS + 1)
  mlm_probability = None
  if spec.task == 'mlm':
    mlm_probability = _get(data, 'mlm_probability')
    if not isinstance(mlm_probability, (int, float)) or not (
        0 < mlm_probability < 1):
      raise ValueError('data.mlm_probability must be in (0, 1), got '
                       f'{mlm_probability!r}')
  return dataclasses.replace(
      spec, tokenizer=tokenizer, sp_vocab_size=sp_vocab_size,
      max_corpus_bytes=_int(data, 'max_corpus_bytes', 1),
      mlm_probability=mlm_probability)


def _synthetic_fields(data: Any, spec: DataSpec) -> DataSpec:
  max_len = _int(data, 'max_len', 1)
  if spec.name == 'listops':
    depth = _int(data, 'listops_max_depth', 1)
    min_len = _int(data, 'min_len', 1)
    longest = listops.longest_expression(depth)
    if min_len > longest:
      raise ValueError(f'data.min_len={min_len} exceeds {longest} tokens, the '
                       f'longest expression of depth {depth} '
                       '(data.listops_max_depth)')
    if max_len < listops.SHORTEST_EXPRESSION:
      raise ValueError(f'data.max_len={max_len} is below '
                       f'{listops.SHORTEST_EXPRESSION} tokens, the shortest '
                       'expression')
  else:
    depth = None
    min_len = _int(data, 'min_len', _MIN_SOURCE_LEN[spec.name])
  if min_len > max_len:
    raise ValueError(f'data.min_len={min_len} exceeds data.max_len={max_len}')
  # One token more than max_len: BOS before a listops expression, EOS after
  # a seq2seq target.
  if max_len + 1 > spec.seq_len:
    raise ValueError(f'data.seq_len={spec.seq_len} is too small for '
                     f'data.max_len={max_len}: it needs max_len + 1')
  return dataclasses.replace(spec, min_len=min_len, max_len=max_len,
                             listops_max_depth=depth)
