"""A run's work directory: its path type, an exclusive lock, an early
writability check, the error every writer of a run raises, and the readers
of its text and JSON files that name a file they cannot read.

Everything a run reads and writes goes through one path type, `etils.epath`
(the one orbax uses), so a work directory may be local or a URL such as
`gs://bucket/run`. `run_path` turns a string into that path and refuses, before
any compute, a URL whose file system is not installed (`gs://` needs the
`gcs` extra: txf.extras.install_hint("gcs")) and a URL that lost a slash on the way
(`gs:/bucket/run`, which would otherwise become a local directory `gs:`).
`check_reachable` then looks at such a URL once within `REACH_TIMEOUT_S`
seconds: a bucket that cannot be reached (no network, no credentials) stops
a command in one line instead of after a minute of retries.

Two runs on one work directory would interleave their metrics and race on
checkpoint steps, so a run holds `workdir/.lock` for its whole life. On a
local disk the lock is an OS-level `fcntl.flock`: it dies with the process
that holds it (also on SIGKILL), so a killed run never leaves a stale lock
behind. Object stores (gs://) have no such lock, and a lock object would
outlive a preempted (killed) holder and block every rerun: there the lock is
not enforced (one warning says so) and keeping to one run per work directory
is up to the user. Only process 0 of a multi-process run takes it: the other
processes write nothing exclusive (checkpoints are coordinated by orbax
across processes).

A run's outputs (metrics, TensorBoard events, samples, config.json) are
written in the training thread, and a failed write (a full or read-only
disk, a lost mount) raises `WriteError`, naming the file and the OS's
reason in one line (`write_error`), so the run stops there instead of
training on without its outputs or hanging in a writer thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib
import json
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from typing import IO, Any

from etils import epath

from txf.extras import install_hint

LOCK_FILE = ".lock"
# How long the first look at a URL work directory may take (check_reachable).
REACH_TIMEOUT_S = 30.0
# URL scheme -> (modules its file system needs, how to install them).
SCHEMES = {
  "gs": (("gcsfs", "google.cloud.storage"), install_hint("gcs")),
  "s3": (("s3fs",), "pip install s3fs"),
  "az": (("adlfs",), "pip install adlfs"),
  "hf": (("huggingface_hub",), "pip install huggingface_hub"),
}
# write_files' temporary of a file NAME: .NAME.<hex>.tmp
_TEMPORARY_HEX = 12
_STALE = re.compile(rf"\..+\.[0-9a-f]{{{_TEMPORARY_HEX}}}\.tmp")
# 'gs:/bucket/run': a URL whose '//' a pathlib.Path has collapsed.
_COLLAPSED_URL = re.compile(rf"^({'|'.join(SCHEMES)}):/(?!/)")

logger = logging.getLogger(__name__)


class WorkdirError(RuntimeError):
  """The work directory cannot be used: not writable, held by another run, or
  on a file system that is not installed."""


class WriteError(RuntimeError):
  """An output of a run (a file of its work directory) could not be written:
  the message is one line, '<path>: <reason>'. What was written before it is
  intact, so a rerun (once the cause is gone) resumes from the last checkpoint."""


def _reason(error: BaseException) -> str:
  """The OS's reason for `error` ('No space left on device'), else its text
  on one line."""
  return getattr(error, "strerror", None) or " ".join(str(error).split()) or repr(error)


def write_error(path: str | os.PathLike, error: BaseException) -> WriteError:
  """WriteError('<path>: <reason>') for `error` met writing `path`."""
  return WriteError(f"{os.fspath(path)}: {_reason(error)}")


def is_local(path: str | os.PathLike) -> bool:
  """Whether `path` is on a local (POSIX) file system rather than a URL."""
  return "://" not in os.fspath(path)


def run_path(path: str | os.PathLike, name: str = "workdir") -> epath.Path:
  """`path` as the path type every run file goes through (local or a URL).

  Args:
    path: a local path or a URL (gs://bucket/run).
    name: the argument or field `path` came from, for the message.

  Raises:
    WorkdirError: a URL scheme epath does not know, one whose file system is
      not installed (naming what installs it), or a URL missing a slash --
      before anything is read or written.
  """
  text = os.fspath(path)
  scheme, separator, _ = text.partition("://")
  if not separator:
    if _COLLAPSED_URL.match(text):
      raise WorkdirError(
        f"{name}: {text} is a URL that lost a slash; write it as {text.replace(':/', '://', 1)}"
      )
    return epath.Path(text)
  if scheme not in SCHEMES:
    raise WorkdirError(
      f"{name}: {text}: unsupported URL scheme {scheme}:// "
      f"(supported: a local path, {', '.join(s + '://' for s in SCHEMES)})"
    )
  modules, install = SCHEMES[scheme]
  for module in modules:
    try:
      importlib.import_module(module)
    except ImportError:
      raise WorkdirError(
        f"{name}: {text} needs {module} for {scheme}:// paths: {install}"
      ) from None
  return epath.Path(text)


def check_reachable(directory: epath.Path) -> None:
  """Looks at a URL `directory` once, in a thread that must answer within
  `REACH_TIMEOUT_S` seconds, before anything else reads or writes it. A
  client such as gcsfs retries a failed request with growing waits (about
  half a minute a request for a host that does not resolve) and logs a
  traceback for each: here its logs are held back and the outcome is one
  line. A local path is not looked at.

  Raises:
    WorkdirError: the look failed (no network, no credentials: the
      client's reason) or gave no answer in time (with the last thing the
      client logged, e.g. the error it retries).
  """
  if is_local(directory):
    return
  outcome: list[BaseException | None] = []

  def look() -> None:
    try:
      directory.exists()  # a missing directory (or bucket) is an answer
      outcome.append(None)
    except Exception as error:
      outcome.append(error)

  logs = _HeldLogs(SCHEMES[os.fspath(directory).partition("://")[0]][0])
  with logs:
    thread = threading.Thread(target=look, name=f"look at {directory}", daemon=True)
    thread.start()
    thread.join(REACH_TIMEOUT_S)
  if not outcome:  # the thread goes on in the background; the process may exit
    last = f"; last logged: {logs.last}" if logs.last else ""
    raise WorkdirError(f"{directory}: no answer within {REACH_TIMEOUT_S:g} s{last}")
  if outcome[0] is not None:
    raise WorkdirError(f"{directory}: cannot be reached ({_reason(outcome[0])})") from outcome[0]


class _HeldLogs(logging.Handler):
  """Within it, what the loggers `names` (and their children) log is kept
  from the process's handlers; `last` is the last message."""

  def __init__(self, names: tuple[str, ...]):
    super().__init__(logging.DEBUG)
    self.last: str | None = None
    self._loggers = [logging.getLogger(name) for name in names]
    self._saved: list[tuple[int, bool]] = []

  def emit(self, record: logging.LogRecord) -> None:
    self.last = " ".join(record.getMessage().split())

  def __enter__(self) -> _HeldLogs:
    for logger_ in self._loggers:
      self._saved.append((logger_.level, logger_.propagate))
      logger_.setLevel(logging.DEBUG)
      logger_.propagate = False
      logger_.addHandler(self)
    return self

  def __exit__(self, *exc_info) -> None:
    for logger_, (level, propagate) in zip(self._loggers, self._saved):
      logger_.removeHandler(self)
      logger_.setLevel(level)
      logger_.propagate = propagate


def _temporary(path: epath.Path) -> epath.Path:
  """A new temporary for `path` in its directory: .NAME.<hex>.tmp. A name per
  writer: two processes replacing one file never share a temporary."""
  return path.with_name(f".{path.name}.{uuid.uuid4().hex[:_TEMPORARY_HEX]}.tmp")


def replace_bytes(path: epath.Path, data: bytes) -> None:
  """Replaces `path`'s contents atomically: `write_file`."""
  write_file(path, data)


def remove_stale_temporaries(directory: epath.Path) -> None:
  """Removes the temporaries of `write_files` left directly in the local
  `directory` by a process killed between writing one and renaming it.
  Only for the holder of the directory's lock (`WorkdirLock`), which no
  other writer of the run shares: every temporary there is stale."""
  for path in directory.glob(".*.tmp"):
    if _STALE.fullmatch(path.name):
      with contextlib.suppress(OSError):  # gone already, or kept: it only takes room
        path.unlink()


def write_files(files: Mapping[Any, str | bytes]) -> list[epath.Path]:
  """Replaces each file of `files` (a local path or URL -> its contents; a
  str is written as UTF-8) atomically and the set as a whole, creating local parent
  directories; returns the paths. The one writer of every file txf writes
  (run outputs, tables, figures: `txf.analysis.plots.save_figure`).

  Local files: every contents goes to a temporary beside its file first
  (.NAME.<hex>.tmp), and only once all are down are they renamed
  over the files, so a failed write (a full disk) leaves every file as it
  was and no temporary behind, and readers never see a mix of old and new.
  Objects (gs://) are uploaded one by one, each atomic.

  Raises:
    WriteError: '<path>: <reason>' for the first file that failed.
  """
  staged: list[tuple[epath.Path, epath.Path]] = []  # (temporary, file)
  paths = [epath.Path(path) for path in files]
  if not paths:
    return paths
  path = paths[0]
  try:
    for path, data in zip(paths, files.values()):
      data = data.encode("utf-8") if isinstance(data, str) else data
      if not is_local(path):  # an object upload is atomic; a rename there is a copy
        path.write_bytes(data)
        continue
      path.parent.mkdir(parents=True, exist_ok=True)
      staged.append((_temporary(path), path))
      staged[-1][0].write_bytes(data)
    for temporary, path in staged:
      temporary.replace(path)
  except BaseException as error:  # also KeyboardInterrupt: no temporary stays
    for temporary, _ in staged:
      temporary.unlink(missing_ok=True)
    # Remote file systems raise their own types (gcsfs's HttpError, ...).
    if isinstance(error, Exception):
      raise write_error(path, error) from error
    raise
  return paths


def write_file(path: str | os.PathLike, data: str | bytes) -> epath.Path:
  """Replaces one file atomically (`write_files`); returns its path.

  Raises:
    WriteError: naming `path` and the reason; `path` is as it was.
  """
  return write_files({epath.Path(path): data})[0]


def replace_text(path: epath.Path, text: str) -> None:
  """Replaces `path`'s text (UTF-8) atomically: `write_file`."""
  write_file(path, text)


def read_text(path: epath.Path) -> str | None:
  """The text (UTF-8) of `path`, a file of a work directory; None if there is none.

  Raises:
    ValueError: one line naming `path`, when it is not UTF-8 text or cannot
      be read (a directory, no permission).
  """
  try:
    if not path.exists():
      return None
    return path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as error:
    raise ValueError(f"{path}: not UTF-8 text (byte {error.start})") from None
  except OSError as error:
    raise ValueError(f"{path}: cannot be read ({_reason(error)})") from None


def read_json(path: epath.Path) -> Any:
  """The JSON value in `path` (`read_text`); None if there is no such file.

  Raises:
    ValueError: one line naming `path`, when it is not UTF-8 JSON or cannot be read.
  """
  text = read_text(path)
  return None if text is None else parse_json(text, path)


def parse_json(text: str, path: epath.Path) -> Any:
  """The JSON value `text` (read from `path`) holds.

  Raises:
    ValueError: one line naming `path`, when `text` is not JSON.
  """
  try:
    return json.loads(text)
  except json.JSONDecodeError as error:
    raise ValueError(f"{path}: not valid JSON ({error})") from None


def not_writable(directory: str | os.PathLike, error: BaseException) -> WorkdirError:
  """WorkdirError('<directory>: not a writable directory (<reason>)') for `error`."""
  return WorkdirError(f"{os.fspath(directory)}: not a writable directory ({_reason(error)})")


def check_writable(directory: str | os.PathLike) -> None:
  """Creates `directory` if needed and proves a file can be written there.

  On an object store nothing is created (it has no directories; a missing
  bucket is reported, never created).

  Raises:
    WorkdirError: naming the directory and the reason (read-only file
      system, a file where a directory should be, no permission, disk full,
      no such bucket, no credentials).
  """
  directory = run_path(directory)
  # Every process probes under its own name: hosts may share the directory.
  probe = directory / f".write-probe-{socket.gethostname()}-{os.getpid()}"
  try:
    is_file = directory.exists() and not directory.is_dir()
    if not is_file:
      if is_local(directory):
        directory.mkdir(parents=True, exist_ok=True)
      try:
        probe.write_text("ok")
      finally:  # also when the write failed (a full disk) after creating the file
        with contextlib.suppress(Exception):  # the write's error is the one to report
          probe.unlink(missing_ok=True)
  # Remote file systems raise their own types (gcsfs's HttpError, google.auth's).
  except Exception as error:
    raise not_writable(directory, error) from error
  if is_file:
    raise WorkdirError(f"{directory}: exists and is not a directory")


class WorkdirLock:
  """Exclusive lock on a work directory for the life of a run.

  Use as a context manager. `acquire` fails at once (never waits) when
  another live process holds the lock, naming its host and pid, and when the
  directory cannot be written (WorkdirError, as `check_writable`). Holding
  it, it removes the temporaries a killed holder left behind
  (`remove_stale_temporaries`). On an object store it only warns that
  nothing is enforced (module docstring).
  """

  def __init__(self, directory: str | os.PathLike):
    self.path = run_path(directory) / LOCK_FILE
    self._file: IO[str] | None = None

  def acquire(self) -> None:
    """Takes the lock and records this process as its holder.

    Raises:
      WorkdirError: another process holds it (its host, pid and start time
        are in the message), or the directory is not a writable one.
    """
    if not is_local(self.path):
      logger.warning(
        "%s: the work directory lock is not enforced on object storage; "
        "make sure no other run uses this work directory",
        self.path.parent,
      )
      return
    # flock needs an OS file descriptor: a local file, opened by the OS.
    try:
      handle = open(self.path, "a+", encoding="utf-8")
    except OSError as error:  # a read-only file system, no permission, no such directory
      raise not_writable(self.path.parent, error) from error
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or "an unknown process"
      handle.close()
      raise WorkdirError(
        f"{self.path.parent}: in use by another run "
        f"({holder}); wait for it to finish or use another --workdir"
      ) from None
    except OSError as error:  # e.g. a file system without flock
      handle.close()
      raise WorkdirError(f"cannot lock {self.path}: {error.strerror or error}") from error
    try:
      handle.seek(0)
      handle.truncate()
      handle.write(
        json.dumps(
          {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
          }
        )
        + "\n"
      )
      handle.flush()
    except OSError as error:  # e.g. a full disk: the lock is held, its note is not written
      with contextlib.suppress(OSError):  # closing flushes (and fails) again
        handle.close()
      raise WorkdirError(f"cannot lock {self.path}: {_reason(error)}") from error
    self._file = handle
    remove_stale_temporaries(self.path.parent)

  def release(self) -> None:
    """Releases the lock (the file stays: the lock is the flock, not the file)."""
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> WorkdirLock:
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()
