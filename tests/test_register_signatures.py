"""What txf.register refuses about what an entry takes and gives, each in one
line before anything runs: a function that cannot be called as its
registry's readers call it (or is not callable), a decay that gives no
schedule and a tokenizer builder that gives no Tokenizer (while the config
is checked, before the run directory is written), a head without
matmul_params (when a model config chooses it), and a setting named as a
ModelConfig field."""

import dataclasses
import re
import types

import optax
import pytest
from test_register_checks import Recorder, scoped

from conftest import repo_commands, tiny_config
from txf import register
from txf.data import ByteTokenizer, make_tokenizer
from txf.data.spec import GENERATED, TASKS, TEXT, TOKENIZERS
from txf.fields import documented, section
from txf.layers.model_config import (
  ACTIVATIONS,
  HEADS,
  INITS,
  NORMS,
  POSITIONS,
  ModelConfig,
)
from txf.runconfig import optim
from txf.runconfig.run_config import ConfigError, parse
from txf.runconfig.tracker_kinds import TRACKERS
from txf.train.run_setup import fit_vocabulary

ALL = (NORMS, ACTIVATIONS, INITS, POSITIONS, GENERATED, TEXT, TOKENIZERS, optim.DECAYS)
ALL += (TRACKERS, TASKS, HEADS)


def wrong_norm(x, cfg):
  return x


def varargs(*args, **kwargs):
  return None


# registry call -> (its txf.register decorator, the arguments it is called
# with as the message names them, a function taking them, one that does not)
FUNCTIONS = {
  "register.norm": (register.norm, "(layer, x, cfg)", lambda layer, x, cfg: x, wrong_norm),
  "register.activation": (register.activation, "(x, cfg)", lambda x, cfg: x, lambda x: x),
  "register.init": (
    register.init,
    "(params, cfg, key)",
    lambda params, cfg, key: params,
    lambda params: params,
  ),
  "register.lm_task": (
    register.lm_task,
    "(rng, seq_len, num_symbols, first_id)",
    lambda rng, seq_len, num_symbols, first_id: None,
    lambda rng: None,
  ),
  "register.text_source": (
    register.text_source,
    "(argument, split, max_bytes)",
    lambda argument, split, max_bytes: [],
    lambda path, split: [],
  ),
  "register.tokenizer": (
    register.tokenizer,
    "(spec, workdir)",
    lambda spec, workdir: ByteTokenizer(),
    lambda: None,
  ),
  "register.decay": (
    register.decay,
    "(phase)",
    lambda phase: optax.constant_schedule(phase.peak),
    lambda: None,
  ),
  "register.tracker": (register.tracker, "(workdir)", lambda workdir: None, lambda: None),
}


@pytest.mark.parametrize("registry", FUNCTIONS)
def test_a_function_its_readers_cannot_call_is_refused(registry):
  decorator, takes, right, wrong = FUNCTIONS[registry]
  with scoped(*ALL):
    with pytest.raises(ValueError) as raised:
      decorator("wrong")(wrong)
    message = str(raised.value)
    assert message.startswith(f"{registry}('wrong'): takes {takes}, but ")
    assert message.endswith(" cannot be called so") and "\n" not in message
    with pytest.raises(ValueError, match=rf"^{re.escape(registry)}\('three'\): takes .* but 3 is"):
      decorator("three")(3)
    assert decorator("right")(right) is right
    assert decorator("flexible")(varargs) is varargs  # *args and **kwargs take them
  for name in ("wrong", "three", "right", "flexible"):  # refused, or undone with the scope
    assert all(name not in registry for registry in ALL)


def test_the_message_names_the_function_and_its_own_arguments():
  with scoped(NORMS):
    with pytest.raises(ValueError) as raised:
      register.norm("badn")(wrong_norm)
  assert str(raised.value) == (
    "register.norm('badn'): takes (layer, x, cfg), but wrong_norm(x, cfg) cannot be called so"
  )


# contributes -> a function of what that kind is called with, and one of another kind's
POSITIONS_BY_KIND = {
  "embedding": (lambda cfg, positions, table: None, lambda cfg, x, positions, extra: x),
  "rotation": (lambda cfg, x, positions: x, lambda cfg, q, k, table, *, bidirectional: q),
  # bidirectional is passed by keyword: a function taking it by position alone cannot take it.
  "bias": (lambda cfg, q, k, table, *, bidirectional: None, lambda cfg, q, k, table, b, /: None),
}


