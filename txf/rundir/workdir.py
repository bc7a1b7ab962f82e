"""A run's work directory: its path type, an exclusive lock, an early
writability check (its files are written and read by txf.storage).

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
disk, a lost mount) raises `WriteError` (txf.storage), naming the file and
the OS's reason in one line, so the run stops there instead of
training on without its outputs or hanging in a writer thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import importlib
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from typing import IO

from etils import epath

from txf.extras import install_hint
from txf.storage import is_local, os_reason, remove_stale_temporaries

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
# 'gs:/bucket/run': a URL whose '//' a pathlib.Path has collapsed.
_COLLAPSED_URL = re.compile(rf"^({'|'.join(SCHEMES)}):/(?!/)")

logger = logging.getLogger(__name__)


class WorkdirError(RuntimeError):
  """The work directory cannot be used: not writable, held by another run, or
  on a file system that is not installed."""


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
    raise WorkdirError(f"{directory}: cannot be reached ({os_reason(outcome[0])})") from outcome[0]


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


def _lock_file_at_fault(path: epath.Path, error: OSError) -> bool:
  """Whether opening the lock file `path` failed for the file itself (a
  read-only file, a directory there) in a writable directory."""
  return path.exists() and error.errno != errno.EROFS and os.access(path.parent, os.W_OK | os.X_OK)


def not_writable(directory: str | os.PathLike, error: BaseException) -> WorkdirError:
  """WorkdirError('<directory>: not a writable directory (<reason>)') for `error`."""
  return WorkdirError(f"{os.fspath(directory)}: not a writable directory ({os_reason(error)})")


def check_writable(directory: str | os.PathLike) -> None:
  """Creates `directory` if needed and proves a file can be written there;
  where it cannot, removes the directories it made (a full disk that let a
  directory be made but no file written in it).

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
  target = made = None
  try:
    is_file = directory.exists() and not directory.is_dir()
    if not is_file:
      if is_local(directory):
        # A link to a directory not made yet: its target is made (mkdir on
        # the link itself was 'File exists', reported as not writable).
        target = epath.Path(os.path.realpath(directory) if os.path.islink(directory) else directory)
        made = _outermost_missing(target)
        target.mkdir(parents=True, exist_ok=True)
      try:
        probe.write_text("ok")
      finally:  # also when the write failed (a full disk) after creating the file
        with contextlib.suppress(Exception):  # the write's error is the one to report
          probe.unlink(missing_ok=True)
  # Remote file systems raise their own types (gcsfs's HttpError, google.auth's).
  except FileNotFoundError as error:
    _remove_made(target, made)
    if is_local(directory):
      raise not_writable(directory, error) from error
    # gcsfs's text is the request's URL; a missing object's parent is the bucket.
    raise WorkdirError(f"{directory}: no such bucket") from error
  except Exception as error:
    _remove_made(target, made)
    raise not_writable(directory, error) from error
  if is_file:
    raise WorkdirError(f"{directory}: exists and is not a directory")


