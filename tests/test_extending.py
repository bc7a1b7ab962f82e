"""Extending txf from outside the package (txf.register, docs/extending.md):
the worked examples in examples/extending/ register a position encoding
with its own setting, a normalisation, a data task, a task kind (the
prefix LM) and an output head
(a model family is registered here); each computes what
its docstring says (float64 numpy references), changes the model it is
chosen in, and its config trains with txf-run from any directory that has
the examples (slow: a few steps each)."""

import contextlib
import json
import math
import runpy
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO, output_lines, tiny_config
from txf import models, ops
from txf.choices import Registry
from txf.data import ByteTokenizer, make_dataset, spec as data_config
from txf.data.spec import parse_data
from txf.interop import CheckpointError, Pretrained
from txf.interop.text import generate_text
from txf.layers import Norm, model_config as layer_config, positions
from txf.runconfig.run_config import parse
from txf.rundir import record
from txf.train.run_setup import TrainedModel, load_trained
from txf.train.step import labels_and_weights, model_inputs
from txf.trained.export import export_files

EXAMPLES = REPO / "examples" / "extending"
REGISTRIES = (positions.ENCODINGS, layer_config.NORMS, layer_config.ACTIVATIONS)
REGISTRIES += (layer_config.INITS, data_config.GENERATED, data_config.TEXT)
REGISTRIES += (layer_config.HEADS, layer_config.FAMILIES, data_config.TASKS)


@contextlib.contextmanager
def registered(*examples):
  """The examples' registrations, undone after (the registries are global)."""
  with contextlib.ExitStack() as scopes:
    for registry in REGISTRIES:
      scopes.enter_context(registry.scoped())
    for name in examples:
      runpy.run_path(str(EXAMPLES / f"{name}.py"))
    yield


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


@pytest.mark.parametrize(
  "change, message",
  [
    (
      lambda leaf: jnp.zeros((leaf.shape[0] + 1, *leaf.shape[1:]), leaf.dtype),
      r"made \S+ float32\[33, 16\], not the layer's float32\[32, 16\]",
    ),
    (
      lambda leaf: leaf.astype(jnp.bfloat16),
      r"made \S+ bfloat16\[32, 16\], not the layer's float32",
    ),
  ],
)
def test_an_init_scheme_that_reshapes_a_parameter_is_refused_naming_it(change, message):
  """A widened (or recast) leaf failed in flax at the first step, naming no
  field, after the run directory was written; the setup's abstract init
  finds it now."""
  from txf import register

  with registered():

    @register.init("widened")
    def widened(params, cfg, key):
      first = ["embedder", "token", "embedding"]
      table = params[first[0]][first[1]][first[2]]
      new = nn.meta.unbox(table)
      boxed = (
        table.replace_boxed(change(new)) if isinstance(table, nn.meta.AxisMetadata) else change(new)
      )
      return {**params, "embedder": {**params["embedder"], "token": {"embedding": boxed}}}

    cfg = layer_config.ModelConfig(**TINY, init="widened")
    with pytest.raises(ValueError, match=rf"^model\.init: 'widened' {message}"):
      jax.eval_shape(models.build(cfg).init, jax.random.key(0), jnp.ones((1, 4), jnp.int32))


def test_a_registered_head_is_chosen_by_the_config_and_matches_numpy():
  with registered("mlp_head"):
    cfg = layer_config.ModelConfig(**TINY, head="mlp_lm")
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, (2, 8)))
    params = nn.meta.unbox(models.build(cfg).init(jax.random.key(0), tokens))["params"]
    got = np.asarray(models.build(cfg).apply({"params": params}, tokens), np.float64)
    # The same body without a head gives the hidden states the head reads.
    body = {name: value for name, value in params.items() if name != "head"}
    hidden = np.asarray(
      models.build(cfg.replace(head="none")).apply({"params": body}, tokens), np.float64
    )
    dense = {k: np.asarray(v, np.float64) for k, v in params["head"]["hidden"].items()}
    x = hidden @ dense["kernel"] + dense["bias"]
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    table = np.asarray(params["embedder"]["token"]["embedding"], np.float64)
    expected = gelu @ table.T / (np.sqrt(16) if cfg.scale_logits else 1.0)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, logits(cfg.replace(head="lm"), tokens), atol=1e-3)
    with pytest.raises(
      ValueError, match=r"model\.head: 'mlp_lm' does not fit model\.family='encoder'"
    ):
      layer_config.ModelConfig(**TINY, family="encoder", head="mlp_lm")
  with pytest.raises(ValueError, match=r"model\.head: 'mlp_lm' is not one of"):
    layer_config.ModelConfig(**TINY, head="mlp_lm")


