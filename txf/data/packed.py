"""Packed language-model batches streamed from a split's records (Grain).

A split of any size (a TFDS split through `tfds.data_source`, or any random-
access sequence of records) becomes batches of packed windows, holding only a
bounded buffer in memory. The stages are Grain's:

  MapDataset.range(N)                 record ids
    .shuffle(grain_seed).repeat()     training: a new order each epoch
    [process_index::process_count]    this process's shard of the ids
    .batch(group).map(read)           one batched read per group of up to
                                      READ_GROUP records; each text
                                      tokenized and closed by EOS (empty
                                      texts skipped), the group's documents
                                      joined
    .to_iter_dataset(ReadOptions)     `read_threads` threads read ahead
    .mp_prefetch(read_workers)        training: worker processes do the
                                      above, each every read_workers-th
                                      group, interleaved back in order
  ConcatThenSplitIterDataset          the groups' tokens concatenated and cut
                                      into windows of window_len; the last
                                      window of a pass padded (then
                                      with the tokenizer's pad_id)
  .batch(rows)

Grain packs whole groups, not single documents: its per-element cost, paid
once per group, would otherwise dominate for sentence-sized documents
(lm1b). Documents inside a window are told apart by their EOS tokens:
`document_segments` gives segment ids (1, 2, ... per document piece, 0 on
padding) and positions (from 0 in each piece), as Grain's packing would.
Which tokens are real comes from Grain's segment ids of the groups (0 only
on padding), never from the ids: a Hugging Face tokenizer's id 0 is a real
token (GPT-2's '!').

The windows depend on neither the thread nor the worker count; the position
(the iterator's state) has a shape of its own for each worker count. Every record of an epoch goes
to exactly one process; windows run on across epoch ends. An evaluation split
is one pass in storage order.

`PackedDataset` turns the windows into the batches of txf.data's Dataset; its
position is the Grain iterator's state (a few integers: which group of
records, where in it, how many windows since), so a resumed run continues
with the very next window after re-reading at most one group. Resumed with
another window length, Grain cuts the windows since that position at the
new length: the stream continues new - old tokens after the next one
(skipping them; repeating old - new where the new is shorter).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from txf.data import seeding
from txf.data.dataset import Dataset
from txf.data.masking import BertMasker
from txf.data.spec import DataSpec
from txf.data.tfds_source import decode_text
from txf.data.tokenizers import Tokenizer, encode_checked

# Records per read (at most): one batched read of many records costs about as
# much as a single one (ArrayRecord and TFDS decoding have a large per-call
# overhead). The loader holds a few groups' tokens (2 + GROUPS_PER_THREAD *
# read_threads, and GROUPS_PER_THREAD per worker, with as many again in each
# worker process): a few MB for sentences (lm1b) or web pages (C4).
READ_GROUP = 256
# Groups each read thread, and each worker's output queue, keeps ready.
GROUPS_PER_THREAD = 2
TOKENS = "tokens"
# Grain's segment ids of the groups packed into a window: 1, 2, ... on their
# tokens, 0 on padding.
GROUPS = f"{TOKENS}_segment_ids"


class ProcessCountError(ValueError):
  """A packed stream's position saved by one number of processes, restored by another."""


class ReadDocuments:
  """Record ids int [n] -> {'tokens': int32 [m]}: the token ids of their
  non-empty texts, each followed by EOS, joined; None if all are empty (a
  Grain map function)."""

  def __init__(self, records: Sequence[Mapping[str, Any]], text_key: str, tokenizer: Tokenizer):
    self._records = records
    self._text_key = text_key
    self._tokenizer = tokenizer
    self._eos = np.array([tokenizer.eos_id], np.int32)

  def __call__(self, ids: np.ndarray) -> dict[str, np.ndarray] | None:
    ids = [int(i) for i in ids]
    read_many = getattr(self._records, "__getitems__", None)
    records = read_many(ids) if read_many else [self._records[i] for i in ids]
    parts = []
    for record in records:
      tokens = encode_checked(self._tokenizer, decode_text(record[self._text_key]))
      if len(tokens):
        parts += [tokens.astype(np.int32), self._eos]
    return {TOKENS: np.concatenate(parts)} if parts else None


