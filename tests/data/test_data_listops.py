"""ListOps: the evaluator, generated expressions and their batches."""

import statistics

import numpy as np
import pytest

from txf.data import listops, make_dataset
from txf.data.spec import parse_data


def _parse(tokens, start=0):
  """Parses from `start` into (operator, [arguments]) or int; -> (tree, end)."""
  token = tokens[start]
  if token in listops.OPERATORS:
    arguments, position = [], start + 1
    while tokens[position] != listops.END:
      argument, position = _parse(tokens, position)
      arguments.append(argument)
    return (token, arguments), position + 1
  return int(token), start + 1


def _value(tree):
  """LRA semantics: MED is int(np.median(...)), SM the sum mod 10."""
  if isinstance(tree, int):
    return tree
  operator, arguments = tree
  values = [_value(argument) for argument in arguments]
  return {
    "[MAX": max,
    "[MIN": min,
    "[SM": lambda v: sum(v) % 10,
    "[MED": lambda v: int(np.median(v)),
  }[operator](values)


def _depth(tree):
  if isinstance(tree, int):
    return 0
  return 1 + max(_depth(argument) for argument in tree[1])


@pytest.mark.parametrize(
  "text, expected",
  [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", max(2, 9, min(4, 7), 0)),
    ("[MIN 3 [MAX 1 0 ] 5 ]", min(3, max(1, 0), 5)),
    ("[SM 9 8 7 ]", (9 + 8 + 7) % 10),
    ("[MED 1 2 3 4 ]", statistics.median_low([1, 2, 4, 3])),  # 2.5 -> 2
    ("[MED 7 1 9 ]", statistics.median([7, 1, 9])),
    ("[MED 8 9 ]", 8),  # int(8.5)
    ("[SM [MED 2 6 5 ] [MAX 1 [SM 4 4 ] ] 3 ]", (5 + 8 + 3) % 10),
  ],
)
def test_evaluate_hand_checked(text, expected):
  assert listops.evaluate(text.split()) == expected


@pytest.mark.parametrize(
  "text", ["[MAX 1 2", "", "[MIN 3 ] ]", "[MAX ]", "[MIN 1 2 ] 3", "[MAX 1 x ]"]
)
def test_evaluate_rejects_malformed(text):
  with pytest.raises(ValueError, match="expression"):
    listops.evaluate(text.split())


def test_generated_expressions_match_independent_evaluator():
  rng = np.random.default_rng(0)
  labels = []
  for _ in range(300):
    tokens = listops.generate(rng, min_len=10, max_len=80, max_depth=3)
    tree, end = _parse(tokens)
    assert end == len(tokens)  # one complete expression
    assert 10 <= len(tokens) <= 80 and 1 <= _depth(tree) <= 3
    assert listops.evaluate(tokens) == _value(tree)
    labels.append(_value(tree))
  assert len(set(labels)) == 10


def test_length_distribution_matches_the_generator():
  # Depth 1: an operator and 2..10 digits, 4..12 tokens alike.
  np.testing.assert_allclose(
    listops.length_distribution(1, 14), [0] * 4 + [1 / 9] * 9 + [0] * 2, atol=1e-15
  )
  # Depth 2, by hand with LRA's operator probability 0.25 (2..10 arguments
  # with chance 1/9 each): 4 tokens are 2 digits, 5 are 3 digits, 7 are 5
  # digits or a digit and a 2-digit operator in either order (an operator's
  # arguments at depth 3 are digits).
  p, q = 0.25, 0.75
  np.testing.assert_allclose(
    listops.length_distribution(2, 7)[4:],
    [q**2 / 9, q**3 / 9, q**4 / 9, q**5 / 9 + 2 * q * (p / 9) / 9],
    rtol=1e-12,
  )
  # Deeper: the exact distribution against the lengths of 20k draws (5 sigma).
  max_depth, max_len, draws = 3, 60, 20_000
  uniform, lengths = listops._Uniforms(np.random.default_rng(0)), []
  for _ in range(draws):
    try:
      lengths.append(len(listops._draw(uniform, max_depth, max_len)))
    except listops._TooLong:
      pass
  counts = np.bincount(lengths, minlength=max_len + 1)
  expected = listops.length_distribution(max_depth, max_len)
  sigma = np.sqrt(expected * (1 - expected) / draws)
  assert np.all(np.abs(counts / draws - expected) <= 5 * sigma + 1e-12)
  kept = sum(length >= 10 for length in lengths) / draws  # of 10..60 tokens
  assert listops.acceptance(min_len=10, max_len=60, max_depth=3) == pytest.approx(kept, abs=0.01)


def test_too_rare_a_length_range_is_refused_before_drawing():
  # 72..122 tokens at depth 2: 5e-5 of the draws; the generator gave up
  # mid-run (100,000 draws) before the config check refused it.
  with pytest.raises(ValueError, match="data.min_example_len=72.*data.listops_max_depth=2"):
    _config(seq_len=128, min_example_len=72, max_example_len=122, listops_max_depth=2)
  assert listops.acceptance(min_len=72, max_len=122, max_depth=2) < listops.MIN_ACCEPTANCE


def test_longest_expression_bound():
  assert listops.longest_expression(1) == 12  # [OP + 10 digits + ]
  assert listops.longest_expression(2) == 2 + 10 * 12


def _config(**overrides):
  fields = dict(
    name="listops",
    task="classify",
    seq_len=65,
    batch_size=16,
    min_example_len=8,
    max_example_len=64,
    listops_max_depth=4,
  )
  return parse_data({**fields, **overrides})


def test_listops_batches():
  ds = make_dataset(_config(), "train", seed=0)
  assert (ds.task, ds.num_classes) == ("classify", 10)
  assert ds.vocab_size == 3 + 4 + 1 + 10
  batch = next(ds)
  assert set(batch) == {"inputs", "labels"}
  assert batch["inputs"].shape == (16, 65) and batch["inputs"].dtype == np.int32
  assert batch["labels"].shape == (16,) and batch["labels"].dtype == np.int32
  np.testing.assert_array_equal(batch["inputs"][:, 0], ds.tokenizer.bos_id)
  for ids, label in zip(batch["inputs"], batch["labels"]):
    tokens = ds.tokenizer.decode(ids).split()
    assert 8 <= len(tokens) <= 64
    assert (ids != 0).sum() == len(tokens) + 1  # BOS, tokens, then padding
    assert _value(_parse(tokens)[0]) == label


def test_listops_deterministic_and_sharded():
  whole = next(make_dataset(_config(), "train", seed=2))
  again = next(make_dataset(_config(), "train", seed=2))
  parts = [
    next(make_dataset(_config(), "train", seed=2, process_index=p, process_count=2))
    for p in range(2)
  ]
  for key in whole:
    np.testing.assert_array_equal(again[key], whole[key])
    np.testing.assert_array_equal(np.concatenate([part[key] for part in parts]), whole[key])
  other = next(make_dataset(_config(), "train", seed=3))
  assert not np.array_equal(other["inputs"], whole["inputs"])
