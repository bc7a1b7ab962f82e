"""Tests of the config files in configs/ and of run-config validation.

Every config file loads, validates against its dataset's tokenizer, builds
its model, documents its own command, and differs from configs/base.py in
exactly the fields listed in EXPECTED_CHANGES (what its docstring says it
changes). Invalid configs fail with a message naming the field.
"""

import importlib
import json
import math
import pathlib
import re
import sys
from unittest import mock

import jax
import jax.numpy as jnp
import pytest
from absl import flags
from ml_collections import config_flags

from conftest import REPO, flatten, load_config
from txf import models
from txf.data import ByteTokenizer, make_tokenizer, num_classes
from txf.layers.model_config import ModelConfig
from txf.runconfig.run_config import ConfigError, parse
from txf.train import loop
from txf.train.step import model_inputs

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / "configs"
CONFIG_NAMES = sorted(p.stem for p in CONFIG_DIR.glob("*.py") if p.stem != "__init__")
# Config files that take an argument (--config=FILE.py:ARG), with the one tested.
CONFIG_ARGS = {"pretrained": str(REPO / "tests" / "fixtures" / "hf" / "gpt2")}


def load(name):
  """configs/<name>.py's get_config(), given its CONFIG_ARGS argument if it takes one."""
  if name in CONFIG_ARGS:
    return importlib.import_module(f"txf.configs.{name}").get_config(CONFIG_ARGS[name])
  return load_config(name)


# config file -> the flattened fields in which it differs from base.py.
EXPECTED_CHANGES = {
  "base": set(),
  "rope": set(),  # base.py's default position is already RoPE
  "sinusoidal": {"model.position"},
  "learned": {"model.position"},
  "alibi": {"model.position"},
  "nope": {"model.position"},
  "t5_bias": {"model.position"},
  "rope_ntk": {"model.position", "model.options.rope_scale"},
  "post_ln": {"model.norm_placement"},
  "lstm": {"model.family", "model.d_model"},  # base.py's 2 layers stay
  "encoder_mlm": {
    "model.family",
    "model.head",
    "model.position",
    "data.task",
    "eval.sample_tokens",
  },
  "encoder_classify": {
    "model.family",
    "model.head",
    "data.name",
    "data.task",
    "data.seq_len",
    "data.max_example_len",
    "data.listops_max_depth",
    "eval.sample_tokens",
  },
  "induction": {
    "model.d_model",
    "data.name",
    "data.seq_len",
    "train.steps",
    "train.warmup_steps",
    "train.checkpoint_every",
    "eval.every",
    "eval.sample_tokens",
  },
  "mqar": {
    "model.d_model",
    "data.name",
    "data.seq_len",
    "data.num_symbols",
    "train.steps",
    "train.warmup_steps",
    "train.checkpoint_every",
    "eval.every",
    "eval.sample_tokens",
  },
  "seq2seq": {
    "model.family",
    "model.position",
    "data.name",
    "data.task",
    "data.seq_len",
    "eval.sample_tokens",
  },
  "gpt2_small": {
    "model.vocab_size",
    "model.d_model",
    "model.num_heads",
    "model.num_layers",
    "model.max_len",
    "model.position",
    "model.use_bias",
    "model.norm_eps",
    "model.scale_logits",
    "model.init",
    "model.dtype",
    "data.seq_len",
    "data.max_corpus_bytes",
    "train.steps",
    "train.learning_rate",
    "train.warmup_steps",
    "train.checkpoint_every",
    "eval.every",
    "eval.num_batches",
    "eval.sample_tokens",
  },
  # The fixture GPT-2's model section (txf.interop: its derived fields left
  # to derive), its tokenizer and weights; the sample fits its learned table.
  "pretrained": {
    "model.vocab_size",
    "model.d_model",
    "model.position",
    "model.max_len",
    "model.norm_eps",
    "model.use_bias",
    "model.dropout_rate",
    "model.attention_dropout_rate",
    "model.scale_logits",
    "model.pad_id",
    "data.tokenizer",
    "data.tokenizer_path",
    "data.seq_len",
    "train.init_from",
    "train.learning_rate",
    "train.warmup_steps",
    "train.weight_decay",
    "eval.sample_tokens",
  },
}
EXPECTED_CHANGES["gpt2_small_8k"] = EXPECTED_CHANGES["gpt2_small"] | {"data.batch_size"}
EXPECTED_CHANGES["decoder_1b"] = {
  "model.vocab_size",
  "model.d_model",
  "model.num_heads",
  "model.num_layers",
  "model.max_len",
  "model.norm",
  "model.activation",
  "model.tie_embeddings",
  "model.dtype",
  "data.seq_len",
  "data.batch_size",
  "data.max_corpus_bytes",
  "train.steps",
  "train.learning_rate",
  "train.warmup_steps",
  "train.checkpoint_every",
  "eval.every",
  "eval.num_batches",
  "eval.sample_tokens",
  "parallel.fsdp",
}


def validate(config):
  """What a run checks before compute (the parse, then the vocabulary:
  txf.train.run_setup.fit_vocabulary, minus a sentencepiece tokenizer's training)."""
  run = parse(config)
  return run.with_vocabulary(make_tokenizer(run.data).vocab_size, num_classes(run.data))


