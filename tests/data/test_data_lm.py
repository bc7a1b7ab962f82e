"""Language-model batches: windows, determinism, resume, sharding, eval."""

import collections
import json

import numpy as np
import pytest

from conftest import assert_same_batches, take_batches
from txf.data import ByteTokenizer, load_corpus, make_dataset
from txf.data.lm import LanguageModelSource, token_stream
from txf.data.masking import BertMasker
from txf.data.spec import parse_data

SEQ_LEN = 31
BATCH = 16
CORPUS_BYTES = 20_000  # 625 windows of 32 tokens: 39 batches per epoch


def _config(**overrides):
  fields = dict(
    name="pystdlib",
    task="lm",
    tokenizer="bytes",
    seq_len=SEQ_LEN,
    batch_size=BATCH,
    max_corpus_bytes=CORPUS_BYTES,
  )
  return parse_data({**fields, **overrides})


def _windows(split="train"):
  """The split's windows of SEQ_LEN + 1 tokens, computed independently."""
  tokens = token_stream(load_corpus(split, max_bytes=CORPUS_BYTES), ByteTokenizer())
  n = len(tokens) // (SEQ_LEN + 1)
  return tokens[: n * (SEQ_LEN + 1)].reshape(n, SEQ_LEN + 1)


def test_token_stream_joins_documents_with_eos():
  tok = ByteTokenizer()
  stream = token_stream(["ab", "c"], tok)
  np.testing.assert_array_equal(
    stream, np.concatenate([tok.encode("ab"), [2], tok.encode("c"), [2]])
  )


def test_batches_are_shifted_windows_with_attributes():
  ds = make_dataset(_config(), "train", seed=0)
  assert (ds.task, ds.vocab_size, ds.num_classes) == ("lm", 260, None)
  assert isinstance(ds.tokenizer, ByteTokenizer)
  assert "Python" in ds.description
  batch = next(ds)
  assert set(batch) == {"inputs", "targets", "weights"}
  for key, dtype in [("inputs", np.int32), ("targets", np.int32), ("weights", np.float32)]:
    assert batch[key].shape == (BATCH, SEQ_LEN) and batch[key].dtype == dtype
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  np.testing.assert_array_equal(batch["weights"], 1.0)
  # Every row is one of the corpus's windows of seq_len + 1 tokens.
  windows = {row.tobytes() for row in _windows()}
  rows = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
  assert all(row.tobytes() in windows for row in rows)


def test_each_epoch_is_a_permutation_and_epochs_differ():
  ds = make_dataset(_config(), "train", seed=0)
  windows = _windows()
  per_epoch = len(windows) // BATCH
  epochs = [np.concatenate([b["inputs"] for b in take_batches(ds, per_epoch)]) for _ in range(2)]
  # Some windows repeat in the corpus (banner comments), so compare counts.
  available = collections.Counter(row.tobytes() for row in windows[:, :-1])
  for rows in epochs:
    used = collections.Counter(row.tobytes() for row in rows)
    assert used.total() == per_epoch * BATCH and not used - available
  assert not np.array_equal(epochs[0], epochs[1])
  assert ds.get_state() == {"epoch": 2, "position": 0}


def test_deterministic_across_constructions_and_seed_dependent():
  first = take_batches(make_dataset(_config(), "train", seed=3), 3)
  assert_same_batches(first, take_batches(make_dataset(_config(), "train", seed=3), 3))
  other = next(make_dataset(_config(), "train", seed=4))
  assert not np.array_equal(first[0]["inputs"], other["inputs"])


@pytest.mark.parametrize("task", ["lm", "mlm"])
@pytest.mark.parametrize("taken, crosses_epoch", [(5, False), (37, True)])
def test_resume_yields_the_same_batches(task, taken, crosses_epoch):
  config = _config(task=task, mlm_probability=0.15)
  original = make_dataset(config, "train", seed=1)
  take_batches(original, taken)
  state = json.loads(json.dumps(original.get_state()))
  resumed = make_dataset(config, "train", seed=1)
  resumed.set_state(state)
  assert_same_batches(take_batches(resumed, 4), take_batches(original, 4))
  assert resumed.get_state() == original.get_state()
  assert (original.get_state()["epoch"] > state["epoch"]) == crosses_epoch


