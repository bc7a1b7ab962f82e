"""TFDS datasets read by random access (ArrayRecord), without TensorFlow.

data.name = 'tfds:<builder>[/<config>][:<version>]' (e.g. 'tfds:lm1b',
'tfds:wmt14_translate/de-en') reads a dataset already prepared as ArrayRecord
in data.tfds_data_dir through `tfds.builder(...).as_data_source(split)`, what
`tfds.data_source` does less its download attempt: nothing is downloaded or
generated here. Splits keep their TFDS names ('train', 'validation', 'test').

Two readers:

* lm / mlm (packed.PackedDataset): the text feature of every record,
  streamed through Grain -- shuffled per epoch, sharded by process,
  tokenized, packed into windows with segment ids -- holding a bounded
  buffer, so a split of any size is read whole. Its position is the Grain
  iterator's state. A sentencepiece model is trained on the split's first
  records in storage order (`training_texts`); TFDS shuffles records when it
  prepares a dataset, so they are a uniform sample.
* seq2seq (`TranslationSource`): one (source, target) record per row, read
  lazily; global batches are a pure function of the step (the Source
  protocol of pipeline.py), so each process reads only its rows.

TFDS and Grain are imported on first use: they take seconds to import and
only runs on TFDS data need them.
"""

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from txf.data import seeding
from txf.data.spec import DataSpec, name_argument, required
from txf.data.synthetic import seq2seq_arrays
from txf.data.tokenizers import Tokenizer, encode_checked


def dataset_name(spec: DataSpec) -> str:
  """The TFDS name of spec.name: 'tfds:lm1b' -> 'lm1b'."""
  return name_argument(spec.name)


def feature_keys(spec: DataSpec) -> dict[str, str]:
  """Config field -> the feature key it names, for the keys spec.batches reads."""
  if spec.batches == "seq2seq":
    return {
      "tfds_source_key": required(spec.tfds_source_key),
      "tfds_target_key": required(spec.tfds_target_key),
    }
  return {"tfds_text_key": required(spec.tfds_text_key)}


def _preparation_hint(spec: DataSpec, data_dir: str) -> str:
  return (
    f"Prepare it where TensorFlow is installed: `tfds build "
    f"{dataset_name(spec)} --data_dir={data_dir} "
    "--file_format=array_record`, or copy the <builder>/<config>/"
    "<version> folder of a prepared copy (dataset_info.json, "
    f"features.json, *.array_record-*) into {data_dir}"
  )


def open_split(spec: DataSpec, split: str) -> Sequence[Mapping[str, Any]]:
  """The split's records (random access), checked before any batch is built.

  Raises:
    ValueError naming data.name, with the commands that prepare the dataset,
    if it is not prepared as ArrayRecord in data.tfds_data_dir (None: TFDS's
    default, $TFDS_DATA_DIR or ~/tensorflow_datasets); ValueError naming the
    data.tfds_*_key field whose feature the records lack.
  """
  import tensorflow_datasets as tfds  # imported here: only TFDS data needs it

  data_dir = spec.tfds_data_dir or tfds.core.constants.get_default_data_dir()
  where = f"{data_dir} (data.tfds_data_dir={spec.tfds_data_dir!r})"
  hint = _preparation_hint(spec, data_dir)
  try:
    builder = _builder(spec)
  except tfds.core.DatasetNotFoundError:
    # TFDS's own message lists every registered builder: too long to chain.
    raise ValueError(
      f"data.name={spec.name!r}: TFDS has no builder code for it and "
      f"{where} holds no prepared copy (check the name). {hint}."
    ) from None
  if not _is_prepared(builder):
    raise ValueError(
      f"data.name={spec.name!r} is not prepared in {where} (looked in {builder.data_dir}). {hint}."
    )
  try:
    records = builder.as_data_source(split=split)
  except NotImplementedError as error:  # prepared, but not for random access
    raise ValueError(
      f"data.name={spec.name!r} in {builder.data_dir} has no ArrayRecord "
      "files (prepared as TFRecord?): convert them with `tfds convert_format "
      f"--dataset_version_dir={builder.data_dir} "
      f"--out_file_format=array_record`. {hint}."
    ) from error
  except ValueError as error:  # a split it has not: TFDS lists those it has
    field = "" if split == "train" else f" (data.tfds_eval_split={split!r})"
    raise ValueError(f"data.name={spec.name!r}{field}: {error}") from None
  if len(records) == 0:
    raise ValueError(f"split={split!r} of data.name={spec.name!r} is empty")
  first = records[0]
  for field, key in feature_keys(spec).items():
    if key not in first:
      raise ValueError(
        f"data.{field}={key!r} is not a feature of "
        f"data.name={spec.name!r}; its features: {sorted(first)}"
      )
  if split == "train" and spec.batches != "seq2seq":
    _check_some_text(records, spec)
  return records


def _check_some_text(records: Sequence[Mapping[str, Any]], spec: DataSpec) -> None:
  """Raises ValueError naming data.tfds_text_key if every text of the train
  split is empty: packing skips empty texts, and the training stream, which
  repeats forever, would wait for a window without end. Reads up to the
  first non-empty text (the first record, in a dataset to train on)."""
  key = required(spec.tfds_text_key)
  if not any(len(_utf8(records[i][key])) for i in range(len(records))):
    raise ValueError(
      f"data.tfds_text_key={key!r}: every text of the train split of "
      f"data.name={spec.name!r} is empty (nothing to train on; another feature?)"
    )


