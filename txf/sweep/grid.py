"""Sweep grids: expand a sweep config into points, check them, pick one to run.

A sweep config is an `ml_collections.ConfigDict` with
  base   a full run config (e.g. configs/base.py's `get_config()`)
  grid   an ordered mapping of dotted field path -> list of values, e.g.
         {"model.position": ["rope", "alibi"], "model.norm_placement": ["pre", "post"]}
  sweep  sweep settings, e.g. `seeds` (replicas per point); not read here

A ConfigDict sorts its keys and rejects dots in them, so build the grid with
`make_grid`, which keeps the order and the dotted paths. Such a ConfigDict
cannot be `copy.deepcopy`-ed (an ml_collections limitation); `expand` copies
only `base`.

Grid values are scalars (str, int, float, bool, None): what a command line
can set. The points are the Cartesian product in grid order, the first field
varying slowest.

The command line narrows or replaces a grid with `override_grid`
(`txf-sweep --grid=model.position=rope,alibi`): a field's values replace
its list, a field not in the grid becomes one more axis, and no values
(`--grid=model.norm_placement=`) take the field out of the grid (the base's
value then holds). A narrowed sweep's points keep their names, so they are
the full sweep's, in the same directories (a field taken out leaves them).

Fields that go together (a learning rate and its warmup) are zipped rather
than multiplied: `make_grid({...}, zip={"train.learning_rate": [1e-3, 3e-3],
"train.warmup_steps": [0, 60]})` gives 2 settings, (1e-3, 0) and (3e-3, 60),
not 4; they are one axis of the product, after the multiplied fields. The grid
holds a zipped group as one entry, its paths joined by ZIP_SEPARATOR
("train.learning_rate,train.warmup_steps") and its values as rows (one tuple
per setting): `zip_fields` builds it, and a grid written by hand may use it.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import os
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import ml_collections

from txf.configs import set_field

SLURM_TASK_ENV = "SLURM_ARRAY_TASK_ID"
# Longest file name most filesystems (ext4, GCS objects' path parts) accept.
_MAX_NAME_BYTES = 255
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._+-]")
_SCALAR_TYPES = (str, int, float, bool, type(None))
# Joins the paths of a zipped grid entry (see `zip_fields`).
ZIP_SEPARATOR = ","
T = TypeVar("T")


class GridError(ValueError):
  """A sweep grid or one of its points is invalid; raised before any training."""


class PointIndexError(GridError):
  """The point asked for (--index, $SLURM_ARRAY_TASK_ID) is not one of the grid's."""


@dataclasses.dataclass(frozen=True)
class Point:
  """One point of a sweep grid.

  Attributes:
    index: position in the Cartesian product (0-based; what `--index` selects).
    name: the point's sub-workdir name (see `point_name`).
    overrides: dotted field path -> value, in grid order.
    config: a copy of the sweep's base config with the overrides applied.
  """

  index: int
  name: str
  overrides: Mapping[str, Any]
  config: ml_collections.ConfigDict


def zip_fields(fields: Mapping[str, Sequence[Any]]) -> dict[str, list[tuple[Any, ...]]]:
  """The grid entry of fields zipped together: {"a.x,b.y": [(x0, y0), (x1, y1), ...]}.

  Raises:
    GridError: fewer than two fields, a field that is not a non-empty list, or
      lists of unequal length (naming the fields and their lengths).
  """
  if len(fields) < 2:
    raise GridError(f"zip: needs two or more fields, got {', '.join(fields) or 'none'}")
  for path, values in fields.items():
    if ZIP_SEPARATOR in path:
      raise GridError(f"zip: {path!r}: a field path has no {ZIP_SEPARATOR!r}")
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
      raise GridError(f"zip: {path}: must be a non-empty list of values, got {values!r}")
  lengths = {path: len(values) for path, values in fields.items()}
  if len(set(lengths.values())) > 1:
    listed = ", ".join(f"{path} has {length}" for path, length in lengths.items())
    raise GridError(f"zip: the lists must have one length, but {listed} values")
  return {ZIP_SEPARATOR.join(fields): list(zip(*fields.values()))}


def make_grid(
  fields: Mapping[str, Sequence[Any]], zip: Mapping[str, Sequence[Any]] | None = None
) -> ml_collections.ConfigDict:
  """A ConfigDict grid that keeps `fields`' order and dotted paths; `zip`:
  fields whose lists are walked together (their i-th values make one
  setting), one more axis of the product, after `fields` (see `zip_fields`).

  Raises:
    GridError: as `zip_fields`, or a field both in `fields` and in `zip`.
  """
  entries = dict(fields)
  if zip is not None:
    both = sorted(set(entries) & set(zip))
    if both:
      raise GridError(f"zip: {both[0]}: also a multiplied field of the grid")
    entries.update(zip_fields(zip))
  return ml_collections.ConfigDict(entries, sort_keys=False, allow_dotted_keys=True)


