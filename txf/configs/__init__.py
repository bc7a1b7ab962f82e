"""The config files that ship with txf: one ml_collections `get_config()` per
experiment (base.py holds the defaults every other starts from) and the sweep
configs in sweeps/.

In a checkout they are also `configs/` at the repository root
(`--config=configs/rope.py`); every command also takes a shipped config by
its bare name, from anywhere (`--config=rope`, `--config=sweeps/pe_ln`, as
`names()` lists them): a path (`./rope.py`, `configs/rope.py`, `rope.txt`) is
that file or nothing, never a shipped file it resembles. Their docstrings
show the installed command (`txf-run --config=rope`); in a checkout
`python -m experiments.run` takes the same flags.

  find("rope")               # .../txf/configs/rope.py
  find("rope.py")            # None: a name has no suffix
  resolve("my_config.py")    # a file that exists; else find(...)
  load(path, *args)          # its get_config(*args): the one way a config file is run
  set_field(config, "model.d_model", 64)   # a dotted field of a loaded config, type-checked
"""

from __future__ import annotations

import importlib.util
import inspect
import pathlib
import sys
from typing import Any

import ml_collections

DIRECTORY = pathlib.Path(__file__).resolve().parent


def resolve(path_or_name: str) -> pathlib.Path | None:
  """The config file `path_or_name` means: that file where it exists, else the
  config txf ships by that name (`find`); None if neither."""
  path = pathlib.Path(path_or_name)
  return path if path.is_file() else find(path_or_name)


def names() -> list[str]:
  """The names `find` takes for the configs txf ships ('rope', 'sweeps/pe_ln', ...)."""
  return sorted(
    path.relative_to(DIRECTORY).with_suffix("").as_posix()
    for path in DIRECTORY.rglob("*.py")
    if path.name != "__init__.py"
  )


def find(name: str) -> pathlib.Path | None:
  """The shipped config file `name` names, exactly as `names()` lists it
  ('rope', 'sweeps/pe_ln'), or None."""
  return DIRECTORY / f"{name}.py" if name in names() else None


class SettingError(Exception):
  """A `file.py:setting` whose get_config() takes no setting."""


def load(path: str | pathlib.Path, *args: str) -> Any:
  """`get_config(*args)` of the config file at `path`, run as a script is:
  its own directory first on the import path, so a config file can import
  the modules beside it (a position encoding, norm or task it registers:
  txf.register, docs/extending.md).

  Raises:
    FileNotFoundError, SyntaxError, SettingError, or whatever the file
    itself raises.
  """
  path = pathlib.Path(path).resolve()
  directory = str(path.parent)
  if directory not in sys.path:
    sys.path.insert(0, directory)
  spec = importlib.util.spec_from_file_location(f"txf_config_{path.stem}", path)
  if spec is None or spec.loader is None:
    raise FileNotFoundError(f"{path}: not a Python config file")
  module = importlib.util.module_from_spec(spec)
  # No __pycache__ beside the user's config and the modules it imports: a
  # config directory may be shared, mounted or a run's own, and it is read
  # once per process, so its bytecode would save nothing.
  writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
  try:
    spec.loader.exec_module(module)
  finally:
    sys.dont_write_bytecode = writes_bytecode
  takes = inspect.signature(module.get_config).parameters
  if args and not takes:
    raise SettingError(f"takes no setting, got ':{args[0]}' (get_config() has no parameter)")
  return module.get_config(*args)


def set_field(config: ml_collections.ConfigDict, path: str, value: Any) -> None:
  """Sets `config.<path>` (a dotted field of an ml_collections ConfigDict)
  through ConfigDict's own setter, which keeps each field's type.

  Raises:
    ValueError: naming the path, for a field that does not exist, a section,
      or a value of the wrong type.
  """
  holder = config
  parts = path.split(".")
  for depth, part in enumerate(parts):
    if not isinstance(holder, ml_collections.ConfigDict) or part not in holder:
      raise ValueError(f"{'.'.join(parts[: depth + 1])}: unknown field")
    if depth < len(parts) - 1:
      holder = holder[part]
  if isinstance(holder[parts[-1]], ml_collections.ConfigDict):
    raise ValueError(f"{path}: is a section, not a field")
  try:
    holder[parts[-1]] = value
  except TypeError as error:
    raise ValueError(f"{path}: {value!r} has the wrong type ({error})") from error
