"""`python -m experiments.run` (and every other command) as a user meets it:
every error the user can cause is one line on stderr with exit status 2 and no
traceback, before any compute; --help lists the config files; --print_config prints every field.

Each case is one process (forked from tests/command_server.py's server, which
has imported jax once: a fresh interpreter spent ~2-5 s on imports); none trains.
"""

import ast
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from test_register_checks import Recorder

from command_server import CommandServer
from conftest import REPO, cli_env, cli_overrides, flatten, load_config, repo_commands, tiny_config
from txf.commands import cli
from txf.commands.run import field_docs, leaves
from txf.layers.model_config import POSITIONS

COMMANDS = ("run", "sweep", "extrapolate", "analyze", "embed", "generate", "textbook", "compile")
TIMEOUT_S = 120  # an error path that hangs fails here instead of hanging CI

pytestmark = pytest.mark.slow  # subprocesses
_SERVER: CommandServer


@pytest.fixture(scope="module", autouse=True)
def command_server():
  """One server for the module's commands: each still runs in a process of
  its own, forked from one that has imported jax once (tests/command_server.py)."""
  global _SERVER
  with repo_commands(JAX_PLATFORMS="cpu") as _SERVER:
    yield _SERVER


def run_cli(*args, command="run"):
  """`python -m experiments.<command> ARGS` in the repository, as a user runs it."""
  return _SERVER.run(f"experiments.{command}", *args, timeout=TIMEOUT_S)


def assert_one_line_error(result, prefix, *fragments):
  assert result.returncode == 2, result.stderr
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(prefix), result.stderr
  for fragment in fragments:
    assert fragment in lines[0], lines[0]


def write(path, text):
  path.write_text(text)
  return str(path)


CONFIG_ERRORS = {
  # case -> (config file text or None for a missing file, expected fragments)
  "missing": (None, ["no such config file"]),
  "syntax": ("def get_config(:\n", [":1: invalid syntax"]),
  "get_config_raises": ("def get_config():\n  raise KeyError('boom')\n", ["KeyError: 'boom'"]),
  # txf's own error is a line of its own: it read 'GridError: zip: ...'.
  "make_grid_refuses": (
    "from txf.sweep.grid import make_grid\n"
    "def get_config():\n  return make_grid({}, zip={'seed': [1, 2], 'data.seed': [1]})\n",
    [".py: zip: the lists must have one length, but seed has 2"],
  ),
  "get_config_returns_none": (
    "def get_config():\n  pass\n",
    ["get_config() returned NoneType, not a ConfigDict"],
  ),
  # Exit 0 with nothing printed or trained; an AttributeError traceback.
  "get_config_exits": (
    "import sys\ndef get_config():\n  sys.exit(0)\n",
    ["exited (sys.exit(0)) while loading"],
  ),
  "get_config_returns_an_object_with_lock": (
    "class Locks:\n  def lock(self): ...\ndef get_config():\n  return Locks()\n",
    ["get_config() returned Locks, not a ConfigDict"],
  ),
}


def test_a_ctrl_c_while_the_config_loads_is_an_interrupt_not_a_config_error(tmp_path):
  """A Ctrl-C while jax's extension imported came back as its ImportError,
  which the loader reported as 'config error: ...: ImportError: ...', exit 2."""
  config = write(
    tmp_path / "config.py",
    "def get_config():\n  try:\n    raise KeyboardInterrupt\n  except KeyboardInterrupt:\n"
    "    raise ImportError('Encountered an error while initializing the extension.')\n",
  )
  result = run_cli(f"--config={config}", f"--workdir={tmp_path / 'run'}")
  assert result.returncode == cli.INTERRUPTED_STATUS, result.stderr
  assert result.stderr.strip().splitlines() == ["interrupted"]


@pytest.mark.parametrize(
  "signal_name, status, line",
  [
    ("SIGINT", cli.INTERRUPTED_STATUS, "interrupted"),
    ("SIGTERM", cli.TERMINATED_STATUS, "terminated"),
  ],
)
def test_a_signal_while_the_command_starts_ends_it_at_once(tmp_path, signal_name, status, line):
  """While the config loads (its imports: jax's extension), a Ctrl-C was a
  KeyboardInterrupt that an import could swallow (the run then trained) or
  crash on, and a SIGTERM killed the command without a line. The config
  here swallows the KeyboardInterrupt, as such an import can."""
  config = write(
    tmp_path / "config.py",
    "import os, signal, time\n"
    "from txf.configs import rope\n"
    "def get_config():\n"
    "  try:\n"
    f"    os.kill(os.getpid(), signal.{signal_name})\n"
    "    time.sleep(5)\n"
    "  except KeyboardInterrupt:\n"
    "    pass\n"
    "  return rope.get_config()\n",
  )
  result = run_cli(f"--config={config}", f"--workdir={tmp_path / 'run'}")
  assert result.returncode == status, result.stderr
  assert result.stderr.strip().splitlines() == [line]
  assert not (tmp_path / "run").exists()


