"""The one significance rule the findings use, applied to a sweep's points.

RULE: two points' final validation losses differ when the t-test of their
seed replicas gives p < ALPHA (0.05) after Holm's adjustment over the family
of comparisons it belongs to (a page's table, a sweep's results.md).

Which test. Each point has R seed replicas; replica r of a run is the single
run of seed + r (txf.runconfig.run_config). Two points' replicas are *paired* when
their runs have the same `seed`, the same `replicas` and the same `data`
section (`paired_design`): then replica r of each starts from the same seed
and reads the same batches (data seed, or with data.seed_per_replica data
seed + r), so a shared good or bad draw moves both. Paired replicas get the
paired t-test on the per-replica differences (df R - 1); unpaired ones
Welch's two-sided t-test, not Student's, because the replicas' spreads differ
between points (a Post-LN point's can be 30 times a Pre-LN one's). Both are
computed from the per-replica values (`compare`); `welch` from a mean, sample
std and count is kept for results whose replicas were not kept. A side with
one replica has no p and is never "resolved"; nor has a pair without spread
(every paired difference the same, as discrete accuracies can be: t is
undefined, and no test on two or three seeds gives evidence from it) or
with a non-finite value (a diverged replica: say so, not a p).

Why Holm. A table of 16 comparisons at 0.05 each would pass about one
unresolved-by-truth pair in 1.25 by chance; Holm's step-down adjustment
(`holm`) keeps the chance of any false pass in the family at or below ALPHA
without assuming the tests independent, and rejects at least what Bonferroni
does.

Which pairs (`comparisons`): for each field the grid varies, the points that
differ in that field alone (every other grid field equal), the lower loss
first. A 2 x 6 grid (norm placement x encoding) gives 6 norm-placement pairs
and 15 encoding pairs per placement.

The p-value says how surprising the difference is under seed noise alone
(init, and data order where the seeds vary it). Beside it each test gives
the CONFIDENCE (95%) interval of the difference, from the same t
distribution: mean paired difference +- t_(0.975, R - 1) x its standard
error where paired, Welch-Satterthwaite's df and standard error otherwise.
A difference the rule does not resolve is not shown to be zero: its
interval says how large an effect the seeds still allow, either way.

Noise of two sweeps (`pooled_variance`, `variance_ratio`): the within-point
variance of the final loss pooled over a sweep's points (each point's sum
of squared deviations from its own mean, over the sum of R - 1), and the
two-sided F test of two such variances, with the ratio's interval.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

ALPHA = 0.05
CONFIDENCE = 1 - ALPHA
RULE = (
  f"t-test over seed replicas on the final validation loss (paired where the points share "
  f"seeds and batches, else Welch's; two-sided), Holm-adjusted p < {ALPHA} within each table"
)


@dataclasses.dataclass(frozen=True)
class Test:
  """A two-sided t-test of a - b.

  Attributes:
    difference: mean(a) - mean(b).
    t: the statistic; None without two replicas on each side, with no
      spread (every paired difference the same, or every replica of both
      sides equal: t is undefined, and the seeds say nothing of the noise),
      or with a non-finite value (a diverged replica).
    df: its degrees of freedom (R - 1 paired, Welch-Satterthwaite unpaired;
      None as t).
    p: two-sided p-value (None as t).
    paired: whether it is the paired test.
    ci: the CONFIDENCE interval (low, high) of the difference, from the t
      distribution of df degrees of freedom (module docstring); None as t.
  """

  difference: float
  t: float | None
  df: float | None
  p: float | None
  paired: bool = False
  ci: tuple[float, float] | None = None


def _t_test(difference: float, variance: float, df: float, paired: bool) -> Test:
  """The test of `difference` with standard error sqrt(`variance`); no p
  with no spread (t undefined: two seeds whose differences happen to agree,
  e.g. discrete accuracies, are not p = 0) or a non-finite value."""
  if not (variance > 0 and math.isfinite(variance) and math.isfinite(difference)):
    return Test(difference, None, None, None, paired)
  se = math.sqrt(variance)
  t = difference / se
  # Here, not at the top: scipy.stats takes seconds to import, and every
  # process that reads a sweep's results (txf-sweep, txf-extrapolate) loads this module.
  from scipy import stats

  half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, df)) * se
  ci = (difference - half, difference + half)
  return Test(difference, t, df, float(2 * stats.t.sf(abs(t), df)), paired, ci)


def welch(
  mean_a: float, std_a: float | None, n_a: int, mean_b: float, std_b: float | None, n_b: int
) -> Test:
  """Welch's two-sided t-test from two samples' means, sample stds (ddof=1)
  and sizes."""
  difference = mean_a - mean_b
  if std_a is None or std_b is None or n_a < 2 or n_b < 2:
    return Test(difference, None, None, None)
  var_a, var_b = std_a**2 / n_a, std_b**2 / n_b
  if not var_a + var_b > 0:  # no spread, or a NaN one: t is undefined (as in _t_test)
    return Test(difference, None, None, None)
  df = (var_a + var_b) ** 2 / (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))
  return _t_test(difference, var_a + var_b, df, False)


def paired_t(a: Sequence[float], b: Sequence[float]) -> Test:
  """The paired two-sided t-test of a - b: a one-sample t-test of the
  per-replica differences a[r] - b[r], df R - 1."""
  if len(a) != len(b):
    raise ValueError(f"paired samples must be of one length, got {len(a)} and {len(b)}")
  d_R = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
  difference = float(d_R.mean())
  if len(d_R) < 2:
    return Test(difference, None, None, None, True)
  return _t_test(difference, float(d_R.var(ddof=1)) / len(d_R), len(d_R) - 1, True)


def compare(a: Sequence[float], b: Sequence[float], *, paired: bool) -> Test:
  """The rule's test of a - b from per-replica values: paired_t where the
  replicas are paired (`paired_design`), else welch."""
  if paired:
    return paired_t(a, b)
  a_R, b_R = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
  std = lambda x: float(x.std(ddof=1)) if len(x) > 1 else None
  return welch(float(a_R.mean()), std(a_R), len(a_R), float(b_R.mean()), std(b_R), len(b_R))


@dataclasses.dataclass(frozen=True)
class VarianceRatio:
  """The two-sided F test of two pooled variances, a over b.

  Attributes:
    ratio: var_a / var_b.
    df_a, df_b: their degrees of freedom.
    p: two-sided p-value (twice the smaller tail of F(df_a, df_b)).
    ci: the CONFIDENCE interval of the ratio of the true variances.
  """

  ratio: float
  df_a: int
  df_b: int
  p: float
  ci: tuple[float, float]


def pooled_variance(samples: Sequence[Sequence[float]]) -> tuple[float, int]:
  """The within-point variance pooled over `samples` (each a point's
  per-replica values): the sum of each one's squared deviations from its own
  mean over the sum of its len - 1, and that df. Points of one value add
  nothing.

  Raises:
    ValueError: without a point of two values, or for a non-finite value.
  """
  squares, df = 0.0, 0
  for sample in samples:
    x = np.asarray(sample, dtype=np.float64)
    if not np.isfinite(x).all():
      raise ValueError(f"a pooled variance of finite values only, got {list(sample)}")
    squares += float(((x - x.mean()) ** 2).sum())
    df += len(x) - 1
  if df < 1:
    raise ValueError("a pooled variance needs a point of two values")
  return squares / df, df


def variance_ratio(var_a: float, df_a: int, var_b: float, df_b: int) -> VarianceRatio:
  """The two-sided F test of var_a = var_b (module docstring).

  Raises:
    ValueError: for a variance that is not positive and finite.
  """
  if not all(0 < v < math.inf for v in (var_a, var_b)):
    raise ValueError(f"an F test of positive finite variances, got {var_a!r} and {var_b!r}")
  from scipy import stats

  ratio = var_a / var_b
  p = 2 * min(float(stats.f.sf(ratio, df_a, df_b)), float(stats.f.cdf(ratio, df_a, df_b)))
  tail = (1 - CONFIDENCE) / 2
  ci = (
    ratio / float(stats.f.isf(tail, df_a, df_b)),
    ratio / float(stats.f.ppf(tail, df_a, df_b)),
  )
  return VarianceRatio(ratio, df_a, df_b, min(1.0, p), ci)


def paired_design(config_a: Mapping[str, Any], config_b: Mapping[str, Any]) -> bool:
  """Whether two runs' replicas pair up (module docstring): the same `seed`,
  `replicas` and `data` section (run configs as config.json holds them)."""
  return all(config_a.get(key) == config_b.get(key) for key in ("seed", "replicas", "data"))


def holm(p_values: Sequence[float | None]) -> list[float | None]:
  """Holm's step-down adjusted p-values of one family, in the given order:
  the k-th smallest of m p-values becomes max over j <= k of
  min(1, (m - j + 1) p_(j)). A comparison without p (None) stays None and
  does not count in m.

  Raises:
    ValueError: for a p outside [0, 1] (a NaN would not sort, and would
      silently raise every later rank's p to 1).
  """
  wrong = [p for p in p_values if p is not None and not 0 <= p <= 1]
  if wrong:
    raise ValueError(f"Holm's adjustment takes p-values in [0, 1], got {wrong[0]!r}")
  order = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
  adjusted: list[float | None] = [None] * len(p_values)
  running = 0.0
  for rank, (p, i) in enumerate(order):
    running = max(running, min(1.0, (len(order) - rank) * p))
    adjusted[i] = running
  return adjusted


def passes(adjusted_p: float | None) -> bool:
  """Whether a Holm-adjusted p passes RULE."""
  return adjusted_p is not None and adjusted_p < ALPHA


@dataclasses.dataclass(frozen=True)
class Comparison:
  """Two points that differ in one grid field, the one with the lower mean loss first.

  Attributes:
    field: the grid field they differ in.
    lower, higher: their point names.
    lower_value, higher_value: their values of `field`.
    test: the rule's test (`compare`) of lower's loss minus higher's
      (difference <= 0).
    holm_p: its p Holm-adjusted over the comparisons found with it.
  """

  field: str
  lower: str
  higher: str
  lower_value: Any
  higher_value: Any
  test: Test
  holm_p: float | None

  @property
  def resolved(self) -> bool:
    """Whether the difference passes RULE."""
    return passes(self.holm_p)


def comparisons(rows: Sequence[Any], fields: Sequence[str]) -> list[Comparison]:
  """Every pair of `rows` (txf.sweep.results.PointSummary) that differ in one
  of `fields` alone, in grid order, Holm-adjusted as one family; only
  finished points (status 'done') take part: a partial run's last loss is
  not its final one. The rule's test (`compare`) of the rows' per-replica
  final losses, paired where the configs the points trained with pair up
  (`paired_design` of their config.json: points a narrowed sweep trained
  with another seed or replica count are not, whatever the sweep's config)."""
  found = []
  scored = [row for row in rows if row.status == "done" and row.eval_loss is not None]
  for field in fields:
    others = [other for other in fields if other != field]
    for a, b in itertools.combinations(scored, 2):
      va, vb = a.point.overrides, b.point.overrides
      if va.get(field) == vb.get(field) or any(va.get(o) != vb.get(o) for o in others):
        continue
      low, high = (a, b) if a.eval_loss.mean <= b.eval_loss.mean else (b, a)
      paired = paired_design(low.trained_config or {}, high.trained_config or {})
      pair_test = compare(low.eval_losses, high.eval_losses, paired=paired)
      found.append((field, low, high, pair_test))
  adjusted = holm([pair_test.p for *_, pair_test in found])
  return [
    Comparison(
      field,
      low.point.name,
      high.point.name,
      low.point.overrides.get(field),
      high.point.overrides.get(field),
      pair_test,
      holm_p,
    )  # fmt: skip
    for (field, low, high, pair_test), holm_p in zip(found, adjusted)
  ]
