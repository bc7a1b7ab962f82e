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
import functools
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

import numpy as np

T = TypeVar("T")
# What a registered name may be: the config field's value names it alone, so
# none holds what a field's parse splits on (train.trackers' commas and
# spaces, data.name's 'files:GLOB' colon).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def require_methods(field: str, name: str, entry: Any, methods: Iterable[str]) -> None:
  """Checks at registration that `entry` has the callables its field's
  readers call (a task kind's model_inputs, a tracker's log_metrics, ...),
  rather than failing at their first call, mid-run.

  Raises:
    ValueError: naming the field, the entry and each missing method.
  """
  missing = [method for method in methods if not callable(getattr(entry, method, None))]
  if missing:
    raise ValueError(f"{field}: {name!r}: {entry!r} lacks the method(s) {', '.join(missing)}")


def require_method_signatures(
  field: str, name: str, entry: Any, methods: Mapping[str, tuple[str, ...]]
) -> None:
  """`require_methods`, and each method callable with the arguments
  `methods` names (by position) as its readers call it on `entry`, an
  instance, or on an instance of `entry`, a class: a tracker's
  log_config(self) failed with a TypeError at the run's start, after the run
  directory was written.

  Raises:
    ValueError: naming the field, the entry and the method.
  """
  require_methods(field, name, entry, methods)
  for method, arguments in methods.items():
    fn = getattr(entry, method)
    unbound = isinstance(entry, type) and not isinstance(
      inspect.getattr_static(entry, method), (staticmethod, classmethod)
    )
    if not can_call(fn, *(("self",) if unbound else ()), *arguments):
      raise ValueError(
        f"{field}: {name!r}: {method}{inspect.signature(fn)} cannot be called as "
        f"{method}({', '.join(arguments)})"
      )


def can_call(fn: Any, *args: Any, **kwargs: Any) -> bool:
  """Whether `fn` takes `args` and `kwargs` (its signature binds them), without
  calling it; True for a callable whose signature inspect cannot read (a
  builtin's: nothing to check), False for one that is not callable."""
  if not callable(fn):
    return False
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return True
  try:
    signature.bind(*args, **kwargs)
  except TypeError:
    return False
  return True


def require_signature(
  registry: str,
  name: str,
  fn: Any,
  positional: tuple[str, ...],
  keywords: tuple[str, ...] = (),
  *,
  declared: str = "",
) -> None:
  """Checks at registration that `fn` can be called as the readers of
  `registry` (e.g. 'register.norm') call it, with the arguments `positional`
  names by position and `keywords` by keyword, rather than failing with a
  TypeError deep in the first step (*args and **kwargs take what they can);
  `declared`: what else the registration said that chose those arguments
  (", contributes='bias'"), for the message.

  Raises:
    ValueError: one line naming the registry, the entry, the arguments it is
      called with and `fn`'s own, for a `fn` not callable or not taking them.
  """
  expected = ", ".join([*positional, *(["*", *keywords] if keywords else [])])
  where = f"{registry}({name!r}{declared}): takes ({expected})"
  if not callable(fn):
    raise ValueError(f"{where}, but {fn!r} is not callable")
  if not can_call(fn, *positional, **dict.fromkeys(keywords)):
    label = getattr(fn, "__name__", None) or repr(fn)
    raise ValueError(f"{where}, but {label}{inspect.signature(fn)} cannot be called so")


@dataclasses.dataclass(frozen=True)
class ShapeChecked:
  """A registered function whose result's shape is checked on every call
  (while jax traces it: shapes are static, so the compiled program is
  unchanged) against `expected(*args, **kwargs)` -> (shape, its letters,
  e.g. '[B, T, D]'); `broadcast`: any shape that broadcasts to it (fewer
  leading dimensions, or 1s), as the reader's addition takes. One that
  returned another shape failed later, in a message naming txf's own
  arguments (an einsum's subscripts, a bias's broadcast), or trained on.
  Equal for the same function (a module imported twice registers it again).

  Raises (from the call):
    ValueError: naming `entry` (e.g. "model.norm 'scale'"), the shape it
      returned and the one expected.
  """

  fn: Callable[..., Any]  # first: `_provided_by` finds the registered function here
  entry: str
  expected: Callable[..., tuple[tuple[int, ...], str]]
  broadcast: bool = False

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    out = self.fn(*args, **kwargs)
    shape, letters = self.expected(*args, **kwargs)
    got, shape = tuple(getattr(out, "shape", ())), tuple(shape)
    if not (_broadcasts(got, shape) if self.broadcast else got == shape):
      ones = " (or one that broadcasts to it)" if self.broadcast else ""
      raise ValueError(
        f"{self.entry} returned shape {got}, expected {letters} = {list(shape)}{ones}"
      )
    return out