def test_a_sigterm_while_a_command_writes_removes_its_temporary_and_exits_143(tmp_path):
  """A command without a SIGTERM handler of its own (all but txf-run and
  txf-sweep) was killed, leaving `.NAME.<hex>.tmp` beside the file it was
  writing and no line. The SIGTERM lands inside txf.storage.write_files,
  between the first file's temporary and the second's."""
  code = (
    "import os, signal, sys\n"
    "from txf.commands.cli import command_started, run_command\n"
    "from txf.storage import write_files\n"
    "class Terminating(str):\n"
    "  def encode(self, *args):\n"
    "    os.kill(os.getpid(), signal.SIGTERM)\n"
    "    return b'second'\n"
    "def main(argv):\n"
    "  command_started()  # as a command that starts jax itself does\n"
    "  write_files({sys.argv[1] + '/a.txt': 'first', sys.argv[1] + '/b.txt': Terminating('b')})\n"
    "  print('not reached')\n"
    "sys.argv[1:] = [sys.argv[1]]\n"
    "run_command(main, arguments='the directory', starts_jax=False)\n"
  )
  result = subprocess.run(
    [sys.executable, "-c", code, str(tmp_path)],
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
    cwd=REPO,
  )
  assert result.returncode == cli.TERMINATED_STATUS, result.stderr
  assert result.stderr.strip().splitlines() == ["terminated"] and not result.stdout
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
  "signame, status, line",
  [
    ("SIGINT", cli.INTERRUPTED_STATUS, "interrupted"),
    ("SIGTERM", cli.TERMINATED_STATUS, "terminated"),
  ],
)
def test_a_signal_that_lands_in_a_garbage_collection_still_ends_the_command(signame, status, line):
  """Python runs a signal's handler at the next line of Python it runs; in
  a garbage collection that is a callback (jax's, at every collection),
  where its KeyboardInterrupt or Terminated was printed as "Exception
  ignored in" and lost: the command went on. Here the signal arrives in a
  collection's first callback, as a Ctrl-C can land in jax's."""
  code = (
    "import gc, os, signal, sys, time\n"
    "from txf.commands.cli import command_started, run_command\n"
    "def collecting(phase, info):\n"
    "  if phase == 'start':\n"
    f"    os.kill(os.getpid(), signal.{signame})\n"
    "def main(argv):\n"
    "  command_started()\n"
    "  gc.callbacks.insert(0, collecting)\n"
    "  try:\n"
    "    gc.collect()\n"
    "  finally:\n"
    "    gc.callbacks.remove(collecting)\n"
    "  time.sleep(10)\n"
    "  print('not reached')\n"
    "run_command(main, required=False, starts_jax=False)\n"
  )
  result = run_python(code)
  assert result.returncode == status, result.stderr
  assert result.stderr.strip().splitlines() == [line] and not result.stdout


def run_python(code, *args):
  return subprocess.run(
    [sys.executable, "-c", code, *map(str, args)],
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
    cwd=REPO,
  )


def test_a_ctrl_c_while_txf_run_starts_jax_ends_it_before_it_trains(tmp_path):
  """txf-run starts jax itself (jax.distributed first): a Ctrl-C there,
  which an import can swallow as this patched start does, let the run train
  to its end, exit 0."""
  code = (
    "import os, signal, sys, time\n"
    "import txf.commands.run as command\n"
    "started = command.start_jax\n"
    "def swallowing():\n"
    "  try:\n"
    "    os.kill(os.getpid(), signal.SIGINT)\n"
    "    time.sleep(2)\n"
    "  except KeyboardInterrupt:\n"
    "    pass\n"
    "  return started()\n"
    "command.start_jax = swallowing\n"
    "sys.argv = ['txf-run', '--config=rope', '--workdir=' + sys.argv[1],\n"
    "            '--config.train.steps=2', '--config.model.num_layers=1']\n"
    "command.cli()\n"
  )
  result = run_python(code, tmp_path / "run")
  assert result.returncode == cli.INTERRUPTED_STATUS, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == "interrupted"
  assert not (tmp_path / "run").exists()


