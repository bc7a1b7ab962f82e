"""Tiny offline look-alikes of wmt14_translate and lm1b for the TFDS tests,
and of a Hugging Face tokenizer whose id 0 is a real token.

Subclasses name a dataset (their class name, snake-cased) and set
TRAIN_PAIRS / VALIDATION_PAIRS (TranslationBuilder) or TRAIN_TEXTS /
VALIDATION_TEXTS (DocumentsBuilder); prepare them with
`tfds.builder('<name>[/de-en]', data_dir=..., file_format='array_record')
.download_and_prepare()`, which needs no network.
"""

import json
import pathlib

import tensorflow_datasets as tfds
import tokenizers
from tokenizers import models, pre_tokenizers

from txf.data import HFTokenizer

# Words and their ids: id 0 is a real token ('!', as GPT-2's), and with no
# padding token pad_id is eos_id (1), GPT-2's convention.
HF_VOCAB = {"!": 0, "<eos>": 1, "a": 2, "b": 3, "c": 4, "<mask>": 5, "<unk>": 6}


def zero_is_a_word_tokenizer(directory: pathlib.Path) -> HFTokenizer:
  """HF_VOCAB as a word-level tokenizer.json (words split at spaces), saved
  in `directory` with its special tokens' roles, and read back."""
  model = tokenizers.Tokenizer(models.WordLevel(vocab=HF_VOCAB, unk_token="<unk>"))
  model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  model.save(str(directory / "tokenizer.json"))
  roles = {"eos_token": "<eos>", "mask_token": "<mask>", "unk_token": "<unk>"}
  (directory / "tokenizer_config.json").write_text(json.dumps(roles))
  return HFTokenizer(directory)


class TranslationBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Translation('de', 'en') with config 'de-en', like wmt14_translate."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="de-en")]
  TRAIN_PAIRS: list[tuple[str, str]] = []
  VALIDATION_PAIRS: list[tuple[str, str]] = []

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.Translation(("de", "en")))

  def _split_generators(self, dl_manager):
    return {
      "train": self._generate_examples(self.TRAIN_PAIRS),
      "validation": self._generate_examples(self.VALIDATION_PAIRS),
    }

  def _generate_examples(self, pairs):
    for i, (de, en) in enumerate(pairs):
      yield i, {"de": de, "en": en}


class DocumentsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A language-model dataset: one 'text' feature per record, like lm1b."""

  VERSION = tfds.core.Version("1.0.0")
  TRAIN_TEXTS: list[str] = []
  VALIDATION_TEXTS: list[str] = []

  def _info(self):
    features = tfds.features.FeaturesDict({"text": tfds.features.Text()})
    return tfds.core.DatasetInfo(builder=self, features=features)

  def _split_generators(self, dl_manager):
    return {
      "train": self._generate_examples(self.TRAIN_TEXTS),
      "validation": self._generate_examples(self.VALIDATION_TEXTS),
    }

  def _generate_examples(self, texts):
    for i, text in enumerate(texts):
      yield i, {"text": text}