def test_a_registered_family_trains_from_a_run_config_and_carries_txfs_lm_head(tmp_path):
  from txf import register
  from txf.decode import generate
  from txf.layers import Embedder
  from txf.train import loop

  with registered():

    @register.family("unigram", tasks=("lm",), heads=("lm",))
    class UnigramLM(nn.Module):
      """Each token's logits from its own embedding: the baseline with no context."""

      cfg: layer_config.ModelConfig

      @nn.compact
      def __call__(self, tokens_BxT, *, deterministic=True, use_cache=False):
        embedder = Embedder(self.cfg, name="embedder")
        head = layer_config.HEADS[self.cfg.head].module(self.cfg, name="head")
        return head(embedder(tokens_BxT, None), tokens_BxT, embedder)

    cfg = layer_config.ModelConfig(**TINY, family="unigram", position="none")
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, (2, 8)))
    params = nn.meta.unbox(models.build(cfg).init(jax.random.key(0), tokens))["params"]
    table = np.asarray(params["embedder"]["token"]["embedding"], np.float64)
    expected = table[np.asarray(tokens)] @ table.T / (np.sqrt(16) if cfg.scale_logits else 1.0)
    np.testing.assert_allclose(logits(cfg, tokens), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"model\.family: 'unigram' cannot generate"):
      generate(models.build(cfg), params, tokens, max_new_tokens=1)

    config = tiny_config("rope", steps=30, model__family="unigram", model__position="none")
    sampling = tiny_config(
      "rope", steps=1, model__family="unigram", model__position="none", eval__sample_tokens=4
    )
    with pytest.raises(
      loop.ConfigError, match=r"; eval\.sample_tokens=0 trains it without samples$"
    ):
      loop.run(parse(sampling), str(tmp_path / "sampling"), log=lambda line: None)
    config.train.learning_rate = 3e-2
    rows = []
    loop.run(parse(config), str(tmp_path), log=lambda line: None)
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
      row = json.loads(line)
      if "loss" in row:
        rows.append(row["loss"])
    # Byte unigram statistics are learnt within a few steps: from ln(260).
    assert rows[0] > 5.0 and rows[-1] < rows[0] - 1.0, rows
    # What txf-extrapolate and txf-analyze cannot read is refused before any
    # compute (a ValueError's traceback as the first window was scored; a KeyError).
    from txf.trained.extrapolate import check_extrapolation
    from txf.trained.head_analysis import check_analysis

    # A family of task 'lm' with txf's LM head is a language model whose
    # windows txf-extrapolate scores (it named 'decoder' and 'lstm' alone).
    assert check_extrapolation(tmp_path, [1, 2]).run.setup.run.model.family == "unigram"
    with pytest.raises(ValueError, match=r"^model\.family: .*'unigram'\) has no attention"):
      check_analysis(tmp_path)
  with pytest.raises(ValueError, match=r"model\.family: 'unigram' is not one of"):
    layer_config.ModelConfig(**TINY, family="unigram")


def test_successor_task_rows_count_upwards_through_the_symbols():
  with registered("successor_task"):
    data = parse_data(dict(name="successor", task="lm", seq_len=12, batch_size=4, num_symbols=5))
    dataset = make_dataset(data, "train", seed=0)
    batch = next(dataset)
    first = int(dataset.tokenizer.encode("s0")[0])
    steps = (batch["targets"] - first) - (batch["inputs"] - first)
    assert np.all(steps % 5 == 1) and np.all(batch["weights"] == 1)
    assert batch["inputs"].min() >= first and batch["inputs"].max() < first + 5
    assert "successor task (registered)" in dataset.description