def packed_windows(
  records: Sequence[Mapping[str, Any]],
  *,
  text_key: str,
  tokenizer: Tokenizer,
  window_len: int,
  rows: int,
  seed: int,
  shuffle: bool,
  process_index: int,
  process_count: int,
  read_threads: int,
  read_workers: int = 0,
):
  """This process's batches of packed windows, a grain.IterDataset.

  Each element: {'tokens': int32 [rows, window_len]} ([<= rows, window_len]
  for the last batch of a pass), plus Grain's segment features of the groups:
  GROUPS (> 0 on real tokens) and their positions (unused: see
  `document_segments`).

  Args:
    records: random-access records with a text feature `text_key`.
    shuffle: training: shuffled by (seeding.grain_seed(seed), epoch) and
      repeated forever; otherwise one pass in storage order.
    read_threads: threads reading groups ahead (0: read when the next
      window needs them).
    read_workers: processes reading and tokenizing the groups (0: this
      process does). Grain starts them at the first window (seconds).
  """
  # Imported here: only TFDS data needs grain (a 1 s import).
  import grain
  from grain import experimental

  ids = grain.MapDataset.range(len(records))
  if shuffle:
    ids = ids.shuffle(seed=seeding.grain_seed(seed)).repeat()
  # A group holds no more than a process's share of an epoch: a split of a
  # few long records (tiny_shakespeare is one) must not read many copies at once.
  group = min(READ_GROUP, -(-len(records) // process_count))
  groups = ids[process_index::process_count].batch(group)
  documents = groups.map(ReadDocuments(records, text_key, tokenizer)).to_iter_dataset(
    grain.ReadOptions(
      num_threads=read_threads, prefetch_buffer_size=GROUPS_PER_THREAD * read_threads
    )
  )
  if read_workers:
    _default_absl_flags()
    documents = documents.mp_prefetch(
      grain.MultiprocessingOptions(
        num_workers=read_workers, per_worker_buffer_size=GROUPS_PER_THREAD
      )
    )
  windows = experimental.ConcatThenSplitIterDataset(documents, length_struct={TOKENS: window_len})
  return windows.batch(rows, drop_remainder=False)


def _default_absl_flags() -> None:
  """Grain reads an absl flag when it starts workers; outside an absl program
  (a notebook, pytest) flags were never parsed: use their defaults."""
  from absl import flags

  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()


def document_segments(
  tokens_RxL: np.ndarray, real_RxL: np.ndarray, eos_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """Segment ids and positions, int32 [R, L], of rows of packed documents.

  A document (or the piece of one a row starts with) ends at its EOS; the
  next token starts the next one. Segment ids count the documents of a row
  from 1, positions count each one's tokens from 0; padding (real_RxL False,
  after a row's real tokens) gets 0.
  """
  starts_RxL = np.ones(tokens_RxL.shape, bool)
  starts_RxL[:, 1:] = tokens_RxL[:, :-1] == eos_id
  index_L = np.arange(tokens_RxL.shape[1], dtype=np.int32)
  first_RxL = np.maximum.accumulate(np.where(starts_RxL, index_L, 0), axis=1)
  segment_ids = np.where(real_RxL, np.cumsum(starts_RxL, axis=1, dtype=np.int32), 0)
  positions = np.where(real_RxL, index_L - first_RxL, 0)
  return segment_ids.astype(np.int32), positions.astype(np.int32)


def lm_batch(
  windows_RxW: np.ndarray, real_RxW: np.ndarray, *, eos_id: int, segmented: bool
) -> dict[str, np.ndarray]:
  """Next-token batch of packed windows of W = T + 1 tokens, real_RxW True on
  their real tokens (False on padding).

  Returns inputs, targets int32 [R, T] (targets = inputs shifted by one),
  weights float32 [R, T] (0 where the target is padding) and, if segmented,
  the inputs' `document_segments` as segment_ids and positions. A
  document's first token is the target of the previous document's EOS,
  whose query attends only its own document.
  """
  batch = {
    "inputs": windows_RxW[:, :-1],
    "targets": windows_RxW[:, 1:],
    "weights": real_RxW[:, 1:].astype(np.float32),
  }
  if segmented:
    batch["segment_ids"], batch["positions"] = document_segments(
      batch["inputs"], real_RxW[:, :-1], eos_id
    )
  return batch


def _to_json(state: Any) -> Any:
  """A Grain state with numpy integers as ints (JSON-serialisable)."""
  if isinstance(state, Mapping):
    return {key: _to_json(value) for key, value in state.items()}
  if isinstance(state, (list, tuple)):
    return [_to_json(value) for value in state]
  return int(state) if isinstance(state, np.integer) else state


def _from_json(state: Any) -> Any:
  """A Grain state read back from JSON: the slices of ConcatThenSplit's
  'remainder_slices' become tuples again (it compares them with tuples;
  every other list stays a list)."""
  if not isinstance(state, Mapping):
    return state
  return {
    key: (
      {name: tuple(bounds) for name, bounds in value.items()}
      if key == "remainder_slices"
      else _from_json(value)
    )
    for key, value in state.items()
  }


class PackedStream:
  """The Source a PackedDataset reads (`packed_windows` of the records, for
  the Dataset base class): iterated, not indexed by step."""

  num_batches = None  # as many as the split has (training: unbounded)

  def __init__(self, records: Sequence[Mapping[str, Any]], *, window_len: int, **kwargs):
    self.window_len = window_len
    self.windows = packed_windows(records, window_len=window_len, **kwargs)


class PackedDataset(Dataset):
  """This process's batches of packed documents (see the module docstring).

  Unlike txf.data.Dataset's other sources, each process streams and packs its
  own shard of the records, so its rows are not a slice of a global batch
  that another process could compute; together the processes still see
  every record of an epoch exactly once.

  Batches (B = data.batch_size / process_count, T = data.seq_len): for 'lm'
  `lm_batch` of windows of T + 1 tokens; for 'mlm' windows of T tokens
  BERT-masked (masking.py, keyed by the global step), plus segment_ids and
  positions. With data.attend_across_documents the batch has no segment_ids
  and positions: attention crosses documents in a window (GPT-2's recipe).

  Training never ends. An evaluation split restarts at every iter() and gives
  num_batches batches, padded with all-padding batches (weight 0) once its
  pass ends -- every process the same number, as the eval steps need -- or,
  with num_batches None, this process's pass.

  State: {'process_index', 'process_count', 'read_workers', 'step',
  'stream'} (the Grain iterator's); a checkpoint of a run of P > 1 processes holds
  {'processes': [the state of each]} (txf.train.distributed).
  """

  def __init__(
    self,
    records: Sequence[Mapping[str, Any]],
    *,
    spec: DataSpec,
    split: str,
    tokenizer: Tokenizer,
    seed: int,
    process_index: int,
    process_count: int,
    num_batches: int | None,
    description: str,
    masker: BertMasker | None,
  ):
    rows = spec.batch_size // process_count
    stream = PackedStream(
      records,
      text_key=spec.tfds_text_key,
      tokenizer=tokenizer,
      window_len=spec.seq_len + (masker is None),
      rows=rows,
      seed=seed,
      shuffle=split == "train",
      process_index=process_index,
      process_count=process_count,
      read_threads=spec.read_threads,
      # An evaluation restarts at every iter(): not worth starting workers.
      read_workers=spec.read_workers if split == "train" else 0,
    )
    # Not a Source (it is iterated, not indexed by step): this class overrides
    # every method of Dataset that reads the source's batches or state.
    super().__init__(
      stream,  # type: ignore[arg-type]
      spec=spec,
      split=split,
      tokenizer=tokenizer,
      process_index=process_index,
      process_count=process_count,
      num_batches=num_batches,
      description=description,
    )
    self._process = (process_index, process_count)
    self._workers = spec.read_workers if split == "train" else 0
    self._masker = masker
    self._segmented = not spec.attend_across_documents
    self._stream = stream
    self._iterator: Any = None  # a Grain DatasetIterator over the stream's windows
    self._closer: weakref.finalize  # closes it; set with it (_restart)
    self._exhausted = False

  def _restart(self) -> None:
    if self._iterator is not None:
      self._closer()  # stops its threads and worker processes
    self._iterator, self._exhausted, self._step = iter(self._stream.windows), False, 0
    # Also closed when the dataset is collected or the program exits, before
    # the interpreter tears down what Grain's cleanup needs.
    self._closer = weakref.finalize(self, self._iterator.close)

  def close(self) -> None:
    """Stops the iterator's read threads and worker processes; iterating
    again starts over (training: call set_state to continue)."""
    if self._iterator is not None:
      self._closer()
      self._iterator = None

  def __iter__(self) -> PackedDataset:
    if self.split != "train" or self._iterator is None:
      self._restart()
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.num_batches is not None and self._step >= self.num_batches:
      raise StopIteration
    if self._iterator is None:
      self._restart()
    windows = {}
    if not self._exhausted:
      try:
        windows = next(self._iterator)
      except StopIteration:
        self._exhausted = True
    if not windows and self.num_batches is None:
      raise StopIteration
    batch = self._batch(*self._padded(windows))
    self._step += 1
    return batch

  def _padded(self, windows: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The windows' tokens int32 [B, W] and which are real, bool [B, W]
    (windows: {} after the pass, none), with all-padding rows up to the
    batch size; padding holds the tokenizer's pad_id (the id an encoder
    masks, model.pad_id; Grain pads with 0, a real token of some
    vocabularies)."""
    none = np.zeros((0, self._stream.window_len), np.int32)
    tokens, groups = windows.get(TOKENS, none), windows.get(GROUPS, none)
    rows = ((0, self.batch_size - len(tokens)), (0, 0))
    real = np.pad(groups > 0, rows)
    return np.where(real, np.pad(tokens, rows), self.tokenizer.pad_id).astype(np.int32), real

  def _batch(self, windows_BxW: np.ndarray, real_BxW: np.ndarray) -> dict[str, np.ndarray]:
    eos_id = self.tokenizer.eos_id
    if self._masker is None:
      return lm_batch(windows_BxW, real_BxW, eos_id=eos_id, segmented=self._segmented)
    batch = self._masker(windows_BxW, real_BxW, self._step, self._rows, self.global_batch_size)
    if self._segmented:
      batch["segment_ids"], batch["positions"] = document_segments(windows_BxW, real_BxW, eos_id)
    return batch

  def get_state(self) -> dict[str, Any]:
    if self._iterator is None:
      self._restart()
    process_index, process_count = self._process
    return {
      "process_index": process_index,
      "process_count": process_count,
      "read_workers": self._workers,
      "step": self._step,
      "stream": _to_json(self._iterator.get_state()),
    }

  def set_state(self, state: dict[str, Any]) -> None:
    """Continues after `state`: this process's state, or {'processes': [...]}
    holding every process's.

    Raises:
      ProcessCountError: the state was saved by another number of processes
        (each packs its own shard, so no exact continuation exists).
      ValueError: `state` is not a state of this dataset.
    """
    process_index, process_count = self._process
    states = state.get("processes", [state]) if isinstance(state, dict) else None
    if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
      raise ValueError(f"state must be a packed stream state dict, got {state!r}")
    saved_count = states[0].get("process_count", len(states))
    if len(states) != process_count or saved_count != process_count:
      raise ProcessCountError(
        f"data position: the checkpoint continues a packed TFDS stream of {saved_count} "
        f"processes, and this run has {process_count}. Each process packs its own shard "
        f"of the records, so the stream continues exactly only on {saved_count} "
        "processes: resume with that many, or start a new --workdir"
      )
    mine = states[process_index]
    expected = {"process_index", "process_count", "read_workers", "step", "stream"}
    if set(mine) != expected or mine["process_index"] != process_index:
      raise ValueError(
        f"state of process {process_index} must have keys {sorted(expected)} "
        f"and process_index={process_index}, got {mine!r}"
      )
    if mine["read_workers"] != self._workers:
      raise ValueError(
        f"data.read_workers={self._workers}: the checkpoint's data position "
        f"is a stream read by {mine['read_workers']} workers; continue with "
        "that many"
      )
    self._restart()
    self._iterator.set_state(_from_json(mine["stream"]))
    self._step = mine["step"]
