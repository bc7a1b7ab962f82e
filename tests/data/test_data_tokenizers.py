"""Tokenizers: round trips, special ids, sentencepiece training and caching;
data.tokenizer's registry (each entry its own ids, one registered from user code)."""

import dataclasses
import hashlib
import json
import shutil

import numpy as np
import pytest

from conftest import FIXTURES, tiny_config
from txf import register
from txf.data import (
  ByteTokenizer,
  HFTokenizer,
  SentencePieceTokenizer,
  SymbolTokenizer,
  make_dataset,
  make_tokenizer,
  tokenizers as tokenizers_module,
)
from txf.data.spec import TOKENIZERS, parse_data
from txf.data.tokenizers import hf_tokenizer_files
from txf.runconfig.run_config import parse
from txf.train.run_setup import fit_vocabulary

TEXTS = [
  "def add(a, b):\n    return a + b\n",
  "  leading spaces,\ttabs and trailing spaces  \n\n",
  "naïve café — 中文 and emoji 🙂\r\n",
  "",
]


def _training_texts():
  words = ["alpha", "beta", "gamma", "delta", "return", "def", "class", "self"]
  rng = np.random.default_rng(0)
  return [" ".join(rng.choice(words, size=12)) + ":\n    pass\n" for _ in range(200)]


@pytest.fixture(scope="module")
def sp_model_prefix(tmp_path_factory):
  prefix = tmp_path_factory.mktemp("sp") / "tiny"
  SentencePieceTokenizer.train(_training_texts(), 300, prefix)
  return prefix


@pytest.mark.parametrize("text", TEXTS)
def test_byte_round_trip(text):
  tok = ByteTokenizer()
  ids = tok.encode(text)
  assert ids.dtype == np.int32
  assert len(ids) == len(text.encode("utf-8"))
  assert ids.min(initial=tok.vocab_size) >= 4 and ids.max(initial=0) < 260
  assert tok.decode(ids) == text


def test_byte_decode_skips_specials_and_replaces_bad_utf8():
  tok = ByteTokenizer()
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 1, 2, 3)
  assert tok.vocab_size == 260
  ids = np.concatenate(
    [[tok.bos_id], tok.encode("hé"), [tok.mask_id], tok.encode("!"), [tok.eos_id, tok.pad_id]]
  )
  assert tok.decode(ids) == "hé!"
  # A lone continuation byte (0x80) is not UTF-8.
  assert tok.decode([0x80 + 4]) == "\ufffd"


def test_symbol_tokenizer():
  chars = SymbolTokenizer("abc")
  assert chars.vocab_size == 6 and chars.mask_id is None
  np.testing.assert_array_equal(chars.encode("cab"), [5, 3, 4])
  assert chars.decode([1, 5, 3, 0, 2, 4]) == "cab"
  words = SymbolTokenizer(["[MAX", "]", "7"], separator=" ")
  assert words.decode(words.encode("[MAX 7 7 ]")) == "[MAX 7 7 ]"
  with pytest.raises(ValueError, match="outside the vocabulary"):
    chars.encode("abz")


@pytest.mark.parametrize("text", TEXTS + ["unseen: Ω∑ ü\x00"])
def test_sentencepiece_round_trip(sp_model_prefix, text):
  tok = SentencePieceTokenizer(f"{sp_model_prefix}.model")
  ids = tok.encode(text)
  assert ids.dtype == np.int32
  assert tok.decode(ids) == text
  assert not set(ids.tolist()) & tok.special_ids


def test_sentencepiece_ids_and_determinism(sp_model_prefix, tmp_path):
  tok = SentencePieceTokenizer(f"{sp_model_prefix}.model")
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 1, 2, 4)
  assert tok.RESERVED_IDS < tok.vocab_size <= 300
  # Common words become single pieces, so the model learned something.
  assert len(tok.encode("alpha")) == 1
  again = SentencePieceTokenizer.train(_training_texts(), 300, tmp_path / "b")
  assert (tmp_path / "b.model").read_bytes() == (sp_model_prefix.parent / "tiny.model").read_bytes()
  assert tok.decode([tok.bos_id, *again.encode("beta"), tok.mask_id]) == "beta"


def test_sentencepiece_train_rejects_bad_input(tmp_path):
  with pytest.raises(ValueError, match="vocab_size"):
    SentencePieceTokenizer.train(["abc"], 100, tmp_path / "m")
  with pytest.raises(ValueError, match="texts"):
    SentencePieceTokenizer.train(["", "\n"], 300, tmp_path / "m")


