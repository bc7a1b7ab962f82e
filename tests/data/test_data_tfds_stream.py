"""TFDS language-model splits streamed through Grain, packed (txf.data.packed).

Offline: a small lm1b look-alike of known documents (each names itself,
'doc 07: ...'), really prepared as ArrayRecord in a temporary folder, read
through `tfds.data_source` as a run reads lm1b. Documents are recovered from
the batches (windows concatenated in stream order, cut at EOS), so every
test checks the tokens themselves:

* every document of an epoch reaches exactly one process, whole, once; the
  next epoch is another order of the same documents;
* segment ids and positions restart at every document: each segment of a row
  is one piece of one known document, positions counting from 0;
* a stream stopped mid-epoch and resumed from its (JSON) state gives the very
  batches an uninterrupted one gives, also past an epoch end, for any read
  thread count; worker processes give the same stream; a state of another
  process or worker count is refused;
* the evaluation split is one pass in storage order, padded (weight 0);
  with a Hugging Face tokenizer whose id 0 is a real token, weights, segment
  ids and positions follow the documents' lengths, not the ids;
* adjacent data seeds never read the same order of records in an epoch;
* memory stays bounded as the split grows (peak RSS in a subprocess);
* two JAX processes put both their states into the one data position a
  checkpoint saves (txf.train.distributed.gather_data_states).
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import REPO, assert_same_batches, take_batches
from tfds_builders import DocumentsBuilder, zero_is_a_word_tokenizer
from txf.data import ByteTokenizer, PackedDataset, ProcessCountError, make_dataset, throughput
from txf.data.spec import parse_data
from txf.data.stacked import StackedDatasets
from txf.data.text import masker

SEQ_LEN = 15  # windows of 16 tokens: many documents are cut across windows
BATCH = 6  # global rows: 6, 3 or 2 per process for 1, 2 or 3 processes
EOS = ByteTokenizer.eos_id

TRAIN_DOCS = [f"doc {i:02d}: " + "xyz " * (i % 7) * 3 for i in range(23)]
VALIDATION_DOCS = [f"val {i}" + "!" * (5 * i) for i in range(4)]
# Tokens per epoch: every document's bytes and its EOS.
EPOCH_TOKENS = sum(len(doc) + 1 for doc in TRAIN_DOCS)


class TxfTestDocuments(DocumentsBuilder):
  """TRAIN_DOCS / VALIDATION_DOCS, prepared offline as ArrayRecord."""

  TRAIN_TEXTS = TRAIN_DOCS
  VALIDATION_TEXTS = VALIDATION_DOCS


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = tmp_path_factory.mktemp("tfds")
  tfds.builder(
    "txf_test_documents", data_dir=directory, file_format="array_record"
  ).download_and_prepare()
  return str(directory)


def config(data_dir, **overrides):
  fields = dict(
    name="tfds:txf_test_documents",
    task="lm",
    tokenizer="bytes",
    seq_len=SEQ_LEN,
    batch_size=BATCH,
    tfds_data_dir=data_dir,
    read_threads=0,
    mlm_probability=0.15,
  )
  return parse_data({**fields, **overrides})


def windows_of(batches):
  """The lm batches' windows of SEQ_LEN + 1 tokens, [N, SEQ_LEN + 1] in stream order."""
  return np.concatenate([np.concatenate([b["inputs"], b["targets"][:, -1:]], 1) for b in batches])


def documents_of(windows):
  """The texts in a stream of windows: tokens in order, padding dropped, cut at EOS."""
  tokens = windows[windows != 0]
  ends = np.flatnonzero(tokens == EOS)
  return [ByteTokenizer().decode(doc) for doc in np.split(tokens, ends + 1)[:-1]]


