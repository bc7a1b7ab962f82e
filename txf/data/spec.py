"""The `data` config section: DataSpec declares its fields (type, default,
doc), `parse_data` reads and checks a section into one, once per run
(txf.runconfig.run_config.parse calls it), and the datasets by data.name
(GENERATED, TEXT) and tokenizers by data.tokenizer (TOKENIZERS) are
registries. Below the parse the data pipeline takes the DataSpec; which
dataset reads which field is tabulated in txf/data/__init__.py.
"""

import dataclasses
import os
import reprlib
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from txf import checks
from txf.choices import Registry
from txf.data.synthetic import GeneratedSource
from txf.data.tokenizers import SentencePieceTokenizer, Tokenizer
from txf.fields import ConfigSection, documented, section, section_values


@section()
class DataSpec:
  """A `data` section as `parse_data` checks it: the fields its dataset
  reads (txf/data/__init__.py tabulates which dataset reads which field),
  those derived from others resolved (a TFDS translation's keys); None
  where the dataset reads none. The defaults are a config's, for the fields
  it leaves out (configs/base.py is built from them)."""

  name: str = documented(
    "the dataset: text (txf.data.text; pystdlib: the Python standard library's sources, "
    "built in) or generated (txf.data.generated), or a registered one",
    default="pystdlib",
  )
  task: str = documented(
    "lm | mlm | seq2seq | classify, or a registered task kind (txf.runconfig.tasks): its batches "
    "are of a kind a data.name gives (txf.data.spec.data_names)",
    default="lm",
  )
  seq_len: int = documented("tokens per example (seq2seq: per source and target)", default=128)
  batch_size: int = documented("global, across all devices and hosts", default=32)
  tokenizer: str | None = documented(
    "bytes | sentencepiece (trained in the run dir) | hf, or a registered one", default="bytes"
  )
  sp_vocab_size: int | None = documented(
    'tokenizer="sentencepiece": its largest vocabulary', default=1024
  )
  tokenizer_path: str | None = documented(
    'tokenizer="hf": a tokenizer.json or its dir', default=None
  )
  max_corpus_bytes: int | None = documented(
    "pystdlib, files: bytes read per split", default=4_000_000
  )
  mlm_probability: float | None = documented('task="mlm": fraction of tokens masked', default=0.15)
  min_example_len: int | None = documented(
    "generated tasks: shortest example (induction: span)", default=4
  )
  max_example_len: int | None = documented(
    "generated tasks: longest example (induction: span)", default=16
  )
  listops_max_depth: int | None = documented("listops: most nested operators (root = 1)", default=4)
  # In-context tasks (incontext.py).
  num_symbols: int | None = documented("induction, mqar: content ids", default=32)
  num_kv_pairs: int | None = documented("mqar: key-value pairs per row", default=8)
  tfds_data_dir: str | None = documented(
    "tfds: the prepared dataset's folder; None: $TFDS_DATA_DIR or ~/tensorflow_datasets",
    default=None,
  )
  tfds_eval_split: str | None = documented(
    "tfds: the split evaluations read, e.g. test (lm1b has no validation split) or a TFDS "
    "slice such as validation[:1000]",
    default="validation",
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
    "tfds lm/mlm: threads reading records ahead (I/O)", default=4
  )
  read_workers: int | None = documented(
    "tfds lm/mlm: processes reading and tokenizing train (CPU); None: 0", default=None
  )
  attend_across_documents: bool | None = documented(
    "tfds lm/mlm: True: attention crosses the documents packed in a window (GPT-2)", default=False
  )
  seed: int | None = documented(
    "the data order's (shuffling, masking, generated examples); None: the run's seed "
    "(seed replicas share the run's unless seed_per_replica)",
    default=None,
  )
  seed_per_replica: bool = documented(
    "replicas > 1: replica r trains on its own batches, drawn from the data order's seed + r "
    "(it trains as the single run of seed + r with data.seed + r; all are evaluated on the "
    "run's validation batches); False: the replicas share the run's batches and differ in "
    "initialisation and dropout only (txf.data.stacked)",
    default=False,
  )

  @property
  def batches(self) -> str:
    """The batch format data.task reads ('lm', 'mlm', 'seq2seq', 'classify'):
    what the dataset gives (a prefix LM reads lm batches)."""
    return TASKS[self.task].batches


