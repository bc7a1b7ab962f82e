"""Tests for txf.checks: every failure is a ValueError starting with the field."""

import numpy as np
import pytest

from txf import checks


@pytest.mark.parametrize("value", [0, -3, 2.0, True, "3", None])
def test_positive_int_rejects_naming_the_field(value):
  with pytest.raises(ValueError, match=r"^model\.d_model: must be a positive integer, got "):
    checks.positive_int(value, "model.d_model")


def test_int_checks_accept_and_return_ints():
  assert checks.positive_int(3, "f") == 3
  assert checks.int_at_least(0, "f", 0) == 0
  assert checks.optional_positive_int(None, "f") is None
  with pytest.raises(ValueError, match=r"^seed: must be an integer >= 0, got -1"):
    checks.int_at_least(-1, "seed", 0)
  assert checks.int_at_least(5, "f", 0, maximum=5) == 5
  with pytest.raises(ValueError, match=r"^f: must be an integer in \[0, 5\], got 6"):
    checks.int_at_least(6, "f", 0, maximum=5)


@pytest.mark.parametrize("value", [-1, 2**31, 99999999999999999999, 1.0])
def test_seed_must_fit_an_int32(value):
  with pytest.raises(ValueError, match=r"^seed: must be an integer in \[0, 2147483647\], got "):
    checks.seed(value, "seed")
  assert checks.seed(2**31 - 1, "seed") == 2**31 - 1


@pytest.mark.parametrize(
  "value", [float("nan"), float("inf"), -float("inf"), -1e-9, "1", True, None]
)
def test_finite_at_least_rejects_nan_infinities_and_values_below(value):
  with pytest.raises(ValueError, match=r"^model\.norm_eps: must be a finite number >= 0"):
    checks.finite_at_least(value, "model.norm_eps", 0.0)


def test_finite_at_least_open_excludes_the_minimum():
  assert checks.finite_at_least(0.0, "f", 0.0) == 0.0
  assert checks.finite_at_least(1e-12, "f", 0.0, open_=True) == 1e-12
  with pytest.raises(ValueError, match=r"^f: must be a finite number > 0.0, got 0.0"):
    checks.finite_at_least(0.0, "f", 0.0, open_=True)


@pytest.mark.parametrize("value", ["false", 0, 1, None])
def test_boolean_rejects_what_is_not_a_bool(value):
  with pytest.raises(ValueError, match=r"^model\.use_bias: must be True or False, got "):
    checks.boolean(value, "model.use_bias")


def test_sentinel_is_the_only_extra_value():
  assert checks.positive_int(-1, "parallel.data", sentinel=(-1, "all")) == -1
  with pytest.raises(ValueError, match=r"^parallel\.data: .* or -1 \(all\), got -2"):
    checks.positive_int(-2, "parallel.data", sentinel=(-1, "all"))


def test_choice_names_the_field_and_the_choices():
  assert checks.choice(None, "model.attention_impl", (None, "xla")) is None
  with pytest.raises(ValueError, match=r"^model\.norm: 'batch' is not one of \('layer', 'rms'\)"):
    checks.choice("batch", "model.norm", ("layer", "rms"))
  with pytest.raises(ValueError, match=r"^model\.norm:"):
    checks.choice(["layer"], "model.norm", ("layer", "rms"))  # unhashable


@pytest.mark.parametrize(
  "value, low_open, high_open, ok",
  [
    (0.0, False, True, True),
    (0.0, True, True, False),
    (1.0, False, True, False),
    (1.0, False, False, True),
    (0.5, True, True, True),
    (-0.1, False, False, False),
    (True, False, False, False),
    ("0.5", False, False, False),
    (float("nan"), False, False, False),
    # numpy scalars as numbers (top_p=np.float32(0.5) was refused), at the ends too.
    (np.float32(0.5), True, False, True),
    (np.float32(1.0), True, False, True),
    (np.float64(0.0), True, False, False),
    (np.float32("nan"), False, False, False),
    (np.bool_(True), False, False, False),
  ],
)
def test_fraction_bounds(value, low_open, high_open, ok):
  check = lambda: checks.fraction(value, "train.b1", low_open=low_open, high_open=high_open)
  if ok:
    assert check() == value
  else:
    with pytest.raises(ValueError, match=r"^train\.b1: must be in [\[(]0, 1[\])], got "):
      check()
