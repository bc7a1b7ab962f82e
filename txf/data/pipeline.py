"""make_dataset and make_tokenizer: the data package's entry points."""

import os
from typing import Any

from etils import epath

from txf import checks
from txf.data import corpus, files, packed, tfds_source
from txf.data.dataset import Dataset, Source
from txf.data.lm import LanguageModelSource, token_stream
from txf.data.masking import BertMasker
from txf.data.spec import (
  FILES_PREFIX,
  GENERATED,
  DataSpec,
  is_files,
  is_tfds,
  read_data_config,
  required,
)
from txf.data.tokenizers import ByteTokenizer, HFTokenizer, SentencePieceTokenizer, Tokenizer

# Bytes of the train split sentencepiece trains on (about 13 s on one core).
SENTENCEPIECE_TRAIN_BYTES = 2_000_000


def _reads_text(spec: DataSpec) -> bool:
  """Whether the data is text read from splits (the corpus, TFDS or files)."""
  return spec.name == "pystdlib" or is_tfds(spec.name) or is_files(spec.name)


def _text_files(spec: DataSpec) -> files.TextFiles:
  return files.TextFiles.find(spec.name[len(FILES_PREFIX) :])


def _corpus_tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  if spec.tokenizer == "bytes":
    return ByteTokenizer()
  if spec.tokenizer == "hf":
    return HFTokenizer(required(spec.tokenizer_path))
  if workdir is None:
    raise ValueError(
      "workdir is required for data.tokenizer='sentencepiece' "
      "(the model is trained into it once, then reused)"
    )
  prefix = epath.Path(workdir) / f"sentencepiece_{spec.sp_vocab_size}"
  model = prefix.with_name(prefix.name + ".model")
  if model.exists():
    return SentencePieceTokenizer(model)
  max_bytes = min(spec.max_corpus_bytes or SENTENCEPIECE_TRAIN_BYTES, SENTENCEPIECE_TRAIN_BYTES)
  if spec.name == "pystdlib":
    texts = corpus.load_corpus("train", max_bytes=max_bytes)
  elif is_files(spec.name):
    texts = _text_files(spec).load("train", max_bytes=max_bytes)
  else:
    texts = tfds_source.training_texts(spec, max_bytes)
  return SentencePieceTokenizer.train(texts, required(spec.sp_vocab_size), prefix)


def _tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  if _reads_text(spec):
    return _corpus_tokenizer(spec, workdir)
  return GENERATED[spec.name].tokenizer(spec)


def make_tokenizer(data_config: Any, workdir: str | os.PathLike | None = None) -> Tokenizer:
  """The tokenizer of the dataset `data_config` describes.

  For data.tokenizer='sentencepiece' the model is
  `<workdir>/sentencepiece_<sp_vocab_size>.model`, trained on the train split
  (at most SENTENCEPIECE_TRAIN_BYTES) the first time and reused afterwards,
  so a resumed run keeps its vocabulary.
  """
  return _tokenizer(read_data_config(data_config), workdir)


def _masker(spec: DataSpec, seed: int, tokenizer: Tokenizer) -> BertMasker | None:
  if spec.task != "mlm":
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


def _lm_source(
  spec: DataSpec, documents: list[str], split: str, seed: int, tokenizer: Tokenizer
) -> LanguageModelSource:
  tokens = token_stream(documents, tokenizer)
  masker = _masker(spec, seed, tokenizer)
  return LanguageModelSource(
    tokens,
    example_len=spec.seq_len + (masker is None),
    batch_size=spec.batch_size,
    seed=seed,
    shuffle=split == "train",
    masker=masker,
  )


def _translation_source(
  spec: DataSpec, split: str, seed: int, tokenizer: Tokenizer
) -> tfds_source.TranslationSource:
  return tfds_source.TranslationSource(
    tfds_source.open_split(spec, split),
    keys=(required(spec.tfds_source_key), required(spec.tfds_target_key)),
    tokenizer=tokenizer,
    seq_len=spec.seq_len,
    batch_size=spec.batch_size,
    seed=seed,
    shuffle=split == "train",
  )


def _description(spec: DataSpec, tokenizer: Tokenizer) -> str:
  if _reads_text(spec):
    if spec.name == "pystdlib":
      data = corpus.corpus_description()
    elif is_files(spec.name):
      data = _text_files(spec).description()
    else:
      data = tfds_source.description(spec)
    return (
      f"{data}; {spec.tokenizer} tokenizer, {tokenizer.vocab_size} ids; "
      f"{spec.task}, seq_len {spec.seq_len}"
    )
  return GENERATED[spec.name].describe(spec)


def make_dataset(
  data_config: Any,
  split: str,
  *,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  workdir: str | os.PathLike | None = None,
  num_batches: int | None = None,
  tokenizer: Tokenizer | None = None,
) -> Dataset:
  """Builds the batches of `split` for this process.

  Args:
    data_config: the `data` config section (fields: txf/data/__init__.py).
    split: 'train', 'validation' or 'test'.
    seed: int >= 0; fixes shuffling, masking and generated examples.
    process_index, process_count: this host's index and the host count;
      data.batch_size must divide by process_count.
    workdir: run directory (holds the sentencepiece model).
    num_batches: stop after this many batches (None: the corpus and TFDS
      evaluation splits give one pass, the training split and generated
      tasks never stop). Required for evaluating generated tasks. A TFDS
      lm/mlm evaluation split gives exactly this many, padded after its pass
      (packed.PackedDataset).
    tokenizer: make_tokenizer(data_config, workdir), where the caller has
      made it already (a run's datasets share one); None: made here.

  Raises:
    ValueError naming the bad field or argument, before loading any data.
  """
  spec = read_data_config(data_config)
  if split not in corpus.SPLITS:
    raise ValueError(f"split={split!r} is not one of {corpus.SPLITS}")
  seed = checks.int_at_least(seed, "seed", 0)
  process_count = checks.positive_int(process_count, "process_count")
  process_index = checks.int_at_least(process_index, "process_index", 0)
  if process_index >= process_count:
    raise ValueError(f"process_index={process_index} must be below process_count={process_count}")
  if spec.batch_size % process_count:
    raise ValueError(
      f"data.batch_size={spec.batch_size} must be divisible by process_count={process_count}"
    )
  if num_batches is not None:
    num_batches = checks.positive_int(num_batches, "num_batches")
  elif split != "train" and not _reads_text(spec):
    raise ValueError(
      f"num_batches is required for split={split!r} of the generated task data.name={spec.name!r}"
    )

  if tokenizer is None:
    tokenizer = _tokenizer(spec, workdir)
  common: dict[str, Any] = dict(
    spec=spec,
    split=split,
    tokenizer=tokenizer,
    process_index=process_index,
    process_count=process_count,
    num_batches=num_batches,
    description=_description(spec, tokenizer),
  )
  if is_tfds(spec.name) and spec.task != "seq2seq":
    return packed.PackedDataset(
      tfds_source.open_split(spec, split),
      seed=seed,
      masker=_masker(spec, seed, tokenizer),
      **common,
    )
  source: Source
  if spec.name == "pystdlib":
    source = _lm_source(
      spec, corpus.load_corpus(split, max_bytes=spec.max_corpus_bytes), split, seed, tokenizer
    )
  elif is_files(spec.name):
    source = _lm_source(
      spec, _text_files(spec).load(split, max_bytes=spec.max_corpus_bytes), split, seed, tokenizer
    )
  elif is_tfds(spec.name):
    source = _translation_source(spec, split, seed, tokenizer)
  else:
    source = GENERATED[spec.name].source(spec, split, seed)
  return Dataset(source, **common)