def _format_name_value(value: Any) -> str:
  text = str(value).lower() if isinstance(value, bool) else str(value)
  return _UNSAFE_NAME_CHARS.sub("_", text)


def _name_keys(paths: Sequence[str]) -> list[str]:
  """Each path's last part, or the whole path where last parts collide."""
  last = [path.rsplit(".", 1)[-1] for path in paths]
  return [key if last.count(key) == 1 else path for key, path in zip(last, paths)]


def point_name(overrides: Mapping[str, Any]) -> str:
  """The sub-workdir name of a point: `key=value` pairs joined by ',' in grid
  order, e.g. 'position=rope,norm_placement=pre'.

  The key is the field's last path part ('model.position' -> 'position'), or
  the whole dotted path when two grid fields share a last part. Booleans are
  written 'true'/'false'; any character of a key or value outside
  [A-Za-z0-9._+-] becomes '_', so the name is safe on every filesystem.
  `expand` rejects a grid whose names would collide.
  """
  keys = _name_keys(list(overrides))
  return ",".join(
    f"{_UNSAFE_NAME_CHARS.sub('_', key)}={_format_name_value(value)}"
    for key, value in zip(keys, overrides.values())
  )


def _read_grid(
  sweep_config: ml_collections.ConfigDict,
) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
  """The grid's axes: (paths, rows), one path and 1-tuples for a multiplied
  field, the group's paths and its rows for a zipped one."""
  for section in ("base", "grid"):
    if section not in sweep_config:
      raise GridError(f"sweep config: {section}: missing section")
  grid = sweep_config.grid
  if not hasattr(grid, "items"):  # a Mapping or a ConfigDict (which is not a Mapping)
    raise GridError(f"grid: must map field paths to lists of values, got {type(grid).__name__}")
  if not len(grid):
    raise GridError("grid: empty (name at least one field to sweep)")
  axes, seen = [], set()
  for key, values in grid.items():
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
      raise GridError(f"grid.{key}: must be a non-empty list of values, got {values!r}")
    paths = key.split(ZIP_SEPARATOR)
    for path in paths:
      if path in seen:
        raise GridError(f"grid.{key}: {path} appears twice in the grid")
      seen.add(path)
    if len(paths) == 1:
      rows = [(value,) for value in values]
    else:  # zipped: one row of values per setting
      rows = []
      for row in values:
        if isinstance(row, str) or not isinstance(row, Sequence) or len(row) != len(paths):
          raise GridError(f"grid.{key}: {row!r} is not a row of {len(paths)} values (zip_fields)")
        rows.append(tuple(row))
    for row in rows:
      for path, value in zip(paths, row):
        if not isinstance(value, _SCALAR_TYPES):
          raise GridError(f"grid.{path}: {value!r} is not a str, int, float, bool or None")
    axes.append((paths, rows))
  return axes


GRID_FLAG = "--grid"
_NONE_TEXTS = ("none", "null")


def _parse_grid_value(text: str, path: str, field_type: type, flag: str) -> Any:
  """A --grid value as the base config declares its field: a string as it
  is, 'true'/'false' for a bool, a number for an int or float field, and
  None for 'None' (as txf-run reads --config.FIELD=None, a string field's
  too) or, where the field is not a string, 'none' or 'null'."""
  if field_type is str:
    return None if text == "None" else text
  if text.lower() in _NONE_TEXTS:
    return None
  try:
    if field_type is bool:
      if text.lower() not in ("true", "false"):
        raise ValueError
      return text.lower() == "true"
    if field_type is int:
      return int(text)
    if field_type is float:
      return float(text)
  except ValueError:
    pass
  kind = {int: "an integer", float: "a number", bool: "true or false"}.get(field_type, "valid")
  raise GridError(f"{flag}: {path}: {text!r} is not {kind}")


def _as_listed(value: Any, listed: Sequence[Any]) -> Any:
  """`value` as the grid lists an equal one (10000 where --grid read a float
  field's '10000' as 10000.0): a narrowed point keeps the full sweep's name."""
  return next(
    (old for old in listed if old == value and isinstance(old, bool) == isinstance(value, bool)),
    value,
  )