def tiny():
  """A small valid base config, for the error tests."""
  config = load("base")
  config.model.d_model = 32
  config.data.seq_len = 32
  config.data.batch_size = 8
  config.data.max_corpus_bytes = 200_000
  config.train.steps = 10
  config.train.warmup_steps = 2
  return config


def test_expected_changes_cover_every_config_file():
  assert set(CONFIG_NAMES) == set(EXPECTED_CHANGES)


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_changes_only_its_documented_fields(name):
  base, config = flatten(load("base")), flatten(load(name))
  assert set(config) == set(base), f"{name}.py adds or removes fields"
  changed = {key for key in base if config[key] != base[key]}
  assert changed == EXPECTED_CHANGES[name]


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_docstring_has_the_command(name):
  module = importlib.import_module(f"txf.configs.{name}")
  command = f"txf-run --config={name}"  # installed; python -m experiments.run in a checkout
  assert module.__doc__ and command in module.__doc__
  assert "python -m experiments" not in module.__doc__


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_config_validates_and_builds(name):
  config = load(name)
  run = validate(config)
  model_cfg = run.model
  assert model_cfg.vocab_size >= make_tokenizer(run.data).vocab_size
  model = models.build(model_cfg)
  length = config.data.seq_len
  batch = {
    key: jnp.ones((1, length), jnp.int32) for key in ("inputs", "encoder_inputs", "decoder_inputs")
  }
  params = jax.eval_shape(
    lambda: model.init(jax.random.key(0), *model_inputs(batch, config.data.task))
  )
  count = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
  assert count > 0
  if name == "gpt2_small":  # "124M parameters" (tied embeddings, 50304-row vocabulary)
    assert 123e6 < count < 126e6, count
  if name == "decoder_1b":  # "1.4B parameters"
    assert 1.35e9 < count < 1.45e9, count


@pytest.mark.parametrize("steps", [1, 30])
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_config_runs_any_number_of_steps_its_warmup_clamped(name, steps):
  # --config.train.steps=30 on a shipped config (warmup 60 and more) was a
  # config error; a warmup longer than the run is now clamped to it, and said.
  config = load(name)
  given = config.train.warmup_steps
  config.train.steps = steps
  run = validate(config)
  assert run.train.warmup_steps == min(given, steps)  # as config.json records it
  assert config.train.warmup_steps == given  # the ConfigDict keeps what was given
  if given > steps:
    (note,) = run.notes
    assert note.startswith(f"train.warmup_steps: {given} is more than train.steps={steps}; ")
    assert f"clamped to {steps}" in note
    # The learning rate rises over the whole run: step t's is peak * t / steps.
    peak = config.train.learning_rate
    assert [float(run.schedule(t)) for t in range(steps)] == pytest.approx(
      [peak * t / steps for t in range(steps)],
      rel=1e-5,  # float32
    )
  else:
    assert run.notes == ()


@pytest.mark.parametrize("section", ["model", "data", "train", "eval", "parallel"])
def test_unknown_field_in_each_section(section):
  config = tiny()
  config[section].bogus_field = 1
  with pytest.raises(ValueError, match=rf"\b{section}\.bogus_field\b"):
    validate(config)


def test_unknown_section():
  config = tiny()
  config.bogus_section = 1
  with pytest.raises(ValueError, match=r"\bbogus_section\b"):
    validate(config)


def error_message(config):
  with pytest.raises(ValueError) as info:
    validate(config)
  return str(info.value)


def test_lm_task_on_an_encoder():
  config = load("encoder_mlm")
  config.data.task = "lm"
  assert "data.task" in error_message(config)


def test_mlm_task_on_a_decoder():
  config = tiny()
  config.data.task = "mlm"
  assert "data.task" in error_message(config)


def test_task_the_dataset_lacks():
  config = load("encoder_classify")
  config.data.task = "lm"
  assert "data.task" in error_message(config)


def test_learned_positions_shorter_than_the_sequence():
  config = tiny()
  config.model.position = "learned"
  config.model.max_len = 16
  config.data.seq_len = 32
  assert re.search(r"\bmodel\.max_len\b", error_message(config))
  config.model.max_len = 32  # exactly seq_len fits
  validate(config)


def test_grad_accum_must_divide_the_batch():
  config = tiny()
  config.train.grad_accum_steps = 3
  assert "train.grad_accum_steps" in error_message(config)
  config.train.grad_accum_steps = 4
  validate(config)


@pytest.mark.parametrize(
  "fields, message",
  [
    (dict(keep_every=-1), "train.keep_every: must be an integer >= 0, got -1"),
    (dict(keep_best=-1), "train.keep_best: must be an integer >= 0, got -1"),
    (
      dict(checkpoint_every=4, keep_every=6),
      "train.keep_every: 6 is not a multiple of train.checkpoint_every=4 (no checkpoint is "
      "saved at its steps)",
    ),
    (
      dict(checkpoint_every=6, keep_best=1),
      "train.keep_best: ranks checkpoints by the evaluation at their step, but "
      "train.checkpoint_every=6 is not a multiple of eval.every=4",
    ),
  ],
)
def test_keep_policies_keep_steps_that_are_saved_and_evaluated(fields, message):
  config = tiny()
  config.eval.every = 4
  config.train.update(fields)
  assert error_message(config) == message
  config.train.update(checkpoint_every=8, keep_every=16, keep_best=2)  # the ends that fit
  validate(config)


