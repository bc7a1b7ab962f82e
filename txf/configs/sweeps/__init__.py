"""Sweep configs for txf-sweep: a base run config, a grid, settings."""

from collections.abc import Mapping
from typing import TypeVar

Setting = TypeVar("Setting")


def pick_setting(sweep: str, settings: Mapping[str, Setting], setting: str | None) -> Setting:
  """The value of `setting` (None: "cpu", every such sweep's default) in a
  sweep config's SETTINGS, as `--config=sweeps/NAME:SETTING` names it.

  Raises:
    ValueError: naming the sweep and the settings it has.
  """
  setting = setting or "cpu"
  if setting not in settings:
    raise ValueError(f"sweeps/{sweep}: setting {setting!r} is not one of {tuple(settings)}")
  return settings[setting]
