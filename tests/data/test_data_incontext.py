"""The in-context lm tasks (txf.data.incontext): 'induction' and 'mqar'.

Weights are checked against predictability computed independently from
each row: a target is predictable when its input token occurred earlier in
the row (induction: the block is repeated; MQAR: the input is a key seen in
the pairs) and the token that followed that occurrence is the target.
"""

import itertools

import ml_collections
import numpy as np
import pytest
import scipy.stats

from txf.data import incontext, make_dataset
from txf.data.incontext import repeat_periods
from txf.data.spec import parse_data

INDUCTION = dict(
  name="induction",
  task="lm",
  seq_len=40,
  batch_size=8,
  min_example_len=3,
  max_example_len=9,
  num_symbols=12,
)
MQAR = dict(name="mqar", task="lm", seq_len=48, batch_size=8, num_kv_pairs=6, num_symbols=20)


def batch(fields, split="train", step=0, seed=0):
  ds = make_dataset(parse_data(fields), split, seed=seed, num_batches=4)
  ds.set_state({"step": step})
  return next(iter(ds)), ds  # validation restarts at step 0


def copied_from_earlier(row):
  """bool [len(row) - 1]: input t's token occurred before t, followed by row[t + 1]."""
  flags = []
  for t in range(len(row) - 1):
    earlier = [s for s in range(t) if row[s] == row[t]]
    flags.append(bool(earlier) and row[earlier[-1] + 1] == row[t + 1])
  return np.array(flags)


def test_induction_weights_cover_exactly_the_second_copy_onwards():
  b, ds = batch(INDUCTION)
  np.testing.assert_array_equal(b["inputs"][:, 1:], b["targets"][:, :-1])
  for inputs, targets, weights in zip(b["inputs"], b["targets"], b["weights"]):
    row = np.append(inputs, targets[-1])
    period = int(np.argmax(weights))  # first weighted input position
    assert INDUCTION["min_example_len"] <= period <= INDUCTION["max_example_len"]
    np.testing.assert_array_equal(row[period:], row[: len(row) - period])  # repeats with P
    assert len(set(row[:period])) == period  # distinct symbols in a block
    np.testing.assert_array_equal(weights.astype(bool), copied_from_earlier(row))
  assert b["inputs"].min() >= 3 and b["inputs"].max() < ds.vocab_size == 3 + 12


def test_mqar_weights_cover_exactly_the_values_after_queried_keys():
  b, ds = batch(MQAR)
  N = MQAR["num_kv_pairs"]
  for inputs, targets, weights in zip(b["inputs"], b["targets"], b["weights"]):
    row = np.append(inputs, targets[-1])
    keys, values = row[0 : 2 * N : 2], row[1 : 2 * N : 2]
    assert len(set(keys)) == len(set(values)) == N and not set(keys) & set(values)
    queried = np.isin(inputs, keys) & (np.arange(len(inputs)) >= 2 * N)
    np.testing.assert_array_equal(weights.astype(bool), queried)
    assert weights.sum() == N  # every key queried once
    lookup = dict(zip(keys, values))
    assert all(targets[t] == lookup[inputs[t]] for t in np.nonzero(weights)[0])
  assert b["inputs"].min() >= 3 and b["inputs"].max() < ds.vocab_size


@pytest.mark.parametrize("fields", [INDUCTION, MQAR])
def test_batches_are_deterministic_and_splits_differ(fields):
  first, _ = batch(fields, step=3)
  again, _ = batch(fields, step=3)
  other, _ = batch(fields, split="validation")
  for key in first:
    np.testing.assert_array_equal(first[key], again[key])
  assert not np.array_equal(first["inputs"], other["inputs"])
  assert not np.array_equal(first["inputs"], batch(fields, seed=1, step=3)[0]["inputs"])


@pytest.mark.parametrize(
  "fields,message",
  [
    (dict(INDUCTION, max_example_len=13), r"^data.max_example_len=13 exceeds data.num_symbols"),
    (dict(INDUCTION, seq_len=16), r"^data.seq_len=16 is too small .* two copies"),
    (dict(INDUCTION, min_example_len=10), r"^data.min_example_len=10 exceeds"),
    (dict(INDUCTION, num_symbols=0), r"^data.num_symbols"),
    (dict(INDUCTION, task="mlm"), r"^data.task='mlm' does not fit"),
    (dict(MQAR, num_kv_pairs=11), r"^data.num_kv_pairs=11 exceeds data.num_symbols // 2"),
    (dict(MQAR, seq_len=22), r"^data.seq_len=22 is too small"),
    (dict(MQAR, num_kv_pairs=None), r"^data.num_kv_pairs: "),
    (dict(MQAR, num_kv_pairs=0), r"^data.num_kv_pairs"),
  ],
)
def test_bad_fields_are_refused_naming_them(fields, message):
  with pytest.raises(ValueError, match=message):
    make_dataset(parse_data(fields), "train", seed=0)


@pytest.mark.parametrize("offset, refused", [(-1, True), (0, False), (3, False), (4, True)])
def test_a_registered_row_task_takes_ids_of_exactly_its_symbols(offset, refused):
  """Ids first_id .. first_id + num_symbols - 1 (4 symbols) are taken, one
  past either end refused."""
  from conftest import scoped
  from txf import register
  from txf.data.spec import GENERATED

  def row(rng, seq_len, num_symbols, first_id):
    return np.full(seq_len + 1, first_id + offset), np.ones(seq_len, bool)

  fields = dict(name="edge", task="lm", seq_len=4, batch_size=2, num_symbols=4)
  with scoped(GENERATED):
    register.lm_task("edge")(row)
    if refused:
      with pytest.raises(ValueError, match=r"^data.name='edge': ids outside \[3, 7\)"):
        batch(fields)
    else:
      np.testing.assert_array_equal(batch(fields)[0]["inputs"], 3 + offset)


