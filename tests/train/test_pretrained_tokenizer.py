"""A run started from another txf run's weights reads text with that run's
tokenizer, known by its contents: its sentencepiece model is copied, not
trained again on the corpus as it is now (other ids for the same embedding
rows), and a tokenizer whose contents differ from the one the source run
recorded is refused in one line. A TFDS run records the dataset version it
reads. Cheap: no model is trained.
"""

import hashlib
import json
import types

import pytest
import tensorflow_datasets as tfds

from conftest import tiny_config
from tfds_builders import DocumentsBuilder
from txf.data import SentencePieceTokenizer
from txf.data.spec import parse_data
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir import record
from txf.train.pretrained import adopt_tokenizer
from txf.train.run_setup import fit_vocabulary

VOCAB = 512
MODEL = SentencePieceTokenizer.file_name(VOCAB)


class TxfVersionedDocuments(DocumentsBuilder):
  """A prepared TFDS dataset of version 1.2.0 (not TFDS's default 1.0.0)."""

  VERSION = tfds.core.Version("1.2.0")
  TRAIN_TEXTS = VALIDATION_TEXTS = ["a document\n"]


def sentencepiece_config(vocab_size=VOCAB, **fields):
  config = tiny_config(data__tokenizer="sentencepiece", data__sp_vocab_size=vocab_size, **fields)
  config.data.max_corpus_bytes = 20_000
  return config


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
  """A directory holding a txf run (config.json) and its sentencepiece model,
  trained on other text than the corpus (as if the corpus had changed since)."""
  directory = tmp_path_factory.mktemp("source")
  (directory / "config.json").write_text(json.dumps(dict(model={}, train={})))
  texts = [f"def f{i}(x):\n  return x * {i}\n" for i in range(300)]
  SentencePieceTokenizer.train(texts, VOCAB, directory / MODEL.removesuffix(".model"))
  return directory


def test_a_run_from_a_sentencepiece_run_uses_its_model_not_a_new_one(source_run, tmp_path):
  config = sentencepiece_config(train__init_from=str(source_run))
  run, _ = fit_vocabulary(parse(config), tmp_path)
  assert (tmp_path / MODEL).read_bytes() == (source_run / MODEL).read_bytes()
  assert run.model.vocab_size == SentencePieceTokenizer(source_run / MODEL).vocab_size


def test_a_model_in_the_workdir_that_differs_from_the_source_runs_is_refused(source_run, tmp_path):
  fit_vocabulary(parse(sentencepiece_config()), tmp_path)  # trained on the corpus: other ids
  trained = (tmp_path / MODEL).read_bytes()
  assert trained != (source_run / MODEL).read_bytes()
  with pytest.raises(ConfigError) as error:
    fit_vocabulary(parse(sentencepiece_config(train__init_from=str(source_run))), tmp_path)
  assert str(error.value) == (
    f"train.init_from: {tmp_path / MODEL} is not the sentencepiece model of {source_run}: "
    "its ids would differ from the ones the weights were trained on; use a new --workdir"
  )
  assert (tmp_path / MODEL).read_bytes() == trained  # nothing replaced


def test_a_source_run_without_that_model_is_refused(source_run, tmp_path):
  spec = parse_data(sentencepiece_config(vocab_size=600).data)
  with pytest.raises(ValueError, match=r"^train.init_from: .* holds no sentencepiece_600.model: "):
    adopt_tokenizer(spec, str(source_run), tmp_path)
  assert not (tmp_path / "sentencepiece_600.model").exists()


def check(init_from, tokenizer):
  """train.init_from's check of a txf run's tokenizer (setup_run's)."""
  record.check_recorded_tokenizer(init_from, tokenizer.sha256, "train.init_from")


def test_a_tokenizer_whose_contents_differ_from_the_recorded_one_is_refused(source_run, tmp_path):
  tokenizer = SentencePieceTokenizer(source_run / MODEL)
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(dict(model={}, train={})))
  check(str(run), tokenizer)  # a run recorded before tokenizers were: as before
  recorded = hashlib.sha256((source_run / MODEL).read_bytes()).hexdigest()
  entry = dict(tokenizer=dict(kind="sentencepiece", sha256=recorded))
  (run / record.RECORD_FILE).write_text(json.dumps([entry]))
  check(str(run), tokenizer)  # the same contents

  entry["tokenizer"]["sha256"] = "0" * 64
  (run / record.RECORD_FILE).write_text(json.dumps([entry]))
  with pytest.raises(ValueError) as error:
    check(str(run), tokenizer)
  assert str(error.value) == (
    f"train.init_from: the tokenizer's contents (sha256 {recorded}) differ from those "
    f"{run} trained with ({'0' * 64}): its ids would differ"
  )


def test_the_record_holds_the_tokenizers_hash(tmp_path):
  run, _ = fit_vocabulary(parse(sentencepiece_config()), tmp_path)
  expected = hashlib.sha256((tmp_path / MODEL).read_bytes()).hexdigest()
  assert record.tokenizer_description(run, tmp_path) == dict(kind="sentencepiece", sha256=expected)


def test_a_tfds_run_records_the_version_it_reads(tmp_path):
  """The version a bare 'tfds:<name>' resolves to: the one prepared."""
  tfds.builder(
    "txf_versioned_documents", data_dir=tmp_path, file_format="array_record"
  ).download_and_prepare()
  config = tiny_config(data__name="tfds:txf_versioned_documents", data__tfds_data_dir=str(tmp_path))
  config.data.tfds_text_key = "text"
  run = types.SimpleNamespace(data=parse_data(config.data))
  assert record.data_description(run)["tfds_version"] == "1.2.0"
