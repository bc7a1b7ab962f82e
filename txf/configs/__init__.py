"""The config files that ship with txf: one ml_collections `get_config()` per
experiment (base.py holds the defaults every other starts from) and the sweep
configs in sweeps/.

In a checkout they are also `configs/` at the repository root
(`--config=configs/rope.py`); every command also takes a shipped config by
name, from anywhere (`--config=rope`, `--config=sweeps/pe_ln`):

  find("rope")               # .../txf/configs/rope.py
  find("configs/rope.py")    # the same
  resolve("my_config.py")    # a file that exists; else find(...)
"""

from __future__ import annotations

import pathlib

DIRECTORY = pathlib.Path(__file__).resolve().parent


def resolve(path_or_name: str) -> pathlib.Path | None:
  """The config file `path_or_name` means: that file where it exists, else the
  config txf ships by that name (`find`); None if neither."""
  path = pathlib.Path(path_or_name)
  return path if path.is_file() else find(path_or_name)


def names() -> list[str]:
  """The names `find` takes for the configs txf ships ('rope', 'sweeps/pe_ln', ...)."""
  return sorted(
    str(path.relative_to(DIRECTORY).with_suffix(""))
    for path in DIRECTORY.rglob("*.py")
    if path.name != "__init__.py"
  )


def find(name: str) -> pathlib.Path | None:
  """The shipped config file `name` names ('rope', 'rope.py', 'sweeps/pe_ln',
  'configs/rope.py'), or None if txf ships none by that name."""
  relative = pathlib.PurePosixPath(name)
  if relative.parts[:1] == ("configs",):
    relative = pathlib.PurePosixPath(*relative.parts[1:])
  if relative.is_absolute() or ".." in relative.parts or not relative.parts:
    return None
  path = DIRECTORY / relative.with_suffix(".py")
  return path if path.is_file() and path.name != "__init__.py" else None
