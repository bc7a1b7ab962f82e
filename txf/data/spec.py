"""Reads and checks the `data` config section; its fields are read only here.

Fields are read by attribute, so an ml_collections ConfigDict and any plain
object (types.SimpleNamespace, a dataclass) both work. Only the fields the
dataset uses are required, and the tfds_* fields may be absent (= None); see
the table in txf/data/__init__.py.
"""

import dataclasses
from typing import Any, TypeVar

from txf import checks
from txf.data import listops
from txf.data.tokenizers import SentencePieceTokenizer
from txf.fields import documented, section
from txf.registry import Registry

# data.name -> the data.task values it supports; the first is its natural one.
TASKS = {
  "pystdlib": ("lm", "mlm"),
  "copy": ("seq2seq",),
  "reverse": ("seq2seq",),
  "sort": ("seq2seq",),
  "addition": ("seq2seq",),
  "listops": ("classify",),
  "induction": ("lm",),
  "mqar": ("lm",),
}
# The in-context lm tasks (incontext.py).
INCONTEXT = ("induction", "mqar")
# Generated language-model tasks registered by user code (txf.register.lm_task):
# data.name -> a row function (rng, seq_len, num_symbols, first_id) -> (ids
# [seq_len + 1] in [first_id, first_id + num_symbols), target weights
# [seq_len]); data.task 'lm', data.num_symbols its alphabet.
LM_TASKS: Registry[Any] = Registry("data.name")
# data.name = TFDS_PREFIX + '<builder>[/<config>][:<version>]' reads a TFDS
# dataset (tfds_source.py).
TFDS_PREFIX = "tfds:"
TFDS_TASKS = ("lm", "mlm", "seq2seq")
# data.name = FILES_PREFIX + PATH_OR_GLOB reads UTF-8 text files (files.py).
FILES_PREFIX = "files:"
FILES_TASKS = ("lm", "mlm")
TOKENIZERS = ("bytes", "sentencepiece", "hf")
# data.read_threads of a config that has none (written before the field).
DEFAULT_READ_THREADS = 4
# Shortest source each seq2seq task can generate ('addition': 'd+d').
_MIN_SOURCE_LEN = {"copy": 1, "reverse": 1, "sort": 1, "addition": 3}


@section()
class DataSpec:
  """Checked fields of a `data` section; None where the dataset needs none
  (configs/base.py holds the defaults; txf/data/__init__.py tabulates which
  dataset reads which field)."""

  name: str = documented(
    "the dataset: pystdlib (the Python standard library's sources, built in) | copy | "
    "reverse | sort | addition | listops | induction | mqar | tfds:<builder> | files:<glob> "
    "| a registered task"
  )
  task: str = documented("lm | mlm | seq2seq | classify (txf.data.spec.TASKS: per data.name)")
  seq_len: int = documented("tokens per example (seq2seq: per source and target)")
  batch_size: int = documented("global, across all devices and hosts")
  tokenizer: str | None = documented(
    "bytes | sentencepiece (trained in the run dir) | hf", default=None
  )
  sp_vocab_size: int | None = documented(
    'tokenizer="sentencepiece": its largest vocabulary', default=None
  )
  tokenizer_path: str | None = documented(
    'tokenizer="hf": a tokenizer.json or its dir', default=None
  )
  max_corpus_bytes: int | None = documented("pystdlib, files: bytes read per split", default=None)
  mlm_probability: float | None = documented('task="mlm": fraction of tokens masked', default=None)
  min_example_len: int | None = documented(
    "generated tasks: shortest example (induction: span)", default=None
  )
  max_example_len: int | None = documented(
    "generated tasks: longest example (induction: span)", default=None
  )
  listops_max_depth: int | None = documented(
    "listops: most nested operators (root = 1)", default=None
  )
  # In-context tasks (incontext.py).
  num_symbols: int | None = documented("induction, mqar: content ids", default=None)
  num_kv_pairs: int | None = documented("mqar: key-value pairs per row", default=None)
  tfds_data_dir: str | None = documented(
    "tfds: the prepared dataset's folder; None: $TFDS_DATA_DIR or ~/tensorflow_datasets",
    default=None,
  )
  tfds_text_key: str | None = documented(
    'tfds lm/mlm: the text feature; None: "text"', default=None
  )
  tfds_source_key: str | None = documented(
    'tfds seq2seq: source feature; None: from "<src>-<tgt>"', default=None
  )
  tfds_target_key: str | None = documented(
    'tfds seq2seq: target feature; None: from "<src>-<tgt>"', default=None
  )
  # TFDS lm/mlm streams (packed.py).
  read_threads: int | None = documented(
    "tfds lm/mlm: threads reading records ahead (I/O)", default=None
  )
  read_workers: int | None = documented(
    "tfds lm/mlm: processes reading and tokenizing train (CPU); None: 0", default=None
  )
  attend_across_documents: bool | None = documented(
    "tfds lm/mlm: True: attention crosses the documents packed in a window (GPT-2)", default=None
  )
  seed: int | None = documented(
    "the data order's (shuffling, masking, generated examples); None: the run's seed "
    "(seed replicas share the run's)",
    default=None,
  )


