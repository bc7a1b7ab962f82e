"""A simulated full disk for tests of file writers, without root: the Nth
file opened for writing (through etils.epath, which every txf writer uses)
in a directory (not below it) gets the first half of what is written to it, then
OSError(ENOSPC), as a write to a full file system does.

  monkeypatch.setattr(*disk_full_at(2, tmp_path))   # the 2nd write fails
  install(2, tmp_path)                               # the same, for good (a subprocess)
"""

import errno
import os

from etils import epath

_PATH_TYPE = type(epath.Path("/"))


class _CutWrites:
  """A file object whose first write stores half its data and raises ENOSPC."""

  def __init__(self, file):
    self._file = file

  def write(self, data):
    self._file.write(data[:len(data) // 2])
    self._file.flush()
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    self._file.close()

  def __getattr__(self, name):
    return getattr(self._file, name)


def disk_full_at(n: int, under) -> tuple:
  """(class, "open", replacement) for monkeypatch.setattr: the `n`th file
  opened for writing in directory `under` (1-based) fails as on a full disk."""
  original, under, opened = _PATH_TYPE.open, os.fspath(under), [0]

  def open_(self, mode="r", **kwargs):
    file = original(self, mode, **kwargs)
    if any(m in mode for m in "wax") and os.fspath(self.parent) == under:
      opened[0] += 1
      if opened[0] == n:
        return _CutWrites(file)
    return file

  return _PATH_TYPE, "open", open_


def install(n: int, under) -> None:
  """`disk_full_at(n, under)` for the rest of the process."""
  cls, name, replacement = disk_full_at(n, under)
  setattr(cls, name, replacement)
