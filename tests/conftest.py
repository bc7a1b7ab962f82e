"""Helpers and fixtures shared by the config and end-to-end tests."""

import atexit
import contextlib
import importlib
import json
import math
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile

# The tests run on the CPU: with txf's compile extras installed (libtpu,
# jax's CUDA plugin), jax would otherwise start those backends in every test
# process; txf.aot compiles for them without starting them.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# No test reaches the Hugging Face Hub: a model name not in the cache is an
# error (txf.interop.hub), in the tests and in the commands they start.
os.environ["HF_HUB_OFFLINE"] = "1"
# The tests' programs are tiny, so XLA's compile time is most of the suite;
# LLVM's optimisations cost more of it than they save at run time (a third
# of tests/train/test_training_behaviour.py's time on 2 cores), and XLA:CPU's
# MLIR fusion emitters compile a tiny train step ~3x slower than its classic
# emitters (2.2 s against 0.7 s; a 2-step run 6.7 s against 4.2 s). The
# numerics are the same program's: the tests compare against references, not
# code generation.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  _fast_compile = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
    " --xla_cpu_use_fusion_emitters=false"
  )
  os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_fast_compile}".strip()
# One JAX persistent compilation cache for every test process: pytest's
# workers and the command-line runs they start (which inherit this
# environment) compile the same tiny programs across modules. The process
# that made the directory (pytest's controller) removes it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = tempfile.mkdtemp(prefix="txf-tests-xla-cache-")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
  os.environ.update(
    JAX_COMPILATION_CACHE_DIR=_cache,
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1",
  )

import jax  # noqa: E402
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from command_server import CommandServer
from txf.rundir import checkpoint

# The tests write Python bytecode even where the environment says not to
# (PYTHONDONTWRITEBYTECODE=1 on CI's machines): otherwise each of the ~150
# test processes (pytest's workers, the command-line runs they start, which
# inherit this environment) compiles txf's modules from source again, about
# 0.8 s each, and each worker rewrites every test module's assertions again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(scope="session")
def compilation_cache_dir():
  """The session's JAX persistent compilation cache (set above), as
  {jax config name: value}, for `cli_env`: end-to-end runs cost mostly XLA
  compilation, and reruns of the same program then compile once."""
  return {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}


@pytest.fixture
def sigterm_is_caught():
  """While a test sends itself SIGTERM: if it arrives outside the runner's
  PreemptionGuard it is recorded here instead of killing pytest."""
  received = []
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
  yield received
  signal.signal(signal.SIGTERM, previous)


def sigterm_at(step, lines):
  """A `log` callback for txf.train.loop.run that records lines and sends
  this process SIGTERM once step `step` is logged (the loop's PreemptionGuard
  turns it into a save and a clean return)."""

  def log(line):
    lines.append(line)
    if line.startswith(f"step {step}/"):
      os.kill(os.getpid(), signal.SIGTERM)

  return log


def optimised(jitted, *args):
  """`jitted` compiled for `args` with XLA's CPU optimisations on, for the few
  tests that run one program hundreds of times: the suite turns them off
  (above), which compiles faster but runs about 3x slower."""
  options = {"xla_backend_optimization_level": 2, "xla_llvm_disable_expensive_passes": False}
  return jitted.lower(*args).compile(options)


def load_config(name):
  """configs/<name>.py's get_config()."""
  return importlib.import_module(f"txf.configs.{name}").get_config()


def tiny_config(name="rope", *, steps=12, **fields):
  """configs/<name>.py shrunk to seconds; `fields` like train__decay='cosine'."""
  config = load_config(name)
  config.model.update(dict(d_model=32, num_heads=2, num_layers=1))
  config.data.update(dict(batch_size=8, max_corpus_bytes=200_000))
  if config.data.task in ("lm", "mlm"):
    config.data.seq_len = 32
  config.train.update(
    dict(steps=steps, warmup_steps=4, decay="constant", log_every=1, checkpoint_every=1000)
  )
  config.eval.update(dict(every=1000, num_batches=1, sample_tokens=0))
  for key, value in fields.items():
    section, field = key.split("__")
    config[section][field] = value
  return config


# A metrics row's fields that differ between two runs of the same config.
TIMING_KEYS = frozenset(
  {"tokens_per_sec", "examples_per_sec", "steps_per_sec", "step_time", "mfu", "time"}
)


def without_timings(rows):
  """Metrics rows without their TIMING_KEYS, to compare two runs' rows."""
  return [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in rows]


