"""Generated seq2seq tasks: correct targets, layout, determinism, resume."""

import numpy as np
import pytest

from txf.data import make_dataset, seeding
from txf.data.spec import parse_data
from txf.data.stacked import StackedDatasets

SEQ_LEN = 20
BATCH = 12


def _config(name, **overrides):
  fields = dict(
    name=name,
    task="seq2seq",
    seq_len=SEQ_LEN,
    batch_size=BATCH,
    min_example_len=3,
    max_example_len=12,
  )
  return parse_data({**fields, **overrides})


def _pairs(ds, batch):
  """Decoded (source, target) texts of a batch."""
  return [
    (ds.tokenizer.decode(src), ds.tokenizer.decode(tgt))
    for src, tgt in zip(batch["encoder_inputs"], batch["targets"])
  ]


def _check_addition(source, target):
  left, right = source.split("+")
  return int(target) == int(left) + int(right) and all(
    part == str(int(part)) for part in (left, right, target)
  )


CHECKS = {
  "copy": lambda source, target: target == source,
  "reverse": lambda source, target: target == source[::-1],
  "sort": lambda source, target: target == "".join(sorted(source)),
  "addition": _check_addition,
}


@pytest.mark.parametrize("task", sorted(CHECKS))
def test_targets_are_correct(task):
  ds = make_dataset(_config(task), "train", seed=0)
  assert ds.task == "seq2seq"
  lengths = []
  for _ in range(5):
    for source, target in _pairs(ds, next(ds)):
      assert CHECKS[task](source, target), (source, target)
      lengths.append(len(source))
  assert min(lengths) >= 3 and max(lengths) <= 12
  assert len(set(lengths)) > 3  # lengths vary


@pytest.mark.parametrize("task", sorted(CHECKS))
def test_batch_layout(task):
  ds = make_dataset(_config(task), "validation", seed=0, num_batches=1)
  batch = next(iter(ds))
  assert set(batch) == {"encoder_inputs", "decoder_inputs", "targets", "weights"}
  for key, array in batch.items():
    assert array.shape == (BATCH, SEQ_LEN), key
    assert array.dtype == (np.float32 if key == "weights" else np.int32), key
  tok = ds.tokenizer
  for row in range(BATCH):
    target = batch["targets"][row]
    length = int((target != tok.pad_id).sum())
    # target + EOS, then padding; decoder inputs are BOS + target.
    assert target[length - 1] == tok.eos_id
    np.testing.assert_array_equal(target[length:], tok.pad_id)
    np.testing.assert_array_equal(batch["decoder_inputs"][row, 0], tok.bos_id)
    np.testing.assert_array_equal(batch["decoder_inputs"][row, 1:length], target[: length - 1])
    np.testing.assert_array_equal(batch["decoder_inputs"][row, length:], 0)
    np.testing.assert_array_equal(batch["weights"][row, :length], 1.0)
    np.testing.assert_array_equal(batch["weights"][row, length:], 0.0)
    assert tok.eos_id not in batch["encoder_inputs"][row]


def test_deterministic_resumable_and_split_dependent():
  config = _config("reverse")
  a, b = (make_dataset(config, "train", seed=5) for _ in range(2))
  first = [next(a) for _ in range(3)]
  for batch in first:
    np.testing.assert_array_equal(next(b)["encoder_inputs"], batch["encoder_inputs"])
  assert not np.array_equal(first[0]["encoder_inputs"], first[1]["encoder_inputs"])
  assert a.get_state() == {"step": 3}
  resumed = make_dataset(config, "train", seed=5)
  resumed.set_state({"step": 2})
  np.testing.assert_array_equal(next(resumed)["targets"], first[2]["targets"])
  validation = make_dataset(config, "validation", seed=5, num_batches=1)
  assert not np.array_equal(next(validation)["encoder_inputs"], first[0]["encoder_inputs"])


def test_rows_and_all_three_splits_draw_their_own_examples():
  """example_rng's key holds the split and the row: a batch's rows are not
  one example repeated, and train, validation and test differ pairwise."""
  config = _config("copy", min_example_len=8, max_example_len=12)
  batches = {
    split: next(make_dataset(config, split, seed=0, num_batches=1))["encoder_inputs"]
    for split in ("train", "validation", "test")
  }
  for split, batch in batches.items():
    assert len({row.tobytes() for row in batch}) == BATCH, split
  assert not np.array_equal(batches["validation"], batches["test"])
  assert not np.array_equal(batches["train"], batches["test"])


def test_the_mask_key_is_not_a_shuffle_key():
  """seeding pads short keys with zeros: mask_rng(s, k) without its nonzero
  tag, or with a tag of 0, would draw shuffle_rng(s, k)'s stream."""
  for step in (0, 5):
    mask = seeding.mask_rng(3, step).random(4)
    assert not np.array_equal(mask, seeding.shuffle_rng(3, step).random(4))


