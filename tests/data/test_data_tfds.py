"""TFDS datasets: seq2seq pairs, resume, sharding, eval, tokenizers, errors.

Offline. LM tests read a mocked 'tiny_shakespeare' (tfds.testing.mock_data
with known texts); the packed LM stream itself is tested in
test_data_tfds_stream.py. wmt14_translate's builder code imports TensorFlow, so it
cannot be mocked here; seq2seq tests read a small wmt-like builder defined
below ('de'/'en' features, config 'de-en'), really prepared as ArrayRecord
into a temporary folder, which also covers the unmocked read path.
"""

import json
import logging

import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import assert_same_batches, take_batches
from tfds_builders import TranslationBuilder, zero_is_a_word_tokenizer
from txf.data import SentencePieceTokenizer, make_dataset
from txf.data.spec import parse_data
from txf.data.tfds_source import TranslationSource, read_texts

SEQ_LEN = 15
BATCH = 4

# The mocked tiny_shakespeare: one record per text, as TFDS gives them (bytes).
TEXTS = {
  "train": [
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "First Citizen:\nYou are all resolved rather to die than to famish?\n"
    "\nAll:\nResolved. resolved.\n",
    "Second Citizen:\nWould you proceed especially against Caius Marcius? \u2014 Ay.\n",
  ],
  "validation": [
    "MENENIUS:\nWhat work's, my countrymen, in hand? where go you\nWith bats and clubs?\n",
  ],
  "test": ["CORIOLANUS:\nThanks. What's the matter, you dissentious rogues?\n"],
}


# The wmt-like translation dataset: (de, en) pairs.
TRAIN_PAIRS = [(f"Hund {i}", f"dog {i}") for i in range(11)] + [
  ("Der sehr lange Satz " * 3, "The very long sentence " * 3)
]
VALIDATION_PAIRS = [(f"Katze {i}", f"cat {i}") for i in range(5)]
TRANSLATION = "tfds:txf_test_translate/de-en"


class TxfTestTranslate(TranslationBuilder):
  """TRAIN_PAIRS / VALIDATION_PAIRS above, prepared offline as ArrayRecord."""

  TRAIN_PAIRS = TRAIN_PAIRS
  VALIDATION_PAIRS = VALIDATION_PAIRS


def _mock_prepared(monkeypatch, as_data_source):
  """mock_data whose builders read as_data_source(builder, split, ...)."""
  # mock_data fakes the records, not the prepared files the loader checks for.
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda _: True)
  return tfds.testing.mock_data(
    policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=as_data_source
  )


@pytest.fixture
def shakespeare(monkeypatch):
  """tiny_shakespeare mocked to hold TEXTS."""

  def as_data_source(builder, split, **kwargs):
    del builder, kwargs
    return [{"text": text.encode("utf-8")} for text in TEXTS[split]]

  with _mock_prepared(monkeypatch, as_data_source):
    yield


@pytest.fixture(scope="module")
def translation_dir(tmp_path_factory):
  """A data_dir holding TxfTestTranslate prepared as ArrayRecord."""
  data_dir = tmp_path_factory.mktemp("tfds")
  tfds.builder(
    TRANSLATION[len("tfds:") :], data_dir=data_dir, file_format="array_record"
  ).download_and_prepare()
  return str(data_dir)


def _config(**overrides):
  fields = dict(
    name="tfds:tiny_shakespeare",
    task="lm",
    tokenizer="bytes",
    seq_len=SEQ_LEN,
    batch_size=BATCH,
    max_corpus_bytes=100_000,
    mlm_probability=0.15,
  )
  return parse_data({**fields, **overrides})


def _translation_config(data_dir, **overrides):
  return _config(name=TRANSLATION, task="seq2seq", tfds_data_dir=data_dir, **overrides)


@pytest.fixture(params=["lm", "mlm", "seq2seq"])
def any_config(request):
  """A config of each task, with its dataset in place."""
  if request.param == "seq2seq":
    return _translation_config(request.getfixturevalue("translation_dir"))
  request.getfixturevalue("shakespeare")
  return _config(task=request.param)


