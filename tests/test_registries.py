"""Every registry's options differ from each other, and each option's own settings matter.

A registry entry that silently behaves like another (a name mapped to the
wrong function, a dispatch that falls through to the default) or ignores one
of its own settings (RoPE's base, T5's max distance, a norm's eps) passes
every test that checks one option at its defaults. Here, for each registry,
every pair of options must give different outputs on the same inputs and
parameters, and changing each setting an option reads must change its output.

The option lists come from the registries themselves (ModelConfig's CHOICES,
txf.layers.positions.ENCODINGS through them, txf.data.spec.data_names(),
txf.runconfig.optim.DECAYS, ...), so a new option is compared with every other
without a new test; SETTINGS must name its settings (an empty dict if it has
none), or `test_every_option_declares_its_settings` fails. Registries whose
options are implementations of the same math (model.attention_impl) are
held equal elsewhere (IMPLEMENTATIONS).

Models are tiny (1 layer, d_model 16, 8 tokens) and run eagerly; their
parameters are random values keyed by each parameter's path, so options
share the parameters they have in common and none is zero (a zero-initialised
bias or relative-position table would make two options agree at init).

Registries not covered here, and where they are: data.tokenizer (each
checked against its library, and the entries against each other, in
test_data_tokenizers.py; sentencepiece trains for seconds), train replica
strategies and decode padding sides (implementations, held equal in
test_replicas.py and test_decode.py), and entry-point tables (textbook
EXPERIMENTS, benchmark MODES, train.trackers, Hugging Face ARCHITECTURES,
each tested where it is run). The registries user code extends through
txf.register beyond the model's and data.name (data.tokenizer, train.decay,
train.trackers) each take a registered name and refuse an unknown one in one
line that lists it (`test_a_registered_name_is_read_and_an_unknown_one_lists_it`).
"""

import dataclasses
import functools
import itertools
import re
import types
import zlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import models, register
from txf.analysis import extrapolation
from txf.data import ByteTokenizer, make_dataset, make_tokenizer, spec as data_config
from txf.interop import text
from txf.layers import model_config as layer_config
from txf.layers.model_config import CHOICES, LSTM_FIELDS, REGISTRY_FIELDS, ModelConfig
from txf.runconfig import optim, tracker_kinds

# --- model options ----------------------------------------------------------------

B, T = 2, 8
BASE = dict(
  vocab_size=16,
  d_model=16,
  num_heads=2,
  num_layers=1,
  max_len=16,
  # The settings of the positions (each model keeps its own position's):
  # rope_scale > 1: rope and rope_ntk rotate differently (at 1 both are
  # plain RoPE); 8 buckets, so that distances 4..7 of 8 tokens fall in the
  # log-spaced buckets that t5_max_distance shapes.
  options=dict(rope_scale=2.0, t5_num_buckets=8, t5_max_distance=16),
)
# The model an option is tried in where the decoder with an lm head cannot
# carry it.
CONTEXT = {
  ("family", "encoder"): dict(head="mlm"),
  ("head", "mlm"): dict(family="encoder"),
  ("head", "classify"): dict(family="encoder"),
  **{("pooling", p): dict(family="encoder", head="classify") for p in layer_config.POOLINGS},
}
# Registries of implementations of the same math, whose options must agree
# instead (-> the test that holds them equal).
IMPLEMENTATIONS = {
  "attention_impl": (
    "ops/test_ops_attention_chunked.py::test_model_attention_impl_chunked_gives_the_xla_logits"
  ),
}
# Registries of initial parameters: the models here replace their parameters,
# so their options are held apart on the parameters init draws instead.
INIT_REGISTRIES = ("init",)
# The settings each option reads, with a value other than BASE's: changing
# each must change the option's output. ModelConfig fields, or settings the
# entry declares (model.options; every one of them is listed).
SETTINGS = {
  ("family", "decoder"): {},
  ("family", "encoder"): dict(num_token_types=2),
  ("family", "encoder_decoder"): dict(num_decoder_layers=2, share_embeddings=False),
  ("family", "lstm"): {},
  ("position", "sinusoidal"): {},
  ("position", "learned"): {},  # its table's size (max_len) only bounds the length
  ("position", "rope"): dict(rope_base=100.0, rope_scale=3.0),
  ("position", "rope_ntk"): dict(rope_base=100.0, rope_scale=3.0),
  ("position", "alibi"): {},  # slopes from num_heads alone
  ("position", "t5_bias"): dict(t5_num_buckets=6, t5_max_distance=6),
  ("position", "none"): {},
  ("activation", "relu"): {},
  ("activation", "gelu"): dict(gelu_approximate=False),
  ("activation", "swiglu"): {},
  ("activation", "geglu"): dict(gelu_approximate=False),
  ("norm", "layer"): dict(norm_eps=0.5),
  ("norm", "rms"): dict(norm_eps=0.5),
  ("norm_placement", "pre"): {},
  ("norm_placement", "post"): {},
  ("attention", "softmax"): {},
  ("attention", "linear"): {},  # no scale: a factor on q.k cancels in its normalisation
  ("head", "lm"): dict(tie_embeddings=False, scale_logits=False),
  ("head", "mlm"): dict(gelu_approximate=False),
  ("head", "classify"): dict(num_classes=3),
  ("head", "none"): {},
  **{("pooling", p): {} for p in layer_config.POOLINGS},
  **{("dtype", d): {} for d in layer_config.DTYPES},
}
# ModelConfig fields that are neither a registry nor one option's setting:
# every model reads them.
GENERAL_FIELDS = {
  "vocab_size",
  "d_model",
  "num_heads",
  "num_kv_heads",
  "head_dim",
  "num_layers",
  "d_ff",
  "max_len",
  "embed_norm",
  "scale_attention",
  "use_bias",
  "dropout_rate",
  "attention_dropout_rate",
  "window",
  "pad_id",
  "remat",
  "scan_layers",
  # The chosen entries' settings: SETTINGS names those of txf's entries (a
  # user's entry is tested where it is registered, e.g. examples/extending).
  "options",
}


FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


def model_config(registry, option, **changes):
  """The model of `option` in BASE, with `changes` to fields or to its settings."""
  settings = {name: value for name, value in changes.items() if name not in FIELDS}
  fields = {**BASE, **CONTEXT.get((registry, option), {}), registry: option}
  fields.update({name: value for name, value in changes.items() if name in FIELDS})
  fields["options"] = {**BASE["options"], **settings}
  if fields.get("family") == "lstm":  # its position keeps rope's default settings
    fields = {k: v for k, v in fields.items() if k in LSTM_FIELDS and k != "options"}
  return ModelConfig(**fields)


def setting_value(cfg, setting):
  """A ModelConfig field's value, or a setting's in model.options."""
  return getattr(cfg, setting) if setting in FIELDS else cfg.option(setting)


FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def random_params(shapes):
  """Normal(0, 0.5) values keyed by each parameter's path (a parameter two
  models share gets the same values; a longer table extends a shorter one)."""

  def fill(path, leaf):
    rng = np.random.default_rng(zlib.crc32(jax.tree_util.keystr(path).encode()))
    return jnp.asarray(rng.normal(0.0, 0.5, int(np.prod(leaf.shape))).reshape(leaf.shape))

  return jax.tree_util.tree_map_with_path(fill, shapes)


@functools.cache
def _output(cfg: ModelConfig) -> np.ndarray:
  model = models.build(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, BASE["vocab_size"], (B, T)), jnp.int32)
  inputs = (tokens,) * (2 if cfg.family == "encoder_decoder" else 1)
  shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"])
  variables = {"params": random_params(shapes)}
  if cfg.dtype == "float32":
    return np.asarray(model.apply(variables, *inputs))
  # Eagerly, each op of a half-precision model would compile on its own; one
  # program compiled without optimisation costs a third of that.
  compiled = jax.jit(model.apply).lower(variables, *inputs).compile(FAST_COMPILE)
  return np.asarray(compiled(variables, *inputs), np.float32)


def output(registry, option, **changes):
  return _output(model_config(registry, option, **changes))


def differ(a, b):
  return a.shape != b.shape or not np.allclose(a, b, rtol=1e-6, atol=1e-6)


DISTINCT_REGISTRIES = [
  name for name in CHOICES if name not in IMPLEMENTATIONS and name not in INIT_REGISTRIES
]


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("registry", INIT_REGISTRIES)
def test_every_init_option_draws_other_parameters(registry):
  tokens = jnp.ones((B, T), jnp.int32)
  drawn = {}
  for option in CHOICES[registry]:
    params = models.build(model_config(registry, option)).init(jax.random.key(0), tokens)
    drawn[option] = np.concatenate([np.ravel(x) for x in jax.tree.leaves(nn.meta.unbox(params))])
  same = [(a, b) for a, b in itertools.combinations(drawn, 2) if not differ(drawn[a], drawn[b])]
  assert not same, f"model.{registry}: options drawing the same parameters: {same}"


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("registry", DISTINCT_REGISTRIES)
def test_every_option_changes_the_model_output(registry):
  outputs = {option: output(registry, option) for option in CHOICES[registry]}
  same = [
    (a, b) for a, b in itertools.combinations(outputs, 2) if not differ(outputs[a], outputs[b])
  ]
  assert not same, f"model.{registry}: options with the same output: {same}"


