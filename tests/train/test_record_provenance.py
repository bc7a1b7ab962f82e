"""Each provenance field of a run's record against the ground truth it claims.

A field recorded wrong (a dirty flag that is always False, the commit of the
wrong object, a data fingerprint over names only) still looks like a field:
the end-to-end record test (test_run_record.py) checks its shape against the
same functions that wrote it. Here each field is compared with what it
describes: the git state with a temporary checkout made clean, then dirty,
then clean again; the data fingerprint with a corpus whose contents change
under the same names (and whose names change over the same contents); the
environment with the installed packages and devices; a start's entry with
the run it records. Cheap: no model, no training.
"""

import datetime
import functools
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys

import jax
import pytest

from conftest import tiny_config
from txf.data import corpus
from txf.runconfig.run_config import parse, to_json
from txf.rundir import record

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(directory, *args):
  return subprocess.run(
    ["git", "-C", str(directory), *args], capture_output=True, text=True, check=True
  ).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
  """A git checkout holding a `txf` package, one commit made: (root, package)."""
  # No user or system git config (signing, hooks, templates) reaches it.
  monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
  monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
  for variable in ("AUTHOR", "COMMITTER"):
    monkeypatch.setenv(f"GIT_{variable}_NAME", "txf test")
    monkeypatch.setenv(f"GIT_{variable}_EMAIL", "test@example.com")
  root = tmp_path / "checkout"
  package = root / "txf"
  package.mkdir(parents=True)
  (package / "__init__.py").write_text("VERSION = 1\n")
  (root / "README.md").write_text("readme\n")
  git(root, "init", "-q")
  git(root, "add", ".")
  git(root, "commit", "-q", "-m", "first")
  return root, package


@needs_git
def test_git_state_follows_a_checkout_made_clean_then_dirty(checkout):
  root, package = checkout
  state = lambda: record.git_state.__wrapped__(str(package))  # uncached
  first = git(root, "rev-parse", "HEAD")
  assert state() == {"commit": first, "dirty": False}

  (package / "__init__.py").write_text("VERSION = 2\n")  # a tracked file edited
  assert state() == {"commit": first, "dirty": True}
  git(root, "add", ".")  # staged, not committed
  assert state() == {"commit": first, "dirty": True}

  git(root, "commit", "-q", "-m", "second")
  second = git(root, "rev-parse", "HEAD")
  assert second != first and state() == {"commit": second, "dirty": False}

  (root / "README.md").write_text("edited\n")  # anywhere in the checkout
  assert state() == {"commit": second, "dirty": True}
  git(root, "checkout", "-q", "--", "README.md")
  # An untracked file (a run's output, a cache) leaves the checkout clean.
  (package / "scratch.txt").write_text("x\n")
  assert state() == {"commit": second, "dirty": False}


def run_config(**data):
  config = tiny_config("rope")
  config.data.update(data)
  return parse(config).with_vocabulary(260, None)


def write_corpus(directory, files):
  directory.mkdir(parents=True, exist_ok=True)
  for path in directory.rglob("*.py"):
    path.unlink()
  for name, text in files.items():
    (directory / name).write_text(text)


@pytest.fixture
def stdlib(tmp_path, monkeypatch):
  """The built-in corpus read from a temporary directory instead of the
  standard library (corpus_fingerprint's cache emptied around the test)."""
  root = tmp_path / "stdlib"
  monkeypatch.setattr(corpus, "stdlib_root", lambda: root)
  corpus.corpus_fingerprint.cache_clear()
  yield root
  corpus.corpus_fingerprint.cache_clear()


FILES = {f"m{i}.py": f"x = {i}\n" * (i + 1) for i in range(6)}


def test_pystdlib_fingerprint_follows_the_corpus_contents_and_names(stdlib):
  def description(files):
    write_corpus(stdlib, files)
    corpus.corpus_fingerprint.cache_clear()
    return record.data_description(run_config())

  before = description(FILES)
  fingerprint = before["corpus"]
  assert fingerprint["files"] == len(FILES)
  assert fingerprint["bytes"] == sum(len(text) for text in FILES.values())
  assert fingerprint["python"] == platform.python_version()
  assert before["name"] == "pystdlib" and before["fields"]["max_corpus_bytes"] == 200_000
  assert description(FILES) == before  # the same corpus: the same record

  # The same names and sizes, one character changed.
  edited = dict(FILES, **{"m3.py": FILES["m3.py"].replace("3", "4")})
  changed = description(edited)
  assert changed["corpus"]["bytes"] == fingerprint["bytes"]
  assert changed["corpus"]["sha256"] != fingerprint["sha256"]
  assert changed["sha256"] != before["sha256"]
  # The same contents under another name.
  renamed = {("n3.py" if name == "m3.py" else name): text for name, text in FILES.items()}
  moved = description(renamed)
  assert moved["corpus"]["sha256"] != fingerprint["sha256"]
  assert moved["sha256"] != before["sha256"]


def corpus_warnings(stdlib, workdir, files, step):
  """The corpus lines a RunRecord start at `step` logs over `files`."""
  write_corpus(stdlib, files)
  corpus.corpus_fingerprint.cache_clear()
  lines = []
  record.RunRecord(workdir, log=lines.append).start(run_config(), step)
  return [line for line in lines if "corpus differs" in line]