def _remove_made(directory: epath.Path | None, made: epath.Path | None) -> None:
  """Removes `directory` and its parents up to `made` (the outermost of them
  that a run made), as far as they are empty: where another process wrote
  meanwhile, kept."""
  if directory is None or made is None:
    return
  with contextlib.suppress(OSError):
    for path in (directory, *directory.parents):
      os.rmdir(path)
      if path == made:
        break


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
    # The lock file's note as `acquire` found it (None: no file), for `release(as_found=True)`.
    self._found: str | None = None

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
    existed = self.path.exists()
    try:
      handle = open(self.path, "a+", encoding="utf-8")
    except OSError as error:  # a read-only file system, no permission, no such directory
      if _lock_file_at_fault(self.path, error):
        raise WorkdirError(f"cannot lock {self.path}: {os_reason(error)}") from error
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
    if not _still_at(handle, self.path):
      # Its holder, a run refused while it set up, removed the directory it
      # had made (`holding`) between this open and the flock: this locks nothing.
      handle.close()
      raise WorkdirError(
        f"{self.path.parent}: in use by another run, which was just refused; try again"
      )
    try:
      handle.seek(0)
      self._found = handle.read() if existed else None
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
      raise WorkdirError(f"cannot lock {self.path}: {os_reason(error)}") from error
    self._file = handle
    # The directory's own files and its subdirectories' (txf-analyze's
    # analysis/): every temporary there is this holder's to remove.
    directory = self.path.parent
    subdirectories = (p for p in directory.iterdir() if p.is_dir() and not os.path.islink(p))
    for place in (directory, *subdirectories):  # a link leads out of the directory: not its own
      remove_stale_temporaries(place)

  def release(self, *, as_found: bool = False) -> None:
    """Releases the lock (the file stays: the lock is the flock, not the
    file); `as_found`: the lock file put back as `acquire` found it first (the
    previous holder's note, or no file), for a run that wrote nothing."""
    if self._file is not None:
      if as_found:
        with contextlib.suppress(OSError):  # the error that stopped the run is the one
          if self._found is None:
            self.path.unlink()
          else:
            self._file.seek(0)
            self._file.truncate()
            self._file.write(self._found)
            self._file.flush()
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> WorkdirLock:
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()


def _still_at(handle: IO[str], path: epath.Path) -> bool:
  """Whether the open file `handle` is still the file at `path`."""
  try:
    return os.path.samestat(os.fstat(handle.fileno()), os.stat(path))
  except FileNotFoundError:
    return False


@contextlib.contextmanager
def holding(
  directory: epath.Path, *, lock: bool = True, undone_by: tuple[type[BaseException], ...] = ()
) -> Iterator[None]:
  """Makes `directory` if needed (`check_writable`) and holds its lock
  (`lock` False: a process other than 0 of a run, which takes none) while a
  run uses it. A run takes it before it reads anything there (config.json,
  the checkpoints) or writes anything (a tokenizer): a second run started on
  the directory meanwhile is refused before it reads or writes, never
  checked against a directory the first is still filling. A run stopped by
  an error before it made any file there (refused while it set up: a config
  error, a signal) leaves the directory as it found it: the lock file as it
  was (`WorkdirLock.release(as_found=True)`), the directories it made gone.
  An error of a type in `undone_by` (one that can only stop the run before
  it trains: a signal while it sets up) also removes what it made there
  meanwhile (a tokenizer it trained: read by a later run as this
  directory's, whatever that run's corpus)."""
  undoes = lock and is_local(directory)  # an object store has neither lock file nor directories
  made = _outermost_missing(directory) if undoes else None
  check_writable(directory)
  with WorkdirLock(directory) if lock else contextlib.nullcontext() as held:
    found = _names(directory) if undoes else set()
    try:
      yield
    except BaseException as error:
      if held is not None and undoes and isinstance(error, undone_by):
        _remove(directory, _names(directory) - found)
      if held is not None and undoes and _names(directory) == found:
        held.release(as_found=True)
        _remove_made(directory, made)
      raise


def _remove(directory: epath.Path, names: set[str]) -> None:
  """Removes `names` (files or directories) from `directory`, as far as it
  can: the signal that stopped the run is what it reports."""
  for name in names:
    path = os.path.join(directory, name)
    with contextlib.suppress(OSError):
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
      else:
        os.unlink(path)


def _names(directory: epath.Path) -> set[str]:
  """The names in `directory` but its lock file's."""
  return {path.name for path in directory.iterdir()} - {LOCK_FILE}


def _outermost_missing(directory: epath.Path) -> epath.Path | None:
  """The outermost of `directory` and its parents that does not exist (None:
  `directory` exists)."""
  missing = None
  for path in (directory, *directory.parents):
    if path.exists():
      break
    missing = path
  return missing
