"""What txf.register refuses at registration, each with one ValueError
naming the problem, rather than an entry that misbehaves later: a name the
config field cannot select, the same entry again with other settings, a
setting whose value model.options would take from another entry, a task
kind or tracker without the methods txf calls; and where txf's own entries
come from (run_record.json's provenance)."""

import dataclasses
import enum

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import scoped
from txf import models, register
from txf.configs import base
from txf.data.spec import TASKS
from txf.layers import feedforward, norm
from txf.layers.model_config import (
  ACTIVATIONS,
  FAMILIES,
  HEADS,
  NORMS,
  POSITIONS,
  ModelConfig,
)
from txf.models import output_heads
from txf.runconfig import tasks
from txf.runconfig.tracker_kinds import TRACKERS, tracker_names
from txf.rundir.trackers import make_trackers


def identity_norm(layer, x, cfg):
  return x


def other_norm(layer, x, cfg):
  return x


class Recorder:
  """A tracker with every method txf calls."""

  def __init__(self, workdir):
    pass

  def log_config(self, config):
    pass

  def log_metrics(self, step, scalars):
    pass

  def log_sample(self, step, text):
    pass

  def log_summary(self, metrics):
    pass

  def close(self):
    pass


@pytest.mark.parametrize("name", ["a,b", " sp ", "sp ", "", "files:x", "-a", ".a", 3, None])
def test_a_name_the_field_cannot_select_is_refused(name):
  with scoped(TRACKERS, NORMS):
    with pytest.raises(ValueError, match=r"^train\.trackers: a registered name is letters"):
      register.tracker(name)(Recorder)
    with pytest.raises(ValueError, match=r"^model\.norm: a registered name is letters"):
      register.norm(name)(identity_norm)
    assert TRACKERS.names() == ("wandb",)
    assert NORMS.names() == ("layer", "rms")


def test_a_registered_tracker_name_is_one_train_trackers_selects():
  with scoped(TRACKERS):
    for name in ("my_tracker", "mlflow-v2.1", "2nd"):
      register.tracker(name)(Recorder)
    assert tracker_names("my_tracker, mlflow-v2.1,2nd") == ("my_tracker", "mlflow-v2.1", "2nd")


class _Mode(enum.Enum):
  A = 1


@pytest.mark.parametrize("default", [(1, 2), None, _Mode.A])
def test_a_setting_default_config_json_and_the_command_line_cannot_keep_is_refused(default):
  # A tuple came back from config.json a list (an unhashable config: a
  # traceback in txf-generate), an enum did not serialise (a traceback after
  # the run directory was written), a None could not be overridden.
  with scoped(NORMS):
    with pytest.raises(ValueError, match=r"^model\.norm: 'mine': setting 'k': default "):
      register.norm("mine", options={"k": default})(identity_norm)
    assert "mine" not in NORMS
  with pytest.raises(ValueError, match=r"^model\.options: expected a mapping"):
    ModelConfig(options=None)


@pytest.mark.parametrize(
  "register_it,message",
  [
    # 'lm' was read as the tasks 'l' and 'm': "cannot train data.task='lm'".
    (
      lambda: register.family("f", tasks="lm")(nn.Module),
      r"^register\.family: 'f': tasks must be a tuple of names, got 'lm' \(write \('lm',\)\)",
    ),
    (lambda: register.family("f", tasks=("lm",), heads="lm")(nn.Module), "heads must be a tuple"),
    (lambda: register.family("f", tasks=("lm",))(lambda cfg: None), "expected a linen module"),
    (
      lambda: register.head("h", tasks=("lm",), families="decoder")(nn.Module),
      r"^register\.head: 'h': families must be a tuple of names",
    ),
    (lambda: register.head("h", tasks=(1,), families=("decoder",))(nn.Module), "tasks must be"),
  ],
)
def test_a_family_or_head_registered_with_a_lone_name_or_no_class_is_refused(register_it, message):
  with scoped(FAMILIES, HEADS):
    with pytest.raises(ValueError, match=message):
      register_it()
    assert "f" not in FAMILIES and "h" not in HEADS


