"""TFDS datasets through the training loop (txf.train.loop.run), offline.

* A language model on a mocked 'tiny_shakespeare' (tfds.testing.mock_data
  with known text; mocks live in this process, so the loop runs in-process),
  streamed and packed (txf.data.packed: the model gets segment ids): trains,
  checkpoints, and a run preempted by SIGTERM mid-epoch (in the second epoch
  of the small split) and resumed from the Grain stream position in its
  checkpoint reaches the same metrics at every step and the same final
  parameters as an uninterrupted run, bit for bit.
* An encoder-decoder on a tiny translation builder really prepared as
  ArrayRecord in a temporary data_dir (the unmocked TFDS read path): the
  training loss falls.

This module turns on JAX's persistent compilation cache in a temporary
directory, so the three runs of one config compile once.
"""

import importlib
import math

import numpy as np
import pytest
import tensorflow_datasets as tfds

from conftest import (
  assert_same_states,
  checkpoint_steps,
  restore_state,
  sigterm_at,
  without_timings,
)
from tfds_builders import TranslationBuilder
from txf.runconfig.run_config import parse
from txf.rundir.metrics import read_metrics
from txf.train import loop

# The mocked tiny_shakespeare: records of known text (bytes, as TFDS gives
# them). About 1.9 kB of training text: 7 batches of 8 packed windows of 33
# byte tokens per epoch, so a 10-step run crosses an epoch end.
_SPEAKERS = ["First Citizen", "Second Citizen", "MENENIUS", "MARCIUS", "All"]
_LINES = [
  "Before we proceed any further, hear me speak.",
  "You are all resolved rather to die than to famish?",
  "We are accounted poor citizens, the patricians good.",
  "What work's, my countrymen, in hand? where go you?",
  "Speak, speak.",
]
TEXTS = {
  "train": [
    f"{_SPEAKERS[i % 5]}:\n{_LINES[(3 * i) % 5]}\n{_LINES[(i + 1) % 5]}\n\n" for i in range(16)
  ],
  "validation": [f"{_SPEAKERS[i % 5]}:\n{_LINES[(2 * i) % 5]}\n\n" for i in range(5)],
  "test": ["CORIOLANUS:\nThanks. What's the matter, you dissentious rogues?\n"],
}

# A tiny translation dataset: (de, en) pairs with a learnable mapping.
_WORDS = [
  ("Hund", "dog"),
  ("Katze", "cat"),
  ("Haus", "house"),
  ("Baum", "tree"),
  ("Vogel", "bird"),
  ("Fisch", "fish"),
]
TRAIN_PAIRS = [(f"der {de} {i}", f"the {en} {i}") for i in range(8) for de, en in _WORDS]
VALIDATION_PAIRS = [(f"ein {de} {i}", f"a {en} {i}") for i, (de, en) in enumerate(_WORDS)]


class TxfTinyTranslate(TranslationBuilder):
  """A learnable de -> en word mapping, prepared offline as ArrayRecord."""

  TRAIN_PAIRS = TRAIN_PAIRS
  VALIDATION_PAIRS = VALIDATION_PAIRS


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


@pytest.fixture
def shakespeare(monkeypatch):
  """tiny_shakespeare mocked to hold TEXTS; counts the records read."""
  reads = []

  def as_data_source(builder, split, **kwargs):
    del builder, kwargs
    reads.append(split)
    return [{"text": text.encode("utf-8")} for text in TEXTS[split]]

  # mock_data fakes the records, not the prepared files the loader checks for.
  monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda _: True)
  with tfds.testing.mock_data(
    policy=tfds.testing.MockPolicy.USE_CODE, as_data_source_fn=as_data_source
  ):
    yield reads


