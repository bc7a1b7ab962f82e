"""What a registered entry gets wrong, refused in one line before a run
computes or writes anything, where each used to train on silently or fail
mid-run with a traceback after the work directory was written: a
tokenizer's ids outside its vocabulary, a head's logits of another width, a
task kind whose inputs the family cannot take or whose labels do not fit the
logits, a decay whose schedule does not trace to a scalar, a tracker
function's result without the tracker methods, a position's `even` that
names no dimension, a NaN setting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import scoped, tiny_config
from txf import models, register
from txf.data import ByteTokenizer
from txf.data.lm import token_stream
from txf.data.spec import TASKS, TOKENIZERS
from txf.fields import documented, section
from txf.layers.model_config import HEADS, POSITIONS, ModelConfig
from txf.models.output_heads import LMHead
from txf.runconfig.optim import DECAYS
from txf.runconfig.run_config import ConfigError, parse
from txf.runconfig.tasks import token_inputs, token_labels
from txf.runconfig.tracker_kinds import TRACKERS
from txf.rundir.trackers import make_trackers
from txf.train.run_setup import setup_run


class ShiftedIds(ByteTokenizer):
  """Ids 1000 past the bytes', beyond the 260 it declares."""

  def encode(self, text):
    return super().encode(text) + 1000


def test_a_tokenizers_ids_outside_its_vocabulary_are_refused_where_the_data_reads_them():
  """The embedding clamped them (traced), and the run trained to accuracy 0."""
  assert list(token_stream(["ab"], ByteTokenizer())) == [101, 102, 2]
  with pytest.raises(
    ValueError, match=r"^data.tokenizer: ShiftedIds.encode gave id 1102, outside its vocabulary"
  ):
    token_stream(["ab"], ShiftedIds())


def test_a_registered_tokenizers_bad_ids_stop_the_runs_setup(tmp_path):
  """About 2 s: pystdlib's corpus, 200 kB of it, tokenized before any compute."""
  with scoped(TOKENIZERS):
    register.tokenizer("shifted")(lambda spec, workdir: ShiftedIds())
    run = parse(tiny_config(data__tokenizer="shifted"))
    with pytest.raises(ConfigError, match=r"^data.tokenizer: ShiftedIds.encode gave id"):
      setup_run(run, tmp_path / "run")
  assert not (tmp_path / "run").exists()


class NarrowHead(LMHead):
  """txf's LM head's logits, cut to 10 of the vocabulary's columns."""

  def __call__(self, x_BxTxD, tokens_BxT, embedder):
    return super().__call__(x_BxTxD, tokens_BxT, embedder)[..., :10]


def _vocab_matmul(cfg):
  return cfg.d_model * cfg.vocab_size


def test_a_registered_heads_logits_of_another_width_are_named():
  """They trained (the loss reads labels past 10 as clamped) with a meaningless perplexity."""
  cfg = dict(vocab_size=16, d_model=8, num_heads=2, num_layers=1, max_len=8)
  tokens = jnp.arange(6, dtype=jnp.int32)[None]
  with scoped(HEADS):
    for _ in range(2):  # a module imported twice registers the same entry again
      for name, head in (("narrow", NarrowHead), ("whole", LMHead)):
        register.head(name, tasks=("lm",), families=("decoder",), matmul_params=_vocab_matmul)(head)
    whole = models.build(ModelConfig(**cfg, head="whole"))
    variables = whole.init(jax.random.key(0), tokens)
    assert whole.apply(variables, tokens).shape == (1, 6, 16)
    # The checked head keeps its parameters' names: txf's 'lm' head's, the same variables.
    np.testing.assert_array_equal(
      whole.apply(variables, tokens), models.build(ModelConfig(**cfg)).apply(variables, tokens)
    )
    narrow = models.build(ModelConfig(**cfg, head="narrow"))
    with pytest.raises(
      ValueError, match=r"^model.head 'narrow' returned shape \(1, 6, 10\), expected \[B, T, V\] ="
    ):
      narrow.init(jax.random.key(0), tokens)