def test_the_same_entry_again_with_other_settings_is_refused():
  with scoped(NORMS):
    register.norm("mine", options={"k": 3})(identity_norm)
    register.norm("mine", options={"k": 3})(identity_norm)  # a module imported twice
    for changed in ({"k": 4}, {"k": 3, "j": 1}, None):
      with pytest.raises(
        ValueError, match=r"^model\.norm: 'mine' is registered already with other settings"
      ):
        register.norm("mine", options=changed)(identity_norm)
    assert NORMS.options("mine") == {"k": 3}
    with pytest.raises(ValueError, match=r"^model\.norm: 'mine' is registered already \(pass"):
      register.norm("mine", options={"k": 3})(other_norm)
    register.norm("mine", options={"k": 4}, replace=True)(identity_norm)
    assert NORMS.options("mine") == {"k": 4}
    # A NaN default is the same default again (NaN != NaN).
    register.norm("nan_default", options={"eps": float("nan")})(identity_norm)
    register.norm("nan_default", options={"eps": float("nan")})(identity_norm)


def test_a_setting_another_entrys_value_would_replace_is_refused():
  """model.options holds one value per name, and a config starts with the
  built-in entries' defaults: a norm declaring rope_base would get rope's
  10000.0 instead of its own default."""
  with scoped(NORMS, POSITIONS, ACTIVATIONS):
    with pytest.raises(
      ValueError,
      match=r"^model\.norm: 'rb_norm': setting 'rope_base' \(default 5\.0\) is declared by "
      r"model\.position 'rope' too \(default 10000\.0\)",
    ):
      register.norm("rb_norm", options={"rope_base": 5.0})(identity_norm)
    assert "rb_norm" not in NORMS
    # The same registry: only one entry is chosen, but the config holds rope's default.
    with pytest.raises(ValueError, match=r"^model\.position: 'fast_rope': setting 'rope_base'"):
      register.position("fast_rope", contributes="rotation", options={"rope_base": 500.0})(
        lambda cfg, x, positions: x
      )
    register.position("same_rope", contributes="rotation", options={"rope_base": 10000.0})(
      lambda cfg, x, positions: x
    )  # rope_ntk's way: one setting of two positions, one default
    # The default's value but an int: the config kept it, and took no 2.5 for rope.
    with pytest.raises(
      ValueError, match=r"^model\.position: 'int_rope': setting 'rope_scale' \(default 1\) is "
    ):
      register.position("int_rope", contributes="rotation", options={"rope_scale": 1})(
        lambda cfg, x, positions: x
      )
    assert type(base.get_config().model.options.rope_scale) is float
    # Between two registered entries of different fields too.
    register.norm("scaled", options={"gain": 2.0})(identity_norm)
    with pytest.raises(ValueError, match=r"setting 'gain' .* by model\.norm 'scaled' too"):
      register.activation("gained", options={"gain": 2.0})(lambda x, cfg: x)
    # A setting of its own keeps its default in a config made from configs/base.py.
    register.norm("own", options={"norm_gain": 5.0})(identity_norm)
    section = base.get_config().model
    section.norm = "own"
    assert ModelConfig.from_config(section).settings("norm").norm_gain == 5.0


def test_a_task_kind_without_its_functions_is_refused():
  class NoInputs:
    @staticmethod
    def labels_and_weights(batch):
      return batch

  with scoped(TASKS):
    with pytest.raises(
      ValueError,
      match=r"^data\.task: 'empty': .* lacks the method\(s\) model_inputs, "
      r"labels_and_weights$",
    ):
      register.task("empty", batches="lm")(type("Empty", (), {}))
    with pytest.raises(ValueError, match=r"lacks the method\(s\) model_inputs$"):
      register.task("no_inputs", batches="lm")(NoInputs)
    assert "empty" not in TASKS and "no_inputs" not in TASKS