T = TypeVar("T")


def required(value: T | None) -> T:
  """A DataSpec field the dataset uses, which parse_data has set (it leaves
  None only the fields a dataset does not use), typed without the None."""
  assert value is not None, "a DataSpec field read for a dataset that does not use it"
  return value


class GeneratedTask(Protocol):
  """A generated dataset, the entry of its data.name in GENERATED
  (txf.data.generated holds txf's own)."""

  @property
  def tasks(self) -> tuple[str, ...]:
    """The data.task values it gives, its natural one first."""
    ...

  @property
  def num_classes(self) -> int | None:
    """A classification task's label count; None for the others."""
    ...

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    """{field: value} of the task's own fields of the data section's values
    (`data`: every DataSpec field, those every dataset reads checked), each
    checked (int_field); ValueError names a bad one."""
    ...

  def tokenizer(self, spec: DataSpec) -> Tokenizer:
    """Its tokenizer (the one its source encodes with), drawing nothing."""
    ...

  def source(self, spec: DataSpec, split: str, seed: int) -> GeneratedSource:
    """Its batches of `split`, drawn from `seed`."""
    ...

  def describe(self, spec: DataSpec) -> str:
    """One line for the run's log."""
    ...


class TextSource(Protocol):
  """A dataset of text read per split and tokenized by data.tokenizer, the
  entry of its data.name in TEXT (txf.data.text holds txf's own)."""

  @property
  def tasks(self) -> tuple[str, ...]:
    """The data.task values it gives, its natural one first."""
    ...

  @property
  def argument(self) -> str | None:
    """What follows '<name>:' in data.name (files: 'PATH_OR_GLOB'); None:
    the name alone."""
    ...

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    """{field: value} of its own fields of the data section's values
    (`data`: every DataSpec field, those every dataset reads checked), each
    checked (corpus_fields, tfds_fields); ValueError names a bad one."""
    ...

  def training_texts(self, spec: DataSpec, max_bytes: int) -> list[str]:
    """Text of the train split to train a sentencepiece tokenizer on."""
    ...

  def dataset(self, spec: DataSpec, split: str, seed: int, common: dict[str, Any]) -> Any:
    """The txf.data.Dataset of `split` (common: the Dataset's other
    arguments, the tokenizer among them)."""
    ...

  def describe(self, spec: DataSpec) -> str:
    """What the data is, for the run's log."""
    ...

  def fingerprint(self, spec: DataSpec) -> dict[str, Any] | None:
    """What a run reads, for its record; None where the name says it."""
    ...


class TaskBatches(Protocol):
  """What the data reads of a data.task entry (txf.runconfig.tasks.TaskKind, the
  whole entry: its inputs, labels, loss weights)."""

  @property
  def batches(self) -> str:
    """The batch format it reads: 'lm', 'mlm', 'seq2seq' or 'classify'
    (txf/data/__init__.py), which a dataset's `tasks` name."""
    ...


# The task kinds by data.task: txf's (txf.runconfig.tasks, imported when the
# registry is first read: the step, evaluation and export read the rest of
# an entry) and those user code registers (txf.register.task). The data
# section's parse checks data.task here, and a dataset gives the entry's batches.
TASKS: Registry[TaskBatches] = Registry("data.task", builtins="txf.runconfig.tasks")

# The datasets by data.name: txf's (txf.data.generated, txf.data.text,
# imported when a registry is first read) and those user code registers
# (txf.register.lm_task, txf.register.text_source).
GENERATED: Registry[GeneratedTask] = Registry("data.name", builtins="txf.data.generated")
TEXT: Registry[TextSource] = Registry("data.name", builtins="txf.data.text")
GENERATED.share_names(TEXT)