@functools.cache  # one class per module: a module imported twice registers an equal entry
def shape_checked_module(
  module: type, entry: str, expected: Callable[..., tuple[tuple[int, ...], str]]
) -> type:
  """A subclass of the linen module class `module` whose __call__'s result
  is checked as ShapeChecked checks a function's (`expected` gets the module
  and the call's arguments). It keeps `module`'s name: flax names an
  unnamed submodule after its class, and a parameter path must not change."""
  checked = ShapeChecked(module.__call__, entry, expected)

  def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
    return checked(self, *args, **kwargs)

  names = {"__module__": module.__module__, "__qualname__": module.__qualname__}
  return type(module.__name__, (module,), {"__call__": __call__, **names})


def _broadcasts(got: tuple[int, ...], shape: tuple[int, ...]) -> bool:
  """Whether an array of shape `got` broadcasts to `shape` without changing
  it (a bias [T, S] or [1, 1, T, S] to [B, H, T, S]): what the reader's
  addition takes."""
  try:
    return np.broadcast_shapes(got, shape) == shape
  except ValueError:
    return False


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
      settings = (
        dataclasses.make_dataclass(f"{name}_settings", fields, frozen=True) if fields else None
      )
    except (TypeError, ValueError) as error:  # a mutable default, a name that is not one
      raise ValueError(f"{field}: {name!r}: options: {error}") from None
  if settings is None:
    return None
  if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
    raise ValueError(f"{field}: {name!r}: settings must be a dataclass type, got {settings!r}")
  for setting in dataclasses.fields(settings):
    if setting.default is dataclasses.MISSING:  # a default_factory too: a setting is a value
      raise ValueError(f"{field}: {name!r}: setting {setting.name!r} has no default")
    _check_setting_default(f"{field}: {name!r}: setting {setting.name!r}", setting.default)
    _check_setting_type(f"{field}: {name!r}: setting {setting.name!r}", setting)
  return settings


_SETTING_TYPES = {kind.__name__: kind for kind in (bool, int, float, str)}


def _check_setting_type(where: str, setting: dataclasses.Field) -> None:
  """A setting annotated bool, int, float or str has a default of that type:
  model.options types it by its default (default_options), so a float
  setting whose default is 1 took no 1.5, from the command line or a config."""
  annotated = setting.type  # a class, or its name under `from __future__ import annotations`
  kind = _SETTING_TYPES.get(annotated) if isinstance(annotated, str) else annotated
  if not isinstance(kind, type) or kind not in _SETTING_TYPES.values():
    return
  if type(setting.default) is kind:
    return
  hint = (
    f" (write {float(setting.default)!r})" if kind is float and type(setting.default) is int else ""
  )
  raise ValueError(
    f"{where}: annotated {kind.__name__}, but its default {setting.default!r} is of type "
    f"{type(setting.default).__name__}{hint}: the config types a setting by its default"
  )


def _check_setting_default(where: str, default: Any) -> None:
  """A setting's default is a bool, int, float or str: what config.json and
  `--config.model.options.NAME=VALUE` keep as it is (a tuple came back a
  list, unhashable; an enum did not serialise; a None could not be
  overridden from the command line)."""
  if not isinstance(default, (bool, int, float, str)):
    raise ValueError(
      f"{where}: default {default!r} is a {type(default).__name__}; a setting's default is "
      "a bool, int, float or str (what config.json and --config.model.options keep as it is)"
    )


def setting_defaults(settings: type | None) -> dict[str, Any]:
  """{setting: default} of a settings dataclass ({} for None)."""
  return {f.name: f.default for f in dataclasses.fields(settings)} if settings else {}


def _settings_form(settings: type | None) -> Any:
  """What two registrations of one entry must agree on: each setting's name,
  type, default and doc, and the check() (`options=` makes a new class each
  time, so the classes themselves are not compared)."""
  if settings is None:
    return None
  # Defaults by repr: a NaN default is the same default again.
  fields = [
    (f.name, f.type, repr(f.default), dict(f.metadata)) for f in dataclasses.fields(settings)
  ]
  return fields, getattr(settings, "check", None)