def test_eval_repeats_and_process_rows_concatenate():
  config = _config("addition")
  ds = make_dataset(config, "test", seed=0, num_batches=2)
  first, second = list(ds), list(ds)
  assert len(first) == 2
  for x, y in zip(first, second):
    np.testing.assert_array_equal(x["encoder_inputs"], y["encoder_inputs"])
  parts = [
    next(make_dataset(config, "test", seed=0, process_index=p, process_count=3, num_batches=2))
    for p in range(3)
  ]
  for key in first[0]:
    np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), first[0][key])


def test_stacked_datasets_hold_each_seeds_batches_and_positions():
  """Seed replicas' own batches (txf.data.stacked): field r of each stacked
  batch is the batch of seed 5 + r, the state holds each position, and a
  state for another replica count is refused naming the expected form."""
  config = _config("reverse")
  stacked = StackedDatasets([make_dataset(config, "train", seed=s) for s in (5, 6)], (5, 6))
  first = [next(stacked) for _ in range(2)]
  for r, seed in enumerate((5, 6)):
    single = make_dataset(config, "train", seed=seed)
    for batch in first:
      np.testing.assert_array_equal(batch["encoder_inputs"][r], next(single)["encoder_inputs"])
  assert first[0]["targets"].shape[:2] == (2, BATCH)
  assert stacked.get_state() == {"replicas": [{"step": 2}, {"step": 2}]}
  assert stacked.batch_size == BATCH and stacked.task == "seq2seq"
  resumed = StackedDatasets([make_dataset(config, "train", seed=s) for s in (5, 6)], (5, 6))
  resumed.set_state({"replicas": [{"step": 1}, {"step": 0}]})
  batch = next(resumed)
  np.testing.assert_array_equal(batch["targets"][0], first[1]["targets"][0])
  np.testing.assert_array_equal(batch["targets"][1], first[0]["targets"][1])
  for state in ({"step": 2}, {"replicas": [{"step": 2}]}, {"replicas": {"step": 2}}):
    with pytest.raises(ValueError, match=r"^state must be \{'replicas': \[one data position"):
      resumed.set_state(state)
  with pytest.raises(ValueError, match="one dataset per seed, two or more"):
    StackedDatasets([make_dataset(config, "train", seed=5)], (5,))


class _Replica:
  """A dataset stand-in that records what StackedDatasets asks of it."""

  def __init__(self, seed, num_batches):
    self.seed, self.num_batches, self.description = seed, num_batches, "toy data"
    self.step, self.state, self.closed = 0, None, False

  def __iter__(self):
    self.step = 0
    return self

  def __next__(self):
    self.step += 1
    return {"inputs": np.array([self.seed, self.step])}

  def set_state(self, state):
    self.state = state

  def close(self):
    self.closed = True


def test_stacked_datasets_restart_route_close_and_describe_every_replica():
  """Every replica restarts at iter(), gets its own positions of each
  process's state, is closed; the count and description cover all R."""
  replicas = [_Replica(5, 4), _Replica(6, 3)]
  stacked = StackedDatasets(replicas, (5, 6))
  assert stacked.num_batches == 3
  assert stacked.description == "toy data; replica r reads data seed 5 + r"
  next(stacked)
  np.testing.assert_array_equal(next(iter(stacked))["inputs"], [[5, 1], [6, 1]])
  processes = [{"replicas": [{"p": 0, "r": 0}, {"p": 0, "r": 1}]}, {"replicas": ["p1r0", "p1r1"]}]
  stacked.set_state({"processes": processes})
  assert replicas[0].state == {"processes": [{"p": 0, "r": 0}, "p1r0"]}
  assert replicas[1].state == {"processes": [{"p": 0, "r": 1}, "p1r1"]}
  with pytest.raises(ValueError, match=r"^state must be \{'replicas'"):
    stacked.set_state({"replicas": [{}, {}], "step": 1})
  stacked.close()
  assert all(replica.closed for replica in replicas)


@pytest.mark.slow  # 600 training batches of three tasks (about 10 s)
def test_the_validation_examples_the_default_lengths_repeat_from_training_are_the_docs_counts():
  """docs/data.md and txf.data.synthetic state how many of 256 validation
  examples 600 default steps of 32 rows train on (they said none)."""
  from txf.data import make_dataset, parse_data

  for name, task, documented in [
    ("listops", "classify", 73),
    ("addition", "seq2seq", 7),
    ("copy", "seq2seq", 1),
  ]:
    spec = parse_data(dict(name=name, task=task))
    key = "inputs" if task == "classify" else "encoder_inputs"
    train = iter(make_dataset(spec, "train", seed=0))
    seen = {row.tobytes() for _ in range(600) for row in next(train)[key]}
    validation = make_dataset(spec, "validation", seed=0, num_batches=8)
    rows = [row.tobytes() for batch in validation for row in batch[key]]
    assert (len(rows), sum(row in seen for row in rows)) == (256, documented), name