@pytest.fixture(scope="module")
def translation_dir(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  tfds.builder(
    "txf_tiny_translate/de-en", data_dir=data_dir, file_format="array_record"
  ).download_and_prepare()
  return str(data_dir)


def tiny(name, **sections):
  """configs/<name>.py shrunk to seconds, then `sections` ({'data': {...}})."""
  config = importlib.import_module(f"txf.configs.{name}").get_config()
  config.model.update(dict(d_model=32, num_heads=2, num_layers=1))
  config.data.update(dict(batch_size=8))
  config.train.update(dict(warmup_steps=2, log_every=1))
  config.eval.update(dict(num_batches=1, sample_tokens=0))
  for section, fields in sections.items():
    config[section].update(fields)
  return config


def train_rows(workdir):
  return [row for row in read_metrics(workdir) if "loss" in row]


@pytest.mark.slow
def test_tfds_lm_trains_and_resumes_exactly(tmp_path, shakespeare, sigterm_is_caught):
  steps, cut = 10, 8  # 7 batches an epoch: the cut is in the second epoch
  config = tiny(
    "rope",
    data=dict(name="tfds:tiny_shakespeare", tokenizer="bytes", seq_len=32),
    train=dict(steps=steps, learning_rate=0.01, checkpoint_every=4, max_to_keep=5),
    eval=dict(every=5),
  )
  straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"

  lines = []
  expected = loop.run(parse(config), straight, log=lines.append)
  assert any(line.startswith("data: TFDS tiny_shakespeare") for line in lines), lines[:3]
  assert {"train", "validation"} <= set(shakespeare)  # the mock was read, nothing else
  assert checkpoint_steps(straight) == [4, 8, 10]
  rows = train_rows(straight)
  assert [row["step"] for row in rows] == list(range(1, steps + 1))
  losses = [row["loss"] for row in rows]
  assert all(np.isfinite(losses)) and np.mean(losses[-3:]) < losses[0] - 1.0, losses
  assert 0 < expected["eval_loss"] < math.log(260)  # better than uniform over the bytes

  lines = []
  loop.run(parse(config), interrupted, log=sigterm_at(cut, lines))
  assert any(line.startswith(f"preempted: saved step {cut}") for line in lines), lines
  assert sigterm_is_caught == []  # the loop's guard took it
  assert checkpoint_steps(interrupted) == [4, 8]
  assert max(row["step"] for row in read_metrics(interrupted)) == cut

  lines = []
  result = loop.run(parse(config), interrupted, log=lines.append)
  assert f"resumed from step {cut}" in "\n".join(lines)
  assert result == expected
  assert without_timings(read_metrics(interrupted)) == without_timings(read_metrics(straight))
  assert checkpoint_steps(interrupted) == [4, 8, 10]

  assert_same_states(restore_state(straight, steps), restore_state(interrupted, steps))


@pytest.mark.slow
def test_tfds_translation_trains_an_encoder_decoder(tmp_path, translation_dir):
  steps = 12
  config = tiny(
    "seq2seq",
    data=dict(name="tfds:txf_tiny_translate/de-en", tfds_data_dir=translation_dir, seq_len=16),
    train=dict(steps=steps, learning_rate=0.01, decay="constant", checkpoint_every=steps),
    eval=dict(every=steps),
  )
  assert config.model.family == "encoder_decoder"
  workdir = tmp_path / "run"
  lines = []
  result = loop.run(parse(config), workdir, log=lines.append)
  assert any(
    "TFDS txf_tiny_translate" in line and "'de'" in line and "'en'" in line for line in lines
  ), lines[:3]
  assert checkpoint_steps(workdir) == [steps]

  losses = [row["loss"] for row in train_rows(workdir)]
  assert len(losses) == steps and all(np.isfinite(losses)), losses
  # Falling: the last steps well below the first (uniform over 260 bytes: 5.56).
  assert np.mean(losses[-3:]) < losses[0] - 1.0, losses
  assert np.isfinite(result["eval_loss"]) and result["eval_loss"] < losses[0]
  assert 0 < result["eval_accuracy"] <= 1
