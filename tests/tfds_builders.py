"""A tiny offline look-alike of wmt14_translate for the TFDS tests.

Subclasses name a dataset (their class name, snake-cased) and set
TRAIN_PAIRS / VALIDATION_PAIRS; prepare them with
`tfds.builder('<name>/de-en', data_dir=..., file_format='array_record')
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
    return {"train": self._generate_examples(self.TRAIN_PAIRS),
            "validation": self._generate_examples(self.VALIDATION_PAIRS)}

  def _generate_examples(self, pairs):
    for i, (de, en) in enumerate(pairs):
      yield i, {"de": de, "en": en}