@pytest.mark.parametrize("task", ["lm", "mlm"])
def test_process_rows_concatenate_to_the_global_batch(task):
  config = _config(task=task, mlm_probability=0.15)
  whole = take_batches(make_dataset(config, "train", seed=0), 2)
  parts = [
    take_batches(make_dataset(config, "train", seed=0, process_index=p, process_count=2), 2)
    for p in range(2)
  ]
  assert parts[0][0]["inputs"].shape == (BATCH // 2, SEQ_LEN)
  for step, batch in enumerate(whole):
    for key in batch:
      np.testing.assert_array_equal(np.concatenate([part[step][key] for part in parts]), batch[key])


def test_eval_is_one_padded_pass_repeated_identically():
  ds = make_dataset(_config(), "validation", seed=0)
  windows = _windows("validation")
  assert ds.num_batches == -(-len(windows) // BATCH)
  first, second = list(ds), list(ds)
  assert_same_batches(first, second)
  assert len(first) == ds.num_batches
  weights = np.concatenate([b["weights"] for b in first])
  inputs = np.concatenate([b["inputs"] for b in first])
  # Stream order, every window once, then rows of weight 0.
  np.testing.assert_array_equal(inputs[: len(windows)], windows[:, :-1])
  np.testing.assert_array_equal(weights[: len(windows)], 1.0)
  np.testing.assert_array_equal(weights[len(windows) :], 0.0)
  np.testing.assert_array_equal(inputs[len(windows) :], 0)


@pytest.mark.parametrize("masked", [False, True])
def test_eval_padding_rows_hold_the_pad_id(masked):
  """docs/data.md: padding holds the tokenizer's pad id (a Hugging Face
  tokenizer's is not 0: RoBERTa's 1); these rows were 0 whatever it was."""
  tokens = np.arange(3, 3 + 5 * 8, dtype=np.int32)  # 5 windows of 8: one batch of 4 and 1
  masker = (
    BertMasker(probability=0.5, mask_id=99, vocab_size=100, special_ids=[0, 1, 2], seed=0)
    if masked
    else None
  )
  source = LanguageModelSource(
    tokens, example_len=8, batch_size=4, seed=0, split="validation", masker=masker, pad_id=7
  )
  batch = source.batch(1, range(4))  # the pass's last batch: one window, three padding rows
  assert np.all(batch["inputs"][1:] == 7) and np.any(batch["weights"][0])
  assert not np.any(batch["weights"][1:])


def test_iter_continues_training():
  train = make_dataset(_config(), "train", seed=0)
  first = next(train)
  assert not np.array_equal(next(iter(train))["inputs"], first["inputs"])
  assert train.get_state() == {"epoch": 0, "position": 2 * BATCH}


def test_num_batches_limits_eval():
  ds = make_dataset(_config(), "test", seed=0, num_batches=2)
  assert ds.num_batches == 2 and len(list(ds)) == 2


@pytest.mark.parametrize(
  "state, message",
  [
    ({"epoch": 0}, "keys"),
    ({"epoch": 0, "position": 3}, "position"),
    ({"epoch": 0, "position": 10_000 * BATCH}, "position"),
    ({"epoch": -1, "position": 0}, "epoch"),
    ({"epoch": 0.5, "position": 0}, "epoch"),
    ({"epoch": True, "position": 0}, "epoch"),
    ({"step": 0}, "keys"),
  ],
)
def test_set_state_rejects_bad_states(state, message):
  ds = make_dataset(_config(), "train", seed=0)
  with pytest.raises(ValueError, match=message):
    ds.set_state(state)


def test_split_too_short_names_itself_and_what_helps():
  with pytest.raises(
    ValueError, match=r"the train split .* one batch of 16 \(lower data.batch_size"
  ):
    make_dataset(_config(max_corpus_bytes=200), "train", seed=0)
  # An evaluation split needs one window, not a batch: the batch size does not matter.
  assert len(list(make_dataset(_config(max_corpus_bytes=200), "validation", seed=0))) == 1
  with pytest.raises(
    ValueError,
    match=r"the validation split .* fewer than one example of 301 tokens \(lower data.seq_len",
  ) as error:
    make_dataset(_config(max_corpus_bytes=200, seq_len=300), "validation", seed=0)
  assert "batch_size" not in str(error.value)


def test_a_train_split_of_exactly_one_batch_is_accepted():
  tokens = np.arange(3, 3 + 4 * 8, dtype=np.int32)  # 4 windows of 8: one batch of 4
  source = LanguageModelSource(tokens, example_len=8, batch_size=4, seed=0, split="train")
  batch = source.batch(0, range(4))
  np.testing.assert_array_equal(np.sort(batch["inputs"][:, 0]), tokens[::8])
  with pytest.raises(ValueError, match="fewer than one batch of 5"):
    LanguageModelSource(tokens, example_len=8, batch_size=5, seed=0, split="train")


def test_leftover_windows_differ_between_epochs():
  """The windows skipped after an epoch's last full batch are drawn anew each
  epoch: over epochs every window is trained on, the last one included."""
  tokens = np.arange(5 * 4, dtype=np.int32)  # 5 windows of 4: 2 batches of 2, 1 left over
  source = LanguageModelSource(tokens, example_len=4, batch_size=2, seed=0, split="train")
  firsts = [source.batch(step, range(2))["inputs"][:, 0] for step in range(2 * 8)]
  seen = np.concatenate(firsts)
  np.testing.assert_array_equal(np.unique(seen), tokens[::4])
  for epoch in range(8):  # within an epoch no window repeats
    assert len(np.unique(seen[4 * epoch : 4 * epoch + 4])) == 4


def test_adjacent_seeds_never_share_an_epoch_order():
  """Seed s + 1's first epoch is not seed s's second (the order's key is
  (seed, epoch), not seed + epoch)."""
  tokens = np.arange(64 * 2, dtype=np.int32)
  make = lambda seed: LanguageModelSource(
    tokens, example_len=2, batch_size=64, seed=seed, split="train"
  )
  second_epoch = make(0).batch(1, range(64))["inputs"]
  assert not np.array_equal(make(1).batch(0, range(64))["inputs"], second_epoch)


def test_step_of_refuses_the_position_past_the_last_batch():
  tokens = np.arange(5 * 4, dtype=np.int32)  # 2 batches of 2 per epoch
  source = LanguageModelSource(tokens, example_len=4, batch_size=2, seed=0, split="train")
  assert source.step_of({"epoch": 1, "position": 2}) == 3
  # The epoch's end exactly is the next one's start: 4 windows taken in
  # batches of 1 (5 an epoch) resume in batches of 2 (2 an epoch, the fifth
  # dropped); it was refused, though 2 divides the 4 windows taken.
  assert source.step_of({"epoch": 0, "position": 4}) == 2
  with pytest.raises(ValueError, match="position"):
    source.step_of({"epoch": 0, "position": 6})