def test_resume_yields_the_same_batches(any_config):
  original = make_dataset(any_config, "train", seed=1)
  take_batches(original, 5)  # past the end of the first epoch
  state = json.loads(json.dumps(original.get_state()))
  resumed = make_dataset(any_config, "train", seed=1)
  resumed.set_state(state)
  assert_same_batches(take_batches(resumed, 4), take_batches(original, 4))
  assert resumed.get_state() == original.get_state()


def test_seq2seq_resumes_at_another_batch_size_with_the_next_record(translation_dir):
  """The position is the records taken: resumed at a batch size that divides
  it, the rows are the uninterrupted run's next records; one that does not
  is refused naming data.batch_size. A state saved as {'step': n} (by runs
  before positions) resumes after n batches of the current size."""

  def dataset(batch_size):
    return make_dataset(
      _translation_config(translation_dir, batch_size=batch_size), "train", seed=1
    )

  def rows(batches):
    return np.concatenate([batch["encoder_inputs"] for batch in batches])

  original = dataset(BATCH)
  take_batches(original, 4)  # past the end of the first epoch (11 + 1 records)
  state = json.loads(json.dumps(original.get_state()))
  uninterrupted = rows(take_batches(original, 2))
  resumed = dataset(2 * BATCH)
  resumed.set_state(state)
  np.testing.assert_array_equal(rows(take_batches(resumed, 1)), uninterrupted)
  refused = rf"\['position'\]={4 * BATCH} is not the start of a batch of {3 * BATCH} records"
  with pytest.raises(ValueError, match=refused + r" \(data.batch_size\)"):
    dataset(3 * BATCH).set_state(state)
  old = dataset(BATCH)
  old.set_state({"step": 4})
  np.testing.assert_array_equal(rows(take_batches(old, 2)), uninterrupted)


def test_process_rows_concatenate_to_the_global_batch(translation_dir):
  # Seq2seq batches are functions of the step; lm/mlm streams are sharded by
  # record instead (test_data_tfds_stream.py).
  any_config = _translation_config(translation_dir)
  whole = take_batches(make_dataset(any_config, "train", seed=0), 4)
  parts = [
    take_batches(make_dataset(any_config, "train", seed=0, process_index=p, process_count=2), 4)
    for p in range(2)
  ]
  for step, batch in enumerate(whole):
    for key in batch:
      assert parts[0][step][key].shape[0] == BATCH // 2
      np.testing.assert_array_equal(np.concatenate([part[step][key] for part in parts]), batch[key])


def _decoded_pairs(batch, tokenizer):
  """(source, target) texts of the rows of weight > 0."""
  return [
    (tokenizer.decode(source), tokenizer.decode(target))
    for source, target, weights in zip(batch["encoder_inputs"], batch["targets"], batch["weights"])
    if weights.any()
  ]


def test_seq2seq_rows_are_the_split_pairs_in_a_new_order_each_epoch(translation_dir):
  seq_len = 12
  ds = make_dataset(_translation_config(translation_dir, seq_len=seq_len), "train", seed=0)
  assert ds.task == "seq2seq"
  assert "tfds_source_key='de', tfds_target_key='en'" in ds.description
  tok = ds.tokenizer
  epochs = []
  for _ in range(2):  # 12 pairs: 3 batches of 4 per epoch
    batches = take_batches(ds, 3)
    for b in batches:
      assert b["encoder_inputs"].shape == (BATCH, seq_len)
      np.testing.assert_array_equal(b["decoder_inputs"][:, 0], tok.bos_id)
      real = b["weights"] > 0
      np.testing.assert_array_equal(  # decoder inputs = targets shifted
        b["decoder_inputs"][:, 1:][real[:, 1:]], b["targets"][:, :-1][real[:, 1:]]
      )
      ends = real.sum(axis=1) - 1  # EOS closes every target
      np.testing.assert_array_equal(b["targets"][np.arange(BATCH), ends], tok.eos_id)
    epochs.append([p for b in batches for p in _decoded_pairs(b, tok)])
  long_de, long_en = TRAIN_PAIRS[-1]
  # Texts longer than the context are cut: source to seq_len, target to
  # seq_len - 1 tokens before EOS.
  expected = set(TRAIN_PAIRS[:-1]) | {(long_de[:seq_len], long_en[: seq_len - 1])}
  for pairs in epochs:
    assert sorted(pairs) == sorted(expected)
  assert epochs[0] != epochs[1]
  assert ds.get_state() == {"position": 6 * BATCH}


