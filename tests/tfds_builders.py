"""Tiny offline look-alikes of wmt14_translate and lm1b for the TFDS tests.

Subclasses name a dataset (their class name, snake-cased) and set
TRAIN_PAIRS / VALIDATION_PAIRS (TranslationBuilder) or TRAIN_TEXTS /
VALIDATION_TEXTS (DocumentsBuilder); prepare them with
`tfds.builder('<name>[/de-en]', data_dir=..., file_format='array_record')
.download_and_prepare()`, which needs no network.
"""

import tensorflow_datasets as tfds


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