def resolved_version(spec: DataSpec) -> str:
  """The version of the prepared dataset data.name reads: the one it names
  (':<version>') or the newest prepared in data.tfds_data_dir."""
  return str(_builder(spec).version)


def _builder(spec: DataSpec) -> Any:
  """TFDS's builder of data.name in data.tfds_data_dir."""
  import tensorflow_datasets as tfds  # imported here: only TFDS data needs it

  return tfds.builder(dataset_name(spec), data_dir=spec.tfds_data_dir)


def _is_prepared(builder: Any) -> bool:
  """builder.is_prepared(), its warnings held back (a version folder without
  dataset_info.json): open_split's error says what is missing and how to
  prepare it in one line, which TFDS's warning line before it confused."""
  absl = logging.getLogger("absl")
  level = absl.level
  absl.setLevel(max(level, logging.ERROR))
  try:
    return bool(builder.is_prepared())
  finally:
    absl.setLevel(level)


def _utf8(value: str | bytes) -> bytes:
  """A text feature's bytes (data sources give bytes, some mocks str)."""
  return value if isinstance(value, bytes) else value.encode("utf-8")


def decode_text(value: str | bytes) -> str:
  """A text feature's str; bytes that are not UTF-8 decode to U+FFFD."""
  return value if isinstance(value, str) else value.decode("utf-8", errors="replace")


def read_texts(
  records: Sequence[Mapping[str, Any]], keys: Sequence[str], max_bytes: int
) -> list[str]:
  """The `keys` texts of `records` in storage order, at most max_bytes in all.

  Reads records one at a time and stops at the budget; the last text is cut
  to fit (a cut UTF-8 character decodes to U+FFFD). Empty texts are skipped.
  """
  texts = []
  budget = max_bytes
  for index in range(len(records)):
    record = records[index]
    for key in keys:
      data = _utf8(record[key])[:budget]
      budget -= len(data)
      if data:
        texts.append(decode_text(data))
      if not budget:
        return texts
  return texts


def training_texts(spec: DataSpec, max_bytes: int) -> list[str]:
  """Texts of the train split that a sentencepiece model is trained on.

  For seq2seq both sides, so one vocabulary covers source and target.
  """
  keys = list(feature_keys(spec).values())
  return read_texts(open_split(spec, "train"), keys, max_bytes)


class TranslationSource:
  """Seq2seq batches of a TFDS split's (source, target) text records.

  Row r of global batch `step` is record `step * batch_size + r` of a Grain
  MapDataset: for training `shuffle(seeding.grain_seed(seed)).repeat()`, a
  fresh permutation each epoch computed per index (O(1) memory, any split
  size), so batches run on across epoch ends and the state is {'position':
  records already taken}, which any batch size dividing it continues;
  for evaluation the split in storage order, one pass, the last batch padded
  with all-zero rows of weight 0. Only the rows asked for are read and
  tokenized. Sources longer than seq_len and targets longer than seq_len - 1
  tokens are cut.

  Batch: `seq2seq_arrays` of the rows.
  """

  def __init__(
    self,
    records: Sequence[Mapping[str, Any]],
    *,
    keys: tuple[str, str],
    tokenizer: Tokenizer,
    seq_len: int,
    batch_size: int,
    seed: int,
    shuffle: bool,
  ):
    import grain

    dataset = grain.MapDataset.source(records)
    if shuffle:
      if len(records) < batch_size:
        raise ValueError(
          f"the split has {len(records)} records, fewer than one batch of "
          f"{batch_size} (lower data.batch_size)"
        )
      dataset = dataset.shuffle(seed=seeding.grain_seed(seed)).repeat()
      self.num_batches = None
    else:
      self.num_batches = math.ceil(len(records) / batch_size)
    self._num_rows = len(dataset)  # sys.maxsize once repeated
    self._pairs = dataset.map(self._encode)
    self._keys = keys
    self._tokenizer = tokenizer
    self._seq_len = seq_len
    self._batch_size = batch_size

  def _encode(self, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    source, target = (
      encode_checked(self._tokenizer, decode_text(record[key])) for key in self._keys
    )
    return source[: self._seq_len], target[: self._seq_len - 1]

  def batch(self, step: int, rows: range) -> dict[str, np.ndarray]:
    """Rows `rows` of global batch `step`."""
    first = step * self._batch_size
    pairs = [self._pairs[first + row] for row in rows if first + row < self._num_rows]
    arrays = seq2seq_arrays(pairs, tokenizer=self._tokenizer, seq_len=self._seq_len)
    # Rows past the end of an evaluation split come last: all padding, of
    # weight 0.
    padding = ((0, len(rows) - len(pairs)), (0, 0))
    pad_id = self._tokenizer.pad_id
    return {
      key: np.pad(value, padding, constant_values=0 if key == "weights" else pad_id)
      for key, value in arrays.items()
    }

  # What runs saved before the state was a position: {'step': batches taken},
  # of the batch size they ran with (resumed as before, at that size).
  older_state_keys = ("step",)

  def state_at(self, step: int) -> dict[str, int]:
    return {"position": step * self._batch_size}

  def step_of(self, state: dict[str, int]) -> int:
    if "step" in state:
      return state["step"]
    step, remainder = divmod(state["position"], self._batch_size)
    if remainder:
      raise ValueError(
        f"state['position']={state['position']} is not the start of a batch "
        f"of {self._batch_size} records (data.batch_size)"
      )
    return step


def description(spec: DataSpec) -> str:
  keys = ", ".join(f"{field}={key!r}" for field, key in feature_keys(spec).items())
  return f"TFDS {dataset_name(spec)} ({keys})"