def test_a_tracker_without_the_tracker_methods_is_refused(tmp_path):
  class NoClose(Recorder):
    close = None

  with scoped(TRACKERS):
    with pytest.raises(
      ValueError,
      match=r"^train\.trackers: 'bare': .* lacks the method\(s\) log_config, log_metrics, "
      r"log_sample, log_summary, close$",
    ):
      register.tracker("bare")(object)
    with pytest.raises(ValueError, match=r"'no_close': .* lacks the method\(s\) close$"):
      register.tracker("no_close")(NoClose)
    # A function's tracker is checked when it starts, before the run writes a row.
    register.tracker("by_function")(lambda workdir: object())
    with pytest.raises(ValueError, match=r"^train\.trackers: 'by_function': .* lacks"):
      make_trackers(("by_function",), tmp_path)
    register.tracker("good")(lambda workdir: Recorder(workdir))
    (tracker,) = make_trackers(("good",), tmp_path)
    assert isinstance(tracker, Recorder)


def test_a_tracker_method_that_cannot_be_called_as_the_run_calls_it_is_refused(tmp_path):
  """log_config(self) was a TypeError traceback at the run's start, after the
  run directory was written: refused at registration for a class, at the
  start (before anything is written through it) for a function's tracker.
  Static methods take no self."""

  class NoConfig(Recorder):
    def log_config(self):
      pass

  class Static(Recorder):
    @staticmethod
    def log_sample(step, text):
      pass

  with scoped(TRACKERS):
    with pytest.raises(
      ValueError,
      match=r"^train\.trackers: 'no_config': log_config\(self\) cannot be called as "
      r"log_config\(config\)$",
    ):
      register.tracker("no_config")(NoConfig)
    register.tracker("static")(Static)
    register.tracker("made")(lambda workdir: NoConfig(workdir))
    with pytest.raises(ValueError, match=r"^train\.trackers: 'made': log_config\(\) cannot be"):
      make_trackers(("made",), tmp_path)


def test_a_builtin_entry_records_the_function_or_class_it_is():
  def where(registry, name):
    found = registry.provenance(name)
    return found["module"], found["function"], found["builtin"]

  assert where(FAMILIES, "decoder") == (models.Decoder.__module__, "Decoder", True)
  assert where(HEADS, "lm") == (output_heads.__name__, "LMHead", True)
  assert where(ACTIVATIONS, "gelu") == (feedforward.__name__, "_gelu", True)
  # A task kind wraps no one function (its first field is the batch format):
  # the entry's class, as the head 'none' (no module) is.
  assert where(TASKS, "lm") == (tasks.__name__, "TaskKind", True)
  assert where(HEADS, "none")[1] == "OutputHead"
  assert where(NORMS, "rms") == (norm.__name__, "rms_norm", True)
  assert where(TRACKERS, "wandb") == ("txf.rundir.trackers", "WandbTracker", True)


def _wrong_bias(cfg, q_positions, k_positions, table, *, bidirectional):
  return jnp.zeros((3,))


def _wrong_rotation(cfg, x, positions):
  return x[..., :2]


def _wrong_embedding(cfg, positions, table):
  return jnp.zeros((1, 5, 7))


def _wrong_norm(layer, x, cfg):
  return x.sum(-1)


def _wrong_activation(x, cfg):
  return x[..., :3]


def _head_independent_bias(cfg, q_positions, k_positions, table, *, bidirectional):
  return -jnp.abs(q_positions[:, None, :, None] - k_positions[:, None, None, :]).astype(jnp.float32)


