"""A registered choice is known by where it came from, not by name only.

A run whose config imports a module replacing txf's `rope` records that
module in run_record.json; a later command on the run (load_run: txf-generate,
txf-analyze, txf-extrapolate, txf-export, init_from; a resume) imports it, or
refuses in one line naming it, and never reads the replaced built-in as the
built-in, nor the reverse.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, tiny_config
from txf.data.spec import TOKENIZERS
from txf.layers.positions import ENCODINGS
from txf.runconfig.optim import DECAYS
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir import record
from txf.train import loop
from txf.train.run_setup import load_run

# A rotation that leaves queries and keys as they are (no position at all),
# noting each call: what the model calls is visible.
USER_ROPE = """
from txf import register

CALLS = []


@register.position("rope", contributes="rotation", even="head_dim", replace=True)
def unrotated(cfg, x_BxTxHxDh, positions_BxT):
  CALLS.append(x_BxTxHxDh.shape)
  return x_BxTxHxDh
"""


@pytest.fixture
def fresh_process(monkeypatch):
  """This process as a new one would be: txf's own `rope`, no user_rope
  module imported, the import path restored afterwards."""
  monkeypatch.setattr(sys, "path", list(sys.path))
  sys.modules.pop("user_rope", None)
  try:
    with ENCODINGS.scoped():
      yield
  finally:
    sys.modules.pop("user_rope", None)


@pytest.fixture(scope="module")
def user_run(tmp_path_factory, compilation_cache_dir):
  """(the run's directory, the module's directory): 2 steps of a tiny rope
  config trained with user_rope.py's `rope`."""
  modules = tmp_path_factory.mktemp("modules")
  (modules / "user_rope.py").write_text(USER_ROPE)
  workdir = tmp_path_factory.mktemp("run")
  path = list(sys.path)
  sys.path.insert(0, str(modules))  # as txf.configs.load puts a config file's directory
  try:
    with ENCODINGS.scoped():
      import user_rope  # noqa: F401 (registers `rope`)

      loop.run(parse(tiny_config(steps=2)), workdir, log=lambda line: None)
  finally:
    sys.path[:] = path
    sys.modules.pop("user_rope", None)
  return workdir, modules


@pytest.mark.slow  # trains a tiny run (~5 s)
def test_the_record_names_the_module_that_provided_each_choice(user_run):
  workdir, modules = user_run
  choices = record.read_record(workdir)[-1]["choices"]
  assert choices["model.position"] == dict(
    name="rope", module="user_rope", function="unrotated", builtin=False, path=str(modules)
  )
  assert choices["model.norm"]["builtin"] and choices["model.norm"]["path"] is None
  assert choices["model.norm"]["module"] == "txf.layers.norm"
  assert set(choices) == set(record.CHOICE_FIELDS)


@pytest.mark.slow  # trains a tiny run (~5 s)
def test_loading_the_run_imports_the_module_it_trained_with(user_run, fresh_process):
  workdir, modules = user_run
  assert ENCODINGS.provenance("rope")["builtin"]
  trained = load_run(workdir)
  user_rope = sys.modules["user_rope"]
  assert user_rope.__file__ == str(modules / "user_rope.py")
  assert ENCODINGS.provenance("rope")["module"] == "user_rope"
  assert user_rope.CALLS  # the model built for the checkpoint calls the user's function
  assert trained.step == 2


@pytest.mark.slow  # trains a tiny run (~5 s)
def test_a_module_that_no_longer_imports_is_refused_naming_it(user_run, fresh_process):
  workdir, modules = user_run
  os.rename(modules / "user_rope.py", modules / "user_rope.moved")
  try:
    with pytest.raises(ConfigError) as error:
      load_run(workdir)
    with pytest.raises(ConfigError, match=r"^model\.position: the run in .* trained with user_"):
      loop.run(parse(tiny_config(steps=3)), workdir, log=lambda line: None)  # a resume
  finally:
    os.rename(modules / "user_rope.moved", modules / "user_rope.py")
  (line,) = str(error.value).splitlines()
  assert line == (
    f"model.position: the run in {workdir} trained with user_rope.unrotated as 'rope' "
    f"(see run_record.json), which does not import from {modules}: "
    "ModuleNotFoundError: No module named 'user_rope'"
  )
  assert ENCODINGS.provenance("rope")["builtin"]  # nothing registered