def test_a_registered_text_source_gives_lm_and_mlm_batches_of_its_documents(tmp_path):
  from txf import register

  def data(name, task="lm"):
    fields = dict(name=name, task=task, seq_len=40, batch_size=2, tokenizer="bytes")
    return dict(fields, max_corpus_bytes=10_000, mlm_probability=0.5)

  with registered():

    @register.text_source("repeat", argument="WORD")
    def repeat(word, split, max_bytes):
      return [f"{word} {split}. " * 20] * 3

    assert "repeat:WORD" in data_config.data_name_forms()
    for split in ("train", "validation"):
      dataset = make_dataset(parse_data(data("repeat:hello")), split, seed=0, num_batches=1)
      text = dataset.tokenizer.decode(np.asarray(next(dataset)["inputs"][0]).tolist())
      assert f"hello {split}. hello" in text and "hello" in dataset.description
    masked = next(make_dataset(parse_data(data("repeat:hello", "mlm")), "train", seed=0))
    assert np.any(masked["weights"]) and not np.all(masked["weights"])
    with pytest.raises(ValueError, match=r"data\.name='repeat:' names no WORD"):
      parse_data(data("repeat:"))

    # A split of no documents, or of bytes, is a line naming the source (it
    # was numpy's "need at least one array to concatenate", an AttributeError).
    @register.text_source("sparse", argument="KIND")
    def sparse(kind, split, max_bytes):
      kinds = {"none": [], "bytes": [b"abc"] * 3, "str": "one text, not a list of them " * 9}
      return kinds[kind] if split == "validation" else ["a" * 99]

    with pytest.raises(
      ValueError, match=r"^data\.name='sparse:none': its validation split holds no"
    ):
      make_dataset(parse_data(data("sparse:none")), "validation", seed=0)
    with pytest.raises(ValueError, match=r"^data\.name='sparse:bytes': .* must be str, got bytes$"):
      make_dataset(parse_data(data("sparse:bytes")), "validation", seed=0)
    # A str: its characters were the documents, trained on without a word.
    with pytest.raises(ValueError, match=r"^data\.name='sparse:str': .* is one str, not a list"):
      make_dataset(parse_data(data("sparse:str")), "validation", seed=0)

    # A file the loader cannot open (extending.md's jsonl source given a wrong
    # path): a FileNotFoundError's traceback, where the built-in sources say one line.
    @register.text_source("lines", argument="DIR")
    def lines(directory, split, max_bytes):
      with open(f"{directory}/{split}.txt") as file:
        return file.read().splitlines()

    with pytest.raises(ValueError, match=r"^data\.name='lines:/nonexistent': .*No such file"):
      make_dataset(parse_data(data("lines:/nonexistent")), "train", seed=0)
    # Any file it cannot read, not only a missing one (a directory where its
    # file should be: IsADirectoryError, an OSError too): one line as well.
    (tmp_path / "train.txt").mkdir()
    with pytest.raises(ValueError, match=rf"^data\.name='lines:{tmp_path}': .*Is a directory"):
      make_dataset(parse_data(data(f"lines:{tmp_path}")), "train", seed=0)
  with pytest.raises(
    ValueError, match=r"data\.name='repeat:hello' is not one of .* or of the forms"
  ):
    parse_data(data("repeat:hello"))


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


def test_a_data_name_is_either_a_generated_dataset_or_a_text_source():
  """GENERATED and TEXT both serve data.name: neither takes a name the other
  holds (a text source named 'copy' would shadow the generated task), even
  with replace; txf's own entries are all there when a user registers."""
  from txf import register

  with registered():
    with pytest.raises(ValueError, match=r"data\.name: 'copy' is registered already, as another"):
      register.text_source("copy", replace=True)(lambda argument, split, max_bytes: ["x"])
    with pytest.raises(ValueError, match=r"data\.name: 'pystdlib' is registered already, as"):
      register.lm_task("pystdlib", replace=True)(lambda *args: None)
    assert "copy" in data_config.GENERATED and "copy" not in data_config.TEXT
    assert "pystdlib" in data_config.TEXT and "pystdlib" not in data_config.GENERATED
  private = Registry("data.name"), Registry("data.name")
  private[0].share_names(private[1])
  private[0].register("a", len)
  private[1].register("b", abs)
  with pytest.raises(ValueError, match="as another kind"):
    private[1].register("a", len)


def prefix_lm_mask_reference(prefix_B, T):
  """float64 [B, T, T]: 1 where query i may attend key j (j <= i or j < prefix)."""
  i, j = np.arange(T)[:, None], np.arange(T)[None, :]
  return np.stack([((j <= i) | (j < p)).astype(np.float64) for p in prefix_B])


