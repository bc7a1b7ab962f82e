"""The text datasets: each `data.name` of text one entry of txf.data.spec.TEXT.

An entry says which `data.task` values it gives, reads and checks its own
fields of the `data` section, and makes the batches of a split and a line
describing it (the TextSource protocol); the tokenizer is the run's
(data.tokenizer: bytes, sentencepiece trained on `training_texts`, or hf).
txf registers its own here; user code registers a source of documents with
`txf.register.text_source` (a DocumentSource).

  pystdlib             DocumentSource  the Python standard library (corpus.py)
  files:PATH_OR_GLOB   DocumentSource  UTF-8 text files (files.py)
  tfds:BUILDER         TFDSSource      a prepared TFDS dataset (tfds_source.py)

An entry with an `argument` is named `<name>:<argument>`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from txf.data import corpus, files, packed, tfds_source
from txf.data.dataset import Dataset
from txf.data.lm import LanguageModelSource, token_stream
from txf.data.masking import BertMasker
from txf.data.spec import TEXT, DataSpec, corpus_fields, name_argument, required, tfds_fields
from txf.data.tokenizers import Tokenizer


def masker(spec: DataSpec, seed: int, tokenizer: Tokenizer) -> BertMasker | None:
  """The BERT masking of data.task 'mlm' (None for the other tasks)."""
  if spec.batches != "mlm":
    return None
  if tokenizer.mask_id is None:  # an HF tokenizer.json without one
    raise ValueError(
      f"data.task='mlm' needs a mask token; the tokenizer "
      f"{spec.tokenizer_path or spec.tokenizer!r} has none"
    )
  return BertMasker(
    probability=required(spec.mlm_probability),
    mask_id=tokenizer.mask_id,
    vocab_size=tokenizer.vocab_size,
    special_ids=tokenizer.special_ids,
    seed=seed,
  )


# (argument, split, max_bytes) -> the split's documents, at most max_bytes
# of text in all (None: no cap).
LoadDocuments = Callable[[str, str, int | None], list[str]]


@dataclasses.dataclass(frozen=True)
class DocumentSource:
  """Documents per split, tokenized as one stream and cut into lm or mlm rows
  (txf.data.lm); data.max_corpus_bytes caps each split.

  Attributes:
    load: (argument, split, max_bytes) -> the split's documents.
    describe_data: (argument) -> what the documents are, for the log line.
    fingerprint_data: (argument, max_bytes) -> what a run reads, for its
      record (txf.rundir.record); None: the record names the source only.
    argument: what follows '<name>:' in data.name (files: 'PATH_OR_GLOB');
      None: named alone (its load gets '').
  """

  load: LoadDocuments
  describe_data: Callable[[str], str]
  fingerprint_data: Callable[[str, int | None], dict[str, Any]] | None = None
  argument: str | None = None
  tasks: tuple[str, ...] = ("lm", "mlm")

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    name = data["name"]
    if self.argument is not None and not name_argument(name).strip():
      raise ValueError(
        f"data.name={name!r} names no {self.argument}; "
        f"expected '{name.partition(':')[0]}:{self.argument}'"
      )
    return corpus_fields(data)

  def training_texts(self, spec: DataSpec, max_bytes: int) -> list[str]:
    return self._documents(spec, "train", max_bytes)

  def dataset(self, spec: DataSpec, split: str, seed: int, common: dict[str, Any]) -> Dataset:
    documents = self._documents(spec, split, spec.max_corpus_bytes)
    tokenizer = common["tokenizer"]
    mask = masker(spec, seed, tokenizer)
    source = LanguageModelSource(
      token_stream(documents, tokenizer),
      example_len=spec.seq_len + (mask is None),
      batch_size=spec.batch_size,
      seed=seed,
      split=split,
      masker=mask,
      pad_id=tokenizer.pad_id,
    )
    return Dataset(source, **common)

  def _documents(self, spec: DataSpec, split: str, max_bytes: int | None) -> list[str]:
    """`load`'s documents of `split`, checked: a registered source's empty
    split or bytes documents failed deep in the tokenizer, naming neither;
    a file it cannot read (OSError: a wrong path) is refused naming the
    source, as the built-in sources' are."""
    try:
      loaded = self.load(name_argument(spec.name), split, max_bytes)
    except OSError as error:
      raise ValueError(f"data.name={spec.name!r}: {error}") from error
    if isinstance(loaded, (str, bytes)):  # list() made each character a document
      raise ValueError(
        f"data.name={spec.name!r}: its {split} split is one {type(loaded).__name__}, "
        "not a list of str documents"
      )
    documents = list(loaded)
    if not documents:
      raise ValueError(f"data.name={spec.name!r}: its {split} split holds no documents")
    kinds = {type(document).__name__ for document in documents if not isinstance(document, str)}
    if kinds:
      raise ValueError(
        f"data.name={spec.name!r}: its {split} split's documents must be str, "
        f"got {', '.join(sorted(kinds))}"
      )
    return documents

  def describe(self, spec: DataSpec) -> str:
    return self.describe_data(name_argument(spec.name))

  def fingerprint(self, spec: DataSpec) -> dict[str, Any] | None:
    if self.fingerprint_data is None:
      return None
    return self.fingerprint_data(name_argument(spec.name), spec.max_corpus_bytes)


