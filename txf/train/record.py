"""A run's record: what each start of a run trained with, in the work
directory's run_record.json -- a JSON list, one object per start (a resumed
run appends one), rewritten atomically:

  start, end     UTC timestamps (ISO 8601); end is null until that start
                 ends (stays null when it crashed) and `ended` says how:
                 'finished', 'preempted' or the error's type
  start_step     the step it continued from (0: a fresh start)
  argv           the command line (sys.argv)
  git            {'commit', 'dirty'} of the txf checkout it ran from; null
                 outside a git checkout (or without git)
  environment    Python, jax/jaxlib/flax/optax/orbax versions, devices and
                 their kind, process count (txf.train.hardware.environment)
  data           {'name', 'sha256', ...}: the data source described (for the
                 built-in corpus its Python version, files and bytes; for
                 text files their count, the bytes the splits read and a
                 hash of those) and a hash of that description
  config         the fully resolved config: the checked RunConfig's fields,
                 derived ones filled in (model.vocab_size, head_dim, d_ff, ...)

config.json stays the config as given (resuming checks it); this file is only
written. Runs written before it have none and load and resume as before.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import pathlib
import subprocess
import sys
from typing import Any

from etils import epath

from txf.train import hardware
from txf.train.config import RunConfig
from txf.train.workdir import replace_text

RECORD_FILE = "run_record.json"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "txf")


def _now() -> str:
  return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _git(directory: pathlib.Path, *args: str) -> str:
  return subprocess.run(
    ["git", "-C", str(directory), *args], capture_output=True, text=True, check=True, timeout=10
  ).stdout.strip()


@functools.cache
def git_state(package_dir: str | None = None) -> dict[str, Any] | None:
  """{'commit': sha, 'dirty': bool} of the git checkout that holds the txf
  package (`package_dir`: another package directory, for tests); None when
  it is not in one (an installed txf) or git is missing or fails."""
  directory = pathlib.Path(package_dir or pathlib.Path(__file__).parents[1]).resolve()
  try:
    top = pathlib.Path(_git(directory, "rev-parse", "--show-toplevel")).resolve()
    if top / directory.name != directory:  # not the checkout's own package
      return None
    commit = _git(directory, "rev-parse", "HEAD")
    dirty = bool(_git(directory, "status", "--porcelain", "--untracked-files=no"))
  except (OSError, subprocess.SubprocessError):
    return None
  return dict(commit=commit, dirty=dirty)


def environment() -> dict[str, Any]:
  """hardware.environment() with the versions of every package a run uses."""
  env = hardware.environment(_PACKAGES)
  env.pop("date", None)  # each entry has its own start and end
  return env


def data_description(run: RunConfig) -> dict[str, Any]:
  """The run's data described as cheaply as is stable, with a SHA-256 of it."""
  from txf.data import config, corpus, files  # noqa: PLC0415 (imports the data pipeline's modules)

  spec = dataclasses.asdict(run.data)
  description: dict[str, Any] = dict(name=run.data.name, fields=spec)
  if run.data.name == "pystdlib":
    description["corpus"] = corpus.corpus_fingerprint()
  elif config.is_files(run.data.name):
    text_files = files.TextFiles.find(run.data.name[len(config.FILES_PREFIX) :])
    description["corpus"] = text_files.fingerprint(max_bytes=run.data.max_corpus_bytes)
  description["sha256"] = hashlib.sha256(
    json.dumps(description, sort_keys=True, default=repr).encode("utf-8")
  ).hexdigest()
  return description


def resolved_config(run: RunConfig) -> dict[str, Any]:
  """The checked config as JSON values, derived fields filled in."""
  config: dict[str, Any] = dict(seed=run.seed, replicas=run.replicas)
  for section in ("model", "data", "train", "eval", "parallel"):
    config[section] = dataclasses.asdict(getattr(run, section))
  return json.loads(json.dumps(config, default=repr))


def read_record(workdir: str | epath.PathLike) -> list[dict[str, Any]]:
  """The run's record ([] for a run without one, or one that is unreadable)."""
  path = epath.Path(workdir) / RECORD_FILE
  if not path.exists():
    return []
  try:
    entries = json.loads(path.read_text())
  except json.JSONDecodeError:
    return []
  return entries if isinstance(entries, list) else []


class RunRecord:
  """Appends this start of a run to the record (`start`) and fills its end
  (`end`); with `enabled=False` (other processes) nothing. Writes raise
  WriteError naming the file (txf.train.workdir)."""

  def __init__(self, workdir: str | epath.PathLike, *, enabled: bool = True):
    self._path = epath.Path(workdir) / RECORD_FILE
    self._enabled = enabled  # only process 0 writes
    self._entries: list[dict[str, Any]] = []

  def start(self, run: RunConfig, start_step: int) -> None:
    if not self._enabled:
      return
    self._entries = read_record(self._path.parent)
    self._entries.append(
      dict(
        start=_now(),
        end=None,
        ended=None,
        start_step=start_step,
        argv=list(sys.argv),
        git=git_state(),
        environment=environment(),
        data=data_description(run),
        config=resolved_config(run),
      )
    )
    self._write()

  def end(self, how: str, end_step: int | None = None) -> None:
    """Fills this start's end: `how` it ended, at `end_step`."""
    if not self._entries:
      return
    self._entries[-1].update(end=_now(), ended=how, end_step=end_step)
    self._write()

  def _write(self) -> None:
    replace_text(self._path, json.dumps(self._entries, indent=1) + "\n")