# What a text dataset's data.tokenizer names: (its DataSpec, the run's work
# directory; None outside a run) -> the Tokenizer. txf's are in
# txf.data.pipeline, imported when the registry is first read; user code
# registers others (txf.register.tokenizer).
TokenizerBuilder = Callable[[DataSpec, str | os.PathLike | None], Tokenizer]
TOKENIZERS: Registry[TokenizerBuilder] = Registry("data.tokenizer", builtins="txf.data.pipeline")


@dataclasses.dataclass(frozen=True)
class CheckedTokenizer:
  """A data.tokenizer entry user code registered (txf.register.tokenizer):
  its builder, called as a TokenizerBuilder, whose result must be a
  Tokenizer. A run builds it before it writes anything (txf.train.run_setup
  fit_vocabulary), so a builder giving something else is a config error
  there, not an AttributeError later. Equal for the same builder: a module
  imported twice registers the same entry again."""

  name: str
  build: TokenizerBuilder

  def __call__(self, spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
    tokenizer = self.build(spec, workdir)
    if not isinstance(tokenizer, Tokenizer):
      raise ValueError(
        f"data.tokenizer {self.name!r}: gave {reprlib.repr(tokenizer)}, not a txf.data.Tokenizer"
      )
    return tokenizer


def text_source(name: Any) -> TextSource | None:
  """The TEXT entry of data.name `name` ('pystdlib'; 'files:GLOB' is the
  entry 'files'); None where it names no text source."""
  if not isinstance(name, str):
    return None
  scheme, colon, _ = name.partition(":")
  entry = TEXT[scheme] if scheme in TEXT else None
  if entry is None or (entry.argument is not None) != bool(colon):
    return None
  return entry


def name_argument(name: str) -> str:
  """What follows the first ':' of a data.name ('' for none)."""
  return name.partition(":")[2]


def data_names() -> dict[str, tuple[str, ...]]:
  """{data.name: the data.task values it gives} of the datasets named alone
  (the text sources that take no argument, the generated datasets); the
  others are named by their forms (`data_name_forms`)."""
  names = {name: entry.tasks for name, entry in TEXT.items() if entry.argument is None}
  return {**names, **{name: GENERATED[name].tasks for name in GENERATED}}


def data_name_forms() -> tuple[str, ...]:
  """The forms of the data.name values with an argument: 'files:PATH_OR_GLOB', ..."""
  return tuple(f"{name}:{entry.argument}" for name, entry in TEXT.items() if entry.argument)


def num_classes(spec: DataSpec) -> int | None:
  """The labels of a classification dataset (listops' 10); None for the others."""
  return GENERATED[spec.name].num_classes if spec.name in GENERATED else None


def int_field(data: Mapping[str, Any], field: str, minimum: int) -> int:
  """data.<field>, an int >= `minimum`; ValueError names it."""
  return checks.int_at_least(data[field], f"data.{field}", minimum)


def parse_data(section: ConfigSection) -> DataSpec:
  """The `data` section (a ConfigDict or a dict; a field it leaves out takes
  its default) as a DataSpec: the fields every dataset reads, then those its
  data.name's entry reads (`fields`), each checked; the others None. The
  one place a `data` section is read (txf.runconfig.run_config.parse calls it).

  Raises:
    ValueError: naming the field.
  """
  data = section_values(DataSpec, section, "data")
  name = data["name"]
  entry: GeneratedTask | TextSource
  text = text_source(name)
  if text is not None:
    entry = text
  elif name in GENERATED:
    entry = GENERATED[name]
  else:
    raise ValueError(
      f"data.name={name!r} is not one of {tuple(data_names())} "
      f"or of the forms {', '.join(map(repr, data_name_forms()))}"
    )
  task = data["task"]
  batches = TASKS[task].batches
  if batches not in entry.tasks:
    reads = "" if batches == task else f" (it reads {batches!r} batches)"
    raise ValueError(
      f"data.task={task!r}{reads} does not fit data.name={name!r}; expected one of {entry.tasks}"
    )
  seed = data["seed"]
  common = dict(
    name=name,
    task=task,
    seq_len=int_field(data, "seq_len", 2),
    batch_size=int_field(data, "batch_size", 1),
    seed=None if seed is None else checks.seed(seed, "data.seed"),
    seed_per_replica=checks.boolean(data["seed_per_replica"], "data.seed_per_replica"),
  )
  read = {**common, **entry.fields({**data, **common})}
  return DataSpec(**{**dict.fromkeys(data), **read})


def corpus_fields(data: Mapping[str, Any]) -> dict[str, Any]:
  """The fields of documents read per split: the text fields and data.max_corpus_bytes."""
  return {**_text_fields(data), "max_corpus_bytes": int_field(data, "max_corpus_bytes", 1)}


def _text_fields(data: Mapping[str, Any]) -> dict[str, Any]:
  """The fields of text read from splits: tokenizer and masking."""
  fields: dict[str, Any] = {
    "tokenizer": checks.choice(data["tokenizer"], "data.tokenizer", TOKENIZERS)
  }
  if fields["tokenizer"] == "sentencepiece":
    fields["sp_vocab_size"] = int_field(
      data, "sp_vocab_size", SentencePieceTokenizer.RESERVED_IDS + 1
    )
  if fields["tokenizer"] == "hf":
    fields["tokenizer_path"] = _optional_str(data, "tokenizer_path")
    if fields["tokenizer_path"] is None:
      raise ValueError(
        "data.tokenizer_path is required for data.tokenizer='hf' (a "
        "tokenizer.json or the model directory holding it)"
      )
  if TASKS[data["task"]].batches == "mlm":
    fields["mlm_probability"] = checks.fraction(
      data["mlm_probability"], "data.mlm_probability", low_open=True
    )
  return fields


def _optional_str(data: Mapping[str, Any], field: str) -> str | None:
  """data.<field>, a non-empty str or None."""
  value = data[field]
  if value is not None and (not isinstance(value, str) or not value):
    raise ValueError(f"data.{field} must be a non-empty str or None, got {value!r}")
  return value


def _translation_keys(data: Mapping[str, Any], dataset: str) -> tuple[str, str]:
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
        f"'tfds:{dataset}': its config is not named "
        "'<source>-<target>'"
      )
    keys.append(key)
  if keys[0] == keys[1]:
    raise ValueError(f"data.tfds_source_key and data.tfds_target_key are both {keys[0]!r}")
  return keys[0], keys[1]