def test_prefix_lm_mask_is_bidirectional_within_the_prefix_and_causal_after():
  prefix_B = np.array([0, 1, 3, 6])
  mask = np.asarray(ops.prefix_lm_mask(jnp.asarray(prefix_B), 6), np.float64)
  np.testing.assert_array_equal(mask[:, 0], prefix_lm_mask_reference(prefix_B, 6))


def test_a_decoder_with_a_prefix_attends_both_ways_within_it_only():
  cfg = layer_config.ModelConfig(**TINY)
  model = models.build(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, (2, 8)))
  params = model.init(jax.random.key(0), tokens)
  prefix = jnp.array([4, 4])
  run = lambda t, p=prefix: np.asarray(model.apply(params, t, None, None, p), np.float64)  # noqa: E731
  # A prefix of 0 is the causal decoder, to the bit.
  np.testing.assert_array_equal(run(tokens, jnp.array([0, 0])), logits(cfg, tokens))
  changed = run(tokens.at[:, 3].set(tokens[:, 3] % 31 + 1)) - run(tokens)
  # Token 3 lies in the prefix: every position sees it (positions 0-2 only through the prefix).
  assert np.all(np.abs(changed).max(axis=-1) > 1e-6)
  changed = run(tokens.at[:, 5].set(tokens[:, 5] % 31 + 1)) - run(tokens)
  # Token 5 lies after it: positions before 5 do not see it (exactly), those from 5 do.
  np.testing.assert_array_equal(changed[:, :5], 0.0)
  assert np.all(np.abs(changed[:, 5:]).max(axis=-1) > 1e-6)


def test_prefix_lm_trains_on_the_suffix_only_and_feeds_the_decoder_its_prefix():
  rng = np.random.default_rng(0)
  B, T = 64, 10
  ids = rng.integers(1, 32, (B, T + 1))
  weights = rng.random((B, T)) > 0.2
  batch = dict(inputs=ids[:, :-1], targets=ids[:, 1:], weights=weights)
  with registered("prefix_lm"):
    parse_data(dict(name="pystdlib", task="prefix_lm"))  # a data.name giving lm batches fits
    inputs, segment_ids, positions_, prefix_B = model_inputs(batch, "prefix_lm")
    labels, loss_weights = labels_and_weights(batch, "prefix_lm")
  prefix_B = np.asarray(prefix_B)
  assert segment_ids is None and positions_ is None and np.all(inputs == batch["inputs"])
  assert prefix_B.min() >= 1 and prefix_B.max() <= T - 1 and len(set(prefix_B)) > T // 2
  # float64 reference: target t (token t + 1) is trained iff it lies in the suffix (t + 1 >= P).
  expected = np.stack([weights[b] * (np.arange(T) + 1 >= p) for b, p in enumerate(prefix_B)])
  np.testing.assert_array_equal(np.asarray(loss_weights, np.float64), expected.astype(np.float64))
  np.testing.assert_array_equal(labels, batch["targets"])


def test_a_task_kind_is_checked_against_the_data_and_its_registry():
  with registered("prefix_lm"):
    with pytest.raises(
      ValueError, match="data.task='prefix_lm' .it reads 'lm' batches. does not fit"
    ):
      parse_data(dict(name="listops", task="prefix_lm"))
  with pytest.raises(ValueError, match="data.task: 'prefix_lm' is not one of"):
    parse_data(dict(name="pystdlib", task="prefix_lm"))


@pytest.mark.slow  # trains five tiny runs in subprocesses
@pytest.mark.parametrize(
  "name", ["log_distance", "scale_norm", "successor", "prefix_lm", "mlp_head"]
)
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
  (eval_line,) = [line for line in output_lines(done.stdout) if line.startswith("eval @ 3")]
  loss = float(eval_line.split("eval_loss=")[1].split(",")[0])
  assert math.isfinite(loss) and loss < 10
  if name == "prefix_lm":  # later commands import the task's module, as the record names it
    choice = record.read_record(tmp_path / "run")[-1]["choices"]["data.task"]
    assert (choice["module"], choice["function"], choice["builtin"]) == (
      "prefix_lm",
      "PrefixLM",
      False,
    )
  if name in ("prefix_lm", "mlp_head"):
    check_runs_as_a_causal_lm_or_not(tmp_path / "run", name)