def test_adjacent_seeds_never_share_an_epoch_order(translation_dir):
  # Grain shuffles epoch e with its seed + e: unhashed, seed s + 1's first
  # epoch would be seed s's second.
  orders = []
  for seed in range(4):
    ds = make_dataset(_translation_config(translation_dir), "train", seed=seed)
    for _ in range(2):  # 12 pairs: 3 batches of 4 per epoch
      batches = take_batches(ds, 3)
      orders.append(tuple(p for b in batches for p in _decoded_pairs(b, ds.tokenizer)))
  assert len(set(orders)) == len(orders)


def test_seq2seq_weights_follow_the_lengths_not_the_ids(tmp_path):
  # A Hugging Face vocabulary's id 0 is a real token (GPT-2's '!'), and its
  # pad_id is its EOS: rows are padded with it, weights count the tokens.
  tokenizer = zero_is_a_word_tokenizer(tmp_path)
  pairs = [("a ! b", "! c"), ("c", "! ! a b"), ("b b", "")]
  source = TranslationSource(
    [{"de": de.encode(), "en": en.encode()} for de, en in pairs],
    keys=("de", "en"),
    tokenizer=tokenizer,
    seq_len=6,
    batch_size=4,
    seed=0,
    shuffle=False,
  )
  batch = source.batch(0, range(4))  # the 3 pairs and a padding row
  lengths = np.array([len(en.split()) + 1 for _, en in pairs] + [0])  # target + EOS
  real = np.arange(6) < lengths[:, None]
  np.testing.assert_array_equal(batch["weights"], real)
  eos = tokenizer.eos_id
  for row, (de, en) in enumerate(pairs):
    target = np.append(tokenizer.encode(en), eos)
    np.testing.assert_array_equal(batch["targets"][row, real[row]], target)
    np.testing.assert_array_equal(
      batch["encoder_inputs"][row, : len(de.split())], tokenizer.encode(de)
    )
  for key in ("targets", "decoder_inputs"):
    np.testing.assert_array_equal(batch[key][~real], tokenizer.pad_id, err_msg=key)
  source_lengths = np.array([len(de.split()) for de, _ in pairs] + [0])
  source_padding = np.arange(6) >= source_lengths[:, None]
  np.testing.assert_array_equal(batch["encoder_inputs"][source_padding], tokenizer.pad_id)


def test_seq2seq_eval_is_one_padded_pass(translation_dir):
  ds = make_dataset(_translation_config(translation_dir), "validation", seed=0)
  assert ds.num_batches == 2  # 5 pairs, batches of 4
  first, second = list(ds), list(ds)
  assert_same_batches(first, second)
  pairs = [p for b in first for p in _decoded_pairs(b, ds.tokenizer)]
  assert sorted(pairs) == sorted(VALIDATION_PAIRS)
  padding = {key: value[1:] for key, value in first[1].items()}
  for key, value in padding.items():
    np.testing.assert_array_equal(value, 0, err_msg=key)


def test_seq2seq_keys_choose_the_direction(translation_dir):
  ds = make_dataset(
    _translation_config(translation_dir, tfds_source_key="en", tfds_target_key="de"),
    "validation",
    seed=0,
  )
  pairs = _decoded_pairs(next(ds), ds.tokenizer)
  assert set(pairs) <= {(en, de) for de, en in VALIDATION_PAIRS}


def test_sentencepiece_is_trained_on_the_train_split(shakespeare, tmp_path):
  ds = make_dataset(
    _config(tokenizer="sentencepiece", sp_vocab_size=300), "train", seed=0, workdir=tmp_path
  )
  assert isinstance(ds.tokenizer, SentencePieceTokenizer)
  assert (tmp_path / "sentencepiece_300.model").exists()
  text = ds.tokenizer.decode(next(ds)["inputs"][0])
  assert text and text in "".join(TEXTS["train"])


