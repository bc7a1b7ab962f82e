"""Named choices that user code extends: the one kind of registry in txf.

The config fields whose choices user code extends (`model.position`,
`model.norm`, `model.activation`, `model.init`, and `data.name` for generated
LM tasks)
read a `Registry`; txf registers its own entries the same way user code does
(see `txf.register`), so a new choice is one function in a file of one's own:

  from txf import register

  @register.norm("scale")
  def scale_norm(layer, x_BxTxD, cfg):
    ...

and a config file that imports it (`--config=my_config.py`) can name it;
`--print_config` lists it beside the built-in choices. Model families and
output heads (`model.family`, `model.head`) are fixed sets in
txf.layers.model_config: each comes with the tasks it trains, the heads it
carries and how it decodes (txf.train.run_config.TASK_MODELS, FAMILY_HEADS,
txf.decode), so a new one is a change to txf.models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """The entries of one config field, by name, in registration order.

  Attributes:
    field: the config field it serves (`model.position`), for error messages.
  """

  def __init__(self, field: str):
    self.field = field
    self._entries: dict[str, T] = {}
    self._options: dict[str, dict[str, Any]] = {}

  def register(
    self, name: str, entry: T, *, options: Mapping[str, Any] | None = None, replace: bool = False
  ) -> T:
    """Adds `entry` as `name`; a name taken already is an error unless
    `replace` (a module imported twice registers the same entry again: allowed).

    Args:
      name: the value of the config field that chooses it.
      entry: what the field's readers call (each registry's docstring).
      options: {setting: default} the entry reads from the config's
        `options` section when chosen (`cfg.option(setting)`): hyper-parameters
        of an entry that the built-in config fields do not have.
      replace: replace an entry registered as `name` before.

    Raises:
      ValueError: naming the field, for a name that is not a non-empty str or
        is registered to another entry.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.field}: a registered name must be a non-empty string, got {name!r}")
    if name in self._entries and not replace and self._entries[name] != entry:
      raise ValueError(
        f"{self.field}: {name!r} is registered already (pass replace=True to replace it)"
      )
    self._entries[name] = entry
    self._options[name] = dict(options or {})
    return entry

  def decorator(
    self, name: str, *, options: Mapping[str, Any] | None = None, replace: bool = False
  ) -> Callable[[T], T]:
    """`@registry.decorator(name)`: registers the decorated object, returns it."""
    return lambda entry: self.register(name, entry, options=options, replace=replace)

  def options(self, name: str) -> dict[str, Any]:
    """The {setting: default} `name` was registered with ({} if none)."""
    self[name]  # an unknown name: the registry's one-line error
    return dict(self._options[name])

  def __getitem__(self, name: str) -> T:
    """The entry of `name`.

    Raises:
      ValueError: one line naming the field and the registered choices.
    """
    try:
      return self._entries[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name
      raise ValueError(f"{self.field}: {name!r} is not one of {self.names()}") from None

  def __contains__(self, name: object) -> bool:
    try:
      return name in self._entries
    except TypeError:
      return False

  def __iter__(self) -> Iterator[str]:
    return iter(tuple(self._entries))

  def __len__(self) -> int:
    return len(self._entries)

  def names(self) -> tuple[str, ...]:
    """The registered names, in registration order."""
    return tuple(self._entries)

  def items(self):
    return tuple(self._entries.items())
