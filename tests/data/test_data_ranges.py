"""Every generator's sampled parameters cover exactly their documented range.

A generator whose parameter silently stops reaching one end of its range (an
off-by-one in `rng.integers(low, high + 1)`, a bound passed through as the
wrong field) still gives well-formed batches, so every check of one example
passes. Here each generator draws a few hundred examples (numpy only) and the
set of values each sampled parameter takes must be exactly the range its
docstring states: both ends included, nothing outside.

RANGES is keyed by data.name (txf.data.spec.data_names()), so a new task fails
`test_sampled_parameters_cover_their_documented_range` until its entry says
what it samples; generators that are not a data.name are in OTHER_GENERATORS.
The row counts make a value of the range missing by chance unlikely
(each expected at least ~10 times; the draws are seeded, so a test that
passes keeps passing).
"""

from collections.abc import Callable

import numpy as np
import pytest

from txf.analysis import head_scores as heads
from txf.data import listops, make_dataset, spec as config, synthetic
from txf.data.masking import BertMasker
from txf.data.spec import parse_data

# label -> (values drawn, the documented range)
Ranges = dict[str, tuple[set, set]]


def first_batch(rows, **fields):
  """Batch 0 of the training split: `rows` examples of data config `fields`."""
  ds = make_dataset(parse_data(dict(fields, batch_size=rows)), "train", seed=0)
  return next(ds), ds.tokenizer


def values(array):
  return {int(v) for v in np.asarray(array).reshape(-1)}


def seq2seq(name):
  def draw() -> Ranges:
    low, high = 2, 8
    batch, tokenizer = first_batch(
      400, name=name, task="seq2seq", seq_len=high + 1, min_example_len=low, max_example_len=high
    )
    sources = batch["encoder_inputs"]
    return {
      "source length": (values((sources != 0).sum(1)), set(range(low, high + 1))),
      "source symbols": (
        values(sources[sources != 0]),
        values(tokenizer.encode(synthetic.ALPHABET)),
      ),
    }

  return draw


def addition() -> Ranges:
  """'a+b' of data.min_example_len..max_example_len characters; each operand
  has at least one digit and no leading zero unless it is a single digit."""
  low, high = 3, 7
  batch, tokenizer = first_batch(
    600,
    name="addition",
    task="seq2seq",
    seq_len=high + 1,
    min_example_len=low,
    max_example_len=high,
  )
  sources = [tokenizer.decode(row) for row in batch["encoder_inputs"]]
  operands = [operand for source in sources for operand in source.split("+")]
  return {
    "source length": ({len(s) for s in sources}, set(range(low, high + 1))),
    "(length, digits of the left operand)": (
      {(len(s), s.index("+")) for s in sources},
      {(length, left) for length in range(low, high + 1) for left in range(1, length - 1)},
    ),
    "a single-digit operand": ({int(o) for o in operands if len(o) == 1}, set(range(10))),
    "the first digit of a longer operand": (
      {int(o[0]) for o in operands if len(o) > 1},
      set(range(1, 10)),
    ),
  }


def parse_listops(tokens):
  """(nesting depth, [argument count of each operator]) of one expression."""
  depth, deepest, open_arguments, argument_counts = 0, 0, [], []
  for token in tokens:
    if token in listops.OPERATORS:
      if open_arguments:
        open_arguments[-1] += 1
      open_arguments.append(0)
      depth += 1
      deepest = max(deepest, depth)
    elif token == listops.END:
      argument_counts.append(open_arguments.pop())
      depth -= 1
    else:
      open_arguments[-1] += 1
  return deepest, argument_counts


def listops_ranges() -> Ranges:
  """Expressions of data.min_example_len..max_example_len tokens, nesting
  1..data.listops_max_depth operators (the root is 1), 2..10 arguments per
  operator, every operator and digit, labels 0..9."""
  low, high, depth = 4, 16, 3
  batch, tokenizer = first_batch(
    500,
    name="listops",
    task="classify",
    seq_len=high + 1,
    min_example_len=low,
    max_example_len=high,
    listops_max_depth=depth,
  )
  expressions = [tokenizer.decode(row).split() for row in batch["inputs"]]
  parsed = [parse_listops(tokens) for tokens in expressions]
  return {
    "expression length": ({len(tokens) for tokens in expressions}, set(range(low, high + 1))),
    "nesting depth": ({deepest for deepest, _ in parsed}, set(range(1, depth + 1))),
    "arguments per operator": (
      {n for _, counts in parsed for n in counts},
      set(range(2, listops.MAX_ARGS + 1)),
    ),
    "operators": (
      {t for tokens in expressions for t in tokens if t.startswith("[")},
      set(listops.OPERATORS),
    ),
    "digits": ({t for tokens in expressions for t in tokens if t.isdigit()}, set("0123456789")),
    "label": (values(batch["labels"]), set(range(listops.NUM_CLASSES))),
  }


