"""Extending txf from outside the package (txf.register, docs/extending.md):
the worked examples in examples/extending/ register a position encoding
with its own setting, a normalisation and a data task; each computes what
its docstring says (float64 numpy references), changes the model it is
chosen in, and its config trains with txf-run from any directory that has
the examples (slow: a few steps each)."""

import contextlib
import math
import runpy
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from conftest import REPO
from txf import models
from txf.data import make_dataset, spec as data_config
from txf.layers import Norm, model_config as layer_config, positions
from txf.registry import Registry

EXAMPLES = REPO / "examples" / "extending"
REGISTRIES = (positions.ENCODINGS, layer_config.NORMS, layer_config.ACTIVATIONS)
REGISTRIES += (layer_config.INITS, data_config.GENERATED)


@contextlib.contextmanager
def registered(*examples):
  """The examples' registrations, undone after (the registries are global)."""
  saved = [(r, dict(r._entries), dict(r._options)) for r in REGISTRIES]
  try:
    for name in examples:
      runpy.run_path(str(EXAMPLES / f"{name}.py"))
    yield
  finally:
    for registry, entries, options in saved:
      registry._entries, registry._options = entries, options


TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=1, max_len=16)


def logits(cfg, tokens):
  model = models.build(cfg)
  params = model.init(jax.random.key(0), tokens)
  return np.asarray(model.apply(params, tokens))


def test_log_distance_bias_and_its_setting():
  with registered("log_distance"):
    cfg = layer_config.ModelConfig(**TINY, position="log_distance")
    assert cfg.option("log_bias_scale") == 1.0
    entry = positions.encoding("log_distance")
    q, k = jnp.arange(5)[None], jnp.arange(5)[None]
    bias = np.asarray(entry.bias(cfg, q, k, None, bidirectional=False), np.float64)
    slopes = 2.0 ** (-8.0 * np.arange(1, 3) / 2)  # ALiBi's for 2 heads
    distance = np.abs(np.arange(5)[:, None] - np.arange(5)[None, :])
    expected = -slopes[:, None, None] * np.log1p(distance)[None]
    np.testing.assert_allclose(bias[0], expected, rtol=1e-6)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, (2, 8)))
    base = logits(cfg, tokens)
    scaled = logits(cfg.replace(options={"log_bias_scale": 2.0}), tokens)
    alibi = logits(layer_config.ModelConfig(**TINY, position="alibi"), tokens)
    assert not np.allclose(base, scaled, atol=1e-5) and not np.allclose(base, alibi, atol=1e-5)
    with pytest.raises(ValueError, match=r"model\.options\.log_bias_slope: not a setting"):
      layer_config.ModelConfig(**TINY, position="log_distance", options={"log_bias_slope": 2})
  with pytest.raises(ValueError, match=r"model\.position: 'log_distance' is not one of"):
    layer_config.ModelConfig(**TINY, position="log_distance")


def test_scale_norm_matches_numpy_and_is_chosen_by_the_config():
  with registered("scale_norm"):
    cfg = layer_config.ModelConfig(**TINY, norm="scale")
    x = 3.0 * jax.random.normal(jax.random.key(1), (2, 4, 16)) + 1.0
    params = nn.meta.unbox(Norm(cfg).init(jax.random.key(0), x))
    assert float(params["params"]["g"]) == pytest.approx(4.0)  # sqrt(16)
    x64 = np.asarray(x, np.float64)
    expected = 4.0 * x64 / np.linalg.norm(x64, axis=-1, keepdims=True)
    np.testing.assert_allclose(Norm(cfg).apply(params, x), expected, rtol=1e-5)
    block = nn.meta.unbox(models.build(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))
    assert set(block["params"]["stack"]["block_0"]["ffn_norm"]) == {"g"}


