"""Config sections whose fields carry their own doc.

Each config section is a `@section` dataclass (frozen) that declares every
field's type, default and one-line doc together
(txf.layers.model_config.ModelConfig, txf.data.spec.DataSpec,
txf.train.run_config's TrainConfig, EvalConfig, ParallelConfig and RunConfig):

  @section()
  class TrainConfig:
    steps: int = documented("training steps (the schedule decays until here)")
    ...
    d_model: int = documented("width of the residual stream and embeddings", default=128)

`--print_config` prints the docs (`docs(TrainConfig)`), so a field is
documented where it is declared, and nowhere else.
"""

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")
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