def test_a_damaged_sentencepiece_model_is_one_line_naming_the_file(sp_model_prefix, tmp_path):
  """A cut model file (a copy interrupted, a full disk) is a ValueError
  naming it, not sentencepiece's RuntimeError (a traceback from txf-run's
  resume and txf-generate)."""
  damaged = tmp_path / "sentencepiece_300.model"
  damaged.write_bytes(sp_model_prefix.with_name("tiny.model").read_bytes()[:100])
  with pytest.raises(ValueError, match="is not a sentencepiece model") as error:
    SentencePieceTokenizer(damaged)
  assert str(error.value).startswith(f"model_path {damaged} ")
  assert "\n" not in str(error.value)
  # Empty: sentencepiece loaded nothing and logged on every later call.
  damaged.write_bytes(b"")
  with pytest.raises(ValueError, match=r"is not a sentencepiece model: it is empty$"):
    SentencePieceTokenizer(damaged)
  # A directory in its place: IsADirectoryError's traceback.
  damaged.unlink()
  damaged.mkdir()
  with pytest.raises(ValueError, match=r"^model_path .* cannot be read \(Is a directory\)$"):
    SentencePieceTokenizer(damaged)


def _corpus_config(**overrides):
  fields = dict(
    name="pystdlib",
    task="lm",
    tokenizer="sentencepiece",
    sp_vocab_size=512,
    seq_len=16,
    batch_size=2,
    max_corpus_bytes=20_000,
  )
  return parse_data({**fields, **overrides})


def test_too_few_pieces_for_the_corpus_name_data_sp_vocab_size(tmp_path):
  """The refusal named the training function's argument (vocab_size=300) and
  quoted sentencepiece's internal check; a run's config field is what to change."""
  with pytest.raises(ValueError, match=r"^data\.sp_vocab_size: 300 pieces leave too few ids"):
    make_tokenizer(_corpus_config(sp_vocab_size=300), tmp_path)
  assert not list(tmp_path.iterdir())  # nothing written


def test_make_tokenizer_trains_once_then_reuses(tmp_path, monkeypatch):
  assert isinstance(make_tokenizer(_corpus_config(tokenizer="bytes")), ByteTokenizer)
  first = make_tokenizer(_corpus_config(), tmp_path)
  assert (tmp_path / "sentencepiece_512.model").exists()

  def fail(*args, **kwargs):
    raise AssertionError("trained again instead of reusing the model")

  monkeypatch.setattr(tokenizers_module.SentencePieceTokenizer, "train", fail)
  second = make_tokenizer(_corpus_config(), tmp_path)
  text = "import os\nprint(os.getcwd())\n"
  np.testing.assert_array_equal(first.encode(text), second.encode(text))


def test_make_tokenizer_sentencepiece_needs_workdir():
  with pytest.raises(ValueError, match="workdir"):
    make_tokenizer(_corpus_config())


def test_sentencepiece_vocab_too_small_for_characters(tmp_path):
  texts = ["".join(map(chr, range(0x4E00, 0x4E00 + 200)))] * 3
  with pytest.raises(ValueError, match=r"^300 pieces leave too few ids .* \(they need \d+\)$"):
    SentencePieceTokenizer.train(texts, 300, tmp_path / "m")


def test_bytes_and_sentencepiece_as_hugging_face_tokenizers(sp_model_prefix, tmp_path):
  """What txf-export writes: tokenizer.json (and its special tokens) that
  txf's Hugging Face reader encodes and decodes as the run's tokenizer."""
  from txf.data import HFTokenizer

  texts = [*TEXTS, "<mask> and <b> as text", "x" * 50 + "\n\n\tq", *_training_texts()[:5]]
  tokenizers = {
    "bytes": ByteTokenizer(),
    "sentencepiece": SentencePieceTokenizer(f"{sp_model_prefix}.model"),
  }
  for name, tokenizer in tokenizers.items():
    directory = tmp_path / name
    directory.mkdir()
    for file, text in tokenizers_module.hf_tokenizer_files(tokenizer).items():
      (directory / file).write_text(text)
    # transformers' AutoTokenizer reads this class, not the model_type's beside
    # an export (whose tokenizer, rebuilt from the vocabulary, gave other ids).
    roles = json.loads((directory / "tokenizer_config.json").read_text())
    assert roles["tokenizer_class"] == "PreTrainedTokenizerFast", name
    read = HFTokenizer(directory)
    assert read.vocab_size == tokenizer.vocab_size, name
    assert (read.pad_id, read.bos_id, read.eos_id, read.mask_id) == (
      tokenizer.pad_id,
      tokenizer.bos_id,
      tokenizer.eos_id,
      tokenizer.mask_id,
    )
    # bytes: '<s>' in a text is its bytes (the special tokens are never read from text).
    for text in [*texts, "<s> and </s>"] if name == "bytes" else texts:
      ids = tokenizer.encode(text)
      np.testing.assert_array_equal(read.encode(text), ids, err_msg=f"{name}: {text!r}")
      assert read.decode(ids) == tokenizer.decode(ids), (name, text)
    # A Hugging Face tokenizer's own files are copied (nothing in them adds tokens).
    assert tokenizers_module.hf_tokenizer_files(read) == {
      file.name: file.read_text() for file in directory.iterdir()
    }
  with pytest.raises(ValueError, match="SymbolTokenizer .* has no Hugging Face tokenizer.json"):
    tokenizers_module.hf_tokenizer_files(SymbolTokenizer(["a", "b"]))


