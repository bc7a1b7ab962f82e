"""Converted checkpoints in the runner and the commands: fine-tuning from a
Hugging Face directory (config.train.init_from through txf.train.run_setup, started by
configs/pretrained.py:DIR), and `experiments.embed` / `experiments.generate`
on the tiny fixtures of tests/fixtures/hf against transformers' outputs.
"""

import json
import shutil

import numpy as np
import pytest

from conftest import FIXTURES
from txf.configs import pretrained as pretrained_config
from txf.data import HFTokenizer
from txf.interop import load_pretrained
from txf.interop.rules import flatten
from txf.runconfig.run_config import ConfigError, parse
from txf.train.run_setup import setup_run

HF_FIXTURES = FIXTURES / "hf"
TIMEOUT_S = 120


def small_run(name, **model_changes):
  """configs/pretrained.py:<fixture> with a small data stream."""
  config = pretrained_config.get_config(str(HF_FIXTURES / name))
  config.data.update(dict(seq_len=16, batch_size=4, max_corpus_bytes=20_000))
  config.train.update(dict(steps=2, warmup_steps=1))
  config.eval.update(dict(num_batches=1, sample_tokens=0))
  config.model.update(model_changes)
  return config


@pytest.mark.slow  # the init is compiled (~3 s)
def test_run_starts_from_the_checkpoint(tmp_path):
  """The run's initial state holds the checkpoint's weights (and reads the
  corpus with its tokenizer); training it is the runner's ordinary step."""
  setup = setup_run(parse(small_run("gpt2")), tmp_path)
  assert setup.task == "lm" and isinstance(setup.train_data.tokenizer, HFTokenizer)
  # What the run's first lines say it starts from (txf.train.loop.run).
  assert setup.started_from == f"the Hugging Face GPT2LMHeadModel in {HF_FIXTURES / 'gpt2'}"
  state = setup.init()
  expected = flatten(load_pretrained(HF_FIXTURES / "gpt2").params)
  found = flatten(state.params)
  assert found.keys() == expected.keys() and int(state.step) == 0
  for path, value in expected.items():
    np.testing.assert_array_equal(np.asarray(found[path]), value, err_msg=path)


@pytest.mark.parametrize(
  "name,changes,message",
  [
    ("gpt2", dict(d_ff=64), "model.d_ff: 64 differs from the checkpoint's 128 in train.init_from="),
    ("gpt2", dict(gelu_approximate=False), "model.gelu_approximate: False differs"),
    # The field overridden, not the derived one the config copied
    # ('model.num_kv_heads: 4 does not divide model.num_heads=2').
    ("gpt2", dict(num_heads=2), "model.num_heads: 2 differs from the checkpoint's 4"),
    # BertModel has no MLM head: its parameters would start at random.
    (
      "minilm",
      dict(head="mlm"),
      r"train.init_from: parameter head/bias is only in the run's model .* "
      r"\(this run sets model.head='mlm' \(the checkpoint's 'none'\)\)$",
    ),
    # Said to start from pretrained:DIR, which the run did.
    (
      "gpt2",
      dict(max_len=16),
      r"train.init_from: parameter embedder/position_table has shape \(16, 32\) .* "
      r"\(this run sets model.max_len=16 \(the checkpoint's 40\)\)$",
    ),
  ],
)
def test_run_refuses_a_model_that_is_not_the_checkpoint(name, changes, message, tmp_path):
  with pytest.raises(ConfigError, match=message):
    setup_run(parse(small_run(name, **changes)), tmp_path)


def test_pretrained_config_needs_a_directory():
  with pytest.raises(ValueError, match="configs/pretrained.py:DIR"):
    pretrained_config.get_config()


def run_command(commands, module, *args):
  """`python -m module args...` in the repository, forked from the module's
  command server (conftest's `commands`: jax imported once)."""
  return commands.run(module, *args, timeout=TIMEOUT_S)


@pytest.mark.slow  # a command (~4 s)
def test_embed_prints_the_sentence_transformers_embeddings(commands):
  """The fixture is a sentence-transformers directory (mean pooling, then
  L2): the command's defaults give its embeddings of the reference texts."""
  texts = [
    "the quick fox jumps",
    "a single step begins the journey of tokens",
    "every model looks at the dog",
  ]
  result = run_command(commands, "experiments.embed", f"--model={HF_FIXTURES / 'minilm'}", *texts)
  assert result.returncode == 0, result.stderr
  rows = [json.loads(line) for line in result.stdout.splitlines()]
  assert [row["text"] for row in rows] == texts
  expected = np.load(HF_FIXTURES / "minilm" / "reference.npz")["padded_mean_l2"]
  np.testing.assert_allclose([row["embedding"] for row in rows], expected, atol=1e-4)


def generate_a_single(commands, *flags):
  """txf-generate of 6 tokens after 'a single' by the GPT-2 fixture."""
  model = f"--model={HF_FIXTURES / 'gpt2'}"
  return run_command(
    commands, "experiments.generate", model, "--prompt=a single", "--max_new_tokens=6", *flags
  )


@pytest.mark.slow  # a command (~5 s)
def test_generate_prints_the_greedy_continuation(commands):
  """GPT-2 continues 'a single' (the second reference prompt) with
  transformers' greedy tokens."""
  reference = np.load(HF_FIXTURES / "gpt2" / "reference.npz")
  tokenizer = HFTokenizer(HF_FIXTURES / "gpt2")
  np.testing.assert_array_equal(tokenizer.encode("a single"), reference["greedy_prompts"][1])
  result = generate_a_single(commands)
  assert result.returncode == 0, result.stderr
  expected = reference["greedy_tokens"][1]
  assert tokenizer.eos_id not in expected  # which would stop the command earlier
  assert result.stdout.splitlines() == [
    "prompt: a single",
    f"generated: {tokenizer.decode(expected)}",
  ]


