"""Config sections whose fields carry their own doc.

Each config section is a `@section` dataclass (frozen) that declares every
field's type, default and one-line doc together
(txf.layers.model_config.ModelConfig, txf.data.spec.DataSpec,
txf.runconfig.run_config's TrainConfig, EvalConfig, ParallelConfig and RunConfig):

  @section()
  class TrainConfig:
    steps: int = documented("training steps (the schedule decays until here)", default=600)
    ...

configs/base.py lays the defaults out as a ConfigDict, `--print_config`
prints the docs (`docs(TrainConfig)`), and a section's parse reads a config
section by them (`section_values`: unknown fields refused, those left out at
their defaults), so a field is declared, defaulted and documented in one
place. A field declared without a doc is no setting (RunConfig.notes).
"""

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias, TypeVar, dataclass_transform

import ml_collections

T = TypeVar("T")
# A config section as a parse reads it: a ConfigDict (a config file's, the
# command line's) or a dict (config.json's); sections of sections alike.
ConfigSection: TypeAlias = Mapping[str, Any] | ml_collections.ConfigDict
_NO_DEFAULT: Any = dataclasses.MISSING


def documented(
  doc: str, *, default: Any = _NO_DEFAULT, default_factory: Callable[[], Any] = _NO_DEFAULT
) -> Any:
  """A field with `doc` in its metadata; without a default, a required one."""
  if not doc:
    raise ValueError("a config field needs its doc")
  return dataclasses.field(default=default, default_factory=default_factory, metadata={"doc": doc})


@dataclass_transform(frozen_default=True, field_specifiers=(documented, dataclasses.field))
def section(*, eq: bool = True) -> Callable[[type[T]], type[T]]:
  """The frozen dataclass of a config section (`eq=False`: compared by identity)."""
  return dataclasses.dataclass(frozen=True, eq=eq)


def docs(cls: type) -> dict[str, str]:
  """{field name: its doc} of the section `cls`, for the fields that have one."""
  return {f.name: f.metadata["doc"] for f in dataclasses.fields(cls) if "doc" in f.metadata}


def section_values(cls: type, section: ConfigSection, name: str) -> dict[str, Any]:
  """{field: value} of the config section `section` (a ConfigDict or a dict)
  for the dataclass `cls`: each field `cls` declares with a doc, at its
  default where the section leaves it out.

  Raises:
    ValueError: `name`.<field> for a field `cls` does not declare (`check_known`).
  """
  check_known(cls, section, name)
  given = dict(section.items())
  return {
    field.name: given[field.name] if field.name in given else _default(field)
    for field in dataclasses.fields(cls)
    if "doc" in field.metadata
  }


def check_known(cls: type, section: ConfigSection, name: str) -> None:
  """Refuses a field of the config section `section` that the dataclass
  `cls` does not declare: ValueError naming `name`.<field>."""
  known = docs(cls)
  unknown = sorted(set(section.keys()) - set(known))
  if unknown:
    raise ValueError(f"{name}.{unknown[0]}: unknown field (known: {', '.join(known)})")


def _default(field: dataclasses.Field) -> Any:
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  if field.default is dataclasses.MISSING:
    raise TypeError(f"config field {field.name} declares no default")
  return field.default