class PrefixInputs:
  """A task kind reading lm batches that feeds the model four inputs, as the prefix LM does."""

  @staticmethod
  def model_inputs(batch):
    return (*token_inputs(batch), None, None, jnp.ones(batch["inputs"].shape[:1], jnp.int32))

  labels_and_weights = staticmethod(token_labels)


class FirstLabels:
  """Labels and weights of each row's first position only: [B], not [B, T]."""

  model_inputs = staticmethod(token_inputs)

  @staticmethod
  def labels_and_weights(batch):
    labels, weights = token_labels(batch)
    return labels[:, 0], weights[:, 0]


@pytest.mark.parametrize(
  "kind, config, message",
  [
    (
      PrefixInputs,
      ("lstm", dict(model__num_heads=4)),
      r"^data.task 'wrong': feeds the model 4 inputs, which model.family 'lstm' does not take",
    ),
    (
      FirstLabels,
      ("rope", {}),
      r"^data.task 'wrong': labels must have shape logits.* = \(8, 32\), got shape \(8,\)",
    ),
  ],
)
def test_a_task_kind_that_does_not_fit_the_model_stops_the_runs_setup(
  tmp_path, kind, config, message
):
  """A TypeError inside model.init, and the loss's ValueError inside the
  first step after the work directory was written: each a traceback. About
  1 s each: 200 kB of pystdlib read, the model traced, nothing compiled."""
  name, fields = config
  with scoped(TASKS):
    register.task("wrong", batches="lm")(kind)
    with pytest.raises(ConfigError, match=message):
      setup_run(parse(tiny_config(name, data__task="wrong", **fields)), tmp_path / "run")
  assert not (tmp_path / "run").exists()


def _vector_schedule(phase):
  return lambda s: jnp.ones(3) * phase.peak


def _branching_schedule(phase):
  return lambda s: phase.peak if s < 3 else 0.0


@pytest.mark.parametrize(
  "decay, message",
  [
    (_vector_schedule, r"its schedule gave float32\[3\] at a step, not a float scalar"),
    (_branching_schedule, r"its schedule does not trace .* TracerBoolConversionError"),
  ],
)
def test_a_decay_whose_schedule_is_no_scalar_function_of_the_step_is_a_config_error(decay, message):
  """Each failed inside the compiled step, after the work directory was
  written (and on a resume after a checkpoint was moved aside)."""
  with scoped(DECAYS):
    register.decay("wrong")(decay)
    with pytest.raises(ValueError, match=rf"^train.decay 'wrong': {message}"):
      parse(tiny_config(train__decay="wrong"))


def test_a_tracker_functions_result_without_the_methods_is_a_config_error(tmp_path):
  """A function's tracker is known once it is made, when the run starts
  writing: a ConfigError still (one line, exit 2), not a traceback."""
  with scoped(TRACKERS):
    register.tracker("bare")(lambda workdir: object())
    with pytest.raises(
      ConfigError, match=r"^train.trackers: 'bare': .* lacks the method\(s\) log_"
    ):
      make_trackers(("bare",), tmp_path)


def test_an_even_that_names_no_dimension_is_refused_at_registration():
  """It was taken, and the config's check failed with a KeyError."""
  with scoped(POSITIONS):
    with pytest.raises(ValueError, match=r"^even: 'width' is not one of \('d_model', 'head_dim'\)"):
      register.position("p", contributes="rotation", even="width")(lambda cfg, x, positions: x)
    assert "p" not in POSITIONS


@section()
class ScaleSettings:
  """A registered encoding's float setting."""

  sin_scale: float = documented("scale", default=1.0)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_registered_settings_nan_or_infinity_is_refused(value):
  """As a float field of the config is; a registered setting's went into the model."""
  with scoped(POSITIONS):
    register.position("scaled", contributes="embedding", settings=ScaleSettings)(
      lambda cfg, positions, table: jnp.zeros((1, positions.shape[-1], cfg.d_model))
    )
    ModelConfig(vocab_size=16, position="scaled", options={"sin_scale": 2.0})
    with pytest.raises(ValueError, match=r"^model.options.sin_scale: must be a finite number"):
      ModelConfig(vocab_size=16, position="scaled", options={"sin_scale": value})