def test_run_command_puts_the_signal_handlers_back_and_keeps_an_ignored_one(tmp_path):
  """From Python: after run_command (its main run, or a flag error) the
  handlers are those before it (SIGTERM raised Terminated ever after); a
  SIGINT the process ignores (a background job's) stays ignored while the
  command starts (it exited 130)."""
  code = (
    "import os, signal, sys, time\n"
    "from txf.commands.cli import command_started, run_command\n"
    "def main(argv):\n"
    "  print('main', flush=True)\n"
    "for argv in (['cmd'], ['cmd', '--no_such_flag']):\n"
    "  sys.argv = argv\n"
    "  try:\n"
    "    run_command(main, starts_jax=False)\n"
    "  except SystemExit:\n"
    "    pass\n"
    "  assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
    "  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "def own(signum, frame):\n"
    "  print('own handler', flush=True)\n"
    "signal.signal(signal.SIGTERM, own)\n"
    "def ignoring(argv):\n"
    "  os.kill(os.getpid(), signal.SIGINT)\n"
    "  time.sleep(0.2)\n"
    "  print('ignored', flush=True)\n"
    "  command_started()  # a SIGTERM handler of the process's own: its again\n"
    "  os.kill(os.getpid(), signal.SIGTERM)\n"
    "  time.sleep(0.2)\n"
    "sys.argv = ['cmd']\n"
    "run_command(ignoring, starts_jax=False)\n"
  )
  result = run_python(code)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines() == ["main", "ignored", "own handler"]


@pytest.mark.parametrize("case", list(CONFIG_ERRORS))
def test_broken_config_file_is_one_line_exit_2(tmp_path, case):
  text, fragments = CONFIG_ERRORS[case]
  config = tmp_path / "config.py"
  if text is not None:
    config.write_text(text)
  workdir = tmp_path / "run"
  result = run_cli(f"--config={config}", f"--workdir={workdir}", "--config.train.steps=3")
  assert_one_line_error(result, "config error: ", str(config), *fragments)
  assert not workdir.exists()


def test_a_syntax_error_in_a_module_the_config_imports_names_that_module(tmp_path):
  """It named the config file at the module's line number (cfg.py:2 of a
  one-line config)."""
  write(tmp_path / "broken_entry.py", "x = 1\ny = (\n")
  config = write(tmp_path / "config.py", "import broken_entry\n")
  result = run_cli(f"--config={config}", f"--workdir={tmp_path / 'run'}")
  assert_one_line_error(result, f"config error: {tmp_path / 'broken_entry.py'}:2: ")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command,config", [("run", "rope"), ("sweep", "sweeps/pe_ln")])
def test_a_setting_for_a_config_that_takes_none_is_one_line_exit_2(tmp_path, command, config):
  """`--config=rope:gpu` was get_config's own TypeError ("takes 0 positional
  arguments but 1 was given")."""
  result = run_cli(f"--config={config}:gpu", f"--workdir={tmp_path / 'run'}", command=command)
  assert_one_line_error(result, "config error: ", f"{config}.py", "takes no setting, got ':gpu'")
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "flag,fragments",
  [
    ("--config.train.steps=abc", ["--config.train.steps=abc", "invalid literal for int()"]),
    ("--no_such_flag=1", ["no_such_flag"]),
  ],
)
def test_bad_flag_is_one_line_exit_2(tmp_path, flag, fragments):
  result = run_cli("--config=configs/rope.py", f"--workdir={tmp_path / 'run'}", flag)
  assert_one_line_error(result, "flag error: ", *fragments)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "command,args,fragments",
  [
    ("run", ["--config=configs/rope.py", "foo"], ["unexpected arguments: foo"]),
    ("sweep", ["--config=configs/sweeps/pe_ln.py", "foo"], ["unexpected arguments: foo"]),
    (
      "sweep",
      ["--config=configs/sweeps/pe_ln.py", "--summarize", "--publish=W"],
      ["--summarize and --publish: choose one"],
    ),
    (
      "sweep",
      ["--config=configs/sweeps/pe_ln.py", "--publish=W", "--index=0"],
      ["--publish copies every point of the sweep: no --index"],
    ),
    (
      "sweep",
      ["--config=configs/sweeps/pe_ln.py", "--summarize", "--index=0"],
      ["--summarize reads every point of the sweep: no --index"],
    ),
    ("embed", ["--model=D"], ["missing the texts to embed"]),
    ("generate", ["--model=W", "--prompt="], ["--prompt: empty"]),
    ("extrapolate", ["--workdir=W", "--stride=abc"], ["--stride=abc", "invalid literal"]),
    ("extrapolate", ["--workdir=W", "--factors=1,a"], ["factors: not a list of integers: 1,a"]),
    ("extrapolate", [], ["--workdir is required (Run directory"]),
    ("analyze", [], ["--workdir is required (Run directory"]),
    ("analyze", ["--workdir=W", "--num_batches=abc"], ["--num_batches=abc"]),
    ("analyze", ["--workdir=W", "--periods=3,x"], ["--periods must be integers, got '3,x'"]),
  ],
)
def test_every_command_reports_a_bad_or_stray_argument_in_one_line_exit_2(
  tmp_path, command, args, fragments
):
  """They used to print a page of usage or absl's FATAL flags error, exit 1."""
  args = [arg.replace("=W", f"={tmp_path / 'run'}") for arg in args]
  if command in ("run", "sweep"):
    args.append(f"--workdir={tmp_path / 'run'}")
  assert_one_line_error(run_cli(*args, command=command), "flag error: ", *fragments)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "command,args,flag",
  [
    ("run", ["--config=configs/rope.py", "--workdir="], "--workdir="),
    ("sweep", ["--config=configs/sweeps/pe_ln.py", "--workdir= "], "--workdir= "),
    ("sweep", ["--config=configs/sweeps/pe_ln.py", "--workdir=W", "--publish="], "--publish="),
    ("export", ["--workdir=", "--out=W"], "--workdir="),
    ("extrapolate", ["--workdir="], "--workdir="),
    ("analyze", ["--workdir="], "--workdir="),
    ("textbook", ["--out_dir=", "positions"], "--out_dir="),
  ],
)
def test_an_empty_path_flag_is_a_flag_error(tmp_path, command, args, flag):
  """txf-run and txf-sweep took --workdir= ($UNSET) for their default
  directory (resuming the run there), txf-sweep's --publish= was a
  traceback, the others read '.' as the run."""
  args = [arg.replace("=W", f"={tmp_path / 'run'}") for arg in args]
  result = run_cli(*args, command=command)
  assert_one_line_error(result, f"flag error: flag {flag}: empty; name a directory")
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
  "command,config,fragments",
  [
    ("run", "configs/sweeps/pe_ln.py", ["a sweep config", "txf-sweep --config="]),
    ("sweep", "configs/rope.py", ["not a sweep config", "txf-run --config="]),
  ],
)
def test_a_config_of_the_other_kind_is_one_line_exit_2(tmp_path, command, config, fragments):
  """A sweep config given to run ended in chained tracebacks (AttributeError: 'data')."""
  result = run_cli(f"--config={config}", f"--workdir={tmp_path / 'run'}", command=command)
  assert_one_line_error(result, "config error: ", config, *fragments)
  assert not (tmp_path / "run").exists()


