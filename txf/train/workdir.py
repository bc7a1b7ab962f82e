"""A run's work directory: an exclusive lock and an early writability check.

Two runs on one work directory would interleave their metrics and race on
checkpoint steps, so a run holds `workdir/.lock` for its whole life. The lock
is an OS-level `fcntl.flock`: it dies with the process that holds it (also on
SIGKILL), so a killed run never leaves a stale lock behind. Only process 0 of
a multi-process run takes it: the other processes write nothing exclusive
(checkpoints are coordinated by orbax across processes).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time

LOCK_FILE = ".lock"


class WorkdirError(RuntimeError):
  """The work directory cannot be used: not writable, or held by another run."""


def check_writable(directory: str | os.PathLike) -> None:
  """Creates `directory` if needed and proves a file can be written there.

  Raises:
    WorkdirError: naming the directory and the OS's reason (read-only file
      system, a file where a directory should be, no permission, disk full).
  """
  directory = os.fspath(directory)
  if os.path.exists(directory) and not os.path.isdir(directory):
    raise WorkdirError(f"{directory}: exists and is not a directory")
  # Every process probes under its own name: hosts may share the directory.
  probe = os.path.join(directory, f".write-probe-{socket.gethostname()}-{os.getpid()}")
  try:
    os.makedirs(directory, exist_ok=True)
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as error:
    raise WorkdirError(f"{directory}: not a writable directory "
                       f"({error.strerror or error})") from error


class WorkdirLock:
  """Exclusive lock on a work directory for the life of a run.

  Use as a context manager. `acquire` fails at once (never waits) when
  another live process holds the lock, naming its host and pid.
  """

  def __init__(self, directory: str | os.PathLike):
    self.path = os.path.join(os.fspath(directory), LOCK_FILE)
    self._file = None

  def acquire(self) -> None:
    """Takes the lock and records this process as its holder.

    Raises:
      WorkdirError: another process holds it (its host, pid and start time
        are in the message).
    """
    handle = open(self.path, "a+", encoding="utf-8")
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or "an unknown process"
      handle.close()
      raise WorkdirError(f"{os.path.dirname(self.path)}: in use by another run "
                         f"({holder}); wait for it to finish or use another --workdir") from None
    except OSError as error:  # e.g. a file system without flock
      handle.close()
      raise WorkdirError(f"cannot lock {self.path}: {error.strerror or error}") from error
    handle.seek(0)
    handle.truncate()
    handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                             "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    handle.flush()
    self._file = handle

  def release(self) -> None:
    """Releases the lock (the file stays: the lock is the flock, not the file)."""
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None

  def __enter__(self) -> "WorkdirLock":
    self.acquire()
    return self

  def __exit__(self, *exc_info) -> None:
    self.release()
