"""Named choices that user code extends: the one kind of registry in txf.

The config fields whose choices user code extends (`model.family`,
`model.head`, `model.position`, `model.norm`, `model.activation`,
`model.init`, and `data.name`: text and generated datasets) read a `Registry`; txf
registers its own entries the same way user code does (see `txf.register`),
so a new choice is one function or class in a file of one's own:

  from txf import register

  @register.norm("scale")
  def scale_norm(layer, x_BxTxD, cfg):
    ...

and a config file that imports it (`--config=my_config.py`) can name it;
`--print_config` lists it beside the built-in choices. Each entry keeps
where it came from (`provenance`): a run records it, and a later command on
the run imports the module that provided it (txf.train.record.check_choices).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """The entries of one config field, by name, in registration order.

  Attributes:
    field: the config field it serves (`model.position`), for error messages.
    builtins: the module that registers txf's own entries, imported the
      first time the registry is read, where that module sits above the
      registry's (txf.models registers the families and heads that
      txf.layers.model_config checks a config against).
  """

  def __init__(self, field: str, *, builtins: str | None = None):
    self.field = field
    self.builtins = builtins
    self._entries_: dict[str, T] = {}
    self._options: dict[str, dict[str, Any]] = {}
    self._providers: dict[str, Any] = {}  # what user code registered, for `provenance`
    self._sharing: list[Registry[Any]] = []  # other registries of the same field

  def share_names(self, other: Registry[Any]) -> None:
    """Makes this registry and `other`, two kinds of entry for one config
    field (data.name: generated datasets and text sources), refuse a name
    the other holds: the field's readers look in one, then the other, so
    a duplicate would silently shadow an entry."""
    self._sharing.append(other)
    other._sharing.append(self)

  @property
  def _entries(self) -> dict[str, T]:
    if self.builtins is not None:
      module, self.builtins = self.builtins, None
      importlib.import_module(module)
    return self._entries_

  def register(
    self,
    name: str,
    entry: T,
    *,
    options: Mapping[str, Any] | None = None,
    replace: bool = False,
    provider: Any = None,
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
      provider: the function or class that `entry` wraps (txf.register's
        decorators pass the decorated one), whose module and name
        `provenance` gives; None: `entry` itself.

    Raises:
      ValueError: naming the field, for a name that is not a non-empty str,
        is registered to another entry, or is held by a registry sharing the
        field's names (`share_names`), replace or not.
    """
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.field}: a registered name must be a non-empty string, got {name!r}")
    for other in self._sharing:
      if name in other._entries:
        raise ValueError(f"{self.field}: {name!r} is registered already, as another kind of entry")
    if name in self._entries and not replace and self._entries[name] != entry:
      raise ValueError(
        f"{self.field}: {name!r} is registered already (pass replace=True to replace it)"
      )
    self._entries[name] = entry
    self._options[name] = dict(options or {})
    self._providers[name] = entry if provider is None else provider
    return entry

  def decorator(
    self, name: str, *, options: Mapping[str, Any] | None = None, replace: bool = False
  ) -> Callable[[T], T]:
    """`@registry.decorator(name)`: registers the decorated object, returns it."""
    return lambda entry: self.register(name, entry, options=options, replace=replace)

  @contextlib.contextmanager
  def scoped(self) -> Iterator[Registry[T]]:
    """Registrations made inside the block are undone at its end: the
    registries are global, and a test or notebook may register for a while."""
    entries, options, providers = dict(self._entries), dict(self._options), dict(self._providers)
    try:
      yield self
    finally:
      self._entries_, self._options, self._providers = entries, options, providers

  def options(self, name: str) -> dict[str, Any]:
    """The {setting: default} `name` was registered with ({} if none)."""
    self[name]  # an unknown name: the registry's one-line error
    return dict(self._options[name])

  def provenance(self, name: str) -> dict[str, Any]:
    """Where the entry of `name` comes from: {'name', 'module', 'function',
    'builtin'}: the module and qualified name of the function or class that
    provided it (for an entry registered as an object, its class), and
    whether that module is txf's own."""
    self[name]  # an unknown name: the registry's one-line error
    provider = self._providers[name]
    module = getattr(provider, "__module__", None) or type(provider).__module__
    function = getattr(provider, "__qualname__", None) or type(provider).__qualname__
    builtin = module == "txf" or module.startswith("txf.")
    return dict(name=name, module=module, function=function, builtin=builtin)

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