def check_runs_as_a_causal_lm_or_not(workdir, name):
  """A prefix LM, trained attending both ways within its prefix, is neither
  generated from nor exported as a causal LM (txf-export wrote a
  GPTNeoXForCausalLM, txf-generate decoded causally); a registered LM head
  generates (txf-generate refused every head but 'lm'): its greedy tokens
  are the full pass's argmax, token by token."""
  with registered():  # loading the run imports the module its record names
    trained = load_trained(workdir)
    if name == "prefix_lm":
      message = r"^data\.task: .* trained for 'prefix_lm', not a causal language model"
      with pytest.raises(ValueError, match=message):
        trained.check_runs_causally()
      with pytest.raises(CheckpointError, match=message):
        export_files(trained)
      return
    check_greedy_text(trained.pretrained)


def check_greedy_text(pretrained):
  """generate_text's greedy tokens from a 3-token prompt are the full pass's
  argmax, token by token."""
  prompt_1xP = np.array([[5, 9, 3]], np.int32)
  got = generate_text(pretrained, prompt_1xP, max_new_tokens=3)
  model = models.build(pretrained.config)
  tokens = prompt_1xP
  for _ in range(3):
    logits_BxTxV = model.apply({"params": pretrained.params}, tokens)
    tokens = np.concatenate([tokens, np.argmax(logits_BxTxV[:, -1:], axis=-1)], axis=1)
  np.testing.assert_array_equal(np.asarray(got), tokens[:, 3:])


@pytest.mark.slow  # compiles decoding and three forward passes (4-5 s)
def test_a_registered_generative_family_generates_text_and_scores_windows():
  """generate_text (txf-generate) and extrapolation's check (txf-extrapolate)
  named 'decoder' and 'lstm' alone: a family registered generative=True, as
  txf.decode generates with it, was refused, and one trained as a prefix LM
  was not refused as the decoder is; a family that names no head was told
  to 'choose from ()'."""
  from txf import register
  from txf.analysis.extrapolation import check_language_model

  with registered("prefix_lm"):

    @register.family("decoder_again", tasks=("lm",), heads=("lm",), generative=True)
    class DecoderAgain(models.Decoder):
      pass

    @register.family("headless", tasks=("lm",))
    class Headless(models.Decoder):
      pass

    cfg = layer_config.ModelConfig(**TINY, family="decoder_again")
    model = models.build(cfg)
    params = nn.meta.unbox(model.init(jax.random.key(0), jnp.ones((1, 4), jnp.int32)))["params"]
    pretrained = Pretrained(cfg, params, "a txf run", {"eos_token_id": None})
    check_greedy_text(pretrained)
    check_language_model(model)
    # Trained as a prefix LM, it is not generated from causally (as a decoder is not).
    trained = TrainedModel(pretrained, ByteTokenizer(), step=1, task="prefix_lm")
    with pytest.raises(ValueError, match=r"^data\.task: a txf run trained for 'prefix_lm'"):
      trained.check_runs_causally()
    encoder = models.build(layer_config.ModelConfig(**TINY, family="encoder", head="mlm"))
    with pytest.raises(ValueError, match=r"^model must be a txf language model"):
      check_language_model(encoder)
    with pytest.raises(ValueError, match=r"'headless' \(it carries none: register\.family"):
      layer_config.ModelConfig(**TINY, family="headless")


def test_export_refuses_a_built_in_name_that_user_code_replaced():
  """A norm registered as 'rms' with replace=True (here: centred first) was
  written as Llama's RMSNorm, another function of the same weights, without
  a word; a registered init scheme does not stop an export (a trained
  model's function does not read it)."""
  from txf import register
  from txf.interop import pretrained_files

  cfg = layer_config.ModelConfig(**TINY, norm="rms", position="rope", activation="swiglu")
  tokens = jnp.ones((1, 4), jnp.int32)
  with registered():

    @register.init("as_drawn")
    def as_drawn(params, cfg, key):
      return params

    plain = models.build(cfg).init(jax.random.key(0), tokens)["params"]
    assert "config.json" in pretrained_files(cfg.replace(init="as_drawn"), plain)

    @register.norm("rms", replace=True)
    def centred_rms(layer, x, cfg):
      scale = layer.param("scale", nn.initializers.ones, (x.shape[-1],))
      x = x - x.mean(-1, keepdims=True)
      return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + cfg.norm_eps) * scale

    params = models.build(cfg).init(jax.random.key(0), tokens)["params"]
    with pytest.raises(
      CheckpointError, match=r"^model\.norm: 'rms' is \S+centred_rms, not txf's own"
    ):
      pretrained_files(cfg, params)