def test_repeat_periods_are_every_period_a_row_repeats_with():
  """Read off the rows themselves (40 batches of 8): a block tiled to fill
  a row repeats with every multiple of its length the row holds, not only
  with the block lengths 3..9 (a probe at 18 met rows of blocks 3, 6, 9)."""
  seen = set()
  for rows in itertools.islice(make_dataset(parse_data(INDUCTION), "train", seed=0), 40):
    tokens_RxL = np.concatenate([rows["inputs"], rows["targets"][:, -1:]], axis=1)
    for row in tokens_RxL:
      seen |= {q for q in range(1, len(row)) if np.array_equal(row[q:], row[:-q])}
  assert repeat_periods(ml_collections.ConfigDict(INDUCTION)) == tuple(sorted(seen))
  assert {18, 36, 27} <= seen and not {11, 13, 17, 19, 23} & seen
  assert repeat_periods(ml_collections.ConfigDict(MQAR)) == ()


@pytest.mark.parametrize(
  "row_weights, ids_dtype, message",
  [
    (np.full(16, 0.25), int, "gave weights other than 0 and 1"),  # read as True: a loss weight of 1
    (np.ones(16), float, "gave float64 ids, not ints"),
  ],
)
def test_a_registered_row_task_refuses_weights_and_ids_it_would_read_otherwise(
  row_weights, ids_dtype, message
):
  from conftest import scoped
  from txf import register
  from txf.data.spec import GENERATED

  def row(rng, seq_len, num_symbols, first_id):
    return (first_id + np.zeros(seq_len + 1)).astype(ids_dtype), row_weights

  with scoped(GENERATED):
    register.lm_task("constant")(row)
    fields = dict(name="constant", task="lm", seq_len=16, batch_size=2, num_symbols=4)
    with pytest.raises(ValueError, match=rf"^data.name='constant': its row function {message}"):
      batch(fields)
    register.lm_task("constant", replace=True)(
      lambda rng, seq_len, num_symbols, first_id: (np.full(seq_len + 1, first_id), [0, 1] * 8)
    )
    got, _ = batch(fields)
  assert got["inputs"].dtype == np.int32
  np.testing.assert_array_equal(got["weights"], np.tile([0.0, 1.0], (2, 8)))


def test_induction_takes_the_shortest_seq_len_whose_row_holds_two_blocks():
  """A row is seq_len + 1 tokens: 2 * max_example_len - 1 fits two blocks of
  the longest period (it was refused, one token stricter than its message)."""
  fields = dict(INDUCTION, min_example_len=9, max_example_len=9, seq_len=17)
  got, _ = batch(fields)
  row = np.concatenate([got["inputs"], got["targets"][:, -1:]], axis=1)  # the 18 tokens
  np.testing.assert_array_equal(row[:, 9:], row[:, :9])
  assert (np.argmax(got["weights"] > 0, axis=1) == 9).all() and got["weights"][:, 9:].all()
  with pytest.raises(ValueError, match=r"^data.seq_len=16 is too small for data.max_example_len=9"):
    batch(dict(fields, seq_len=16))


def test_mqar_takes_the_shortest_seq_len_whose_row_holds_pairs_and_queries():
  """A row of seq_len + 1 tokens holds N pairs and N queries at 4N - 1."""
  got, _ = batch(dict(MQAR, seq_len=4 * 6 - 1))
  assert got["inputs"].shape == (8, 23) and (got["weights"].sum(1) == 6).all()
  with pytest.raises(ValueError, match=r"^data.seq_len=22 is too small"):
    batch(dict(MQAR, seq_len=22))


def test_mqar_query_gaps_follow_the_power_law():
  """With one pair the query's slot g (1-based) is drawn with probability
  proportional to g ** (a - 1), zoology's power law: a chi-square test of
  4,000 rows against it (bins of at least 100 expected rows), at a 1e-4
  level. Only the set of query positions was tested: uniform gaps passed."""
  rng = np.random.default_rng(0)
  length, rows = 42, 4000
  slots = (length - 2) // 2
  gaps = np.array([(incontext.mqar_row(rng, length, 16, 1, 4)[1][0] - 2) // 2 for _ in range(rows)])
  g = np.arange(1, slots + 1, dtype=np.float64)
  p = g ** (incontext.MQAR_POWER_A - 1)
  p /= p.sum()
  # Pool the tail into bins of >= 100 expected rows each.
  edges, expected, total = [0], [], 0.0
  for i, mass in enumerate(p * rows):
    total += mass
    if total >= 100:
      edges.append(i + 1)
      expected.append(total)
      total = 0.0
  expected[-1] += total
  edges[-1] = slots
  observed = np.add.reduceat(np.bincount(gaps, minlength=slots), edges[:-1])
  statistic = ((observed - expected) ** 2 / expected).sum()
  assert statistic < scipy.stats.chi2.ppf(1 - 1e-4, len(expected) - 1), (observed, expected)
  assert observed[0] > 3 * observed[-1]  # the nearest slot is the likeliest, by far