@pytest.mark.parametrize(
  "registry, option, setting",
  [(r, o, s) for (r, o), settings in SETTINGS.items() for s in settings],
  ids=lambda value: str(value),
)
def test_every_option_setting_changes_the_model_output(registry, option, setting):
  value = SETTINGS[registry, option][setting]
  assert setting_value(model_config(registry, option), setting) != value
  assert differ(output(registry, option), output(registry, option, **{setting: value})), (
    f"model.{registry}={option!r} ignores model.{setting} (= {value!r})"
  )


def test_every_option_declares_its_settings():
  options = {(r, o) for r in DISTINCT_REGISTRIES for o in CHOICES[r]}
  assert not options - set(SETTINGS), "options without a SETTINGS entry (add one, {} for none)"
  assert not set(SETTINGS) - options
  settings = {s for entry in SETTINGS.values() for s in entry}
  unsorted = FIELDS - set(CHOICES) - settings - GENERAL_FIELDS
  assert not unsorted, (
    f"ModelConfig fields {sorted(unsorted)}: name each in the SETTINGS of the "
    "options that read it, or in GENERAL_FIELDS"
  )
  for (registry, option), listed in SETTINGS.items():
    declared = REGISTRY_FIELDS[registry].options(option) if registry in REGISTRY_FIELDS else {}
    assert set(declared) == set(listed) - FIELDS, (
      f"model.{registry}={option!r}: SETTINGS lists {sorted(set(listed) - FIELDS)} of its "
      f"settings, it declares {sorted(declared)}"
    )


# --- data names (txf.data.spec.data_names()) ------------------------------------

DATA_BASE = {
  "pystdlib": dict(seq_len=8, tokenizer="bytes", max_corpus_bytes=4000, mlm_probability=0.5),
  "copy": dict(seq_len=9, min_example_len=2, max_example_len=8),
  "reverse": dict(seq_len=9, min_example_len=2, max_example_len=8),
  "sort": dict(seq_len=9, min_example_len=2, max_example_len=8),
  "addition": dict(seq_len=9, min_example_len=3, max_example_len=8),
  "listops": dict(seq_len=17, min_example_len=4, max_example_len=16, listops_max_depth=3),
  "induction": dict(seq_len=16, min_example_len=2, max_example_len=7, num_symbols=9),
  "mqar": dict(seq_len=20, num_kv_pairs=3, num_symbols=12),
}
# The data fields each name reads (those parse_data sets for it), with
# another value.
DATA_SETTINGS = {
  "pystdlib": dict(max_corpus_bytes=3000, mlm_probability=0.2),
  "copy": dict(min_example_len=3, max_example_len=7),
  "reverse": dict(min_example_len=3, max_example_len=7),
  "sort": dict(min_example_len=3, max_example_len=7),
  "addition": dict(min_example_len=4, max_example_len=7),
  "listops": dict(min_example_len=5, max_example_len=14, listops_max_depth=2),
  "induction": dict(min_example_len=3, max_example_len=6, num_symbols=12),
  "mqar": dict(num_kv_pairs=2, num_symbols=16),
}
# Fields every name reads, and registries of their own; seed_per_replica is
# the run's (tests/train/test_replica_runs.py shows it changes the batches).
DATA_COMMON = {"name", "task", "seq_len", "batch_size", "seed", "tokenizer", "seed_per_replica"}
DATA_OPTIONS = [(name, task) for name, tasks in data_config.data_names().items() for task in tasks]


def data_fields(name, task, **changes):
  return data_config.parse_data(
    dict(DATA_BASE[name], name=name, task=task, batch_size=8, **changes)
  )


def first_batch(name, task, **changes):
  return next(make_dataset(data_fields(name, task, **changes), "train", seed=0))


def batches_differ(a, b):
  return a.keys() != b.keys() or any(differ(a[k], b[k]) for k in a)


def test_every_data_name_and_task_gives_its_own_batches():
  batches = {option: first_batch(*option) for option in DATA_OPTIONS}
  same = [
    (a, b)
    for a, b in itertools.combinations(batches, 2)
    if not batches_differ(*map(batches.get, (a, b)))
  ]
  assert not same, f"data.name/data.task with the same batches: {same}"


@pytest.mark.parametrize("name, task", DATA_OPTIONS, ids=lambda value: str(value))
def test_every_data_field_a_name_reads_changes_its_batches(name, task):
  assert name in DATA_BASE and name in DATA_SETTINGS, f"data.name={name!r}: add its entries"
  spec = data_fields(name, task)
  read = {k for k, v in dataclasses.asdict(spec).items() if v is not None} - DATA_COMMON
  assert read <= set(DATA_SETTINGS[name]), (
    f"{name}: no other value for {read - set(DATA_SETTINGS[name])}"
  )
  base = first_batch(name, task)
  for field in sorted(read):
    changed = first_batch(name, task, **{field: DATA_SETTINGS[name][field]})
    assert batches_differ(base, changed), f"data.name={name!r} ignores data.{field}"


