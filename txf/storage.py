"""Files written whole and read back naming the file: the file I/O every
package may use (a run's outputs, sweep tables, figures), on a local disk or
an object store (gs://) through one path type, `etils.epath`.

  write_file(path, data)          # atomic: the old contents or the new, never a mix
  write_files({path: data, ...})  # the set as a whole (local files)
  read_json(path)                 # None for no file; ValueError naming `path`

A failed write (a full or read-only disk, a lost mount) raises `WriteError`,
naming the file and the OS's reason in one line (`write_error`). A run's work
directory (its lock, reachability, writability) is txf.rundir.workdir's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import uuid
from collections.abc import Mapping
from typing import Any

from etils import epath

# write_files' temporary of a file NAME: .NAME.<host>-<pid>-<hex>.tmp, its
# writer named (the host as 8 hex digits of its name's hash) so that a
# temporary of a process that is gone can be told from one being written.
# Older txf wrote .NAME.<hex>.tmp.
_TEMPORARY_HEX = 12
_STALE = re.compile(rf"\..+\.(?:([0-9a-f]{{8}})-(\d+)-)?[0-9a-f]{{{_TEMPORARY_HEX}}}\.tmp")
_HOST = hashlib.sha256(socket.gethostname().encode("utf-8")).hexdigest()[:8]


class WriteError(RuntimeError):
  """A file (a run's output, a table, a figure) could not be written: the
  message is one line, '<path>: <reason>'. What was written before it is
  intact, so a rerun of a run (once the cause is gone) resumes from its last
  checkpoint."""


def os_reason(error: BaseException) -> str:
  """The OS's reason for `error` ('No space left on device'), else its text
  on one line."""
  return getattr(error, "strerror", None) or " ".join(str(error).split()) or repr(error)


def write_error(path: str | os.PathLike, error: BaseException) -> WriteError:
  """WriteError('<path>: <reason>') for `error` met writing `path`."""
  return WriteError(f"{os.fspath(path)}: {os_reason(error)}")


def is_local(path: str | os.PathLike) -> bool:
  """Whether `path` is on a local (POSIX) file system rather than a URL."""
  return "://" not in os.fspath(path)


def is_replaceable(path: str | os.PathLike) -> bool:
  """Whether an atomic write may rename a new file over the local `path`: it
  does not exist, or is a regular file. A device, a pipe or a socket is not
  (renaming over /dev/full made the device a JSON file)."""
  try:
    return stat.S_ISREG(os.stat(path).st_mode)
  except FileNotFoundError:
    return True


def _kind(path: str | os.PathLike) -> str:
  mode = os.stat(path).st_mode
  for test, name in (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISSOCK, "a socket"),
  ):
    if test(mode):
      return name
  return "a device"


def holds_current_directory(path: str | os.PathLike) -> bool:
  """Whether the local `path` (absolute, normal) is the current directory or
  one above it: a directory replaced whole there (a staged copy renamed
  over it) would leave the shell in one that is gone."""
  here = os.getcwd()
  path = os.fspath(path)
  return here == path or here.startswith(path.rstrip(os.sep) + os.sep)


def temporary_sibling(path: epath.Path) -> epath.Path:
  """A new temporary for `path` in its directory (a file, or the directory
  txf-export stages a model in): .NAME.<host>-<pid>-<hex>.tmp. A name per
  writer: two processes replacing one file never share a temporary."""
  writer = f"{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:_TEMPORARY_HEX]}"
  return path.with_name(f".{path.name}.{writer}.tmp")


def remove_stale_temporaries(directory: epath.Path, *, held: bool = True) -> None:
  """Removes the temporaries (`temporary_sibling`) left directly in the
  local `directory` by a process killed between writing one and renaming
  it. For the holder of the directory's lock (txf.rundir.workdir.WorkdirLock,
  `held`), which the directory's writers share: all but those of a live
  process of this host (a txf-export into a run's subdirectory takes no
  lock); `held` False (a sweep's directory, txf-export's --out parent,
  which no lock guards): only those of processes of this host that are gone."""
  for path in directory.glob(".*.tmp"):
    name = _STALE.fullmatch(path.name)
    if name is None or os.path.islink(path):
      continue
    host, pid = name.groups()
    alive = _running(pid) if host == _HOST else None  # None: not known here
    if alive or (not held and alive is None):
      continue
    with contextlib.suppress(OSError):  # gone already, or kept: it only takes room
      if path.is_dir():
        shutil.rmtree(path)
      else:
        path.unlink()


def _running(pid: str | None) -> bool | None:
  """Whether process `pid` of this host runs (None: a temporary of older
  txf names no writer)."""
  if pid is None:
    return None
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except OSError:  # another user's process: running
    return True
  return True


def free_path(path: epath.Path) -> epath.Path:
  """`path`, or `path-2`, `path-3`, ... whichever does not exist yet (where
  something is moved aside, never over what an earlier move left)."""
  candidate, n = path, 1
  while candidate.exists():
    n += 1
    candidate = path.parent / f"{path.name}-{n}"
  return candidate


def write_files(files: Mapping[Any, str | bytes]) -> list[epath.Path]:
  """Replaces each file of `files` (a local path or URL -> its contents; a
  str is written as UTF-8) atomically and the set as a whole, creating local parent
  directories; returns the paths. The one writer of every file txf writes
  (run outputs, tables, figures: `txf.analysis.plots.save_figure`).

  Local files: every contents goes to a temporary beside its file first
  (.NAME.<hex>.tmp), and only once all are down are they renamed
  over the files, so a failed write (a full disk) leaves every file as it
  was and no temporary behind, and readers never see a mix of old and new.
  Each temporary reaches the disk (fsync) before its rename, and each
  directory's renames before the call returns, so that a machine that
  crashes or loses power leaves the old contents or the new: without, a
  file system may keep the rename and lose the data (an empty config.json).
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
      if not is_replaceable(path):
        raise OSError(f"not a regular file ({_kind(path)}), which a write would replace")
      staged.append((temporary_sibling(path), path))
      with open(staged[-1][0], "wb") as temporary_file:
        temporary_file.write(data)
        temporary_file.flush()
        os.fsync(temporary_file.fileno())
    for temporary, path in staged:
      temporary.replace(path)
    for directory in dict.fromkeys(path.parent for _, path in staged):
      _sync_directory(directory)
  except BaseException as error:  # also KeyboardInterrupt: no temporary stays
    for temporary, _ in staged:
      temporary.unlink(missing_ok=True)
    # Remote file systems raise their own types (gcsfs's HttpError, ...).
    if isinstance(error, Exception):
      raise write_error(path, error) from error
    raise
  return paths


def _sync_directory(directory: epath.Path) -> None:
  """Makes the renames in a local `directory` reach the disk (fsync of the
  directory), where its file system can: some (several network file
  systems) refuse to sync a directory, and a rename there stands as the
  file system keeps it."""
  try:
    descriptor = os.open(directory, os.O_RDONLY)
  except OSError:  # a directory that cannot be opened for reading (no r permission)
    return
  try:
    os.fsync(descriptor)
  except OSError:  # EINVAL: this file system does not sync directories
    pass
  finally:
    os.close(descriptor)


def write_file(path: str | os.PathLike, data: str | bytes) -> epath.Path:
  """Replaces one file atomically (`write_files`); returns its path.

  Raises:
    WriteError: naming `path` and the reason; `path` is as it was.
  """
  return write_files({epath.Path(path): data})[0]


def read_text(path: epath.Path) -> str | None:
  """The text (UTF-8) of `path`; None if there is no such file.

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
    raise ValueError(f"{path}: cannot be read ({os_reason(error)})") from None


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