@pytest.mark.parametrize("contributes", POSITIONS_BY_KIND)
def test_a_position_encoding_takes_what_its_kind_passes(contributes):
  right, wrong = POSITIONS_BY_KIND[contributes]
  with scoped(POSITIONS):
    with pytest.raises(
      ValueError,
      match=rf"^register\.position\('p', contributes='{contributes}'\): takes \(cfg, .* but "
      r"<lambda>\(.*\) cannot be called so$",
    ):
      register.position("p", contributes=contributes)(wrong)
    assert "p" not in POSITIONS
    register.position("p", contributes=contributes)(right)
    register.position("flexible", contributes=contributes)(varargs)
  with pytest.raises(ValueError, match=r"takes \(cfg, q_positions, k_positions, table, \*, bidi"):
    with scoped(POSITIONS):
      register.position("by_position", contributes="bias")(lambda cfg, q, k, table: None)


def test_a_task_kinds_functions_take_what_the_step_passes():
  class InstanceMethods:  # registered as the class: model_inputs(self, batch) gets no self
    def model_inputs(self, batch):
      return (batch["inputs"],)

    def labels_and_weights(self, batch):
      return batch["targets"], batch["weights"]

  class Functions:
    def model_inputs(batch):
      return (batch["inputs"],)

    def labels_and_weights(batch):
      return batch["targets"], batch["weights"]

  class WrongLoss(Functions):
    def loss_sums(logits, labels, weights):  # the step passes label_smoothing=, z_loss=
      return None

  class Hooks(Functions):
    def loss_sums(logits, labels, weights, *, label_smoothing, z_loss):
      return None

    def metric_sums(logits, labels, weights):
      return {}

  with scoped(TASKS):
    with pytest.raises(
      ValueError,
      match=r"^register\.task\('methods'\): takes \(batch\), but model_inputs\(self, batch\)",
    ):
      register.task("methods", batches="lm")(InstanceMethods)
    with pytest.raises(
      ValueError,
      match=r"^register\.task\('loss'\): takes \(logits, labels, weights, \*, label_smoothing, "
      r"z_loss\), but loss_sums\(logits, labels, weights\) cannot",
    ):
      register.task("loss", batches="lm")(WrongLoss)
    register.task("functions", batches="lm")(Functions)
    register.task("hooks", batches="lm")(Hooks)
    assert "methods" not in TASKS and "loss" not in TASKS


def test_a_trackers_class_and_check_take_the_workdir():
  class TwoArguments(Recorder):
    def __init__(self, workdir, project):
      pass

  with scoped(TRACKERS):
    with pytest.raises(ValueError, match=r"^register\.tracker\('two'\): takes \(workdir\), but "):
      register.tracker("two")(TwoArguments)
    with pytest.raises(ValueError, match=r"^register\.tracker\('check'\): takes \(workdir\), but"):
      register.tracker("check", check=lambda: None)(Recorder)
    register.tracker("checked", check=lambda workdir: None)(Recorder)
    assert "two" not in TRACKERS and "check" not in TRACKERS


def test_a_heads_matmul_params_and_a_text_sources_describe_are_checked():
  with scoped(HEADS, TEXT):
    with pytest.raises(
      ValueError, match=r"^register\.head\('h'\): takes \(cfg\), but <lambda>\(\)"
    ):
      register.head("h", tasks=("lm",), families=("decoder",), matmul_params=lambda: 0)(
        HEADS["lm"].module
      )
    with pytest.raises(ValueError, match=r"^register\.text_source\('t'\): takes \(argument\)"):
      register.text_source("t", describe=lambda: "")(lambda argument, split, max_bytes: [])
    assert "h" not in HEADS and "t" not in TEXT


def schedule_of(decay, **train):
  fields = dict(learning_rate=1.0, warmup_steps=3, steps=12, end_lr_fraction=0.1)
  return optim.make_schedule(types.SimpleNamespace(**{**fields, **train}, decay=decay))


@pytest.mark.parametrize("gives", [3.0, None, lambda: 1.0])
def test_a_decay_that_gives_no_schedule_is_a_config_error(gives):
  with scoped(optim.DECAYS):
    register.decay("odd")(lambda phase: gives)
    for warmup in (0, 3):  # joined after warmup, or the schedule itself
      with pytest.raises(ValueError) as raised:
        schedule_of("odd", warmup_steps=warmup)
      assert re.fullmatch(
        r"train\.decay 'odd': gave .*, not a schedule \(a function of the step s after warmup\)",
        str(raised.value),
      )
    with pytest.raises(ValueError, match=r"^train\.decay 'odd': gave"):
      parse(tiny_config(train__decay="odd"))  # the run config's check, before any run
    register.decay("flat")(lambda phase: lambda s: phase.peak)
    assert schedule_of("flat")(5) == 1.0