def test_a_run_field_set_on_a_sweep_config_says_how_to_set_its_base(tmp_path):
  result = run_cli(
    "--config=configs/sweeps/pe_ln.py",
    f"--workdir={tmp_path / 'sweep'}",
    "--config.train.steps=3",
    command="sweep",
  )
  assert_one_line_error(
    result, "config error: train.steps: unknown field", "--config.base.<section>.<field>=VALUE"
  )
  assert not (tmp_path / "sweep").exists()


def test_a_sweep_grid_is_narrowed_with_the_grid_flag_not_its_config_fields(tmp_path):
  workdir = f"--workdir={tmp_path / 'sweep'}"
  result = run_cli(
    "--config=configs/sweeps/pe_ln.py",
    workdir,
    "--config.grid.model.position=rope",
    command="sweep",
  )
  assert_one_line_error(
    result, "config error: grid.model.position: unknown field", "--grid=model.position="
  )
  result = run_cli(
    "--config=configs/sweeps/pe_ln.py",
    workdir,
    "--grid=model.position=rope,alibi",
    "--dry_run",
    command="sweep",
  )
  assert result.returncode == 0, result.stderr
  points = [line for line in result.stdout.splitlines() if line.startswith("point ")]
  assert points == [
    "point 0 (position=rope,norm_placement=pre):",
    "point 1 (position=rope,norm_placement=post):",
    "point 2 (position=alibi,norm_placement=pre):",
    "point 3 (position=alibi,norm_placement=post):",
  ]
  result = run_cli(
    "--config=configs/sweeps/pe_ln.py", workdir, "--grid=model.num_layers=two", command="sweep"
  )
  assert_one_line_error(result, "flag error: --grid=model.num_layers=two: ", "not an integer")
  result = run_cli("--config=configs/sweeps/pe_ln.py", workdir, "--index=12", command="sweep")
  assert_one_line_error(result, "flag error: --index=12: out of range", "indices 0..11")
  assert not (tmp_path / "sweep").exists()


@pytest.mark.parametrize(
  "override,error",
  [
    ("--config.model.position=rpoe", "config error: model.position: "),
    # A mesh size is checked with the config, not only where the mesh is made.
    ("--config.parallel.fsdp=0", "config error: parallel.fsdp: must be a positive integer"),
  ],
)
def test_print_config_rejects_an_invalid_value_in_one_line_exit_2(tmp_path, override, error):
  result = run_cli(
    "--config=configs/rope.py", f"--workdir={tmp_path / 'run'}", "--print_config", override
  )
  assert_one_line_error(result, error)
  assert not result.stdout