T = TypeVar("T")


def required(value: T | None) -> T:
  """A DataSpec field the dataset uses, which read_data_config has set (it
  leaves None only the fields a dataset does not use), typed without the None."""
  assert value is not None, "a DataSpec field read for a dataset that does not use it"
  return value


def num_classes(spec: DataSpec) -> int | None:
  """The labels of a 'classify' dataset (listops' NUM_CLASSES); None for the
  other tasks."""
  return listops.NUM_CLASSES if spec.task == "classify" else None


def is_tfds(name: Any) -> bool:
  """Whether data.name `name` names a TFDS dataset ('tfds:...')."""
  return isinstance(name, str) and name.startswith(TFDS_PREFIX)


def is_files(name: Any) -> bool:
  """Whether data.name `name` names text files ('files:...')."""
  return isinstance(name, str) and name.startswith(FILES_PREFIX)


def _get(data: Any, field: str) -> Any:
  try:
    return getattr(data, field)
  except AttributeError:
    raise ValueError(
      f"data.{field} is required for data.name={getattr(data, 'name', None)!r}"
    ) from None


def _int(data: Any, field: str, minimum: int) -> int:
  return checks.int_at_least(_get(data, field), f"data.{field}", minimum)


def read_data_config(data: Any) -> DataSpec:
  """Returns the checked DataSpec of `data`; ValueError names a bad field."""
  name = _get(data, "name")
  if is_tfds(name):
    tasks = TFDS_TASKS
  elif is_files(name):
    if not name[len(FILES_PREFIX) :].strip():
      raise ValueError(f"data.name={name!r} names no path; expected '{FILES_PREFIX}PATH_OR_GLOB'")
    tasks = FILES_TASKS
  elif name in tuple(TASKS):  # a tuple: an unhashable name is just unknown
    tasks = TASKS[name]
  elif name in LM_TASKS:
    tasks = ("lm",)
  else:
    raise ValueError(
      f"data.name={name!r} is not one of {tuple(TASKS) + LM_TASKS.names()}, "
      f"'{TFDS_PREFIX}<builder>[/<config>][:<version>]' or "
      f"'{FILES_PREFIX}PATH_OR_GLOB'"
    )
  task = _get(data, "task")
  if task not in tasks:
    raise ValueError(f"data.task={task!r} does not fit data.name={name!r}; expected one of {tasks}")
  seed = getattr(data, "seed", None)
  spec = DataSpec(
    name=name,
    task=task,
    seq_len=_int(data, "seq_len", 2),
    batch_size=_int(data, "batch_size", 1),
    seed=None if seed is None else checks.seed(seed, "data.seed"),
  )
  if name == "pystdlib" or is_files(name):
    return _corpus_fields(data, spec)
  if is_tfds(name):
    return _tfds_fields(data, spec)
  if name == "induction":
    return _induction_fields(data, spec)
  if name == "mqar":
    return _mqar_fields(data, spec)
  if name in LM_TASKS:
    return dataclasses.replace(spec, num_symbols=_int(data, "num_symbols", 1))
  return _synthetic_fields(data, spec)


