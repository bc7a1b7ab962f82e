"""A trained txf run as a Hugging Face model (txf.train.export): train tiny ->
export -> load with txf's Hugging Face reader (and with transformers where it
is installed) -> the same logits; txf-generate / txf-embed on a run
directory; train.init_from a run directory; the fields that do not map.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, REPO, tiny_config
from txf.data import HFTokenizer
from txf.interop import CheckpointError, load_pretrained
from txf.interop.rules import flatten
from txf.train import loop
from txf.train.export import export_run, is_run_directory, load_trained
from txf.train.run_config import ConfigError
from txf.train.setup import parse_run, setup_run

OLD_RUN = FIXTURES / "run_822e561"  # RoPE, no biases
HF_GPT2 = FIXTURES / "hf" / "gpt2"
TEXT = "def f(x):\n  return x  # é"
ATOL = 1e-4
# Tiny runs of each family's Hugging Face shape (two steps: the weights move
# off their initialisation).
SHAPES = {
  "gpt2": ("learned", dict(use_bias=True, scale_logits=False)),
  "bert": (
    "encoder_mlm",
    dict(
      norm_placement="post",
      embed_norm=True,
      use_bias=True,
      num_token_types=1,
      scale_logits=False,
      gelu_approximate=False,
    ),
  ),
  "t5": (
    "seq2seq",
    dict(position="t5_bias", norm="rms", use_bias=False, scale_attention=False),
  ),
}


def train_tiny(name, workdir):
  config_name, model = SHAPES[name]
  fields = {f"model__{field}": value for field, value in model.items()}
  config = tiny_config(config_name, steps=2, train__warmup_steps=1, **fields)
  loop.run(config, workdir, log=lambda line: None)
  return workdir


@pytest.fixture(scope="module")
def runs(tmp_path_factory, compilation_cache_dir):
  """name -> the work directory of its tiny run, trained once for the module."""
  trained = {}

  def get(name):
    if name not in trained:
      trained[name] = train_tiny(name, tmp_path_factory.mktemp("runs") / name)
    return trained[name]

  return get


def inputs_of(name, tokenizer):
  """The model's inputs: TEXT's tokens [1, T]; for T5 (the reverse task's
  symbols) source and decoder tokens."""
  if name == "t5":
    return (np.array([[5, 6, 7, 8, 9]], np.int32), np.array([[1, 9, 8]], np.int32))
  return (tokenizer.encode(TEXT)[None],)


def transformers_logits(directory, name, inputs):
  """transformers' logits for `inputs` from the exported directory (None
  without transformers and torch)."""
  try:
    import torch
    import transformers
  except ImportError:
    return None
  config = json.loads((directory / "config.json").read_text())
  model = getattr(transformers, config["architectures"][0]).from_pretrained(
    directory, attn_implementation="eager"
  )
  arguments = dict(input_ids=torch.tensor(inputs[0], dtype=torch.long))
  if name == "t5":
    arguments["decoder_input_ids"] = torch.tensor(inputs[1], dtype=torch.long)
  with torch.no_grad():
    return model.eval()(**arguments).logits.numpy()


@pytest.mark.slow  # trains three tiny runs
@pytest.mark.parametrize("name", ["gpt2", "bert", "t5"])
def test_a_run_exported_loads_as_the_same_model(name, runs, tmp_path):
  workdir = runs(name)
  written = export_run(workdir, tmp_path / "hf")
  architecture = {
    "gpt2": "GPT2LMHeadModel",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
  }[name]
  assert written.architecture == architecture and written.step == 2
  trained = load_trained(workdir)
  exported = load_pretrained(tmp_path / "hf")
  assert exported.config == trained.pretrained.config
  found, expected = flatten(exported.params), flatten(trained.pretrained.params)
  assert found.keys() == expected.keys()
  inputs = inputs_of(name, trained.tokenizer)
  logits = trained.pretrained.model().apply({"params": trained.pretrained.params}, *inputs)
  again = exported.model().apply({"params": exported.params}, *inputs)
  np.testing.assert_array_equal(np.asarray(again), np.asarray(logits))
  assert not np.allclose(logits, logits.mean())  # a model, not a constant
  if name == "t5":  # the reverse task's symbols have no tokenizer.json
    assert "tokenizer.json" not in written.files and "symbols" in written.no_tokenizer
    assert exported.token_ids["decoder_start_token_id"] == trained.tokenizer.bos_id
  else:  # the run's bytes, read back by the Hugging Face reader
    tokenizer = HFTokenizer(tmp_path / "hf")
    np.testing.assert_array_equal(tokenizer.encode(TEXT), trained.tokenizer.encode(TEXT))
    assert (tokenizer.pad_id, tokenizer.eos_id) == (0, 2)
  reference = transformers_logits(tmp_path / "hf", name, inputs)
  if reference is not None:  # transformers reads the directory as the same model
    np.testing.assert_allclose(reference, np.asarray(logits), atol=ATOL)


def test_what_is_a_run_directory(tmp_path):
  assert is_run_directory(OLD_RUN)
  assert not is_run_directory(HF_GPT2)
  assert not is_run_directory(tmp_path)
  (tmp_path / "config.json").write_text("{not json")
  assert not is_run_directory(tmp_path)


@pytest.mark.slow  # restores the run
def test_an_export_that_does_not_map_names_every_field_and_writes_nothing(tmp_path):
  with pytest.raises(CheckpointError) as raised:
    export_run(OLD_RUN, tmp_path / "hf")
  message = str(raised.value)
  assert "\n" not in message
  assert message.startswith("model.position: 'rope' cannot be written as GPT2LMHeadModel")
  for field in ("model.use_bias: False", "model.scale_logits: True"):
    assert field in message
  assert not (tmp_path / "hf").exists()
  shutil.copytree(OLD_RUN, tmp_path / "run")
  with pytest.raises(ConfigError, match="is the run's work directory"):
    export_run(tmp_path / "run", tmp_path / "run")
  assert (tmp_path / "run" / "config.json").read_bytes() == (OLD_RUN / "config.json").read_bytes()


def run_command(module, *args):
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )


@pytest.mark.slow  # subprocesses (~5 s each) and a tiny run
def test_commands_take_a_run_directory(runs, tmp_path):
  """txf-export writes the directory; txf-generate continues a prompt the
  same from the run and from its export; txf-embed embeds with an encoder
  run's hidden states."""
  workdir = runs("gpt2")
  result = run_command("experiments.export", f"--workdir={workdir}", f"--out={tmp_path / 'hf'}")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith(f"wrote {tmp_path / 'hf'}: GPT2LMHeadModel of step 2 (")
  outputs = []
  for model in (workdir, tmp_path / "hf"):
    result = run_command(
      "experiments.generate", f"--model={model}", "--prompt=def ", "--max_new_tokens=5"
    )
    assert result.returncode == 0, result.stderr
    outputs.append(result.stdout)
  assert outputs[0] == outputs[1] and outputs[0].startswith("prompt: def \ngenerated: ")

  result = run_command("experiments.embed", f"--model={runs('bert')}", "a", "bc")
  assert result.returncode == 0, result.stderr
  rows = [json.loads(line) for line in result.stdout.splitlines()]
  assert [row["text"] for row in rows] == ["a", "bc"]
  assert [len(row["embedding"]) for row in rows] == [32, 32]  # d_model
  result = run_command("experiments.export", f"--workdir={OLD_RUN}", f"--out={tmp_path / 'x'}")
  assert result.returncode == 2 and result.stderr.startswith("export error: model.position:")
  assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


@pytest.mark.slow  # a tiny run, and the init compiled
def test_a_run_starts_from_a_txf_run(runs, tmp_path):
  """train.init_from=RUN: the new run's first state holds the run's weights;
  configs/pretrained.py:RUN writes the run's model and data sections."""
  from txf.configs import pretrained as pretrained_config

  workdir = runs("gpt2")
  config = pretrained_config.get_config(str(workdir))
  saved = json.loads((workdir / "config.json").read_text())
  assert config.model.to_dict() == saved["model"] and config.data.seq_len == 32
  assert config.train.init_from == str(workdir)
  config.train.update(dict(steps=2, warmup_steps=1))
  state = setup_run(parse_run(config), tmp_path / "fine_tuned").init()
  expected = flatten(load_trained(workdir).pretrained.params)
  found = flatten(state.params)
  assert found.keys() == expected.keys() and int(state.step) == 0
  for path, value in expected.items():
    np.testing.assert_array_equal(np.asarray(found[path]), value, err_msg=path)
  config.model.d_ff = 64
  with pytest.raises(ConfigError, match=r"model.d_ff: 64 differs .* train.init_from="):
    setup_run(parse_run(config), tmp_path / "other")