def test_heads_must_divide_d_model():
  config = tiny()
  config.model.num_heads = 3
  assert "model.num_heads" in error_message(config)


def test_vocab_smaller_than_the_tokenizer():
  config = tiny()
  config.model.vocab_size = ByteTokenizer().vocab_size - 1
  assert "model.vocab_size" in error_message(config)
  config.model.vocab_size += 1
  validate(config)


def test_decay_typo():
  config = tiny()
  config.train.decay = "cosin"
  assert "train.decay" in error_message(config)


@pytest.mark.parametrize(
  "section, field, value, named",
  [
    ("train", "decay", "cosin", "train.decay"),
    ("model", "num_heads", 3, "model.num_heads"),
    ("data", "bogus_field", 1, "data.bogus_field"),
  ],
)
def test_runner_stops_before_compute(tmp_path, section, field, value, named):
  """run() itself raises ConfigError naming the field and writes no checkpoint."""
  config = tiny()
  config[section][field] = value
  with pytest.raises(ConfigError, match=re.escape(named)):
    loop.run(parse(config), tmp_path / "run", log=lambda line: None)
  assert not (tmp_path / "run" / "checkpoints").exists()


# ---------------------------------------------------------------------------
# Command-line overrides of fields whose default is None.

# Fields base.py leaves unset (None): each must still be settable from the
# command line, which needs a typed placeholder.
UNSET_FIELDS = sorted(field for field, value in flatten(load("base")).items() if value is None)
CLI_VALUES = {int: ("2", 2), str: ("xla", "xla"), bool: ("false", False)}


def parse_cli(*overrides):
  """The config that `python -m experiments.run --config=configs/rope.py <overrides>`
  runs: absl + ml_collections' config_flags, with a fresh flag registry."""
  argv = ["run", f"--config={CONFIG_DIR / 'rope.py'}", *overrides]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config file", flag_values=flag_values)
  # config_flags reads the overrides from sys.argv, as in a real run.
  with mock.patch.object(sys, "argv", argv):
    flag_values(argv)
  return flag_values.config


def test_unset_fields_include_those_users_set():
  assert {
    "model.num_kv_heads",
    "model.head_dim",
    "model.d_ff",
    "model.window",
    "model.num_decoder_layers",
    "model.vocab_size",
    "model.attention_impl",
    "data.tfds_data_dir",
    "data.tfds_text_key",
  } <= set(UNSET_FIELDS)


@pytest.mark.parametrize("field", UNSET_FIELDS)
def test_unset_field_is_overridable_on_the_command_line(field):
  section, name = field.split(".")
  text, value = CLI_VALUES[load("base")[section].get_ref(name).get_type()]
  config = parse_cli(f"--config.{field}={text}")
  assert config[section][name] == value
  # Plain values (FieldReferences resolved) reach ModelConfig and config.json.
  assert dict(config[section].items())[name] == value
  assert json.loads(config.to_json_best_effort())[section][name] == value


def test_unset_fields_stay_none_and_serialise_as_null():
  config = parse_cli()
  saved = json.loads(config.to_json_best_effort())
  for field in UNSET_FIELDS:
    section, name = field.split(".")
    assert dict(config[section].items())[name] is None
    assert saved[section][name] is None


def test_placeholder_rejects_a_value_of_the_wrong_type():
  with pytest.raises(flags.IllegalFlagValueError, match="num_kv_heads"):
    parse_cli("--config.model.num_kv_heads=two")


def test_cli_override_resolves_in_model_config():
  config = parse_cli("--config.model.num_kv_heads=2", "--config.model.d_ff=96")
  cfg = ModelConfig.from_config({**config.model, "vocab_size": 260})
  assert (cfg.num_kv_heads, cfg.d_ff, cfg.head_dim) == (2, 96, 128 // 4)


def test_a_config_file_leaves_no_bytecode_beside_it(tmp_path, monkeypatch):
  """txf.configs.load writes no __pycache__ into a config's directory, for
  the config or a module it imports from there, where Python otherwise
  writes bytecode (the tests do: conftest), and restores that setting."""
  from txf import configs

  (tmp_path / "side_module_of_a_config.py").write_text("WIDTH = 7\n")
  (tmp_path / "a_config.py").write_text(
    "import side_module_of_a_config\n\ndef get_config():\n  return side_module_of_a_config.WIDTH\n"
  )
  monkeypatch.setattr(sys, "dont_write_bytecode", False)
  monkeypatch.setattr(sys, "path", list(sys.path))
  try:
    assert configs.load(tmp_path / "a_config.py") == 7
  finally:
    sys.modules.pop("side_module_of_a_config", None)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["a_config.py", "side_module_of_a_config.py"]
  assert sys.dont_write_bytecode is False
