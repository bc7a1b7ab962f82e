"""The one significance rule the findings use, applied to a sweep's points.

RULE: two points' final validation losses differ when Welch's two-sided
t-test over their seed replicas gives p < ALPHA (0.05). Welch's test, not
Student's, because the replicas' spreads differ between points (a Post-LN
point's can be 30 times a Pre-LN one's); it takes each point's mean, sample
std (ddof=1) and replica count, so a summary row is enough. A point with one
replica has no std: its comparisons have no p and are never "resolved".

Which pairs: for each field the grid varies, the points that differ in that
field alone (every other grid field equal), the lower loss first. A 2 x 6
grid (norm placement x encoding) gives 6 norm-placement pairs and 15
encoding pairs per placement.

The p-value says how surprising the difference is under seed noise alone
(init, and data order where the seeds vary it); it does not correct for the
number of comparisons a page makes, which the page states beside the rule.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import Any

ALPHA = 0.05
RULE = f"two-sided Welch's t-test over seed replicas on the final validation loss, p < {ALPHA}"


@dataclasses.dataclass(frozen=True)
class Welch:
  """Welch's t-test of mean_a - mean_b.

  Attributes:
    difference: mean_a - mean_b.
    t: the statistic; None without two replicas on each side or with both
      stds 0 and the means equal.
    df: the Welch-Satterthwaite degrees of freedom (None as t).
    p: two-sided p-value (None as t).
  """

  difference: float
  t: float | None
  df: float | None
  p: float | None

  @property
  def resolved(self) -> bool:
    """Whether the difference passes RULE."""
    return self.p is not None and self.p < ALPHA


def welch(
  mean_a: float, std_a: float | None, n_a: int, mean_b: float, std_b: float | None, n_b: int
) -> Welch:
  """Welch's two-sided t-test from two samples' means, sample stds (ddof=1)
  and sizes."""
  difference = mean_a - mean_b
  if std_a is None or std_b is None or n_a < 2 or n_b < 2:
    return Welch(difference, None, None, None)
  var_a, var_b = std_a**2 / n_a, std_b**2 / n_b
  if var_a + var_b == 0:
    return (
      Welch(difference, None, None, None)
      if difference == 0
      else Welch(difference, math.copysign(math.inf, difference), math.inf, 0.0)
    )
  t = difference / math.sqrt(var_a + var_b)
  df = (var_a + var_b) ** 2 / (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))
  # Here, not at the top: scipy.stats takes seconds to import, and every
  # process that reads a sweep's results (txf-sweep, txf-extrapolate) loads this module.
  from scipy import stats

  return Welch(difference, t, df, float(2 * stats.t.sf(abs(t), df)))


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Two points that differ in one grid field, the one with the lower mean loss first.

  Attributes:
    field: the grid field they differ in.
    lower, higher: their point names.
    lower_value, higher_value: their values of `field`.
    test: Welch's test of lower's loss minus higher's (difference <= 0).
  """

  field: str
  lower: str
  higher: str
  lower_value: Any
  higher_value: Any
  test: Welch


def comparisons(rows: Sequence[Any], fields: Sequence[str]) -> list[Comparison]:
  """Every pair of `rows` (txf.sweep.results.PointSummary) that differ in one
  of `fields` alone, in grid order; only finished points (status 'done')
  take part: a partial run's last loss is not its final one."""
  found = []
  scored = [row for row in rows if row.status == "done" and row.eval_loss is not None]
  for field in fields:
    others = [other for other in fields if other != field]
    for a, b in itertools.combinations(scored, 2):
      va, vb = a.point.overrides, b.point.overrides
      if va.get(field) == vb.get(field) or any(va.get(o) != vb.get(o) for o in others):
        continue
      low, high = (a, b) if a.eval_loss.mean <= b.eval_loss.mean else (b, a)
      test = welch(
        low.eval_loss.mean, low.eval_loss.std, low.replicas,
        high.eval_loss.mean, high.eval_loss.std, high.replicas,
      )  # fmt: skip
      found.append(
        Comparison(
          field,
          low.point.name,
          high.point.name,
          low.point.overrides.get(field),
          high.point.overrides.get(field),
          test,
        )  # fmt: skip
      )
  return found
