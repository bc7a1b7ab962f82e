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
`--print_config` lists it beside the built-in choices. An entry's settings
(hyper-parameters its config field does not have: RoPE's base, T5's
buckets) are a small frozen dataclass registered with it, each field with
its default and doc; their values live in the config's `options` section
(txf.layers.model_config.ModelConfig.settings). Each entry keeps
where it came from (`provenance`): a run records it, and a later command on
the run imports the module that provided it (txf.rundir.record.check_choices).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def settings_class(
  field: str, name: str, settings: type | None, options: Mapping[str, Any] | None
) -> type | None:
  """The settings dataclass of entry `name`: `settings` itself, checked, or
  one made from `options` ({setting: default}, a frozen dataclass of those
  fields); None for an entry without settings.

  Raises:
    ValueError: naming the entry, for both given, `options` that make no
      dataclass (a list default, a setting name that is not an identifier), a
      `settings` that is not a dataclass, or one of its fields without a
      default (a setting the config does not give must still have a value).
  """
  if settings is not None and options is not None:
    raise ValueError(f"{field}: {name!r}: pass settings or options, not both")
  if options is not None:
    fields = [
      (key, type(value), dataclasses.field(default=value)) for key, value in options.items()
    ]
    try:
      return dataclasses.make_dataclass(f"{name}_settings", fields, frozen=True) if fields else None
    except (TypeError, ValueError) as error:  # a mutable default, a name that is not one
      raise ValueError(f"{field}: {name!r}: options: {error}") from None
  if settings is None:
    return None
  if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
    raise ValueError(f"{field}: {name!r}: settings must be a dataclass type, got {settings!r}")
  for setting in dataclasses.fields(settings):
    if setting.default is dataclasses.MISSING:  # a default_factory too: a setting is a value
      raise ValueError(f"{field}: {name!r}: setting {setting.name!r} has no default")
  return settings


def setting_defaults(settings: type | None) -> dict[str, Any]:
  """{setting: default} of a settings dataclass ({} for None)."""
  return {f.name: f.default for f in dataclasses.fields(settings)} if settings else {}


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
    self._settings: dict[str, type | None] = {}
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
    settings: type | None = None,
    options: Mapping[str, Any] | None = None,
    replace: bool = False,
    provider: Any = None,
  ) -> T:
    """Adds `entry` as `name`; a name taken already is an error unless
    `replace` (a module imported twice registers the same entry again: allowed).

    Args:
      name: the value of the config field that chooses it.
      entry: what the field's readers call (each registry's docstring).
      settings: the entry's settings, a dataclass whose fields each have a
        default (and a doc: txf.fields.documented), and may define check()
        raising a ValueError naming the field; their values live in the
        config's `options` section when the entry is chosen
        (`cfg.settings(field)` returns an instance, `cfg.option(setting)` one
        value): hyper-parameters of an entry that the config fields do not have.
      options: {setting: default}, the same as a settings dataclass of those
        fields (without docs or checks); not with `settings`.
      replace: replace an entry registered as `name` before.
      provider: the function or class that `entry` wraps (txf.register's
        decorators pass the decorated one), whose module and name
        `provenance` gives; None: `entry` itself.

    Raises:
      ValueError: naming the field, for a name that is not a non-empty str,
        is registered to another entry, or is held by a registry sharing the
        field's names (`share_names`), replace or not; settings as
        `settings_class` refuses them.
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
    declared = settings_class(self.field, name, settings, options)
    self._entries[name] = entry
    self._settings[name] = declared
    self._providers[name] = entry if provider is None else provider
    return entry

  def decorator(
    self,
    name: str,
    *,
    settings: type | None = None,
    options: Mapping[str, Any] | None = None,
    replace: bool = False,
  ) -> Callable[[T], T]:
    """`@registry.decorator(name)`: registers the decorated object, returns it."""
    return lambda entry: self.register(
      name, entry, settings=settings, options=options, replace=replace
    )

  @contextlib.contextmanager
  def scoped(self) -> Iterator[Registry[T]]:
    """Registrations made inside the block are undone at its end: the
    registries are global, and a test or notebook may register for a while."""
    entries, settings, providers = dict(self._entries), dict(self._settings), dict(self._providers)
    try:
      yield self
    finally:
      self._entries_, self._settings, self._providers = entries, settings, providers

  def settings(self, name: str) -> type | None:
    """The settings dataclass `name` was registered with (None if none)."""
    self[name]  # an unknown name: the registry's one-line error
    return self._settings[name]

  def options(self, name: str) -> dict[str, Any]:
    """{setting: default} of `name`'s settings ({} if none)."""
    return setting_defaults(self.settings(name))

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
