"""An encoder, an encoder-decoder and the classify head treat every token
equal to model.pad_id as padding, so a run refuses a tokenizer whose padding
id is not model.pad_id, or is its eos (a tokenizer.json without a pad token:
GPT-2's pads with its eos), in one line before anything is trained; the data
pad with the tokenizer's pad id (tests/data). A decoder language model masks nothing by
id and takes any tokenizer. Cheap: no model is trained.
"""

import json

import pytest

from conftest import tiny_config
from tfds_builders import HF_VOCAB, zero_is_a_word_tokenizer
from txf.layers.model_config import ModelConfig
from txf.runconfig.run_config import ConfigError, parse, to_json
from txf.train.run_setup import fit_vocabulary

EOS = HF_VOCAB["<eos>"]


def hf_run(directory, name, *, pad_token=None, **model_fields):
  """configs/<name>.py shrunk, reading text with a word-level tokenizer.json
  whose id 0 is the word '!' (and, given pad_token, a pad token of its own)."""
  directory.mkdir(exist_ok=True)
  zero_is_a_word_tokenizer(directory)
  if pad_token is not None:
    roles = json.loads((directory / "tokenizer_config.json").read_text())
    (directory / "tokenizer_config.json").write_text(json.dumps({**roles, "pad_token": pad_token}))
  config = tiny_config(name, data__tokenizer="hf", data__tokenizer_path=str(directory))
  config.model.update(model_fields)
  return parse(config)


def test_a_tokenizer_padding_with_its_eos_is_refused_for_a_model_that_masks_padding(tmp_path):
  with pytest.raises(ConfigError, match=rf"^data\.tokenizer: its padding id {EOS} is its eos"):
    fit_vocabulary(hf_run(tmp_path, "encoder_mlm", pad_id=EOS), None)


def test_a_model_pad_id_other_than_the_tokenizers_is_refused_naming_it(tmp_path):
  # model.pad_id 0 would mask the word '!' and attend the padding (<unk>).
  with pytest.raises(ConfigError, match=r"^model\.pad_id: 0 is not the tokenizer's padding id 6"):
    fit_vocabulary(hf_run(tmp_path, "encoder_mlm", pad_token="<unk>"), None)
  run = hf_run(tmp_path, "encoder_mlm", pad_token="<unk>", pad_id=6)
  run, tokenizer = fit_vocabulary(run, None)
  assert run.model.pad_id == tokenizer.pad_id == 6


def test_a_run_trained_before_the_check_is_read_as_it_was_trained(tmp_path):
  # Its model.pad_id cannot change on resume: refusing it left no remedy.
  run = hf_run(tmp_path / "tokenizer", "encoder_mlm", pad_token="<unk>")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(to_json(run)))
  fitted, tokenizer = fit_vocabulary(run, workdir)
  assert (fitted.model.pad_id, tokenizer.pad_id) == (0, 6)


def test_a_decoder_language_model_takes_a_tokenizer_without_a_pad_token(tmp_path):
  run, tokenizer = fit_vocabulary(hf_run(tmp_path, "rope"), None)
  assert tokenizer.pad_id == EOS and run.model.pad_id == 0


@pytest.mark.parametrize(
  "family,head,masks",
  [
    ("decoder", "lm", False),
    ("lstm", "lm", False),
    ("decoder", "classify", True),
    ("encoder", "mlm", True),
    ("encoder", "classify", True),
    ("encoder_decoder", "lm", True),
  ],
)
def test_which_models_mask_padding(family, head, masks):
  fields = dict(family=family, head=head, vocab_size=8, pad_id=0)
  if head == "classify":
    fields.update(num_classes=2, pooling="mean")
  cfg = ModelConfig(**fields)
  assert cfg.masks_padding is masks
  if masks:
    with pytest.raises(ValueError, match=r"^model\.pad_id: 0 is not"):
      cfg.check_padding(pad_id=3, eos_id=2)
    with pytest.raises(ValueError, match=r"^data\.tokenizer: its padding id 0 is its eos"):
      cfg.check_padding(pad_id=0, eos_id=0)
  else:
    cfg.check_padding(pad_id=3, eos_id=3)
  cfg.check_padding(pad_id=0, eos_id=2)  # txf's own tokenizers: pad 0, eos 2