def output_lines(text):
  """The lines of a command's stdout, each without the wall-clock time that
  progress.say puts before a line of long work off a terminal."""
  return [re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", line) for line in text.splitlines()]


def flatten(tree, prefix=""):
  """{'model.d_model': 128, ...} from a nested dict / ConfigDict."""
  flat = {}
  for key, value in tree.items():
    if hasattr(value, "items"):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def checkpoint_steps(workdir):
  """Finalised checkpoint steps in a run's work directory, ascending."""
  directory = pathlib.Path(workdir) / "checkpoints"
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def restore_state(workdir, step):
  """The train state of checkpoint `step` of a run (local or gs://), read
  with orbax directly, not txf's Checkpointer: a packed state
  (txf.rundir.packed_state) cut by the layout its extras record, into
  nested dicts keyed by its leaves' paths; a state saved as it is, as orbax
  restores it."""
  step_dir = epath.Path(workdir) / "checkpoints" / str(step)
  if "://" not in str(workdir):
    step_dir = step_dir.resolve()  # orbax wants an absolute path
  with ocp.StandardCheckpointer() as checkpointer:
    state = checkpointer.restore(step_dir / "state")
  extras = json.loads((step_dir / "extras" / "metadata").read_text())
  layout = extras.get(checkpoint.LAYOUT_KEY)
  if layout is None:
    return state
  leaves = {}
  for index, packed in enumerate(layout):
    values, offset = np.asarray(state[str(index)]), 0
    for path, shape in packed["leaves"]:
      leaves[path] = values[offset : offset + math.prod(shape)].reshape(shape)
      offset += math.prod(shape)
  return _nested(leaves)


# One key of a jax.tree_util.keystr path: .attribute, ['key'] or [index].
PATH_KEY = re.compile(r"\.(\w+)|\['([^']*)'\]|\[(\d+)\]")


def _nested(leaves):
  """{keystr path: value} as nested dicts, a level for each key of a path."""
  tree = {}
  for path, value in leaves.items():
    found = list(PATH_KEY.finditer(path))
    assert "".join(match.group(0) for match in found) == path, path
    keys = [match.group(1) or match.group(2) or int(match.group(3)) for match in found]
    node = tree
    for key in keys[:-1]:
      node = node.setdefault(key, {})
    node[keys[-1]] = value
  return tree


def assert_same_states(state_a, state_b):
  """Two restored train states are bit-identical: same tree (of more than a
  handful of leaves, so an empty or truncated restore cannot pass) and equal
  arrays."""
  leaves_a, tree_a = jax.tree.flatten(state_a)
  leaves_b, tree_b = jax.tree.flatten(state_b)
  assert tree_a == tree_b and len(leaves_a) > 3
  for a, b in zip(leaves_a, leaves_b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def take_batches(dataset, n):
  """The next n batches of a txf.data Dataset."""
  return [next(dataset) for _ in range(n)]


def assert_same_batches(batches_a, batches_b):
  """Two lists of batch dicts hold exactly the same arrays."""
  assert len(batches_a) == len(batches_b)
  for a, b in zip(batches_a, batches_b):
    assert a.keys() == b.keys()
    for key in a:
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def truncate_state_files(step_dir):
  """Cuts every array file of a checkpoint step to 3 bytes (a corrupt save)."""
  files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"]
  assert files
  for path in files:
    with open(path, "r+b") as f:
      f.truncate(3)


# --- the CLI in subprocesses ---------------------------------------------------

REPO = pathlib.Path(__file__).resolve().parent.parent
# Files the tests read: tiny Hugging Face checkpoints, a run an old commit wrote.
FIXTURES = REPO / "tests" / "fixtures"
_CACHE_OPTIONS = {  # jax config option -> environment variable (subprocesses)
  "jax_compilation_cache_dir": "JAX_COMPILATION_CACHE_DIR",
  "jax_persistent_cache_min_compile_time_secs": "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
  "jax_persistent_cache_min_entry_size_bytes": "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES",
}


def cli_overrides(config, name):
  """--config.<field>=<value> flags that turn configs/<name>.py into `config`."""
  base = flatten(load_config(name))
  return [f"--config.{key}={value}" for key, value in flatten(config).items() if value != base[key]]


def cli_env(cache):
  env = dict(os.environ, PYTHONUNBUFFERED="1")
  env.update({_CACHE_OPTIONS[name]: str(value) for name, value in cache.items()})
  return env


@contextlib.contextmanager
def repo_commands(**env):
  """A CommandServer (tests/command_server.py) that runs commands in the
  repository, each in a process of its own forked from one that imported jax
  once, under this process's environment with `env` set; closed after."""
  server = CommandServer(dict(os.environ, **env), REPO)
  try:
    yield server
  finally:
    server.close()


@pytest.fixture(scope="module")
def commands():
  """The module's `repo_commands()`: commands as `python -m` in the repository runs them."""
  with repo_commands() as server:
    yield server


def cli_command(name, workdir, config, *extra):
  return [
    sys.executable,
    "-m",
    "experiments.run",
    f"--config=configs/{name}.py",
    f"--workdir={workdir}",
    *cli_overrides(config, name),
    *extra,
  ]


@contextlib.contextmanager
def scoped(*registries):
  """Entries registered inside are gone after (each registry's `scoped()`)."""
  with contextlib.ExitStack() as stack:
    for registry in registries:
      stack.enter_context(registry.scoped())
    yield


def gone_pid() -> int:
  """The pid of a process that has exited (no process holds it, unless
  reused since: a test then sees it alive)."""
  exited = subprocess.run(
    [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
  )
  return int(exited.stdout)