def test_none_on_the_command_line_unsets_a_field():
  """--config.FIELD=None: a str field read the text 'None' (attention_impl:
  "'None' is not one of (None, ...)"), an int field refused it as a flag
  error, so a config's value could not be set back to None. The last
  override of a field wins; a field that is not None-able names itself."""
  result = run_cli(
    "--config=configs/gpt2_small.py",
    "--print_config",
    "--config.model.attention_impl=None",
    "--config.model.scale_logits=None",  # gpt2_small: False
    "--config.model.d_ff=None",
    "--config.model.window=64",
    "--config.model.window",  # absl's spaced form
    "None",
    "--config.model.head_dim=None",
    "--config.model.head_dim=32",
  )
  assert result.returncode == 0, result.stderr
  values = dict(line.split(" = ", 1) for line in result.stdout.splitlines() if " = " in line)
  assert values["model.attention_impl"].startswith("None  #")
  assert values["model.scale_logits"].startswith("None  (resolved: True)")
  assert values["model.d_ff"].startswith("None  (resolved: 3072)")
  assert values["model.window"].startswith("None  #")
  assert values["model.head_dim"].startswith("32 ")
  result = run_cli("--config=configs/rope.py", "--print_config", "--config.train.steps=None")
  assert_one_line_error(
    result, "config error: train.steps: must be an integer in [1, 2147483647], got None"
  )
  result = run_cli("--config=configs/rope.py", "--print_config", "--config.model.nosuch=None")
  assert_one_line_error(result, "config error: model.nosuch: unknown field")


def test_print_config_reads_a_pods_config_on_a_machine_without_its_devices():
  """decoder_1b's mesh (16-way FSDP) is checked where it runs, not here."""
  result = run_cli("--config=configs/decoder_1b.py", "--print_config")
  assert result.returncode == 0, result.stderr
  assert "parallel.fsdp = 16" in result.stdout


def test_every_config_field_has_a_doc():
  """--print_config's docs: a field added to configs/base.py or a section's
  dataclass without its doc fails here."""
  docs = field_docs()
  undocumented = [name for name, _ in leaves(load_config("base")) if not docs.get(name)]
  assert not undocumented


def test_print_config_lists_the_choices_user_code_registers():
  from txf import register
  from txf.data.spec import GENERATED
  from txf.layers.model_config import FAMILIES, HEADS, NORMS
  from txf.models import Decoder, LMHead

  with GENERATED.scoped(), NORMS.scoped(), HEADS.scoped(), FAMILIES.scoped():
    before = field_docs()
    assert "mqar" in before["data.name"] and "parity" not in before["data.name"]
    register.lm_task("parity")(lambda rng, seq_len, num_symbols, first_id: None)
    register.norm("unit")(lambda layer, x, cfg: x)
    register.head("other_lm", tasks=("lm",), families=("decoder",))(LMHead)
    register.family("other_decoder", tasks=("lm",))(Decoder)
    after = field_docs()
  assert "parity" in after["data.name"] and "induction" in after["data.name"]
  for field, name in (("norm", "unit"), ("head", "other_lm"), ("family", "other_decoder")):
    assert name in after[f"model.{field}"] and name not in before[f"model.{field}"]
  assert "other_lm" not in field_docs()["model.head"]  # unregistered at the block's end
  # Each choice once: the doc's own list, then the registered ones (it read
  # 'layer | rms | unit: layer | rms').
  assert after["model.norm"] == f"{before['model.norm']} (registered: unit)"
  # txf's own choices are never labelled registered (data.name's generated
  # datasets and model.dtype's bfloat16 were).
  assert not any("(registered" in doc for doc in before.values())


class Suffix:
  """A task kind of lm batches."""

  @staticmethod
  def model_inputs(batch): ...

  @staticmethod
  def labels_and_weights(batch): ...


def test_print_config_lists_the_registered_tasks_tokenizers_decays_and_trackers():
  """They were not listed at all (only model.* and data.name were)."""
  from txf import register
  from txf.data.spec import TASKS, TOKENIZERS
  from txf.runconfig.optim import DECAYS
  from txf.runconfig.tracker_kinds import TRACKERS

  with TASKS.scoped(), TOKENIZERS.scoped(), DECAYS.scoped(), TRACKERS.scoped():
    before = field_docs()
    register.task("suffix", batches="lm")(Suffix)
    register.tokenizer("lower_bytes")(lambda spec, workdir: None)
    register.decay("halving")(lambda phase: None)
    register.tracker("recorder")(Recorder)
    after = field_docs()
  for field, name in (
    ("data.task", "suffix"),
    ("data.tokenizer", "lower_bytes"),
    ("train.decay", "halving"),
    ("train.trackers", "recorder"),
  ):
    assert after[field] == f"{before[field]} (registered: {name})", after[field]


