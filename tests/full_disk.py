"""A disk that fills up, for tests: from the Nth write to a file whose path
matches a pattern, that write and every later one to such files fail with
OSError(ENOSPC), as on a full disk (the failing write puts part of its data
down first, as a real one can). `read_only` makes a directory read-only.

In-process it wraps `builtins.open`, which every Python writer of a run goes
through (metrics, TensorBoard events, samples, config.json, and orbax's JSON
item of a checkpoint, written in orbax's background commit). As a script it
runs `experiments.run` with the fault in place:

  python tests/full_disk.py PATTERN N [--slow_finalize=SECONDS] -- RUN_FLAGS...

`slow_finalize` delays orbax's save-finalize thread before it waits for the
background commit, widening the window in which another thread could take
the commit's error from it (issue 28's harness for a deleted checkpoint).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import os
import re
import sys
import threading
import time


class FullDisk:
  """Counts writes to files whose path matches `pattern`; the `after`-th and
  every later one fail with ENOSPC. `failed` lists the paths it failed."""

  def __init__(self, pattern: str, after: int):
    self.pattern, self.after = re.compile(pattern), after
    self.writes = 0
    self.failed: list[str] = []
    self._lock = threading.Lock()

  @property
  def full(self) -> bool:
    return self.writes >= self.after

  def count(self, path: str) -> bool:
    """Counts a write to `path`; whether it fails."""
    with self._lock:
      self.writes += 1
      if self.full:
        self.failed.append(path)
      return self.full

  def error(self, path: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

  def open(self, real_open):
    def open_(file, mode="r", *args, **kwargs):
      handle = real_open(file, mode, *args, **kwargs)
      if (
        isinstance(file, (str, os.PathLike))
        and set(mode) & set("wax+")
        and self.pattern.search(os.fspath(file))
      ):
        return _Filling(handle, self, os.fspath(file))
      return handle

    return open_


class _Filling:
  """A file on a FullDisk: writes (and flushes, once the disk is full) fail."""

  def __init__(self, handle, disk: FullDisk, path: str):
    self._handle, self._disk, self._path = handle, disk, path

  def write(self, data):
    if self._disk.count(self._path):
      self._handle.write(data[: len(data) // 2])  # what still fitted
      raise self._disk.error(self._path)
    return self._handle.write(data)

  def flush(self):
    if self._disk.full:
      raise self._disk.error(self._path)
    return self._handle.flush()

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self._handle.close()

  def __iter__(self):
    return iter(self._handle)

  def __getattr__(self, name):
    return getattr(self._handle, name)


def files_in(directory: str | os.PathLike) -> str:
  """A `full_disk` pattern for the files directly in `directory`."""
  return re.escape(os.fspath(directory)) + r"/[^/]+$"


@contextlib.contextmanager
def full_disk(pattern: str, after: int, slow_finalize: float = 0.0):
  """Within it, writes to files matching `pattern` fail from the `after`-th on."""
  disk = FullDisk(pattern, after)
  real_open = builtins.open
  builtins.open = disk.open(real_open)
  restore_finalize = _slow_finalize(slow_finalize) if slow_finalize else (lambda: None)
  try:
    yield disk
  finally:
    builtins.open = real_open
    restore_finalize()


@contextlib.contextmanager
def read_only(directory: str | os.PathLike, *, except_under: str | os.PathLike | None = None):
  """Within it, `directory` is on a read-only file system, as far as Python's
  writers see it (root writes through permissions and tests cannot mount):
  opening a file below it for writing or making a directory there fails with
  OSError(EROFS); below `except_under` (a writable volume mounted there) not."""
  root = os.path.abspath(directory)
  mounted = None if except_under is None else os.path.abspath(except_under) + os.sep
  real_open, real_mkdir = builtins.open, os.mkdir

  def below(path) -> bool:
    if not isinstance(path, (str, os.PathLike)):
      return False
    inside = os.path.abspath(path) + os.sep
    return inside.startswith(root + os.sep) and not (mounted and inside.startswith(mounted))

  def refuse(path):
    return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))

  def open_(file, mode="r", *args, **kwargs):
    if below(file) and set(mode) & set("wax+"):
      raise refuse(file)
    return real_open(file, mode, *args, **kwargs)

  def mkdir(path, *args, **kwargs):
    if below(path) and not os.path.isdir(path):
      raise refuse(path)
    return real_mkdir(path, *args, **kwargs)

  builtins.open, os.mkdir = open_, mkdir
  try:
    yield
  finally:
    builtins.open, os.mkdir = real_open, real_mkdir


def _slow_finalize(seconds: float):
  """Delays orbax's save-finalize thread by `seconds` before it collects the
  background commit's result; returns what undoes it."""
  from orbax.checkpoint import checkpoint_manager

  manager = checkpoint_manager.CheckpointManager
  original = manager._wait_for_checkpointers

  def slowly(self):
    time.sleep(seconds)
    return original(self)

  manager._wait_for_checkpointers = slowly
  return lambda: setattr(manager, "_wait_for_checkpointers", original)


def main(argv: list[str]) -> None:
  """python tests/full_disk.py PATTERN N [--slow_finalize=S] -- RUN_FLAGS..."""
  import runpy

  split = argv.index("--")
  pattern, after, *options = argv[1:split]
  slow = 0.0
  for option in options:
    slow = float(option.removeprefix("--slow_finalize="))
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  sys.argv = ["experiments.run", *argv[split + 1 :]]
  with full_disk(pattern, int(after), slow):
    runpy.run_module("experiments.run", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main(sys.argv)