@pytest.mark.slow  # a subprocess (~5 s of imports) on a tiny run
def test_txf_export_refuses_in_one_line_when_the_module_is_gone(user_run, tmp_path):
  workdir, modules = user_run
  run = tmp_path / "run"
  shutil.copytree(workdir, run)
  entries = record.read_record(run)
  entries[-1]["choices"]["model.position"]["path"] = str(tmp_path / "gone")
  (run / record.RECORD_FILE).write_text(json.dumps(entries))
  result = subprocess.run(
    [sys.executable, "-m", "experiments.export", f"--workdir={run}", f"--out={tmp_path / 'hf'}"],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert result.returncode == 2, result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert line.startswith("config error: model.position: ") and "user_rope.unrotated" in line
  assert not (tmp_path / "hf").exists()


def builtin_run(workdir):
  """A work directory whose record says the run trained with txf's own
  choices: the entry `record.RunRecord` writes, cut to its choices."""
  run = parse(tiny_config())
  entry = dict(choices=record.registered_choices(run))
  (workdir / record.RECORD_FILE).write_text(json.dumps([entry]))
  return run


def test_a_builtin_replaced_by_user_code_is_not_read_as_the_builtin(tmp_path, fresh_process):
  builtin_run(tmp_path)
  record.check_choices(tmp_path)  # txf's own rope, as recorded
  sys.path.insert(0, str(tmp_path))
  (tmp_path / "user_rope.py").write_text(USER_ROPE)
  import user_rope  # noqa: F401 (replaces `rope`)

  with pytest.raises(ValueError) as error:
    record.check_choices(tmp_path)
  assert str(error.value) == (
    "model.position: 'rope' is user_rope.unrotated here, not txf's built-in "
    f"(txf.layers.positions) that the run in {tmp_path} trained with (see run_record.json)"
  )


USER_TRACKER = """
from txf import register


@register.tracker("user_jsonl")
class UserTracker:
  def __init__(self, workdir): pass
  def log_config(self, config): pass
  def log_metrics(self, step, metrics): pass
  def log_sample(self, step, text): pass
  def log_summary(self, metrics): pass
  def close(self): pass
"""


def test_a_registered_tracker_is_imported_for_a_later_command(tmp_path, monkeypatch):
  """A run trained with a registered tracker could not be read by
  txf-generate, txf-export, ... ('train.trackers: ... is not one of
  ('wandb',)'): its config.json names the tracker, whose module they never
  imported. It is recorded, and imported, as the other choices are."""
  from txf.runconfig.tracker_kinds import TRACKERS

  monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
  (tmp_path / "user_tracker.py").write_text(USER_TRACKER)
  with TRACKERS.scoped():
    import user_tracker  # noqa: F401 (registers user_jsonl)

    run = parse(tiny_config(train__trackers="user_jsonl"))
    entry = dict(choices=record.registered_choices(run))
  sys.modules.pop("user_tracker")
  assert entry["choices"]["train.trackers[0]"]["module"] == "user_tracker"
  (tmp_path / record.RECORD_FILE).write_text(json.dumps([entry]))
  monkeypatch.setattr(sys, "path", sys.path[1:])  # a later command, elsewhere
  with TRACKERS.scoped():
    assert "user_jsonl" not in TRACKERS
    record.check_choices(tmp_path)  # imports it from the recorded directory
    assert parse(tiny_config(train__trackers="user_jsonl")).train.trackers == ("user_jsonl",)
  sys.modules.pop("user_tracker", None)


def test_a_builtin_recorded_under_its_old_module_is_still_the_builtin(tmp_path, fresh_process):
  """Before txf.train was split, the built-in task kinds, decays and trackers
  lived in txf.train.tasks, txf.train.optim and txf.train.trackers: a run
  recorded then reads as trained with the built-in, and a user entry
  recorded under a module that is gone is still refused."""
  builtin_run(tmp_path)
  entries = json.loads((tmp_path / record.RECORD_FILE).read_text())
  choices = entries[0]["choices"]
  assert choices["data.task"]["module"] == "txf.runconfig.tasks"
  choices["data.task"]["module"] = "txf.train.tasks"
  (tmp_path / record.RECORD_FILE).write_text(json.dumps(entries))
  record.check_choices(tmp_path)  # no import of txf.train.tasks is tried
  choices["data.task"]["builtin"] = False
  (tmp_path / record.RECORD_FILE).write_text(json.dumps(entries))
  with pytest.raises(ValueError, match="data.task: .* txf.train.tasks.TaskKind .* does not import"):
    record.check_choices(tmp_path)


def test_a_run_recorded_without_choices_is_read_as_before(tmp_path, fresh_process):
  """Runs recorded before choices were (or with a record that does not
  read) check nothing, whatever this process registered."""
  sys.path.insert(0, str(tmp_path))
  (tmp_path / "user_rope.py").write_text(USER_ROPE)
  import user_rope  # noqa: F401

  # A damaged entry (no module) too: it was imported as module 'None' and refused.
  damaged = json.dumps([{"choices": {"model.position": {"name": "rope", "function": "f"}}}])
  for text in ("[{}]", "[]", "not json", damaged):
    (tmp_path / record.RECORD_FILE).write_text(text)
    record.check_choices(tmp_path)


# A decay and a tokenizer of user code: entries of train.decay and data.tokenizer.
USER_SCHEDULE = """
import optax

from txf import register
from txf.data import ByteTokenizer


@register.decay("flat")
def flat(phase):
  return optax.constant_schedule(phase.peak)


@register.tokenizer("user_bytes")
def user_bytes(spec, workdir):
  return ByteTokenizer()
"""


def test_a_registered_decay_and_tokenizer_are_recorded_and_imported_again(tmp_path, monkeypatch):
  monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
  (tmp_path / "user_schedule.py").write_text(USER_SCHEDULE)
  config = tiny_config(train__decay="flat", data__tokenizer="user_bytes")
  try:
    with DECAYS.scoped(), TOKENIZERS.scoped():
      import user_schedule  # noqa: F401 (registers both)

      run = parse(config)
      choices = record.registered_choices(run)
      (tmp_path / record.RECORD_FILE).write_text(json.dumps([dict(choices=choices)]))
    sys.modules.pop("user_schedule")
    assert choices["train.decay"] == dict(
      name="flat", module="user_schedule", function="flat", builtin=False, path=str(tmp_path)
    )
    assert choices["data.tokenizer"]["function"] == "user_bytes"
    with DECAYS.scoped(), TOKENIZERS.scoped():  # a later command on the run, in a new process
      assert "flat" not in DECAYS and "user_bytes" not in TOKENIZERS
      record.check_choices(tmp_path)
      assert DECAYS.provenance("flat")["module"] == "user_schedule"
      assert TOKENIZERS.provenance("user_bytes")["module"] == "user_schedule"
  finally:
    sys.modules.pop("user_schedule", None)


def test_a_choice_registered_from_a_package_is_imported_again_from_its_parent(
  tmp_path, monkeypatch
):
  """A package's __init__ registering a choice: the directory recorded is
  the one holding the package, which a later command puts on its path."""
  (tmp_path / "user_package").mkdir()
  (tmp_path / "user_package" / "__init__.py").write_text(USER_SCHEDULE)
  monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
  try:
    with DECAYS.scoped(), TOKENIZERS.scoped():
      import user_package  # noqa: F401 (registers both)

      choices = record.registered_choices(parse(tiny_config(train__decay="flat")))
    sys.modules.pop("user_package")
    assert choices["train.decay"]["path"] == str(tmp_path)
    (tmp_path / record.RECORD_FILE).write_text(json.dumps([dict(choices=choices)]))
    monkeypatch.setattr(sys, "path", sys.path[1:])  # a later command, elsewhere
    with DECAYS.scoped(), TOKENIZERS.scoped():
      record.check_choices(tmp_path)
      assert DECAYS.provenance("flat")["module"] == "user_package"
  finally:
    sys.modules.pop("user_package", None)


def test_a_choice_now_another_function_of_the_same_module_is_refused(tmp_path, monkeypatch):
  """The run trained with user_schedule.old_flat as 'flat'; the module now
  registers user_schedule.flat under that name: another schedule. Checking
  imports the module, and leaves bytecode writing as it was."""
  monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
  (tmp_path / "user_schedule.py").write_text(USER_SCHEDULE)
  trained = dict(
    name="flat", module="user_schedule", function="old_flat", builtin=False, path=str(tmp_path)
  )
  (tmp_path / record.RECORD_FILE).write_text(json.dumps([{"choices": {"train.decay": trained}}]))
  monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as a process writing bytecode
  try:
    with DECAYS.scoped(), TOKENIZERS.scoped(), pytest.raises(ValueError) as error:
      record.check_choices(tmp_path)
  finally:
    sys.modules.pop("user_schedule", None)
  assert str(error.value) == (
    "train.decay: 'flat' is user_schedule.flat here, not user_schedule.old_flat that the run "
    f"in {tmp_path} trained with (see run_record.json)"
  )
  assert sys.dont_write_bytecode is False


def test_a_choice_from_a_module_that_cannot_be_imported_again_is_warned_of(tmp_path):
  """A norm registered inside the config file itself (its module,
  txf_config_<stem>, is no file later commands can import) trained without
  a word; every later command then refused the run."""
  from txf import register
  from txf.layers.model_config import NORMS
  from txf.layers.norm import layer_norm

  def inline(layer, x, cfg):
    return layer_norm(layer, x, cfg)

  inline.__module__ = "txf_config_inline_cfg"  # as txf.configs.load names a config's module
  lines = []
  with NORMS.scoped():
    register.norm("inline")(inline)
    run = parse(tiny_config(model__norm="inline"))
    record.RunRecord(tmp_path, log=lines.append).start(run, 0)
    quiet = []
    record.RunRecord(tmp_path / "builtin", log=quiet.append).start(parse(tiny_config()), 0)
  assert lines == [
    "warning: model.norm 'inline' comes from txf_config_inline_cfg, which later commands "
    "(txf-generate, txf-analyze, txf-export, txf-extrapolate) cannot import: "
    "register it in a module beside the config file and import that"
  ]
  assert quiet == []