def test_an_lstm_reads_the_options_of_its_registered_norm():
  from txf import register

  with registered():

    @register.norm("fixed_scale", options={"norm_scale": 1.0})
    def fixed_scale(layer, x_BxTxD, cfg):
      return cfg.option("norm_scale") * x_BxTxD

    lstm = dict(vocab_size=32, d_model=16, num_layers=1, family="lstm", norm="fixed_scale")
    cfg = layer_config.ModelConfig(**lstm)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, (2, 8)))
    doubled = logits(cfg.replace(options={"norm_scale": 2.0}), tokens)
    # The final norm feeds the tied head (no bias): the logits scale with it.
    np.testing.assert_allclose(doubled, 2.0 * logits(cfg, tokens), rtol=1e-5, atol=1e-6)


def test_a_registered_init_scheme_redraws_the_parameters_with_its_setting():
  from txf import register

  with registered():

    @register.init("constant", options={"init_value": 0.5})
    def constant(params, cfg, key):
      return jax.tree.map(lambda leaf: jnp.full_like(leaf, cfg.option("init_value")), params)

    cfg = layer_config.ModelConfig(**TINY, init="constant")
    tokens = jnp.ones((1, 4), jnp.int32)
    for value, config in ((0.5, cfg), (-2.0, cfg.replace(options={"init_value": -2.0}))):
      params = nn.meta.unbox(models.build(config).init(jax.random.key(0), tokens))["params"]
      leaves = jax.tree.leaves(params)
      assert len(leaves) > 4 and all(np.all(np.asarray(leaf) == value) for leaf in leaves)
  with pytest.raises(ValueError, match=r"model\.init: 'constant' is not one of \('txf', 'gpt2'\)"):
    layer_config.ModelConfig(**TINY, init="constant")


def test_successor_task_rows_count_upwards_through_the_symbols():
  with registered("successor_task"):
    data = ml_collections.ConfigDict(
      dict(name="successor", task="lm", seq_len=12, batch_size=4, num_symbols=5)
    )
    dataset = make_dataset(data, "train", seed=0)
    batch = next(dataset)
    first = int(dataset.tokenizer.encode("s0")[0])
    steps = (batch["targets"] - first) - (batch["inputs"] - first)
    assert np.all(steps % 5 == 1) and np.all(batch["weights"] == 1)
    assert batch["inputs"].min() >= first and batch["inputs"].max() < first + 5
    assert "successor task (registered)" in dataset.description


def test_a_name_registered_twice_needs_replace():
  registry = Registry("model.norm")
  registry.register("a", len)
  registry.register("a", len)  # the same entry again: a module imported twice
  with pytest.raises(ValueError, match=r"model\.norm: 'a' is registered already"):
    registry.register("a", abs)
  registry.register("a", abs, replace=True)
  assert registry["a"] is abs
  with pytest.raises(ValueError, match=r"model\.norm: 'b' is not one of \('a',\)"):
    registry["b"]


@pytest.mark.slow  # trains three tiny runs in subprocesses
@pytest.mark.parametrize("name", ["log_distance", "scale_norm", "successor"])
def test_each_example_config_trains_with_txf_run_from_another_directory(tmp_path, name):
  shutil.copytree(REPO / "examples", tmp_path / "examples")
  command = [
    sys.executable,
    "-c",
    "import sys; from txf.commands.run import cli; sys.argv[0] = 'txf-run'; cli()",
    f"--config=examples/extending/{name}_config.py",
    f"--workdir={tmp_path / 'run'}",
    *(
      f"--config.{field}={value}"
      for field, value in (
        ("train.steps", 3),
        ("train.warmup_steps", 1),
        ("model.d_model", 32),
        ("model.num_layers", 1),
        ("data.batch_size", 4),
        ("data.max_corpus_bytes", 300_000),
        ("eval.every", 3),
        ("eval.num_batches", 1),
        ("eval.sample_tokens", 0),
      )
    ),
  ]
  done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-2000:]
  (eval_line,) = [line for line in done.stdout.splitlines() if line.startswith("eval @ 3")]
  loss = float(eval_line.split("eval_loss=")[1].split(",")[0])
  assert math.isfinite(loss) and loss < 10