@pytest.mark.slow  # four commands (~4 s each)
def test_generate_samples_with_its_seed_top_k_and_top_p(commands):
  """--temperature=1 samples with --seed: other tokens than transformers'
  greedy ones, and others again at the next seed; --top_k=1 and
  --top_p=1e-6 keep the most likely token only, which is greedy decoding
  (each flag reached decoding: a command greedy for them, or sampling
  without them, printed the sample)."""
  reference = np.load(HF_FIXTURES / "gpt2" / "reference.npz")
  tokenizer = HFTokenizer(HF_FIXTURES / "gpt2")
  greedy = f"generated: {tokenizer.decode(reference['greedy_tokens'][1])}"
  flags = {
    "seed 3": ("--seed=3",),
    "seed 4": ("--seed=4",),
    "top_k=1": ("--seed=3", "--top_k=1"),
    "top_p=1e-6": ("--seed=3", "--top_p=1e-6"),
  }
  generated = {}
  for name, extra in flags.items():
    result = generate_a_single(commands, "--temperature=1", *extra)
    assert result.returncode == 0, result.stderr
    generated[name] = result.stdout.splitlines()[1]
  assert generated["top_k=1"] == generated["top_p=1e-6"] == greedy
  assert len({greedy, generated["seed 3"], generated["seed 4"]}) == 3, generated


@pytest.mark.slow  # a command (~5 s)
def test_generate_prints_nothing_after_the_eos(commands, tmp_path):
  """A Llama whose config.json names no pad id (as Llama 3's) pads rows
  after EOS with id 0, a real token ('!' here): the command printed it."""
  from safetensors.numpy import load_file, save_file

  shutil.copytree(HF_FIXTURES / "llama", tmp_path / "llama")
  model = tmp_path / "llama"
  for name in ("config.json", "generation_config.json"):
    if (model / name).exists():
      config = json.loads((model / name).read_text())
      config.pop("pad_token_id", None)
      (model / name).write_text(json.dumps(config))
  weights = load_file(model / "model.safetensors")
  eos = json.loads((model / "config.json").read_text())["eos_token_id"]
  # EOS as greedy's third token: its row of the head made the largest there.
  weights["lm_head.weight"][eos] = 1.5 * weights["lm_head.weight"][177]
  save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
  result = run_command(
    commands,
    "experiments.generate",
    f"--model={model}",
    "--prompt=the quick fox",
    "--max_new_tokens=8",
  )
  assert result.returncode == 0, result.stderr
  tokenizer = HFTokenizer(model)
  generated = result.stdout.splitlines()[1].removeprefix("generated: ")
  # Two tokens and the EOS (the head rigged above); before, '!!!!!' followed.
  assert tokenizer.decode([0]) == "!" and "!" not in generated and generated


@pytest.mark.slow  # four commands
def test_commands_name_an_unusable_directory(commands, tmp_path):
  result = run_command(commands, "experiments.generate", f"--model={tmp_path}", "--prompt=hi")
  assert result.returncode == 2
  assert result.stderr.strip() == f"model error: {tmp_path / 'config.json'}: no such file"
  # A file, a missing path and an empty flag each named what they are (they
  # read '<path>/config.json: no such file', and '' the current directory's).
  (tmp_path / "weights.bin").write_bytes(b"")
  for model, line in [
    (tmp_path / "weights.bin", f"{tmp_path / 'weights.bin'} is a file, not a model directory"),
    (tmp_path / "missing", f"{tmp_path / 'missing'} is no directory"),
    ("", "empty; name a txf run, a Hugging Face model directory or a Hub name"),
  ]:
    result = run_command(commands, "experiments.embed", f"--model={model}", "a")
    assert (result.returncode, result.stderr.strip()) == (2, f"model error: model: {line}")


# Each was accepted: 32 garbage tokens (top_p=nan), a top_p past 1, uniform
# sampling (temperature=inf), silently greedy (temperature=nan); or failed
# in jax's words (top_k=-3) or with an OverflowError traceback (the seed).
BAD_SAMPLING_FLAGS = {
  "--top_p=nan": "top_p: must be in (0, 1], got nan",
  "--top_p=2": "top_p: must be in (0, 1], got 2.0",
  "--temperature=inf": "temperature: must be a finite number >= 0, got inf",
  "--temperature=nan": "temperature: must be a finite number >= 0, got nan",
  "--top_k=-3": "top_k: must be an integer >= 0, got -3",
  "--seed=99999999999999999999": "seed: must be an integer in [0, 2147483647], got 99999",
  "--max_new_tokens=0": "max_new_tokens: must be an integer >= 1, got 0",
}


@pytest.mark.slow  # a command each (they stop before the model loads)
@pytest.mark.parametrize("flag", list(BAD_SAMPLING_FLAGS))
def test_generate_refuses_a_sampling_flag_out_of_range_before_loading(commands, tmp_path, flag):
  """An empty --model directory: the flag is what is reported, not the model."""
  result = run_command(commands, "experiments.generate", f"--model={tmp_path}", "--prompt=hi", flag)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().startswith(f"flag error: {BAD_SAMPLING_FLAGS[flag]}")
  assert len(result.stderr.strip().splitlines()) == 1 and not result.stdout