def test_unusable_workdir_is_one_line_exit_2(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("keep me")
  for workdir, fragment in (
    (a_file, "exists and is not a directory"),
    (a_file / "run", "not a writable directory"),
  ):
    result = run_cli("--config=configs/rope.py", f"--workdir={workdir}")
    assert_one_line_error(result, "workdir error: ", str(workdir), fragment)
  assert a_file.read_text() == "keep me"


def test_export_reports_a_bad_out_as_a_flag_error(tmp_path):
  """They read `config error: out: ...` or `workdir error: out: ...`, though
  --out is a flag. A config.json with the model and train sections is a
  run to the checks, which refuse --out before anything is read."""
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text('{"model": {}, "train": {}}')
  (tmp_path / "file").touch()
  for out, fragment in (
    ("", "out: empty"),
    ("gs:/bucket/hf", "out: gs:/bucket/hf is a URL that lost a slash"),
    (tmp_path / "file", "exists and is not a directory"),
    (run, "is the run's work directory"),
  ):
    result = run_cli(f"--workdir={run}", f"--out={out}", command="export")
    assert_one_line_error(result, "flag error: out: ", fragment)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
def test_read_only_workdir_is_one_line_exit_2(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  workdir.chmod(0o500)
  try:
    result = run_cli("--config=configs/rope.py", f"--workdir={workdir}")
  finally:
    workdir.chmod(0o700)
  assert_one_line_error(result, "workdir error: ", str(workdir), "not a writable directory")
  assert not any(workdir.iterdir())


def listed_configs(help_text, heading):
  """name -> purpose (its lines joined) of the configs listed under `heading`."""
  listing = help_text.split(heading + "\n", 1)[1].split("\n\n", 1)[0]
  entries = {}
  for line in listing.splitlines():
    if line.startswith("  ") and not line.startswith("   "):
      name, _, purpose = line.strip().partition(" ")
      entries[name] = purpose.strip()
    else:
      entries[name] += " " + line.strip()
  return entries


def first_paragraph(path):
  return " ".join(ast.get_docstring(ast.parse(path.read_text())).split("\n\n")[0].split())


@pytest.mark.parametrize(
  "command, directory, heading",
  [
    ("run", "", "Configs txf ships (--config=NAME):"),
    ("sweep", "sweeps", "Sweep configs txf ships (--config=NAME):"),
  ],
)
def test_help_lists_every_config_by_its_name_with_its_whole_purpose(command, directory, heading):
  # They were listed as configs/alibi.py (a checkout's path) and their purpose
  # cut at the docstring's first line (pe_ln_gpu's, decoder_1b's mid-sentence).
  result = run_cli("--help", command=command)
  files = sorted(p for p in (REPO / "configs" / directory).glob("*.py") if p.name != "__init__.py")
  assert len(files) >= 3
  listed = listed_configs(result.stdout, heading)
  prefix = f"{directory}/" if directory else ""
  assert listed == {prefix + path.stem: first_paragraph(path) for path in files}
  assert all(len(line) <= 100 for line in result.stdout.splitlines())
  if command == "run":
    assert "--print_config" in result.stdout
    assert "--config.<section>.<field>=VALUE" in result.stdout
  else:
    assert "--config.base.<section>.<field>=VALUE" in result.stdout
    assert "--config.base.train.steps=" in result.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_shows_the_installed_command_first_and_the_checkout_one_after(command):
  # The help showed only `python -m experiments.X` (no module named 'experiments'
  # for a pip user), and --config only under --helpfull.
  result = run_cli("--help", command=command)
  usage = [
    line.strip()
    for line in result.stdout.split("\n\n")[1].splitlines()
    if line.strip().startswith(("txf-", "python "))
  ]
  assert usage[0].startswith(f"txf-{command} ")
  assert usage[-1].startswith(f"python -m experiments.{command} ")
  assert "python -m" not in "\n".join(usage[:-1])
  assert ("  --config: " in result.stdout) == (command in ("run", "sweep", "compile"))


def test_print_config_prints_every_resolved_field_once_with_docs(tmp_path):
  workdir = tmp_path / "run"
  result = run_cli(
    "--config=configs/seq2seq.py",
    f"--workdir={workdir}",
    "--print_config",
    "--config.train.steps=700",
  )
  assert result.returncode == 0, result.stderr
  expected = flatten(load_config("seq2seq"))
  expected["train.steps"] = 700
  base = flatten(load_config("base"))
  printed = {}
  for line in result.stdout.splitlines():
    name, _, rest = line.partition(" = ")
    assert name not in printed, name
    printed[name] = rest
  assert set(printed) == set(expected)
  for name, value in expected.items():
    assert printed[name].startswith(repr(value)), (name, printed[name])
    assert ("(base: " in printed[name]) == (value != base[name]), (name, printed[name])
  # Docs: a model field's from ModelConfig, another section's from configs/base.py.
  assert printed["model.position"].endswith(
    "# " + " | ".join(POSITIONS) + ": a txf.layers.positions.ENCODINGS name"
  )
  assert printed["train.steps"].startswith("700  (base: 600)  # ")
  assert printed["data.batch_size"].endswith("# global, across all devices and hosts")
  assert all("  # " in rest for rest in printed.values())
  # Derived values as the run uses them: from the tokenizer and ModelConfig.
  model = load_config("seq2seq").model
  assert model.vocab_size is None and model.head_dim is None and model.d_ff is None
  assert printed["model.vocab_size"].startswith("None  (resolved: 19)")
  head_dim = model.d_model // model.num_heads
  assert printed["model.head_dim"].startswith(f"None  (resolved: {head_dim})")
  assert printed["model.d_ff"].startswith(f"None  (resolved: {4 * model.d_model})")
  assert "(resolved: " not in printed["model.d_model"]
  assert not workdir.exists()


def run_in(directory, *args):
  """experiments.run from `directory` (this checkout's txf)."""
  return subprocess.run(
    [sys.executable, "-m", "experiments.run", *args],
    cwd=directory,
    capture_output=True,
    text=True,
    timeout=TIMEOUT_S,
    env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO)),
  )