def _corpus_fields(data: Any, spec: DataSpec) -> DataSpec:
  return dataclasses.replace(
    _text_fields(data, spec), max_corpus_bytes=_int(data, "max_corpus_bytes", 1)
  )


def _text_fields(data: Any, spec: DataSpec) -> DataSpec:
  """The fields of text read from splits: tokenizer and masking."""
  tokenizer = checks.choice(_get(data, "tokenizer"), "data.tokenizer", TOKENIZERS)
  sp_vocab_size = tokenizer_path = None
  if tokenizer == "sentencepiece":
    sp_vocab_size = _int(data, "sp_vocab_size", SentencePieceTokenizer.RESERVED_IDS + 1)
  if tokenizer == "hf":
    tokenizer_path = _optional_str(data, "tokenizer_path")
    if tokenizer_path is None:
      raise ValueError(
        "data.tokenizer_path is required for data.tokenizer='hf' (a "
        "tokenizer.json or the model directory holding it)"
      )
  mlm_probability = None
  if spec.task == "mlm":
    mlm_probability = checks.fraction(
      _get(data, "mlm_probability"), "data.mlm_probability", low_open=True
    )
  return dataclasses.replace(
    spec,
    tokenizer=tokenizer,
    sp_vocab_size=sp_vocab_size,
    tokenizer_path=tokenizer_path,
    mlm_probability=mlm_probability,
  )


def _optional_str(data: Any, field: str) -> str | None:
  """data.<field>, a non-empty str or None; an absent field reads as None."""
  value = getattr(data, field, None)
  if value is not None and (not isinstance(value, str) or not value):
    raise ValueError(f"data.{field} must be a non-empty str or None, got {value!r}")
  return value


def _translation_keys(data: Any, dataset: str) -> tuple[str, str]:
  """(source, target) feature keys; by default the config's 'src-tgt'.

  'wmt14_translate/de-en:1.0.0' -> ('de', 'en'), WMT's naming.
  """
  config = dataset.split(":")[0].partition("/")[2]
  derived = config.split("-") if config.count("-") == 1 else [None, None]
  keys = []
  for field, default in zip(("tfds_source_key", "tfds_target_key"), derived):
    key = _optional_str(data, field) or default
    if not key:
      raise ValueError(
        f"data.{field} is required for data.name="
        f"'{TFDS_PREFIX}{dataset}': its config is not named "
        "'<source>-<target>'"
      )
    keys.append(key)
  if keys[0] == keys[1]:
    raise ValueError(f"data.tfds_source_key and data.tfds_target_key are both {keys[0]!r}")
  return keys[0], keys[1]


def _tfds_fields(data: Any, spec: DataSpec) -> DataSpec:
  dataset = spec.name[len(TFDS_PREFIX) :]
  if not dataset.split(":")[0].split("/")[0]:
    raise ValueError(
      f"data.name={spec.name!r} names no TFDS builder; expected "
      f"'{TFDS_PREFIX}<builder>[/<config>][:<version>]'"
    )
  spec = dataclasses.replace(
    _text_fields(data, spec), tfds_data_dir=_optional_str(data, "tfds_data_dir")
  )
  if spec.task == "seq2seq":
    source_key, target_key = _translation_keys(data, dataset)
    return dataclasses.replace(spec, tfds_source_key=source_key, tfds_target_key=target_key)
  # lm / mlm stream the split (packed.py); fields absent from a config
  # written before they existed take their defaults.
  threads = getattr(data, "read_threads", None)
  workers = getattr(data, "read_workers", None)
  across = getattr(data, "attend_across_documents", None)
  if across is not None and not isinstance(across, bool):
    raise ValueError(f"data.attend_across_documents must be a bool, got {across!r}")
  return dataclasses.replace(
    spec,
    tfds_text_key=_optional_str(data, "tfds_text_key") or "text",
    read_threads=DEFAULT_READ_THREADS
    if threads is None
    else checks.int_at_least(threads, "data.read_threads", 0),
    read_workers=0 if workers is None else checks.int_at_least(workers, "data.read_workers", 0),
    attend_across_documents=bool(across),
  )