def test_a_tokenizer_that_gives_no_tokenizer_is_a_config_error(tmp_path):
  with scoped(TOKENIZERS):
    register.tokenizer("text")(lambda spec, workdir: "notatokenizer")
    run = parse(tiny_config(data__tokenizer="text"))
    with pytest.raises(ConfigError) as raised:
      fit_vocabulary(run, tmp_path)
    assert str(raised.value) == (
      "data.tokenizer 'text': gave 'notatokenizer', not a txf.data.Tokenizer"
    )
    assert not list(tmp_path.iterdir())
    register.tokenizer("bytes_again")(lambda spec, workdir: ByteTokenizer())
    assert isinstance(
      make_tokenizer(dataclasses.replace(run.data, tokenizer="bytes_again")), ByteTokenizer
    )
    # The same builder registered again (a module imported twice) is the same entry.
    builder = lambda spec, workdir: ByteTokenizer()  # noqa: E731
    register.tokenizer("twice")(builder)
    register.tokenizer("twice")(builder)
    with pytest.raises(ValueError, match=r"^data\.tokenizer: 'twice' is registered already"):
      register.tokenizer("twice")(lambda spec, workdir: ByteTokenizer())


def test_a_model_config_choosing_a_head_without_matmul_params_is_refused():
  with scoped(HEADS):
    register.head("bare_lm", tasks=("lm",), families=("decoder",))(HEADS["lm"].module)
    with pytest.raises(ValueError) as raised:
      ModelConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, head="bare_lm")
    assert str(raised.value) == (
      "model.head: 'bare_lm' declares no matmul_params (txf.register.head), so the FLOPs per "
      "token of a model with it are not known"
    )
    register.head("counted_lm", tasks=("lm",), families=("decoder",), matmul_params=lambda cfg: 0)(
      HEADS["lm"].module
    )
    ModelConfig(vocab_size=40, d_model=16, num_heads=2, num_layers=1, head="counted_lm")


@section()
class WidthSettings:
  """A setting named as a ModelConfig field."""

  d_model: int = documented("a second width", default=7)


@pytest.mark.parametrize(
  "declare",
  [dict(options={"d_model": 7}), dict(options={"norm_eps": 0.5}), dict(settings=WidthSettings)],
)
def test_a_setting_named_as_a_model_config_field_is_refused(declare):
  setting = next(iter(declare.get("options") or {"d_model": None}))
  with scoped(NORMS, ACTIVATIONS):
    with pytest.raises(ValueError) as raised:
      register.norm("shadow", **declare)(lambda layer, x, cfg: x)
    assert str(raised.value) == (
      f"model.norm: 'shadow': setting {setting!r} is a ModelConfig field (model.{setting}); "
      "name it otherwise"
    )
    with pytest.raises(ValueError, match=rf"^model\.activation: 'shadow': setting {setting!r}"):
      register.activation("shadow", **declare)(lambda x, cfg: x)
    assert "shadow" not in NORMS and "shadow" not in ACTIVATIONS
    register.norm("own", options={"own_eps": 0.5})(lambda layer, x, cfg: x)


BAD_ENTRIES = {
  # case -> (the module a config file imports, the config's change, the error's start)
  "signature": (
    "@register.norm('badn')\ndef badn(x, cfg):\n  return x\n",
    "c.model.norm = 'badn'",
    "config error: ",
  ),
  "decay": (
    "@register.decay('dr')\ndef dr(phase):\n  return 3.0\n",
    "c.train.decay = 'dr'",
    "config error: train.decay 'dr': gave 3.0",
  ),
  "tokenizer": (
    "@register.tokenizer('tt')\ndef tt(spec, workdir):\n  return 'no'\n",
    "c.data.tokenizer = 'tt'",
    "config error: data.tokenizer 'tt': gave 'no'",
  ),
  "head": (
    "@register.head('hn', tasks=('lm',), families=('decoder',))\n"
    "class HN(nn.Module):\n  cfg: object\n",
    "c.model.head = 'hn'",
    "config error: model.head: 'hn' declares no matmul_params",
  ),
  "setting": (
    "@register.norm('fd', options={'d_model': 7})\ndef fd(layer, x, cfg):\n  return x\n",
    "c.model.norm = 'fd'",
    "config error: ",
  ),
}


@pytest.mark.slow  # subprocesses
def test_a_config_registering_a_bad_entry_is_one_line_exit_2_before_the_run(tmp_path):
  with repo_commands(JAX_PLATFORMS="cpu") as commands:
    for case, (module, change, start) in BAD_ENTRIES.items():
      (tmp_path / f"bad_{case}.py").write_text(
        f"import flax.linen as nn\nfrom txf import register\n{module}"
      )
      config = tmp_path / f"{case}_config.py"
      config.write_text(
        f"import bad_{case}  # noqa\nfrom txf.configs import base\n\n\ndef get_config():\n"
        f"  c = base.get_config()\n  {change}\n  c.train.steps = 2\n  return c\n"
      )
      workdir = tmp_path / f"run_{case}"
      for extra in ((f"--workdir={workdir}",), ("--print_config",)):
        result = commands.run("experiments.run", f"--config={config}", *extra, timeout=120)
        assert result.returncode == 2, (case, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(start), (case, result.stderr)
      assert not workdir.exists(), case