@pytest.mark.parametrize(
  "config", ["./rope.py", "rope.txt", "rope.yaml", "rope/", "configs/rope.py"]
)
def test_a_config_path_is_that_file_or_an_error(tmp_path, config):
  """Each loaded the shipped txf/configs/rope.py where no such file was."""
  (tmp_path / "rope").mkdir()
  result = run_in(tmp_path, f"--config={config}", "--print_config")
  assert_one_line_error(result, f"config error: {config}: ", "nor the name of a config txf ships")
  # The runs and the sweeps apart (txf-run takes no sweep; the line named them as one).
  runs, _, sweeps = result.stderr.partition("; sweeps ")
  assert "ships: runs alibi, " in runs and " rope, " in runs and "sweeps/" not in runs
  assert sweeps.startswith("sweeps/") and "sweeps/pe_ln" in sweeps


def test_the_config_file_loaded_is_printed_first_and_recorded(tmp_path, compilation_cache_dir):
  """A local rope.py and the shipped rope: the run's first line and its
  run_record.json name the file each loaded (neither did)."""
  local = tmp_path / "rope.py"
  local.write_text(
    "from txf.configs import rope\n\ndef get_config():\n  return rope.get_config()\n"
  )
  config = tiny_config(steps=4)
  result = run_in(tmp_path, "--config=rope.py", "--workdir=run", *cli_overrides(config, "rope"))
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[0] == f"config: {local}"
  (entry,) = json.loads((tmp_path / "run" / "run_record.json").read_text())
  assert entry["config_file"] == str(local)
  shipped = run_in(tmp_path, "--config=rope", "--print_config")
  assert shipped.returncode == 0, shipped.stderr[-2000:]
  assert shipped.stderr.splitlines()[0] == f"config: {REPO / 'txf' / 'configs' / 'rope.py'}"


# --- help, a closed output, jax's platform plugins ------------------------------

EVERY_COMMAND = (*COMMANDS, "export")


@pytest.mark.parametrize("command", EVERY_COMMAND)
def test_help_exits_0(command):
  # absl's help flags exit 1.
  for flag in ("--help", "--helpfull"):
    result = run_cli(flag, command=command)
    assert result.returncode == 0 and result.stderr == "", (flag, result.stderr)
    assert f"txf-{command}" in result.stdout


def test_extrapolate_factors_default_is_the_librarys():
  """--factors' default is its own list (txf.commands.extrapolate cannot
  import txf.analysis.extrapolation, jax and all, before --help): the same
  as extrapolate_run's, in the flag and in the usage line."""
  from txf.analysis.extrapolation import DEFAULT_FACTORS

  factors = ",".join(str(factor) for factor in DEFAULT_FACTORS)
  result = run_cli("--help", command="extrapolate")
  assert result.returncode == 0, result.stderr
  assert f"(default: '{factors}')" in result.stdout
  assert f"[--factors={factors}]" in result.stdout


@pytest.mark.parametrize("command", ["compile", "export"])
def test_a_closed_output_ends_quietly_with_141(command):
  # `txf-compile --help | head -5` printed a BrokenPipeError traceback.
  read, write = os.pipe()
  os.close(read)  # the reader has gone before the first line
  try:
    result = subprocess.run(
      [sys.executable, "-m", f"experiments.{command}", "--help"],
      cwd=REPO,
      stdout=write,
      stderr=subprocess.PIPE,
      text=True,
      timeout=TIMEOUT_S,
    )
  finally:
    os.close(write)
  assert result.returncode == cli.CLOSED_OUTPUT_STATUS and result.stderr == ""


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full here")
@pytest.mark.parametrize("command", ["compile", "textbook"])
def test_an_output_that_cannot_be_written_is_one_line_exit_1(command):
  """stdout on a full device (/dev/full) was an OSError traceback."""
  args = ["--help"] if command == "compile" else ["--list"]
  with open("/dev/full", "w") as full:
    result = subprocess.run(
      [sys.executable, "-m", f"experiments.{command}", *args],
      cwd=REPO,
      stdout=full,
      stderr=subprocess.PIPE,
      text=True,
      timeout=TIMEOUT_S,
    )
  assert result.returncode == 1, result.stderr
  assert result.stderr.splitlines() == ["write error: stdout: No space left on device"]