def override_grid(
  sweep_config: ml_collections.ConfigDict, specs: Sequence[str]
) -> ml_collections.ConfigDict:
  """The sweep's grid with the command line's `--grid=PATH=V1,V2,...` flags
  (`specs`: 'PATH=V1,V2,...' each) applied; returns it without changing
  `sweep_config`.

  PATH is a field of the base run config. Its values (comma-separated, read
  as the field's type: see `_parse_grid_value`) replace the grid's list for
  it, in its place in the grid; a field the grid does not sweep is added as
  a multiplied axis after the others; an empty list ('PATH=') takes the
  field out of the grid. A field zipped with others (`zip_fields`) is given
  with every field of its group, lists of one length, which are zipped
  again (an empty list for each takes the group out).

  Raises:
    GridError: one line naming the flag: no '=', an unknown field or a value
      not of its type, a field given twice, part of a zipped group, or a
      grid left empty.
  """
  axes = [(paths, rows) for paths, rows in _read_grid(sweep_config)]
  types = {path: field_type for path, (_, field_type) in _leaves(sweep_config.base).items()}
  listed = {path: [row[i] for row in rows] for paths, rows in axes for i, path in enumerate(paths)}
  given: dict[str, list[Any]] = {}
  for spec in specs:
    flag = f"{GRID_FLAG}={spec}"
    path, equals, values_text = spec.partition("=")
    path = path.strip()
    if not equals or not path:
      raise GridError(f"{flag}: expected {GRID_FLAG}=FIELD=VALUE,VALUE,... (e.g. model.position)")
    if path not in types:
      raise GridError(f"{flag}: {path}: not a field of the sweep's base run config")
    if path in given:
      raise GridError(f"{flag}: {path} is given twice")
    texts = [text.strip() for text in values_text.split(",")] if values_text.strip() else []
    values = [_parse_grid_value(text, path, types[path], flag) for text in texts]
    given[path] = [_as_listed(value, listed.get(path, ())) for value in values]
  entries: dict[str, list[Any]] = {}
  for paths, rows in axes:
    named = [path for path in paths if path in given]
    if not named:
      entries[ZIP_SEPARATOR.join(paths)] = [row[0] if len(paths) == 1 else row for row in rows]
      continue
    if len(named) < len(paths):
      missing = [path for path in paths if path not in given]
      raise GridError(
        f"{GRID_FLAG}={named[0]}=...: zipped with {', '.join(missing)} in the grid; give "
        f"{GRID_FLAG} for each of them too (lists of one length, walked together)"
      )
    lists = {path: given.pop(path) for path in paths}
    if len(paths) == 1:
      if lists[paths[0]]:
        entries[paths[0]] = lists[paths[0]]
    elif any(lists.values()):
      try:
        entries.update(zip_fields(lists))
      except GridError as error:
        raise GridError(f"{GRID_FLAG}: {error}") from None
  entries.update({path: values for path, values in given.items() if values})
  if not entries:
    raise GridError(f"{GRID_FLAG}: no field is left to sweep")
  for key, values in entries.items():
    if len(dict.fromkeys(map(repr, values))) < len(values):
      raise GridError(f"{GRID_FLAG}: {key}: a value is given twice")
  return ml_collections.ConfigDict(entries, sort_keys=False, allow_dotted_keys=True)


def expand(sweep_config: ml_collections.ConfigDict) -> list[Point]:
  """All points of `sweep_config`'s grid, first grid field varying slowest
  (a zipped group is one axis; its fields vary together).

  Raises:
    GridError: a missing base/grid, an empty or non-list grid entry, an
      unknown field path, a value of the wrong type for its field (each
      naming the point and the field), or two points with the same name.
  """
  axes = _read_grid(sweep_config)
  points: list[Point] = []
  seen: dict[str, int] = {}
  for index, rows in enumerate(itertools.product(*(rows for _, rows in axes))):
    overrides = {
      path: value for (paths, _), row in zip(axes, rows) for path, value in zip(paths, row)
    }
    name = point_name(overrides)
    if name in seen:
      raise GridError(
        f"points {seen[name]} and {index} have the same name {name!r} "
        "(repeated or equivalent grid values)"
      )
    if len(name.encode()) > _MAX_NAME_BYTES:
      raise GridError(f"point {index}: its name is longer than {_MAX_NAME_BYTES} bytes: {name}")
    seen[name] = index
    config = copy.deepcopy(sweep_config.base)
    for path, value in overrides.items():
      try:
        set_field(config, path, value)
      except ValueError as error:
        raise GridError(f"point {index} ({name}): {error}") from error
    points.append(Point(index=index, name=name, overrides=overrides, config=config))
  return points


