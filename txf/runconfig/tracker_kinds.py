"""What `train.trackers` names: an entry of TRACKERS per tracker (a
`TrackerKind`: how to start it, its start-up check, the package it needs),
and the parse of the field's value (`tracker_names`). txf's trackers are in
txf.rundir.trackers, imported when the registry is first read; user code
registers its own with `txf.register.tracker`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable
from typing import Any

from etils import epath

from txf.choices import Registry
from txf.runconfig.tracking import Tracker


@dataclasses.dataclass(frozen=True)
class TrackerKind:
  """A `train.trackers` name's entry in TRACKERS.

  Attributes:
    start: (the run's work directory) -> its Tracker; called on process 0
      only, once the config and `check` have passed.
    check: (the work directory) -> None, raising ValueError naming what is
      missing where the tracker could not start there (a login, a readable
      run id); called before anything is written. None: nothing to check.
    package: the module `start` imports that txf does not install, looked
      for with the config's check, before anything is written; None: none.
    install: how to install `package`, for the error that asks for it;
      None: 'pip install <package>'.
  """

  start: Callable[[epath.Path], Tracker]
  check: Callable[[epath.Path], None] | None = None
  package: str | None = None
  install: str | None = None

  def needs(self, name: str) -> str:
    """What a run naming the tracker `name` says where `package` is missing."""
    install = self.install or f"pip install {self.package}"
    return f"{name!r} needs the {self.package} package: {install}"

  def installed(self) -> bool:
    """Whether `package` (if any) can be imported."""
    if self.package is None:
      return True
    try:
      return importlib.util.find_spec(self.package) is not None
    except (ImportError, ValueError, AttributeError):  # e.g. sys.modules[package] is None
      return False


# The trackers by train.trackers name: txf's (txf.rundir.trackers) and those
# user code registers (txf.register.tracker).
TRACKERS: Registry[TrackerKind] = Registry("train.trackers", builtins="txf.rundir.trackers")


def tracker_names(value: Any) -> tuple[str, ...]:
  """The tracker names of a config's `train.trackers` ('wandb', 'a,b', a list
  of names; '' or None: none), each once.

  Raises:
    ValueError: naming train.trackers, for a value of another type, a name
      not in TRACKERS (listing those that are) or a tracker whose package is
      not installed.
  """
  if value is None:
    return ()
  if isinstance(value, str):
    names = [name.strip() for name in value.split(",") if name.strip()]
  elif isinstance(value, list | tuple) and all(isinstance(name, str) for name in value):
    names = [name.strip() for name in value]
  else:
    raise ValueError(
      f"{TRACKERS.field}: expected tracker names (a string or a list), got {value!r}"
    )
  kinds = [TRACKERS[name] for name in names]  # every name known before any package is looked for
  for name, kind in zip(names, kinds):
    if not kind.installed():
      raise ValueError(f"{TRACKERS.field}: {kind.needs(name)}")
  return tuple(dict.fromkeys(names))