def test_running_out_of_memory_is_one_line_exit_1():
  """XLA's RESOURCE_EXHAUSTED (a run's activations past the device's memory,
  which no check before compute bounds) was a traceback."""
  program = (
    "import jax.numpy as jnp\n"
    "from txf.commands.cli import run_command\n"
    "def main(argv):\n"
    "  jnp.zeros(2**40).block_until_ready()\n"  # 4 TiB
    "run_command(main)\n"
  )
  result = subprocess.run(
    [sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT_S
  )
  assert result.returncode == 1, result.stderr
  assert re.fullmatch(
    r"out of memory: RESOURCE_EXHAUSTED: .*4398046511104 bytes\.\n", result.stderr
  )


def test_what_starting_jax_prints_is_held_back_unless_it_fails(capfd):
  # File descriptor 2, where native code writes (and Python's sys.stderr,
  # outside pytest's capture).
  def noisy(result):
    os.write(2, b"libtpu: no TPU\n")
    return result()

  value, text = cli._holding_back_stderr(lambda: noisy(lambda: 42))
  assert (value, text) == (42, "libtpu: no TPU\n")
  assert capfd.readouterr().err == ""
  with pytest.raises(ZeroDivisionError):
    cli._holding_back_stderr(lambda: noisy(lambda: 1 / 0))
  assert capfd.readouterr().err == "libtpu: no TPU\n"


def test_the_platform_plugins_print_nothing_and_the_platform_is_one_line(
  tmp_path, compilation_cache_dir
):
  # With the compile extras (libtpu, jax's CUDA plugin) installed, every
  # command on a CPU machine printed ~20 lines of their tracebacks.
  env = {k: v for k, v in cli_env(compilation_cache_dir).items() if k != "JAX_PLATFORMS"}
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      "--config=configs/rope.py",
      f"--workdir={tmp_path / 'run'}",
      *cli_overrides(tiny_config(steps=1), "rope"),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
  platforms = [line for line in result.stdout.splitlines() if line.startswith("platform: ")]
  assert platforms == ["platform: cpu (1 device)"] == result.stdout.splitlines()[1:2]


def test_the_default_workdir_of_a_config_with_an_argument_names_the_argument():
  """--config=rope.py:small and rope.py:large train in runs of their own
  (root/<stem>_<arg>): named by the stem alone, each resumed the other's run."""
  small = cli.default_workdir("workdirs", "/x/rope.py:small")
  assert small == cli.epath.Path("workdirs") / "rope_small"
  assert cli.default_workdir("workdirs", "/x/rope.py:large") != small
  assert cli.default_workdir("workdirs", "/x/rope.py") == cli.epath.Path("workdirs") / "rope"


def test_a_sweeps_default_workdir_is_under_runs(tmp_path):
  """Without --workdir the sweep works in runs/<config file stem> (the
  documented default): each point's command trains in runs/pe_ln/<point>.
  A dry run creates nothing. (txf.commands.sweep, the installed command:
  experiments/ is found from the checkout's root only.)"""
  result = _SERVER.run(
    "txf.commands.sweep", "--config=sweeps/pe_ln", "--dry_run", cwd=tmp_path, timeout=TIMEOUT_S
  )
  assert result.returncode == 0, result.stderr
  points = re.findall(r"^point \d+ \((.*)\):$", result.stdout, re.MULTILINE)
  workdirs = re.findall(r" --workdir=(\S+)", result.stdout)
  assert len(points) == 12 and workdirs == [f"runs/pe_ln/{point}" for point in points]
  assert os.listdir(tmp_path) == []


def test_publish_asks_for_each_points_extrapolation_unless_told_noextrapolate(tmp_path):
  """A sweep that extrapolates publishes a point only with its
  extrapolation.json; --noextrapolate (the sweep was run with it) does not
  ask for one."""
  committed = REPO / "docs" / "data" / "t5_distance"
  workdir = tmp_path / "runs"
  for point in committed.iterdir():
    if point.is_dir():
      shutil.copytree(point, workdir / point.name)
  (workdir / "t5_max_distance=64" / "extrapolation.json").unlink()
  args = ["--config=configs/sweeps/t5_distance.py", f"--workdir={workdir}"]
  refused = run_cli(*args, f"--publish={tmp_path / 'refused'}", command="sweep")
  assert refused.returncode == 2 and "has no extrapolation.json" in refused.stderr
  assert not (tmp_path / "refused").exists()
  published = run_cli(
    *args, f"--publish={tmp_path / 'published'}", "--noextrapolate", command="sweep"
  )
  assert published.returncode == 0, published.stderr
  assert not (tmp_path / "published" / "t5_max_distance=64" / "extrapolation.json").exists()
  assert (tmp_path / "published" / "t5_max_distance=32" / "extrapolation.json").exists()