class TFDSSource:
  """A prepared TFDS dataset: lm / mlm rows packed from its text feature as
  it streams (packed.PackedDataset), or seq2seq pairs (TranslationSource)."""

  tasks = ("lm", "mlm", "seq2seq")
  argument = "<builder>[/<config>][:<version>]"

  def fields(self, data: Mapping[str, Any]) -> dict[str, Any]:
    return tfds_fields(data)

  def training_texts(self, spec: DataSpec, max_bytes: int) -> list[str]:
    return tfds_source.training_texts(spec, max_bytes)

  def dataset(self, spec: DataSpec, split: str, seed: int, common: dict[str, Any]) -> Dataset:
    # An evaluation ('validation') reads the split the config names: not
    # every dataset has one called so (lm1b: train and test).
    records = tfds_source.open_split(
      spec, split if split == "train" else required(spec.tfds_eval_split)
    )
    if spec.batches != "seq2seq":
      return packed.PackedDataset(
        records,
        seed=seed,
        masker=masker(spec, seed, common["tokenizer"]),
        **common,
      )
    source = tfds_source.TranslationSource(
      records,
      keys=(required(spec.tfds_source_key), required(spec.tfds_target_key)),
      tokenizer=common["tokenizer"],
      seq_len=spec.seq_len,
      batch_size=spec.batch_size,
      seed=seed,
      shuffle=split == "train",
    )
    return Dataset(source, **common)

  def describe(self, spec: DataSpec) -> str:
    return tfds_source.description(spec)

  def fingerprint(self, spec: DataSpec) -> dict[str, Any] | None:
    return None  # a TFDS version names its data


TEXT.register(
  "pystdlib",
  DocumentSource(
    load=lambda _, split, max_bytes: corpus.load_corpus(split, max_bytes=max_bytes),
    describe_data=lambda _: corpus.corpus_description(),
    fingerprint_data=lambda _, max_bytes: corpus.corpus_fingerprint(),
  ),
)
TEXT.register(
  "files",
  DocumentSource(
    load=lambda glob, split, max_bytes: files.TextFiles.find(glob).load(split, max_bytes=max_bytes),
    describe_data=lambda glob: files.TextFiles.find(glob).description(),
    fingerprint_data=lambda glob, max_bytes: files.TextFiles.find(glob).fingerprint(
      max_bytes=max_bytes
    ),
    argument="PATH_OR_GLOB",
  ),
)
TEXT.register("tfds", TFDSSource())