def test_every_tokenizer_decodes_ids_outside_its_vocabulary_to_nothing(sp_model_prefix, tmp_path):
  """A model's vocabulary may be larger than its tokenizer's, so a sample
  can hold such ids: sentencepiece raised on one past its pieces (a run
  stopped at its first sample), tokenizers on a negative one."""
  from txf.data import HFTokenizer

  sentencepiece = SentencePieceTokenizer(f"{sp_model_prefix}.model")
  for file, text in tokenizers_module.hf_tokenizer_files(sentencepiece).items():
    (tmp_path / file).write_text(text)
  for tokenizer in (ByteTokenizer(), SymbolTokenizer("ab"), sentencepiece, HFTokenizer(tmp_path)):
    ids = tokenizer.encode("ab")
    outside = [-1, tokenizer.vocab_size, tokenizer.vocab_size + 1000]
    assert tokenizer.decode([*outside[:1], *ids, *outside[1:]]) == "ab", type(tokenizer)


def test_sentencepiece_refuses_texts_of_lines_too_long_to_train_on(tmp_path):
  """Only lines over 4192 bytes: sentencepiece's internal error (a traceback
  for a files: corpus of minified text). With one line short enough, it trains."""
  with pytest.raises(ValueError, match=r"^texts hold no line of at most 4192 bytes"):
    SentencePieceTokenizer.train(["x" * 4193, "y" * 5000], 300, tmp_path / "m")
  SentencePieceTokenizer.train(["x" * 4192], 300, tmp_path / "m")


@pytest.mark.parametrize("fixture", ["bert", "t5"])
def test_a_hugging_face_tokenizer_is_exported_encoding_as_the_run(fixture, tmp_path):
  """A run encodes without special tokens; its export's tokenizer.json kept
  the post-processor that adds them (BERT's [CLS] ... [SEP], T5's </s>),
  so txf-embed and txf-generate on the export (which add what a Hugging Face
  directory's tokenizer adds) fed the model other ids than the run did."""
  from txf.data import HFTokenizer

  run = HFTokenizer(FIXTURES / "hf" / fixture)
  text = "hello world, a run's text"
  assert len(run.encode(text, add_special_tokens=True)) > len(run.encode(text))  # it adds some
  for file, contents in tokenizers_module.hf_tokenizer_files(run).items():
    (tmp_path / file).write_text(contents)
  exported = HFTokenizer(tmp_path)
  np.testing.assert_array_equal(exported.encode(text, add_special_tokens=True), run.encode(text))
  assert (exported.pad_id, exported.bos_id, exported.eos_id, exported.vocab_size) == (
    run.pad_id,
    run.bos_id,
    run.eos_id,
    run.vocab_size,
  )
  config = json.loads((tmp_path / "tokenizer_config.json").read_text())
  assert not config.get("add_bos_token") and not config.get("add_eos_token")