def _synthetic_fields(data: Any, spec: DataSpec) -> DataSpec:
  max_len = _int(data, "max_example_len", 1)
  if spec.name == "listops":
    depth = _int(data, "listops_max_depth", 1)
    min_len = _int(data, "min_example_len", 1)
    longest = listops.longest_expression(depth)
    if min_len > longest:
      raise ValueError(
        f"data.min_example_len={min_len} exceeds {longest} "
        f"tokens, the longest expression of depth {depth} "
        "(data.listops_max_depth)"
      )
    if max_len < listops.SHORTEST_EXPRESSION:
      raise ValueError(
        f"data.max_example_len={max_len} is below "
        f"{listops.SHORTEST_EXPRESSION} tokens, the shortest "
        "expression"
      )
  else:
    depth = None
    min_len = _int(data, "min_example_len", _MIN_SOURCE_LEN[spec.name])
  if min_len > max_len:
    raise ValueError(f"data.min_example_len={min_len} exceeds data.max_example_len={max_len}")
  # One token more than an example: BOS before a listops expression, EOS
  # after a seq2seq target.
  if max_len + 1 > spec.seq_len:
    raise ValueError(
      f"data.seq_len={spec.seq_len} is too small for "
      f"data.max_example_len={max_len}: it needs one more"
    )
  return dataclasses.replace(
    spec, min_example_len=min_len, max_example_len=max_len, listops_max_depth=depth
  )


def _induction_fields(data: Any, spec: DataSpec) -> DataSpec:
  """Block lengths (periods) in [min_example_len, max_example_len] of distinct
  symbols, each row holding at least two copies of its block."""
  min_len, max_len = _int(data, "min_example_len", 1), _int(data, "max_example_len", 1)
  num_symbols = _int(data, "num_symbols", 1)
  if min_len > max_len:
    raise ValueError(f"data.min_example_len={min_len} exceeds data.max_example_len={max_len}")
  if max_len > num_symbols:
    raise ValueError(
      f"data.max_example_len={max_len} exceeds data.num_symbols={num_symbols}: "
      "a block holds distinct symbols"
    )
  if 2 * max_len > spec.seq_len:
    raise ValueError(
      f"data.seq_len={spec.seq_len} is too small for "
      f"data.max_example_len={max_len}: it needs two copies of a block"
    )
  return dataclasses.replace(
    spec, num_symbols=num_symbols, min_example_len=min_len, max_example_len=max_len
  )


def _mqar_fields(data: Any, spec: DataSpec) -> DataSpec:
  """N key-value pairs and N queries fit the row; keys and values from
  separate halves of the symbols, noise from the symbols that are not keys."""
  pairs = _int(data, "num_kv_pairs", 1)
  num_symbols = _int(data, "num_symbols", 2)
  if pairs > num_symbols // 2:
    raise ValueError(
      f"data.num_kv_pairs={pairs} exceeds data.num_symbols // 2 = "
      f"{num_symbols // 2}: keys and values are distinct symbols of "
      "separate halves"
    )
  if 4 * pairs > spec.seq_len + 1:
    raise ValueError(
      f"data.seq_len={spec.seq_len} is too small for "
      f"data.num_kv_pairs={pairs}: pairs and queries need "
      f"{4 * pairs - 1} positions"
    )
  return dataclasses.replace(spec, num_symbols=num_symbols, num_kv_pairs=pairs)
