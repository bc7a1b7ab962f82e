"""make_dataset input checks: each bad field or argument is named, early."""

import dataclasses

import ml_collections
import numpy as np
import pytest

from txf.configs.base import get_config
from txf.data import DataSpec, corpus, make_dataset
from txf.data.spec import parse_data


@pytest.fixture(autouse=True)
def no_corpus_reads(monkeypatch):
  """Checks must fail before any data is read."""

  def fail(*args, **kwargs):
    raise AssertionError("read the corpus before checking the arguments")

  monkeypatch.setattr(corpus, "load_corpus", fail)


def _data(**overrides):
  """The base config's data fields with `overrides`, parsed."""
  return parse_data({**get_config().data.to_dict(), **overrides})


SEQ2SEQ = dict(name="copy", task="seq2seq")
LISTOPS = dict(name="listops", task="classify", seq_len=64, max_example_len=60)


@pytest.mark.parametrize(
  "overrides, field",
  [
    (dict(name="wikitext"), "data.name"),
    (dict(task="seq2seq"), "data.task"),
    (dict(name="sort", task="lm"), "data.task"),
    (dict(name="listops", task="seq2seq"), "data.task"),
    (dict(tokenizer="chars"), "data.tokenizer"),
    (dict(tokenizer="sentencepiece", sp_vocab_size=100), "data.sp_vocab_size"),
    (dict(seq_len=1), "data.seq_len"),
    (dict(seq_len=16.0), "data.seq_len"),
    (dict(batch_size=0), "data.batch_size"),
    (dict(max_corpus_bytes=0), "data.max_corpus_bytes"),
    (dict(task="mlm", mlm_probability=1.5), "data.mlm_probability"),
    (dict(task="mlm", mlm_probability=0.0), "data.mlm_probability"),
    (dict(**SEQ2SEQ, min_example_len=0), "data.min_example_len"),
    (dict(**SEQ2SEQ, min_example_len=9, max_example_len=8), "data.min_example_len"),
    (dict(name="addition", task="seq2seq", min_example_len=2), "data.min_example_len"),
    (dict(**SEQ2SEQ, seq_len=16, max_example_len=16), "data.seq_len"),
    (dict(**LISTOPS, listops_max_depth=0), "data.listops_max_depth"),
    (
      dict(**LISTOPS, listops_max_depth=1, min_example_len=13),
      r"^data.min_example_len=13 exceeds 12 tokens, the longest",
    ),
    (
      dict(name="listops", task="classify", max_example_len=3),
      r"^data.max_example_len=3 is below 4 tokens, the shortest",
    ),
    (dict(name="listops", task="classify", seq_len=32, max_example_len=40), "data.seq_len"),
    # Possible lengths, but too rare to draw (listops.MIN_ACCEPTANCE).
    (
      dict(**LISTOPS, min_example_len=55, listops_max_depth=2),
      r"data.min_example_len=55\.\.data.max_example_len=60: .*data.listops_max_depth=2",
    ),
  ],
)
def test_bad_field_is_named(overrides, field):
  with pytest.raises(ValueError, match=field):
    make_dataset(_data(**overrides), "train", seed=0)


def test_a_field_left_out_takes_its_default_and_a_read_none_is_named():
  data = dict(name="copy", task="seq2seq", seq_len=32, batch_size=4, max_example_len=8)
  assert parse_data(data).min_example_len == DataSpec().min_example_len == 4
  with pytest.raises(ValueError, match="data.min_example_len"):
    parse_data({**data, "min_example_len": None})
  with pytest.raises(ValueError, match=r"^data\.bogus: unknown field"):
    parse_data({**data, "bogus": 1})


def test_the_spec_keeps_only_the_fields_its_dataset_reads():
  data = dict(
    name="sort", task="seq2seq", seq_len=16, batch_size=4, min_example_len=2, max_example_len=8
  )
  unread = {field.name: None for field in dataclasses.fields(DataSpec)}
  assert parse_data({**get_config().data.to_dict(), **data}) == DataSpec(
    **{**unread, **data, "seed_per_replica": False}
  )
  assert parse_data(ml_collections.ConfigDict(data)) == parse_data(data)


@pytest.mark.parametrize(
  "kwargs, argument",
  [
    (dict(split="dev"), "split"),
    (dict(seed=-1), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(process_count=0), "process_count"),
    (dict(process_index=2, process_count=2), "process_index"),
    (dict(process_count=3), "process_count"),  # 32 rows over 3 processes
    (dict(num_batches=0), "num_batches"),
    (dict(workdir=None, data=dict(tokenizer="sentencepiece")), "workdir"),
    (dict(split="validation", data=SEQ2SEQ), "num_batches"),
  ],
)
def test_bad_argument_is_named(kwargs, argument):
  kwargs = {"split": "train", "seed": 0, **kwargs}
  data = _data(**kwargs.pop("data", {}))
  with pytest.raises(ValueError, match=argument):
    make_dataset(data, kwargs.pop("split"), **kwargs)


def test_base_config_builds_every_task(monkeypatch):
  """The default fields of configs/base.py fit each dataset."""
  monkeypatch.undo()  # the corpus may be read here
  cases = [
    dict(),
    dict(task="mlm"),
    SEQ2SEQ,
    dict(name="addition", task="seq2seq"),
    dict(name="listops", task="classify"),
  ]
  for overrides in cases:
    data = get_config().data
    data.update(max_corpus_bytes=50_000, **overrides)
    ds = make_dataset(parse_data(data), "train", seed=0)
    batch = next(ds)
    assert all(isinstance(v, np.ndarray) for v in batch.values())
    assert ds.task == data.task