def _model_output(field, name):
  """The logits of a tiny decoder with `field` = `name`, and of the same
  model with the built-in choice (rope, layer, gelu) in its place."""
  cfg = ModelConfig(vocab_size=16, d_model=8, num_heads=2, num_layers=1, max_len=8, **{field: name})
  tokens = jnp.arange(6, dtype=jnp.int32)[None] % 16
  model = models.build(cfg)
  return model.apply(model.init(jax.random.key(0), tokens), tokens)


@pytest.mark.parametrize(
  "register_entry, field, message",
  [
    (
      lambda: register.position("wrong", contributes="bias")(_wrong_bias),
      "position",
      r"model.position 'wrong' returned shape \(3,\), expected \[B\|1, H, T, S\] = \[1, 2, 6, 6\]"
      r" \(or one that broadcasts to it\)",
    ),
    (
      lambda: register.position("wrong", contributes="rotation")(_wrong_rotation),
      "position",
      r"model.position 'wrong' returned shape \(1, 6, 2, 2\), expected x's \[B, T, H, Dh\] = "
      r"\[1, 6, 2, 4\]",
    ),
    (
      lambda: register.position("wrong", contributes="embedding", table="absolute")(
        _wrong_embedding
      ),
      "position",
      r"model.position 'wrong' returned shape \(1, 5, 7\), expected \[B\|1, T, D\] = \[1, 6, 8\]",
    ),
    (
      lambda: register.norm("wrong")(_wrong_norm),
      "norm",
      r"model.norm 'wrong' returned shape \(1, 6\), expected x's shape = \[1, 6, 8\]",
    ),
    (
      lambda: register.activation("wrong")(_wrong_activation),
      "activation",
      r"model.activation 'wrong' returned shape \(1, 6, 3\), expected x's shape = \[1, 6, 32\]",
    ),
  ],
)
def test_a_registered_function_returning_another_shape_is_named(register_entry, field, message):
  """Each failed later naming txf's own arguments (an einsum's subscripts, a
  bias's broadcast, the norm's add) or, for the activation and the rotation,
  trained a model of other shapes without a word (flax's Dense takes the
  width it is given)."""
  with scoped(POSITIONS, NORMS, ACTIVATIONS):
    register_entry()
    register_entry()  # a module imported twice registers the same entry again
    with pytest.raises(ValueError, match=f"^{message}"):
      _model_output(field, "wrong")


def _bias_without_batch_and_heads(cfg, q_positions, k_positions, table, *, bidirectional):
  return _head_independent_bias(cfg, q_positions, k_positions, table, bidirectional=bidirectional)[
    0, 0
  ]


def test_a_result_that_broadcasts_is_taken_as_the_reader_takes_it():
  """A bias of [T, S] (no batch or head dimension) broadcasts in the
  attention's addition as one of [1, 1, T, S] does, and gives its logits;
  the check's first form refused it (it asked for four dimensions)."""
  with scoped(POSITIONS):
    register.position("distance", contributes="bias")(_head_independent_bias)
    register.position("distance_2d", contributes="bias")(_bias_without_batch_and_heads)
    np.testing.assert_array_equal(
      _model_output("position", "distance_2d"), _model_output("position", "distance")
    )


def test_a_registered_function_of_the_right_shape_is_called_as_it_is():
  """The check passes what the function returns through: a bias broadcast
  over heads (a dimension of 1) gives the logits of the same function
  without the check, and the registered norm's provenance is the function."""
  with scoped(POSITIONS, NORMS):
    register.position("distance", contributes="bias")(_head_independent_bias)
    register.norm("identity")(identity_norm)
    checked = _model_output("position", "distance")
    POSITIONS.register(
      "distance_unchecked",
      dataclasses.replace(POSITIONS["distance"], bias=_head_independent_bias),
      provider=_head_independent_bias,
    )
    np.testing.assert_array_equal(checked, _model_output("position", "distance_unchecked"))
    assert NORMS.provenance("identity")["function"] == "identity_norm"
    assert np.isfinite(np.asarray(_model_output("norm", "identity"))).all()