def tfds_fields(data: Mapping[str, Any]) -> dict[str, Any]:
  """The fields of a TFDS dataset (data.name `tfds:<builder>[/<config>][:<version>]`),
  those derived from others resolved (the translation keys, the text key,
  read_workers)."""
  dataset = name_argument(data["name"])
  if not dataset.split(":")[0].split("/")[0]:
    raise ValueError(
      f"data.name={data['name']!r} names no TFDS builder; expected "
      f"'tfds:<builder>[/<config>][:<version>]'"
    )
  fields = {
    **_text_fields(data),
    "tfds_data_dir": _optional_str(data, "tfds_data_dir"),
    "tfds_eval_split": _optional_str(data, "tfds_eval_split") or "validation",
  }
  if TASKS[data["task"]].batches == "seq2seq":
    source_key, target_key = _translation_keys(data, dataset)
    return {**fields, "tfds_source_key": source_key, "tfds_target_key": target_key}
  # lm / mlm stream the split (packed.py).
  workers = data["read_workers"]
  return {
    **fields,
    "tfds_text_key": _optional_str(data, "tfds_text_key") or "text",
    "read_threads": int_field(data, "read_threads", 0),
    "read_workers": 0 if workers is None else int_field(data, "read_workers", 0),
    "attend_across_documents": checks.boolean(
      data["attend_across_documents"], "data.attend_across_documents"
    ),
  }