def batches_for(tokens, rows):
  """Batches of `rows` windows that hold at least `tokens` tokens."""
  return -(-tokens // (rows * (SEQ_LEN + 1)))


@pytest.mark.parametrize("processes", [1, 2, 3])
def test_every_document_of_an_epoch_reaches_one_process_once(data_dir, processes):
  rows = BATCH // processes
  # Process p's k-th document is record k * P + p of the (endless) shuffled
  # order, which is epoch (k * P + p) // N.
  epochs = {0: [], 1: []}
  for p in range(processes):
    ds = make_dataset(config(data_dir), "train", seed=0, process_index=p, process_count=processes)
    # More than this process's share of two epochs, whatever documents it got.
    documents = documents_of(windows_of(take_batches(ds, batches_for(2 * EPOCH_TOKENS, rows))))
    for k, text in enumerate(documents):
      epoch = (k * processes + p) // len(TRAIN_DOCS)
      if epoch in epochs:
        epochs[epoch].append((k * processes + p, text))
  for epoch, found in epochs.items():
    assert sorted(text for _, text in found) == sorted(TRAIN_DOCS), epoch
  orders = [[text for _, text in sorted(found)] for found in epochs.values()]
  assert orders[0] != orders[1] and orders[0] != TRAIN_DOCS  # shuffled, anew each epoch


def check_segments(tokens, segment_ids, positions):
  """Each segment of a packed row is one run of tokens with positions 0, 1,
  ..., holding a piece of one document: a whole document closed by EOS, or
  the end of one (a row's first segment), or its start (a row's last)."""
  assert segment_ids[0] == 1 and np.all(np.diff(segment_ids) >= 0)
  for segment in range(1, segment_ids.max() + 1):
    where = np.flatnonzero(segment_ids == segment)
    np.testing.assert_array_equal(where, np.arange(where[0], where[0] + len(where)))
    np.testing.assert_array_equal(positions[where], np.arange(len(where)))
    piece = tokens[where]
    assert EOS not in piece[:-1]
    text = ByteTokenizer().decode(piece)
    closed = piece[-1] == EOS
    if segment == 1:  # may continue a document from the previous row
      assert any(doc.endswith(text) if closed else text in doc for doc in TRAIN_DOCS)
    elif closed:
      assert text in TRAIN_DOCS
    else:
      assert where[-1] == len(tokens) - 1 and any(doc.startswith(text) for doc in TRAIN_DOCS)


def test_lm_batches_are_shifted_windows_with_document_segments(data_dir):
  ds = make_dataset(config(data_dir), "train", seed=0)
  assert isinstance(ds, PackedDataset) and ds.task == "lm"
  assert "txf_test_documents" in ds.description
  documents = 0
  for batch in take_batches(ds, 4):
    assert set(batch) == {"inputs", "targets", "weights", "segment_ids", "positions"}
    assert batch["inputs"].shape == (BATCH, SEQ_LEN) and batch["inputs"].dtype == np.int32
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    np.testing.assert_array_equal(batch["weights"], 1.0)  # training windows are full
    for row in zip(batch["inputs"], batch["segment_ids"], batch["positions"]):
      check_segments(*row)
      documents += row[1].max()
  assert documents > 4 * BATCH  # rows hold several documents


def test_attending_across_documents_drops_the_segments(data_dir):
  packed = take_batches(make_dataset(config(data_dir), "train", seed=0), 3)
  across = take_batches(
    make_dataset(config(data_dir, attend_across_documents=True), "train", seed=0), 3
  )
  for batch, plain in zip(packed, across):
    assert set(plain) == {"inputs", "targets", "weights"}
    for key in plain:
      np.testing.assert_array_equal(plain[key], batch[key])


def test_mlm_windows_are_masked_with_segments(data_dir):
  ds = make_dataset(config(data_dir, task="mlm"), "train", seed=0)
  batch = next(ds)
  assert batch["inputs"].shape == (BATCH, SEQ_LEN)
  chosen = batch["weights"] > 0
  assert chosen.any() and (batch["targets"][chosen] != EOS).all()  # EOS is never masked
  np.testing.assert_array_equal(batch["inputs"][~chosen], batch["targets"][~chosen])
  for row in zip(batch["targets"], batch["segment_ids"], batch["positions"]):
    check_segments(*row)


def test_batches_depend_on_the_seed_not_on_the_read_threads(data_dir):
  first = take_batches(make_dataset(config(data_dir), "train", seed=3), 6)
  threaded = take_batches(make_dataset(config(data_dir, read_threads=3), "train", seed=3), 6)
  assert_same_batches(first, threaded)
  other = next(make_dataset(config(data_dir), "train", seed=4))
  assert not np.array_equal(first[0]["inputs"], other["inputs"])


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_resume_mid_epoch_yields_the_same_batches(data_dir, task):
  epoch_batches = batches_for(EPOCH_TOKENS, BATCH)
  original = make_dataset(config(data_dir, task=task), "train", seed=1)
  take_batches(original, epoch_batches - 2)  # mid-epoch; the next 5 cross its end
  state = json.loads(json.dumps(original.get_state()))  # as a checkpoint holds it
  resumed = make_dataset(config(data_dir, task=task, read_threads=2), "train", seed=1)
  resumed.set_state(state)
  assert_same_batches(take_batches(resumed, 5), take_batches(original, 5))
  assert resumed.get_state() == original.get_state()


@pytest.mark.parametrize(
  "overrides, shift",
  [
    (dict(batch_size=BATCH // 2), 0),
    (dict(seq_len=SEQ_LEN + 4), 4),
    (dict(seq_len=SEQ_LEN - 4), -4),
  ],
)
def test_resume_at_another_size_continues_the_token_stream(data_dir, overrides, shift):
  """docs/data.md: resumed with another data.batch_size the stream continues
  at its next token; with data.seq_len changed by d, Grain re-cuts the last
  window trained at the new length, so it continues d tokens later (d > 0
  skipped, d < 0 repeated)."""
  original = make_dataset(config(data_dir), "train", seed=1)
  trained = take_batches(original, 3)
  state = json.loads(json.dumps(original.get_state()))
  stream = windows_of(trained + take_batches(original, 3)).ravel()  # uninterrupted
  resumed = make_dataset(config(data_dir, **overrides), "train", seed=1)
  resumed.set_state(state)
  tokens = windows_of(take_batches(resumed, 2)).ravel()
  start = windows_of(trained).size + shift
  np.testing.assert_array_equal(tokens, stream[start : start + tokens.size])


@pytest.mark.slow
def test_worker_processes_give_the_same_stream_and_resume_it(data_dir):
  plain = make_dataset(config(data_dir), "train", seed=5)
  workers = make_dataset(config(data_dir, read_workers=2), "train", seed=5)
  assert_same_batches(take_batches(workers, 4), take_batches(plain, 4))
  state = json.loads(json.dumps(workers.get_state()))
  resumed = make_dataset(config(data_dir, read_workers=2), "train", seed=5)
  resumed.set_state(state)
  assert_same_batches(take_batches(resumed, 3), take_batches(plain, 3))
  # The position of a stream read by 2 workers has their shape.
  with pytest.raises(ValueError, match="data.read_workers=0: .* read by 2 workers"):
    make_dataset(config(data_dir), "train", seed=5).set_state(state)


def test_resume_needs_the_process_count_that_saved(data_dir):
  def shard(p, count):
    return make_dataset(config(data_dir), "train", seed=0, process_index=p, process_count=count)

  pair = [shard(p, 2) for p in range(2)]
  for ds in pair:
    take_batches(ds, 3)
  # What a checkpoint of two processes holds (txf.train.distributed).
  saved = json.loads(json.dumps({"processes": [ds.get_state() for ds in pair]}))
  for p, ds in enumerate(pair):
    resumed = shard(p, 2)
    resumed.set_state(saved)
    assert_same_batches(take_batches(resumed, 3), take_batches(ds, 3))
  with pytest.raises(ProcessCountError, match="stream of 2 processes.*this run has 1"):
    shard(0, 1).set_state(saved)
  single = json.loads(json.dumps(shard(0, 1).get_state()))
  with pytest.raises(ProcessCountError, match="stream of 1 processes.*this run has 2"):
    shard(1, 2).set_state(single)
  with pytest.raises(ValueError, match="state"):
    shard(0, 1).set_state({"step": 3})


def test_seed_replicas_resume_from_a_checkpoint_of_two_processes(data_dir):
  """replicas > 1 with data.seed_per_replica on two processes: the processes'
  stacked states differ, so the checkpoint holds {'processes': [each
  process's {'replicas': [...]}]}; each process's replicas continue from it."""
  seeds = (0, 1)

  def stacked(p):
    return StackedDatasets(
      [
        make_dataset(config(data_dir), "train", seed=s, process_index=p, process_count=2)
        for s in seeds
      ],
      seeds,
    )

  pair = [stacked(p) for p in range(2)]
  for ds in pair:
    take_batches(ds, 3)
  states = [ds.get_state() for ds in pair]
  assert states[0] != states[1]  # so gather_data_states saves both
  saved = json.loads(json.dumps({"processes": states}))
  for p, ds in enumerate(pair):
    resumed = stacked(p)
    resumed.set_state(saved)
    assert_same_batches(take_batches(resumed, 3), take_batches(ds, 3))
  with pytest.raises(ValueError, match=r"^state must be \{'replicas': .* or \{'processes'"):
    stacked(0).set_state({"processes": [states[0], {"replicas": states[1]["replicas"][:1]}]})


def test_eval_is_one_padded_pass_in_storage_order(data_dir):
  ds = make_dataset(config(data_dir), "validation", seed=0)
  first, second = list(ds), list(ds)  # every iter() starts over
  assert_same_batches(first, second)
  stored = tfds.data_source(
    "txf_test_documents", split="validation", data_dir=data_dir, download=False
  )
  assert documents_of(windows_of(first)) == [r["text"].decode() for r in stored]
  assert sorted(documents_of(windows_of(first))) == sorted(VALIDATION_DOCS)
  last = first[-1]
  padding = last["targets"] == 0
  assert padding.any()
  np.testing.assert_array_equal(last["weights"], ~padding)  # the loss ignores padding
  np.testing.assert_array_equal(last["segment_ids"][last["inputs"] == 0], 0)
  # With num_batches, every process gives that many: padding batches after the pass.
  padded = list(make_dataset(config(data_dir), "validation", seed=0, num_batches=len(first) + 2))
  assert_same_batches(padded[: len(first)], first)
  for batch in padded[len(first) :]:
    for key, value in batch.items():
      np.testing.assert_array_equal(value, 0, err_msg=key)


def test_evaluations_read_the_split_data_tfds_eval_split_names(data_dir):
  """lm1b has no validation split: evaluations read the one the field names
  (here a slice of train, which stores other documents); a split the
  dataset lacks is one error naming the field and the splits it has."""
  train_docs = [
    r["text"].decode()
    for r in tfds.data_source("txf_test_documents", split="train[:3]", data_dir=data_dir)
  ]
  evaluated = make_dataset(config(data_dir, tfds_eval_split="train[:3]"), "validation", seed=0)
  assert documents_of(windows_of(list(evaluated))) == train_docs
  assert set(train_docs).isdisjoint(VALIDATION_DOCS)  # the default split's documents
  with pytest.raises(
    ValueError,
    match=r"^data.name='tfds:txf_test_documents' \(data.tfds_eval_split='test'\): "
    r"Unknown split 'test'",
  ):
    make_dataset(config(data_dir, tfds_eval_split="test"), "validation", seed=0)


def test_adjacent_seeds_never_share_an_epoch_order(data_dir):
  # Grain shuffles epoch e with its seed + e: unhashed, seed s + 1's first
  # epoch would be seed s's second.
  orders = []
  for seed in range(4):
    ds = make_dataset(config(data_dir), "train", seed=seed)
    documents = documents_of(windows_of(take_batches(ds, batches_for(2 * EPOCH_TOKENS, BATCH))))
    n = len(TRAIN_DOCS)
    orders += [tuple(documents[:n]), tuple(documents[n : 2 * n])]
  assert len(set(orders)) == len(orders)


def packed_reference(documents, eos_id, window_len, rows):
  """The stream of `documents` (id arrays, each closed by eos_id) cut into
  `rows` windows of window_len, padded with 0, from the documents' lengths:
  tokens, real (bool), segment ids and positions, [rows, window_len]."""
  lengths = [len(document) + 1 for document in documents]

  def windows(values):
    return np.pad(values, (0, rows * window_len - len(values))).reshape(rows, window_len)

  tokens = windows(np.concatenate([np.append(document, eos_id) for document in documents]))
  real = windows(np.ones(sum(lengths), bool))
  index = windows(np.repeat(np.arange(len(lengths)), lengths))  # the document of each token
  place = windows(np.concatenate([np.arange(length) for length in lengths]))
  segments = np.where(real, index - index[:, :1] + 1, 0)
  # A row's first segment may continue a document: its positions restart at 0.
  positions = np.where(segments == 1, place - place[:, :1], place) * real
  return tokens, real, segments, positions


class TxfTestEmptyTexts(DocumentsBuilder):
  """A train split whose texts are all empty (a text key naming an unused feature)."""

  TRAIN_TEXTS = [""] * 5
  VALIDATION_TEXTS = ["", "abc"]


def test_a_train_split_of_empty_texts_is_an_error_naming_the_text_key(tmp_path):
  """Packing skips empty texts, so the endless training stream waited for a
  window without end (a run hung at its first step); an evaluation split of
  empty texts is all padding, as before."""
  tfds.builder(
    "txf_test_empty_texts", data_dir=tmp_path, file_format="array_record"
  ).download_and_prepare()
  spec = config(str(tmp_path), name="tfds:txf_test_empty_texts")
  with pytest.raises(ValueError, match=r"^data\.tfds_text_key='text': every text of the train"):
    make_dataset(spec, "train", seed=0)
  (batch,) = take_batches(make_dataset(spec, "validation", seed=0), 1)
  assert documents_of(windows_of([batch])) == ["abc"]


HF_TEXTS = ["a ! b", "! !", "c", "b a ! ! c a", "!", "a b c ! a b"]  # 25 tokens with EOS


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_real_token_zero_is_not_padding(task, tmp_path):
  # A Hugging Face vocabulary's id 0 is a real token (GPT-2's '!'); padding,
  # written as 0 too, is told apart by the stream's lengths.
  tokenizer = zero_is_a_word_tokenizer(tmp_path)
  rows, seq_len = 2, 7
  spec = parse_data(
    dict(
      name="tfds:hf_like",
      task=task,
      tokenizer="hf",
      tokenizer_path=str(tmp_path),
      seq_len=seq_len,
      batch_size=rows,
      read_threads=0,
      mlm_probability=0.9,
    )
  )
  ds = PackedDataset(
    [{"text": text.encode()} for text in HF_TEXTS],
    spec=spec,
    split="validation",
    tokenizer=tokenizer,
    seed=0,
    process_index=0,
    process_count=1,
    num_batches=3,  # 2 batches of windows, the last one part padding, then padding
    description="",
    masker=masker(spec, 0, tokenizer),
  )
  batches = list(ds)
  batch = {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
  window_len = seq_len + (task == "lm")
  documents = [tokenizer.encode(text) for text in HF_TEXTS]
  tokens, real, segments, positions = packed_reference(
    documents, tokenizer.eos_id, window_len, 3 * rows
  )
  filled = real.sum(axis=1)
  # What is tested: real 0s, a window part padding, a batch all padding.
  assert (tokens[real] == 0).any() and (filled % window_len).any() and not filled[-rows:].any()
  # Padding holds the tokenizer's pad id (this vocabulary's eos: it has no
  # pad token), not Grain's 0.
  assert tokenizer.pad_id != 0
  tokens = np.where(real, tokens, tokenizer.pad_id)
  if task == "lm":
    np.testing.assert_array_equal(batch["inputs"], tokens[:, :-1])
    np.testing.assert_array_equal(batch["targets"], tokens[:, 1:])
    np.testing.assert_array_equal(batch["weights"], real[:, 1:])
    tokens, real, segments, positions = (x[:, :-1] for x in (tokens, real, segments, positions))
  else:
    np.testing.assert_array_equal(batch["targets"], tokens)
    chosen = batch["weights"] > 0
    assert not chosen[~real].any() and chosen[real & (tokens == 0)].any()
  np.testing.assert_array_equal(batch["segment_ids"], segments)
  np.testing.assert_array_equal(batch["positions"], positions)


_PEAK_RSS = textwrap.dedent("""
    import resource, sys, types
    from txf.data import ByteTokenizer, PackedDataset
    from txf.data.spec import parse_data

    class Records:  # lm1b-like records (440 bytes) made on demand: only the loader holds memory
      def __init__(self, n):
        self._n = n
      def __len__(self):
        return self._n
      def __getitem__(self, i):
        return {'text': (f'record {i} ' * 40).encode()}

    n, seq_len = int(sys.argv[1]), 255  # records
    spec = parse_data(dict(
        name='tfds:lm_like', task='lm', tokenizer='bytes', seq_len=seq_len, batch_size=16,
        read_threads=2))
    ds = PackedDataset(Records(n), spec=spec, split='train', tokenizer=ByteTokenizer(),
                       seed=0, process_index=0, process_count=1, num_batches=None,
                       description='', masker=None)
    tokens = sum(len(Records(n)[i]['text']) + 1 for i in range(n))
    for _ in range(tokens // (16 * (seq_len + 1)) + 1):  # one epoch
      next(ds)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
""")


@pytest.mark.slow
def test_memory_stays_bounded_as_the_split_grows():
  def peak_kib(records):
    result = subprocess.run(
      [sys.executable, "-c", _PEAK_RSS, str(records)],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
      check=True,
    )
    return int(result.stdout.split()[-1])

  # One epoch each of 1280 and 12800 records (several groups of
  # packed.READ_GROUP, so both fill the loader's buffers): 0.56 MB and 5.6 MB
  # of text. A loader holding the split's tokens (int32) would add 20 MB; the
  # streaming one adds 0-2 MB (measured).
  small, large = peak_kib(1280), peak_kib(12800)
  assert large - small < 4 * 1024, (small, large)


_GATHER = textwrap.dedent("""
    import json, sys, jax
    jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))
    from txf.train.distributed import gather_data_states
    process = jax.process_index()
    print(json.dumps([gather_data_states({'step': 3, 'process_index': process}),
                      gather_data_states({'epoch': 1, 'position': 8})]))
""")


@pytest.mark.slow
def test_two_processes_save_both_states():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    address = f"localhost:{s.getsockname()[1]}"
  env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="1")
  processes = [
    subprocess.Popen(
      [sys.executable, "-c", _GATHER, address, str(i)],
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for i in range(2)
  ]
  try:
    outputs = [process.communicate(timeout=120) for process in processes]
  finally:
    for process in processes:
      process.kill()
  for process, (out, err) in zip(processes, outputs):
    assert process.returncode == 0, err[-2000:]
    per_process, shared = json.loads(out.strip().splitlines()[-1])
    # Different states: every process's, in process order; equal ones: as they are.
    assert per_process == {
      "processes": [{"step": 3, "process_index": 0}, {"step": 3, "process_index": 1}]
    }
    assert shared == {"epoch": 1, "position": 8}


def test_the_loader_benchmark_names_readers_only_where_a_stream_has_them(data_dir):
  """benchmarks.run data printed 'None worker processes and None read
  threads' for data made in its own process, and read_threads' default (4)
  for data that reads no records."""
  streamed = throughput.loader_throughput(config(data_dir, read_threads=2), batches=2)
  assert (streamed["read_workers"], streamed["read_threads"]) == (0, 2)
  assert "with 0 worker processes and 2 read threads" in throughput.format_throughput(streamed)
  made = throughput.loader_throughput(parse_data(dict(name="induction", batch_size=2)), batches=2)
  assert (made["read_workers"], made["read_threads"]) == (None, None)
  assert "tokens/s per host made in this process (2 batches" in throughput.format_throughput(made)