def _provided_by(entry: Any) -> Any:
  """The function or class an entry registered without a `provider` comes
  from: for an entry object that wraps one in its first field (txf's own
  ModelFamily's module, OutputHead's, Activation's function, registered
  directly), that one; else the entry itself (a TaskKind, whose first field
  is its batch format; the head 'none', which has no module)."""
  fields = dataclasses.fields(entry) if dataclasses.is_dataclass(entry) else ()
  if fields and not isinstance(entry, type):
    value = getattr(entry, fields[0].name)
    if inspect.isfunction(value) or inspect.isclass(value):
      return value
  return entry


def share_settings(*registries: Registry[Any]) -> None:
  """Makes the settings of `registries`' entries one namespace (model.options:
  one value per setting name, whichever entries are chosen), so that
  `Registry.register` refuses a setting name one of them declares already."""
  for registry in registries:
    registry._namespace = registries


def reserve_setting_names(reserved: Mapping[str, str], *registries: Registry[Any]) -> None:
  """Makes `registries` refuse an entry's setting named as a key of
  `reserved` ({name: what holds it already}: ModelConfig's fields), which a
  setting would sit beside under the same name (model.d_model and
  model.options.d_model: two values, one name)."""
  for registry in registries:
    registry._reserved.update(reserved)


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
    # The registries whose entries' settings share one namespace with these
    # (`share_settings`).
    self._namespace: tuple[Registry[Any], ...] = (self,)
    # Setting names held by something else: name -> what (`reserve_setting_names`).
    self._reserved: dict[str, str] = {}

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
        `provenance` gives; None: the one it wraps (`_provided_by`), or
        `entry` itself.

    Raises:
      ValueError: naming the field, for a name that is not a str of letters,
        digits, '_', '.' and '-' (`NAME`), is registered to another entry or
        with other settings, or is held by a registry sharing the field's
        names (`share_names`), replace or not; settings as `settings_class`
        refuses them, and a setting that `_check_setting_names` refuses (one
        another entry declares, or a reserved name).
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
      raise ValueError(
        f"{self.field}: a registered name is letters, digits, '_', '.' and '-' (starting with "
        f"a letter, digit or '_'), got {name!r}"
      )
    for other in self._sharing:
      if name in other._entries:
        raise ValueError(f"{self.field}: {name!r} is registered already, as another kind of entry")
    declared = settings_class(self.field, name, settings, options)
    if name in self._entries and not replace:
      if self._entries[name] != entry:
        raise ValueError(
          f"{self.field}: {name!r} is registered already (pass replace=True to replace it)"
        )
      if _settings_form(self._settings[name]) != _settings_form(declared):
        raise ValueError(
          f"{self.field}: {name!r} is registered already with other settings "
          f"({setting_defaults(self._settings[name])}; pass replace=True to replace them)"
        )
    self._check_setting_names(name, declared)
    self._entries[name] = entry
    self._settings[name] = declared
    self._providers[name] = _provided_by(entry) if provider is None else provider
    return entry

  def _check_setting_names(self, name: str, declared: type | None) -> None:
    """Refuses a setting of entry `name` that an entry of another registry of
    the namespace (`share_settings`) declares, or one of this registry with
    another default: model.options holds one value per name, so one of the
    two entries would silently get the other's value (a config starts with
    the built-in entries' defaults: configs/base.py); and one whose name is
    reserved (`reserve_setting_names`: a ModelConfig field's)."""
    for setting, default in setting_defaults(declared).items():
      if setting in self._reserved:
        raise ValueError(
          f"{self.field}: {name!r}: setting {setting!r} is {self._reserved[setting]}; "
          "name it otherwise"
        )
      for registry in self._namespace:
        for owner in registry:
          theirs = registry.options(owner)
          if setting not in theirs or (registry is self and owner == name):
            continue
          # 1 == 1.0, but the config types the setting by the default it keeps.
          other = theirs[setting] != default or type(theirs[setting]) is not type(default)
          if registry is not self or other:
            raise ValueError(
              f"{self.field}: {name!r}: setting {setting!r} (default {default!r}) is declared "
              f"by {registry.field} {owner!r} too (default {theirs[setting]!r}); "
              "model.options holds one value for both: name it otherwise"
            )

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