def validate(points: Sequence[Point], check: Callable[[ml_collections.ConfigDict], T]) -> list[T]:
  """Runs the run-config validator `check` on every point before any trains
  and returns what it returns for each (txf.sweep.runner.check_point_config:
  the point's parsed RunConfig).

  `check(config)` raises a ValueError whose message starts with the field,
  as `txf.runconfig.run_config.parse` does.

  Raises:
    GridError: the first point `check` rejects: 'point N (name): <field>: ...'.
  """
  checked = []
  for point in points:
    try:
      checked.append(check(point.config))
    except ValueError as error:
      raise GridError(f"point {point.index} ({point.name}): {error}") from error
  return checked


def select(points: Sequence[Point], index: int | None = None) -> list[Point]:
  """The points to run here: all of them, or the one `index` names.

  With `index` None, the environment variable SLURM_ARRAY_TASK_ID (set in
  each task of a SLURM job array) picks the point when it is set.

  Raises:
    PointIndexError: an index out of range or not an integer, naming where it came from.
  """
  source = f"--index={index}"
  if index is None:
    if SLURM_TASK_ENV not in os.environ:
      return list(points)
    source = f"{SLURM_TASK_ENV}={os.environ[SLURM_TASK_ENV]}"
    try:
      index = int(os.environ[SLURM_TASK_ENV])
    except ValueError as error:
      raise PointIndexError(f"{source}: not an integer") from error
  if not 0 <= index < len(points):
    raise PointIndexError(
      f"{source}: out of range (the grid has {len(points)} points, indices 0..{len(points) - 1})"
    )
  return [points[index]]


def _leaves(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, tuple[Any, type]]:
  """Dotted path -> (value, declared type) of every field below `config`."""
  leaves = {}
  for key, value in config.items():
    path = f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      leaves.update(_leaves(value, f"{path}."))
    else:
      leaves[path] = (value, config.get_type(key))
  return leaves


def _format_flag_value(path: str, value: Any, field_type: type) -> str:
  """`value` as txf's command line parses it back for a field declared as
  `field_type` in the config file (None: 'None', which sets any field to
  None: txf.commands.cli)."""
  if value is None:
    return "None"
  if field_type is bool and isinstance(value, bool):
    return "true" if value else "false"
  if field_type is int and isinstance(value, int) and not isinstance(value, bool):
    return str(value)
  if field_type is float and isinstance(value, (int, float)) and not isinstance(value, bool):
    return repr(float(value))
  if field_type is str and isinstance(value, str):
    return value
  raise GridError(
    f"{path}: cannot set {value!r} from the command line (the config file "
    f"declares it as {field_type.__name__}; config_flags parses only str, int, "
    "float and bool fields)"
  )


# The console script that trains one point; `python -m experiments.run` in a checkout.
RUN_COMMAND = "txf-run"


def command_for(
  point: Point,
  config_path: str,
  workdir: str | os.PathLike,
  *,
  reference: ml_collections.ConfigDict,
) -> str:
  """The `txf-run` command line that trains `point` in `workdir` (in a
  checkout, `python -m experiments.run` takes the same arguments).

  Args:
    point: a point from `expand`.
    config_path: the run config the command loads (a path, or a shipped name: 'base').
    workdir: the point's run directory.
    reference: the config `config_path` loads. Every field where the point's
      config differs from it becomes a `--config.<path>=<value>` override, so
      the command reproduces the point exactly even where the sweep's base
      changed fields of that file; values are written for the field types
      the file declares.

  Raises:
    GridError: a field the reference lacks (or has and the point lacks), or a
      value config_flags cannot parse back (a list, or a str for an int
      field), naming the point and the field.
  """
  wanted, given = _leaves(point.config), _leaves(reference)
  flags = []
  try:
    unmatched = sorted(set(wanted) ^ set(given))
    if unmatched:
      raise GridError(f"{unmatched[0]}: in only one of the point's config and {config_path}'s")
    for path, (value, _) in wanted.items():
      reference_value, field_type = given[path]
      if value != reference_value or type(value) is not type(reference_value):
        flags.append(f"--config.{path}={_format_flag_value(path, value, field_type)}")
  except GridError as error:
    raise GridError(f"point {point.index} ({point.name}): {error}") from error
  return shlex.join(
    [RUN_COMMAND, f"--config={config_path}", f"--workdir={os.fspath(workdir)}", *flags]
  )