class _Records:
  """Records that fail when read past `limit`: reading must stop early."""

  def __init__(self, texts, limit):
    self._texts, self._limit = texts, limit

  def __len__(self):
    return len(self._texts)

  def __getitem__(self, index):
    assert index < self._limit, f"read record {index}"
    return {"de": self._texts[index].encode(), "en": self._texts[index]}


def test_read_texts_stops_at_the_budget():
  records = _Records(["abc", "", "d\u00e9f", "never read"], limit=3)
  # 'é' is 2 bytes: 'déf' is 4; a cut through 'é' decodes to U+FFFD.
  assert read_texts(records, ["de"], 7) == ["abc", "d\u00e9f"]
  assert read_texts(records, ["de", "en"], 6) == ["abc", "abc"]
  assert read_texts(records, ["de"], 5) == ["abc", "d\ufffd"]
  assert read_texts(_Records(["ab"], 1), ["de"], 100) == ["ab"]


@pytest.mark.parametrize(
  "name", ["tfds:tiny_shakespeare", "tfds:wmt14_translate/de-en", "tfds:no_such_dataset"]
)
def test_unprepared_dataset_names_itself_and_how_to_prepare(name, tmp_path, caplog):
  data_dir = tmp_path / "empty"
  data_dir.mkdir()
  workdir = tmp_path / "run"
  task = "seq2seq" if "translate" in name else "lm"
  config = _config(
    name=name, task=task, tfds_data_dir=str(data_dir), tokenizer="sentencepiece", sp_vocab_size=300
  )
  with pytest.raises(ValueError) as error:
    make_dataset(config, "train", seed=0, workdir=workdir)
  message = str(error.value)
  assert f"data.name={name!r}" in message
  assert (
    f"tfds build {name[len('tfds:') :]} --data_dir={data_dir} --file_format=array_record"
  ) in message
  assert not workdir.exists()  # failed before training a tokenizer
  # The error is the one line: TFDS's warning of the folder it found empty
  # ("Variant folder ... has no dataset_info.json") came before it.
  assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_tfrecord_copy_names_the_conversion(monkeypatch):
  def as_data_source(builder, split, **kwargs):
    del builder, split, kwargs
    # What TFDS raises for a dataset prepared as TFRecord.
    raise NotImplementedError(
      "Random access data source for file format FileFormat.TFRECORD is not supported."
    )

  with _mock_prepared(monkeypatch, as_data_source):
    with pytest.raises(
      ValueError,
      match=r"data.name='tfds:tiny_shakespeare'.*"
      "tfds convert_format --dataset_version_dir=",
    ):
      make_dataset(_config(), "train", seed=0)


@pytest.mark.parametrize(
  "overrides, field",
  [
    (dict(name="tfds:"), "data.name"),
    (dict(name="tfds:/de-en"), "data.name"),
    (dict(task="classify"), "data.task"),
    (dict(name="tfds:lm1b", task="seq2seq"), "data.tfds_source_key"),
    (dict(name="tfds:lm1b", task="seq2seq", tfds_source_key="text"), "data.tfds_target_key"),
    (dict(name=TRANSLATION, task="seq2seq", tfds_target_key="de"), "data.tfds_target_key"),
    (dict(tfds_text_key=3), "data.tfds_text_key"),
    (dict(tfds_data_dir=""), "data.tfds_data_dir"),
    (dict(tokenizer="chars"), "data.tokenizer"),
  ],
)
def test_bad_tfds_field_is_named(overrides, field):
  with pytest.raises(ValueError, match=field):
    make_dataset(_config(**overrides), "train", seed=0)


def test_missing_feature_is_named(shakespeare):
  with pytest.raises(ValueError, match=r"data.tfds_text_key='content'.*'text'"):
    make_dataset(_config(tfds_text_key="content"), "train", seed=0)
