"""Field checks shared by every config reader (data, layers, train).

Each returns the checked value or raises a `ValueError` whose message starts
with the field's name (`'model.d_model: ...'`), so every config error names
what to fix. `txf.ops` imports only jax/numpy and keeps its own argument
checks.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable
from typing import Any

INT32_MAX = 2**31 - 1
# The largest seed: replica seeds are an int32 array (txf.train.replicas).
SEED_MAX = INT32_MAX


def int_at_least(value: Any, name: str, minimum: int, maximum: int | None = None) -> int:
  """`value` as an int in [minimum, maximum] (bools are not ints here)."""
  bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
  try:
    if isinstance(value, bool):
      raise TypeError
    value = operator.index(value)
  except TypeError:
    raise ValueError(f"{name}: must be an integer {bounds}, got {value!r}") from None
  if value < minimum or (maximum is not None and value > maximum):
    raise ValueError(f"{name}: must be an integer {bounds}, got {value!r}")
  return value


def seed(value: Any, name: str) -> int:
  """`value` as a seed: an int in [0, SEED_MAX]."""
  return int_at_least(value, name, 0, SEED_MAX)


def finite_at_least(value: Any, name: str, minimum: float, *, open_: bool = False) -> float:
  """`value` a finite real number >= minimum (> minimum when `open_`); NaN and
  infinities fail (every comparison with NaN is False, so they would pass a
  plain `value < minimum` check)."""
  ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
  if ok:
    ok = value > minimum if open_ else value >= minimum
  if not ok:
    raise ValueError(
      f"{name}: must be a finite number {'>' if open_ else '>='} {minimum}, got {value!r}"
    )
  return value


def boolean(value: Any, name: str) -> bool:
  """`value` if it is True or False (a string such as 'false' would be truthy)."""
  if not isinstance(value, bool):
    raise ValueError(f"{name}: must be True or False, got {value!r}")
  return value


def positive_int(value: Any, name: str, *, sentinel: tuple[int, str] | None = None) -> int:
  """`value` as an int >= 1, or `sentinel[0]`, a special value meaning `sentinel[1]`."""
  if sentinel is not None and value == sentinel[0] and not isinstance(value, bool):
    return value
  try:
    return int_at_least(value, name, 1)
  except ValueError:
    extra = "" if sentinel is None else f" or {sentinel[0]} ({sentinel[1]})"
    raise ValueError(f"{name}: must be a positive integer{extra}, got {value!r}") from None


def optional_positive_int(value: Any, name: str) -> int | None:
  """None, or `value` as an int >= 1."""
  return None if value is None else positive_int(value, name)


def choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
  """`value` if it is one of `choices`."""
  # A tuple: an unhashable value is just not one of them.
  if value not in tuple(choices):
    raise ValueError(f"{name}: {value!r} is not one of {tuple(choices)}")
  return value


def fraction(value: Any, name: str, *, low_open: bool = False, high_open: bool = True) -> float:
  """`value` a real number in [0, 1], each end excluded when its flag is set."""
  ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if ok:
    ok = (0 < value if low_open else 0 <= value) and (value < 1 if high_open else value <= 1)
  if not ok:
    interval = f"{'(' if low_open else '['}0, 1{')' if high_open else ']'}"
    raise ValueError(f"{name}: must be in {interval}, got {value!r}")
  return value