def test_tokenizer_hashes_are_of_the_files_that_define_the_ids(sp_model_prefix, tmp_path):
  """sha256 changes with the files' contents (a run records it, and a run
  started from it compares it), not with where they are."""
  model = sp_model_prefix.with_name("tiny.model")
  expected = hashlib.sha256(model.read_bytes()).hexdigest()
  assert SentencePieceTokenizer(model).sha256 == expected
  assert ByteTokenizer().sha256 is None

  directory = shutil.copytree(FIXTURES / "hf" / "bert", tmp_path / "bert")
  digest = hashlib.sha256()
  for name in ("tokenizer.json", "special_tokens_map.json", "tokenizer_config.json"):
    if (directory / name).exists():
      data = (directory / name).read_bytes()
      digest.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
  assert HFTokenizer(directory).sha256 == digest.hexdigest()
  config = directory / "tokenizer_config.json"
  config.write_text(json.dumps(dict(json.loads(config.read_text()), model_max_length=7)))
  assert HFTokenizer(directory).sha256 != digest.hexdigest()  # a special-token file counts


# --- data.tokenizer: txf.data.spec.TOKENIZERS ----------------------------------------

# The fields each entry of TOKENIZERS reads, for the corpus.
TOKENIZER_FIELDS = {
  "bytes": dict(tokenizer="bytes"),
  "sentencepiece": dict(tokenizer="sentencepiece", sp_vocab_size=512),
  "hf": dict(tokenizer="hf", tokenizer_path=str(FIXTURES / "hf" / "gpt2")),
}


def test_each_tokenizer_gives_its_own_ids(tmp_path):
  assert set(TOKENIZER_FIELDS) == set(TOKENIZERS.names())
  text = "def add(a, b):\n    return a + b\n"
  ids = {
    name: tuple(make_tokenizer(_corpus_config(**fields), tmp_path).encode(text))
    for name, fields in TOKENIZER_FIELDS.items()
  }
  assert len(set(ids.values())) == len(ids), ids


def test_an_hf_tokenizer_that_cannot_be_read_is_named_by_its_field(tmp_path):
  # The tokenizer's message names the file (a path given elsewhere, too).
  for path, why in [
    (tmp_path / "missing", "no tokenizer.json there"),
    (FIXTURES / "hf" / "gpt2" / "config.json", "not a tokenizers tokenizer.json"),
  ]:
    spec = _corpus_config(tokenizer="hf", tokenizer_path=str(path))
    with pytest.raises(ValueError, match=rf"^data\.tokenizer_path: {path}: {why}"):
      make_tokenizer(spec, tmp_path)


class LowerBytes(ByteTokenizer):
  """docs/extending.md's tokenizer: the UTF-8 bytes of the lower-cased text."""

  def encode(self, text):
    return super().encode(text.lower())


def test_a_registered_tokenizer_is_a_runs_tokenizer(tmp_path):
  built = []

  def lower_bytes(spec, workdir):
    built.append((spec.tokenizer, workdir))
    return LowerBytes()

  capitals = np.arange(ord("A"), ord("Z") + 1) + 4  # ByteTokenizer's ids of A..Z
  with TOKENIZERS.scoped():
    register.tokenizer("lower_bytes")(lower_bytes)
    run, _ = fit_vocabulary(parse(tiny_config(data__tokenizer="lower_bytes")), tmp_path)
    assert built == [("lower_bytes", tmp_path)]
    assert run.model.vocab_size == ByteTokenizer.vocab_size
    tokenizer = make_tokenizer(run.data, tmp_path)
    batch = next(make_dataset(run.data, "train", seed=0, tokenizer=tokenizer))
  assert "lower_bytes" not in TOKENIZERS  # scoped: undone
  plain = next(make_dataset(dataclasses.replace(run.data, tokenizer="bytes"), "train", seed=0))
  assert np.isin(plain["inputs"], capitals).any()
  assert not np.isin(batch["inputs"], capitals).any()


def test_a_registered_subclass_of_a_converted_tokenizer_has_no_hugging_face_form():
  # Exported as plain bytes, its tokenizer.json gave 'DEF' the ids of D, E,
  # F where the run read d, e, f: other ids than the model was trained on.
  assert "tokenizer.json" in hf_tokenizer_files(ByteTokenizer())
  with pytest.raises(ValueError, match=r"^LowerBytes \(its own encoding\) has no Hugging Face"):
    hf_tokenizer_files(LowerBytes())


def test_an_unknown_tokenizer_lists_the_registered_ones():
  with TOKENIZERS.scoped():
    register.tokenizer("lower_bytes")(lambda spec, workdir: LowerBytes())
    with pytest.raises(ValueError) as raised:
      make_tokenizer(_corpus_config(tokenizer="nope"))
  assert str(raised.value) == (
    "data.tokenizer: 'nope' is not one of ('bytes', 'sentencepiece', 'hf', 'lower_bytes')"
  )