def induction() -> Ranges:
  """Periods P in [data.min_example_len, data.max_example_len]; content ids
  3 .. num_symbols + 2."""
  low, high, num_symbols = 2, 7, 9
  batch, _ = first_batch(
    400,
    name="induction",
    task="lm",
    seq_len=2 * high + 2,
    min_example_len=low,
    max_example_len=high,
    num_symbols=num_symbols,
  )
  # Weight 1 from input position P on (the second copy of the block).
  periods = np.argmax(batch["weights"] > 0, axis=1)
  return {
    "period": (values(periods), set(range(low, high + 1))),
    "symbol ids": (values(batch["inputs"]), set(range(3, 3 + num_symbols))),
  }


def mqar() -> Ranges:
  """N pairs (keys from the lower half of the ids 3 .. num_symbols + 2, values
  from the upper half), each key queried once at an even offset after the
  pairs, anywhere up to the end of the row."""
  seq_len, pairs, num_symbols = 20, 3, 12
  batch, _ = first_batch(
    300, name="mqar", task="lm", seq_len=seq_len, num_kv_pairs=pairs, num_symbols=num_symbols
  )
  queried = batch["weights"] > 0
  rows, positions = np.nonzero(queried)
  slots = (seq_len + 1 - 2 * pairs) // 2
  half = 3 + num_symbols // 2
  return {
    "queries per row": (values(queried.sum(1)), {pairs}),
    "query position": (values(positions), set(range(2 * pairs, 2 * pairs + 2 * slots, 2))),
    "key ids": (values(batch["inputs"][rows, positions]), set(range(3, half))),
    "value ids": (values(batch["targets"][rows, positions]), set(range(half, 3 + num_symbols))),
    "ids of a row": (values(batch["inputs"]), set(range(3, 3 + num_symbols))),
  }


def bert_masking() -> Ranges:
  """pystdlib's only draws of a range: the 'random token' of BERT masking, any
  id but the specials (txf.data.masking)."""
  vocab, specials, mask_id = 12, (0, 1, 2, 3), 3
  masker = BertMasker(
    probability=0.9, mask_id=mask_id, vocab_size=vocab, special_ids=specials, seed=0
  )
  tokens = np.random.default_rng(0).integers(len(specials), vocab, (64, 64)).astype(np.int32)
  masked = masker(tokens, np.ones(tokens.shape, bool), 0, range(64), 64)
  replaced = (masked["inputs"] != tokens) & (masked["inputs"] != mask_id)
  return {
    "random replacement ids": (
      values(masked["inputs"][replaced]),
      set(range(vocab)) - set(specials),
    ),
    "selected positions": (values(masked["weights"]), {0, 1}),
  }


def probe_tokens() -> Ranges:
  """txf.analysis.head_scores.repeated_random_tokens: ids from [low, vocab_size), or
  from `ids`."""
  rng = np.random.default_rng(0)
  drawn = heads.repeated_random_tokens(rng, 200, 3, 12, low=5)
  ids = np.array([4, 7, 9, 11])
  from_ids = heads.repeated_random_tokens(rng, 100, 2, 12, ids=ids)
  return {
    "ids from [low, vocab_size)": (values(drawn), set(range(5, 12))),
    "ids from `ids`": (values(from_ids), values(ids)),
  }


RANGES: dict[str, Callable[[], Ranges]] = {
  "pystdlib": bert_masking,
  "copy": seq2seq("copy"),
  "reverse": seq2seq("reverse"),
  "sort": seq2seq("sort"),
  "addition": addition,
  "listops": listops_ranges,
  "induction": induction,
  "mqar": mqar,
}
OTHER_GENERATORS: dict[str, Callable[[], Ranges]] = {"induction_probe": probe_tokens}


def describe(drawn, documented):
  missing, outside = sorted(documented - drawn), sorted(drawn - documented)
  return f"never drawn: {missing[:10]}; drawn outside the range: {outside[:10]}"


@pytest.mark.parametrize("generator", [*config.data_names(), *OTHER_GENERATORS])
def test_sampled_parameters_cover_their_documented_range(generator):
  draw = RANGES.get(generator) or OTHER_GENERATORS.get(generator)
  assert draw is not None, (
    f"data.name={generator!r} has no entry in RANGES: write one that draws its "
    "examples and states the documented range of each parameter it samples"
  )
  for label, (drawn, documented) in draw().items():
    assert drawn == documented, f"{generator}: {label}: {describe(drawn, documented)}"


def test_every_entry_is_a_registered_generator():
  assert not set(RANGES) - set(config.data_names())
  assert not set(OTHER_GENERATORS) & set(config.data_names())