# --- learning-rate decays, extrapolation protocols, sentence poolings -----------------

TRAIN = dict(learning_rate=1.0, warmup_steps=3, steps=12, end_lr_fraction=0.1)
DECAY_SETTINGS = {
  "cosine": dict(warmup_steps=2, steps=10, end_lr_fraction=0.3),
  "linear": dict(warmup_steps=2, steps=10, end_lr_fraction=0.3),
  "constant": dict(warmup_steps=2),
  "rsqrt": dict(warmup_steps=2),
}


def learning_rates(decay, **changes):
  schedule = optim.make_schedule(types.SimpleNamespace(**{**TRAIN, **changes, "decay": decay}))
  return np.asarray(schedule(jnp.arange(16)))


def test_every_decay_has_its_own_schedule_and_reads_its_settings():
  assert set(DECAY_SETTINGS) == set(optim.DECAYS)
  rates = {decay: learning_rates(decay) for decay in optim.DECAYS}
  same = [(a, b) for a, b in itertools.combinations(rates, 2) if not differ(rates[a], rates[b])]
  assert not same, f"train.decay options with the same schedule: {same}"
  for decay, settings in DECAY_SETTINGS.items():
    for field, value in settings.items():
      assert differ(rates[decay], learning_rates(decay, **{field: value})), (
        f"train.decay={decay!r} ignores train.{field}"
      )


# --- names user code registers: data.tokenizer, train.decay, train.trackers ---------


def tokenizer_of(name):
  return make_tokenizer(data_fields("pystdlib", "lm", tokenizer=name))


def schedule_of(name):
  return optim.make_schedule(types.SimpleNamespace(**TRAIN, decay=name))


# field -> (its registry, its txf.register function, an entry, what reads the field)
USER_REGISTRIES = {
  "data.tokenizer": (
    data_config.TOKENIZERS,
    register.tokenizer,
    lambda spec, workdir: ByteTokenizer(),
    tokenizer_of,
  ),
  "train.decay": (
    optim.DECAYS,
    register.decay,
    lambda phase: lambda s: phase.peak,
    schedule_of,
  ),
  "train.trackers": (
    tracker_kinds.TRACKERS,
    register.tracker,
    lambda workdir: None,
    tracker_kinds.tracker_names,
  ),
}


@pytest.mark.parametrize("field", USER_REGISTRIES)
def test_a_registered_name_is_read_and_an_unknown_one_lists_it(field):
  registry, register_as, entry, read = USER_REGISTRIES[field]
  with registry.scoped():
    assert register_as("mine")(entry) is entry
    read("mine")
    assert registry.provenance("mine")["module"] == __name__  # recorded as the user's
    with pytest.raises(ValueError) as raised:
      read("nope")
    assert str(raised.value) == f"{field}: 'nope' is not one of {registry.names()}"
    assert registry.names()[-1] == "mine"
  with pytest.raises(ValueError, match=f"^{re.escape(field)}: 'mine' is not one of"):
    read("mine")  # undone with the scope


def test_every_extrapolation_protocol_has_its_own_windows_and_reads_its_settings():
  windows = {
    protocol: extrapolation.windows(40, seq_len=8, protocol=protocol)
    for protocol in extrapolation.PROTOCOLS
  }
  for a, b in itertools.combinations(windows, 2):
    assert any(differ(x, y) for x, y in zip(windows[a], windows[b])), (a, b)
  # Only the sliding protocol takes a setting: its stride (default seq_len // 2).
  strided = extrapolation.windows(40, seq_len=8, protocol="sliding", stride=3)
  assert any(differ(x, y) for x, y in zip(windows["sliding"], strided))


def test_every_sentence_pooling_differs_and_reads_normalize():
  rng = np.random.default_rng(0)
  hidden = jnp.asarray(rng.normal(size=(2, 5, 4)), jnp.float32)
  valid = jnp.asarray([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  pooled = {
    p: np.asarray(text.pool_sentences(hidden, valid, pooling=p)) for p in text.SENTENCE_POOLINGS
  }
  for a, b in itertools.combinations(pooled, 2):
    assert differ(pooled[a], pooled[b]), (a, b)
  for pooling, plain in pooled.items():
    normalized = text.pool_sentences(hidden, valid, pooling=pooling, normalize=True)
    assert differ(plain, np.asarray(normalized)), pooling
