"""make_dataset and make_tokenizer: the data package's entry points; txf's
data.tokenizer entries (TOKENIZERS)."""

import os
from typing import Any

from etils import epath

from txf import checks
from txf.data import corpus
from txf.data.dataset import Dataset
from txf.data.spec import (
  GENERATED,
  TOKENIZERS,
  DataSpec,
  TextSource,
  required,
  text_source,
)
from txf.data.tokenizers import ByteTokenizer, HFTokenizer, SentencePieceTokenizer, Tokenizer
from txf.storage import write_files

# Bytes of the train split sentencepiece trains on (about 13 s on one core).
SENTENCEPIECE_TRAIN_BYTES = 2_000_000


@TOKENIZERS.decorator("bytes")
def bytes_tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  """UTF-8 bytes (ByteTokenizer)."""
  return ByteTokenizer()


def sentencepiece_model(spec: DataSpec, workdir: str | os.PathLike) -> epath.Path:
  """Where a run in `workdir` keeps its sentencepiece model of
  data.sp_vocab_size pieces."""
  return epath.Path(workdir) / SentencePieceTokenizer.file_name(required(spec.sp_vocab_size))


@TOKENIZERS.decorator("sentencepiece")
def sentencepiece_tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  """The sentencepiece model of data.sp_vocab_size pieces in `workdir`,
  trained there on the train split the first time (see make_tokenizer)."""
  if workdir is None:
    raise ValueError(
      "workdir is required for data.tokenizer='sentencepiece' "
      "(the model is trained into it once, then reused)"
    )
  model = sentencepiece_model(spec, workdir)
  prefix = model.with_suffix("")
  if model.exists():
    return SentencePieceTokenizer(model)
  max_bytes = min(spec.max_corpus_bytes or SENTENCEPIECE_TRAIN_BYTES, SENTENCEPIECE_TRAIN_BYTES)
  texts = required(text_source(spec.name)).training_texts(spec, max_bytes)
  try:
    return SentencePieceTokenizer.train(texts, required(spec.sp_vocab_size), prefix)
  except ValueError as error:  # too few pieces for the text's characters
    raise ValueError(f"data.sp_vocab_size: {error}") from None


# Where a run keeps a copy of its hf tokenizer's files (keep_hf_tokenizer).
HF_TOKENIZER_COPY = "hf_tokenizer"


@TOKENIZERS.decorator("hf")
def hf_tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  """The Hugging Face tokenizer.json at data.tokenizer_path (HFTokenizer);
  where that file is gone (a run moved to another machine, whose Hub cache
  is elsewhere; a cleaned cache's broken link), the copy the run in
  `workdir` keeps (keep_hf_tokenizer). The run's record holds the contents'
  SHA-256, against which a trained run's is checked
  (txf.rundir.record.check_recorded_tokenizer)."""
  path = required(spec.tokenizer_path)
  if workdir is not None and not HFTokenizer.json_file(path).exists():
    kept = _kept_tokenizer_file(epath.Path(workdir) / HF_TOKENIZER_COPY)
    if kept is not None:
      return HFTokenizer(kept)
  try:
    return HFTokenizer(path)
  except ValueError as error:  # it says what is wrong with the file, not which field named it
    raise ValueError(f"data.tokenizer_path: {error}") from None


def _kept_tokenizer_file(copy: epath.Path) -> epath.Path | None:
  """The tokenizer.json (under its own name) among a run's copied files, or
  None where the run keeps none."""
  if not copy.is_dir():
    return None
  main = [file for file in copy.iterdir() if file.name not in HFTokenizer.SPECIAL_FILES]
  return main[0] if len(main) == 1 else None


def keep_hf_tokenizer(spec: DataSpec, tokenizer: Tokenizer, workdir: str | os.PathLike) -> None:
  """Copies the files of the run's hf `tokenizer` (`hf_tokenizer`'s,
  HFTokenizer.files, under their own names) into `workdir`'s
  HF_TOKENIZER_COPY, replacing what it held, which `hf_tokenizer` reads
  where data.tokenizer_path is gone: the directory of a run that trains
  holds what its ids need. Nothing for another data.tokenizer, or where the
  run reads its copy already."""
  copy = epath.Path(workdir) / HF_TOKENIZER_COPY
  if spec.tokenizer != "hf" or not isinstance(tokenizer, HFTokenizer):
    return
  if tokenizer.file.parent == copy:  # the run reads its copy: nothing newer to keep
    return
  stale = list(copy.iterdir()) if copy.is_dir() else []
  files = {copy / file.name: file.read_bytes() for file in tokenizer.files()}
  write_files(files)
  for file in stale:  # another tokenizer file name than the one kept now
    if file not in files:
      file.unlink()


def _tokenizer(spec: DataSpec, workdir: str | os.PathLike | None) -> Tokenizer:
  """A text dataset's data.tokenizer (TOKENIZERS), a generated one's own."""
  if text_source(spec.name) is not None:
    return TOKENIZERS[required(spec.tokenizer)](spec, workdir)
  return GENERATED[spec.name].tokenizer(spec)


def make_tokenizer(spec: DataSpec, workdir: str | os.PathLike | None = None) -> Tokenizer:
  """The tokenizer of the dataset `spec` describes: a text dataset's
  data.tokenizer (an entry of txf.data.spec.TOKENIZERS: txf's bytes,
  sentencepiece and hf, above, or one registered with
  txf.register.tokenizer), a generated dataset's own.

  For data.tokenizer='sentencepiece' the model is
  `<workdir>/sentencepiece_<sp_vocab_size>.model`, trained on the train split
  (at most SENTENCEPIECE_TRAIN_BYTES) the first time and reused afterwards,
  so a resumed run keeps its vocabulary.
  """
  return _tokenizer(spec, workdir)


def _description(spec: DataSpec, text: TextSource | None, tokenizer: Tokenizer) -> str:
  if text is None:
    return GENERATED[spec.name].describe(spec)
  return (
    f"{text.describe(spec)}; {spec.tokenizer} tokenizer, {tokenizer.vocab_size} ids; "
    f"{spec.task}, seq_len {spec.seq_len}"
  )


def make_dataset(
  spec: DataSpec,
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
    spec: the `data` section, parsed (txf.data.spec.parse_data; fields:
      txf/data/__init__.py).
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
    tokenizer: make_tokenizer(spec, workdir), where the caller has
      made it already (a run's datasets share one); None: made here.

  Raises:
    ValueError naming the bad field or argument, before loading any data.
  """
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
  text = text_source(spec.name)
  if num_batches is not None:
    num_batches = checks.positive_int(num_batches, "num_batches")
  elif split != "train" and text is None:
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
    description=_description(spec, text, tokenizer),
  )
  if text is not None:
    return text.dataset(spec, split, seed, common)
  return Dataset(GENERATED[spec.name].source(spec, split, seed), **common)