def test_a_resume_over_a_changed_corpus_says_so(stdlib, tmp_path):
  # A resume continues at the saved window count whatever the text is now;
  # it used to say nothing of an edited corpus (the record held it).
  start = functools.partial(corpus_warnings, stdlib, tmp_path)
  assert start(FILES, 0) == []
  assert start(FILES, 5) == []  # the same corpus
  (line,) = start(dict(FILES, **{"m3.py": "y = 1\n"}), 9)
  assert line.startswith("warning: data.name 'pystdlib': the corpus differs")
  assert "before step 9" in line
  assert start(dict(FILES, **{"m3.py": "y = 1\n"}), 12) == []  # compared with the last start
  assert len(record.read_record(tmp_path)) == 4


def test_the_corpus_is_compared_with_the_last_start_and_only_on_a_resume(stdlib, tmp_path):
  """A fresh start (step 0) over a changed corpus continues nothing: no
  warning. A record not laid out as RunRecord writes it (another tool's
  json.dumps) is compared with its last entry too, not its first."""
  edited = dict(FILES, **{"m3.py": "y = 1\n"})

  start = functools.partial(corpus_warnings, stdlib, tmp_path)
  assert start(FILES, 0) == []
  assert start(edited, 0) == []  # trained afresh on the edited corpus
  entries = record.read_record(tmp_path)
  (tmp_path / record.RECORD_FILE).write_text(json.dumps(entries))  # one line
  assert start(edited, 5) == []
  assert record.read_record(tmp_path)[:2] == entries and len(record.read_record(tmp_path)) == 3


@pytest.mark.parametrize("count", [2, 5])  # split by position / whole files
def test_text_files_fingerprint_follows_their_contents_and_names(tmp_path, count):
  texts = tmp_path / "texts"
  files = {f"t{i}.txt": "".join(f"line {i} {j}\n" for j in range(40)) for i in range(count)}

  def description(files):
    texts.mkdir(exist_ok=True)
    for path in texts.iterdir():
      path.unlink()
    for name, text in files.items():
      (texts / name).write_text(text)
    return record.data_description(run_config(name=f"files:{texts}", max_corpus_bytes=10_000))

  before = description(files)
  # Every byte is read (under max_corpus_bytes), each in one split.
  assert before["corpus"]["files"] == count
  assert before["corpus"]["bytes"] == sum(len(text) for text in files.values())
  assert description(files) == before

  edited = {**files, "t1.txt": files["t1.txt"].replace("line 1 7", "line 1 8")}
  changed = description(edited)
  assert changed["corpus"]["bytes"] == before["corpus"]["bytes"]
  assert changed["corpus"]["sha256"] != before["corpus"]["sha256"]
  assert changed["sha256"] != before["sha256"]

  renamed = {("u1.txt" if name == "t1.txt" else name): text for name, text in files.items()}
  moved = description(renamed)
  assert moved["corpus"]["sha256"] != before["corpus"]["sha256"]
  assert moved["sha256"] != before["sha256"]


def test_a_generated_task_is_described_by_its_fields():
  base = record.data_description(run_config(name="induction"))
  assert "corpus" not in base and base["fields"]["num_symbols"] == 32
  for field, value in dict(max_example_len=9, num_symbols=20).items():
    changed = record.data_description(run_config(name="induction", **{field: value}))
    assert changed["fields"][field] == value and changed["sha256"] != base["sha256"]


def test_environment_is_the_installed_packages_and_devices():
  env = record.environment()
  for package, version in env["versions"].items():
    try:
      assert version == importlib.metadata.version(package), package
    except importlib.metadata.PackageNotFoundError:
      assert version is None, package
  assert set(env["versions"]) >= {"jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "txf"}
  assert env["versions"]["jax"] == jax.__version__
  assert env["python"] == platform.python_version()
  assert env["backend"] == jax.default_backend()
  assert env["device_kind"] == jax.local_devices()[0].device_kind
  assert env["device_count"] == jax.device_count()
  assert env["process_count"] == jax.process_count()
  assert env["xla_flags"] == os.environ.get("XLA_FLAGS", "")
  assert "date" not in env  # each entry has its own start and end


def test_a_start_and_its_end_record_the_run_they_describe(tmp_path):
  run = run_config(name="induction")
  log = record.RunRecord(tmp_path)
  earliest = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
  log.start(run, 7)
  (entry,) = record.read_record(tmp_path)
  start = datetime.datetime.fromisoformat(entry["start"])
  assert earliest <= start <= datetime.datetime.now(datetime.UTC)
  # Every key from the start, null until it ends: a killed run's entry had
  # no end_step (a KeyError for a reader of the documented keys).
  assert (entry["end"], entry["ended"], entry["end_step"], entry["start_step"]) == (
    None,
    None,
    None,
    7,
  )
  assert entry["argv"] == sys.argv
  assert entry["git"] == record.git_state()
  assert entry["environment"] == record.environment()
  assert entry["data"] == record.data_description(run)
  config = entry["config"]
  assert config == to_json(run)
  assert config["seed"] == run.seed and config["replicas"] == run.replicas
  assert config["data"]["name"] == "induction" and config["data"]["seq_len"] == 32
  assert config["model"]["head_dim"] == run.model.d_model // run.model.num_heads
  assert config["model"]["vocab_size"] == 260 and config["train"]["steps"] == run.train.steps

  log.end("preempted", 9)
  (ended,) = record.read_record(tmp_path)
  assert ended["ended"] == "preempted" and ended["end_step"] == 9
  assert start <= datetime.datetime.fromisoformat(ended["end"])
  assert {k: v for k, v in ended.items() if k not in ("end", "ended", "end_step")} == {
    k: v for k, v in entry.items() if k not in ("end", "ended", "end_step")
  }
