"""txf.sweep.significance: Welch's and the paired test against scipy's on the
raw samples, their 95% intervals, the pooled variance and F test, Holm's
adjustment against a direct transcription of its
definition, the pairing rule, the pairs a grid gives, and results.md's
comparison section."""

import json
import math
import types

import numpy as np
import pytest
from scipy import stats
from test_sweep_results import points, summaries, sweep_config, sweep_dir  # noqa: F401 (fixtures)

from txf.sweep import results, significance
from txf.sweep.results import Stat

SAMPLES = [
  ([1.0, 1.2, 0.9], [1.5, 1.4, 1.7]),
  ([2.0, 2.5], [2.3, 2.7]),  # two seeds each, as pe_ln
  ([0.90, 0.91, 0.93], [0.5, 1.5, 1.2]),  # spreads 50x apart
]


@pytest.mark.parametrize(
  "a, b",
  [
    ([1.0, 1.2, 0.9], [1.5, 1.4, 1.7, 1.6]),  # unequal sizes
    ([2.0, 2.5], [2.3, 2.7]),  # two seeds each, as the findings' sweeps
    ([0.90, 0.91], [0.5, 1.5, 1.2]),  # spreads 50x apart: Welch's df near n - 1 of the wide one
  ],
)
def test_welch_from_summaries_and_from_samples_equals_scipy(a, b):
  """From mean, std and n alone, and from the samples unpaired, the t, df and
  p scipy's ttest_ind(equal_var=False) computes; rtol 1e-9."""
  sa, sb = Stat.of(a), Stat.of(b)
  want = stats.ttest_ind(a, b, equal_var=False)
  for got in (
    significance.welch(sa.mean, sa.std, len(a), sb.mean, sb.std, len(b)),
    significance.compare(a, b, paired=False),
  ):
    assert got.difference == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
    assert got.t == pytest.approx(want.statistic, rel=1e-9)
    assert got.df == pytest.approx(want.df, rel=1e-9)
    assert got.p == pytest.approx(want.pvalue, rel=1e-9)
    assert not got.paired


@pytest.mark.parametrize("a, b", SAMPLES)
def test_the_paired_test_equals_scipys_ttest_rel(a, b):
  """t, df (R - 1) and p of scipy's ttest_rel on the same replicas; rtol 1e-9."""
  got = significance.compare(a, b, paired=True)
  want = stats.ttest_rel(a, b)
  assert got.paired and got.df == len(a) - 1
  assert got.difference == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
  assert got.t == pytest.approx(want.statistic, rel=1e-9)
  assert got.p == pytest.approx(want.pvalue, rel=1e-9)


@pytest.mark.parametrize("a, b", SAMPLES)
def test_the_paired_interval_equals_scipys_and_the_t_interval_by_hand(a, b):
  """The 95% interval of the mean paired difference: scipy's
  ttest_rel(...).confidence_interval(0.95), and a float64 transcription of
  mean(d) -+ t_(0.975, R - 1) x std(d, ddof=1) / sqrt(R); rtol 1e-9."""
  got = significance.compare(a, b, paired=True).ci
  want = stats.ttest_rel(a, b).confidence_interval(significance.CONFIDENCE)
  assert got == pytest.approx((want.low, want.high), rel=1e-9)
  d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
  half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
  assert got == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-9)
  assert got[0] < got[1] and (got[0] < 0 < got[1]) == (
    significance.compare(a, b, paired=True).p > 0.05
  )


@pytest.mark.parametrize(
  "a, b",
  [
    ([1.0, 1.2, 0.9], [1.5, 1.4, 1.7, 1.6]),
    ([2.0, 2.5], [2.3, 2.7]),
    ([0.90, 0.91], [0.5, 1.5, 1.2]),
  ],
)
def test_the_welch_interval_equals_scipys(a, b):
  """Welch-Satterthwaite's 95% interval of mean(a) - mean(b), from the
  samples and from mean, std and n: scipy's ttest_ind(equal_var=False)
  .confidence_interval(0.95); rtol 1e-9."""
  want = stats.ttest_ind(a, b, equal_var=False).confidence_interval(significance.CONFIDENCE)
  sa, sb = Stat.of(a), Stat.of(b)
  for got in (
    significance.compare(a, b, paired=False),
    significance.welch(sa.mean, sa.std, len(a), sb.mean, sb.std, len(b)),
  ):
    assert got.ci == pytest.approx((want.low, want.high), rel=1e-9)


def test_no_test_no_interval():
  assert significance.compare([1.0, 2.0], [1.5, 2.5], paired=True).ci is None
  assert significance.compare([1.0, 2.0], [1.0, 2.0], paired=True).ci is None
  assert significance.compare([1.0], [2.0], paired=True).ci is None
  assert significance.welch(1.0, None, 1, 2.0, 0.1, 3).ci is None


def test_the_pooled_variance_and_the_f_test_of_two_against_references():
  """pooled_variance: a float64 transcription (sum of squared deviations from
  each point's mean over the sum of R - 1; rtol 1e-12). variance_ratio: the
  two-sided p and 95% interval from F's cdf written as the regularised
  incomplete beta, I_(d1 x / (d1 x + d2))(d1 / 2, d2 / 2) (scipy.special.betainc,
  not scipy.stats.f), the interval's ends solved by bisection on it; rtol 1e-6."""
  from scipy import special

  groups = [[1.61, 1.63, 1.60], [1.70, 1.72], [1.55, 1.59, 1.58, 1.52]]
  var, df = significance.pooled_variance(groups)
  squares = sum(((np.asarray(g) - np.mean(g)) ** 2).sum() for g in groups)
  assert df == 2 + 1 + 3 and var == pytest.approx(squares / 6, rel=1e-12)
  assert significance.pooled_variance([[1.0, 2.0], [3.0]]) == (0.5, 1)  # one value adds nothing
  with pytest.raises(ValueError, match="two values"):
    significance.pooled_variance([[1.0], [2.0]])
  # A diverged replica: refused, not a NaN variance whose F test read p = 1.
  with pytest.raises(ValueError, match="finite values only"):
    significance.pooled_variance([[1.0, math.nan], [2.0, 2.1]])
  for var_a in (math.nan, math.inf, 0.0):
    with pytest.raises(ValueError, match="positive finite variances"):
      significance.variance_ratio(var_a, 6, 1e-4, 6)

  def cdf(x, d1, d2):
    return special.betainc(d1 / 2, d2 / 2, d1 * x / (d1 * x + d2))

  def quantile(q, d1, d2):
    low, high = 0.0, 1e6
    for _ in range(200):
      mid = (low + high) / 2
      low, high = (mid, high) if cdf(mid, d1, d2) < q else (low, mid)
    return (low + high) / 2

  for var_a, df_a, var_b, df_b in [
    (0.0147**2, 12, 0.0080**2, 12),
    (1.0, 6, 2.5, 12),
    (3.0, 2, 1.0, 30),
  ]:
    got = significance.variance_ratio(var_a, df_a, var_b, df_b)
    f = var_a / var_b
    want_p = min(1.0, 2 * min(cdf(f, df_a, df_b), 1 - cdf(f, df_a, df_b)))
    assert got.ratio == pytest.approx(f, rel=1e-12) and (got.df_a, got.df_b) == (df_a, df_b)
    assert got.p == pytest.approx(want_p, rel=1e-6)
    want_ci = (f / quantile(0.975, df_a, df_b), f / quantile(0.025, df_a, df_b))
    assert got.ci == pytest.approx(want_ci, rel=1e-6)


def test_pairing_removes_a_shared_offset_that_welch_counts_as_noise():
  """Replica r of b is replica r of a plus 0.01 and a seed effect both share:
  unpaired the seed effect swamps the gap, paired it cancels."""
  seed_effect = np.array([0.0, 0.3, -0.2])
  a, b = 1.0 + seed_effect, 1.01 + seed_effect + np.array([0.001, -0.001, 0.0])
  assert significance.compare(a, b, paired=False).p > 0.9
  assert significance.compare(a, b, paired=True).p < 0.01


def test_zero_spread_non_finite_values_and_single_replicas():
  """No spread, whatever the means (t is undefined: two seeds whose
  differences agree, as discrete accuracies can, are no evidence; it gave p
  = 0 and 'resolved'), a non-finite value (a diverged replica; it gave p
  NaN) and one replica a side: no p, in both tests."""
  assert significance.welch(1.0, 0.0, 2, 2.0, 0.0, 2).p is None
  assert significance.welch(1.0, 0.0, 2, 1.0, 0.0, 2).p is None
  assert significance.compare([1.0, 2.0], [1.5, 2.5], paired=True).p is None  # constant gap
  assert significance.compare([1.0, 1.0, 1.0], [0.25] * 3, paired=False).p is None
  assert significance.compare([1.0, 2.0], [1.0, 2.0], paired=True).p is None
  for paired in (True, False):
    test = significance.compare([1.0, math.nan, 1.2], [2.0, 2.1, 2.3], paired=paired)
    assert (test.t, test.df, test.p, test.ci) == (None, None, None, None)
  assert significance.welch(1.0, math.inf, 3, 2.0, 0.1, 3).p is None
  assert significance.welch(1.0, None, 1, 2.0, 0.1, 3).p is None
  assert significance.compare([1.0], [2.0], paired=True).p is None
  with pytest.raises(ValueError, match="one length"):
    significance.compare([1.0, 2.0], [1.0, 2.0, 3.0], paired=True)


def holm_by_definition(ps):
  """Holm (1979) as statsmodels' multipletests(method='holm') writes it: sort
  ascending, multiply the j-th (0-based) by m - j, take the running maximum,
  cap at 1, and put the values back in the input order."""
  m = len(ps)
  order = np.argsort(ps, kind="stable")
  scaled = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * np.asarray(ps)[order]))
  out = np.empty(m)
  out[order] = scaled
  return list(out)


@pytest.mark.parametrize(
  "ps",
  [
    [0.03],  # one comparison: Holm is the raw p
    [0.01, 0.04, 0.03, 0.005],
    [0.02, 0.02, 0.02],  # all equal: each becomes 3 x 0.02
    [0.9, 0.001, 0.5, 0.04, 0.2],
    [0.5, 0.6, 0.7],  # capped at 1
  ],
)
def test_holm_equals_its_definition(ps):
  assert significance.holm(ps) == pytest.approx(holm_by_definition(ps), rel=1e-12)


def test_holm_edges_and_the_rule_at_alpha():
  assert significance.holm([0.03]) == [0.03]
  assert significance.holm([0.02, 0.02, 0.02]) == pytest.approx([0.06] * 3)
  # A comparison without p keeps none and does not count in the family.
  assert significance.holm([0.01, None, 0.04]) == pytest.approx([0.02, None, 0.04])
  assert significance.holm([]) == []
  # A NaN does not sort: it made every p after it 1, or none, by its place.
  for wrong in ([math.nan, 0.001, 0.3], [0.001, 0.3, math.nan], [1.5]):
    with pytest.raises(ValueError, match=r"^Holm's adjustment takes p-values in \[0, 1\]"):
      significance.holm(wrong)
  assert not significance.passes(significance.ALPHA)  # p < alpha, strictly
  assert significance.passes(np.nextafter(significance.ALPHA, 0))
  assert not significance.passes(None)


def test_holm_never_rejects_less_than_bonferroni_nor_more_than_raw():
  rng = np.random.default_rng(0)
  for ps in rng.uniform(0, 0.2, size=(50, 6)):
    adjusted = np.array(significance.holm(list(ps)))
    assert np.all(adjusted >= ps) and np.all(adjusted <= np.minimum(1, 6 * ps) + 1e-15)


def test_replicas_pair_when_seed_replicas_and_data_agree():
  base = {"seed": 0, "replicas": 3, "data": {"seed": None, "seed_per_replica": True}}
  other_model = {**base, "model": {"position": "rope"}, "train": {"learning_rate": 0.01}}
  assert significance.paired_design(base, other_model)
  for change in (
    {"seed": 1},
    {"replicas": 2},
    {"data": {"seed": None, "seed_per_replica": False}},
    {"data": {"seed": 7, "seed_per_replica": True}},
  ):
    assert not significance.paired_design(base, {**base, **change}), change


def row(name, status="done", mean=1.0, replicas=2, seed=0, **overrides):
  """A summary row whose replicas' final losses are mean -/+ 0.05 (paired
  with another row's where they have the same seed)."""
  config = {"seed": seed, "replicas": replicas, "data": {"seed": None}}
  point = types.SimpleNamespace(name=name, overrides=overrides)
  losses = None if mean is None else (mean - 0.05, mean + 0.05)
  return types.SimpleNamespace(
    point=point,
    status=status,
    eval_loss=None if losses is None else Stat.of(losses),
    eval_losses=losses,
    replicas=replicas,
    trained_config=config,
  )


def test_pairs_differ_in_one_field_alone_lower_loss_first_finished_points_only():
  fields = ["model.norm_placement", "model.position"]
  rows = [
    row(f"{pos}_{norm}", mean=1.0 + i / 10, **{fields[0]: norm, fields[1]: pos})
    for i, (norm, pos) in enumerate(
      (norm, pos) for norm in ("pre", "post") for pos in ("rope", "alibi", "t5")
    )
  ]
  pairs = significance.comparisons(rows, fields)
  # 3 pre/post pairs, and 3 encoding pairs under each placement.
  assert [c.field for c in pairs].count(fields[0]) == 3
  assert [c.field for c in pairs].count(fields[1]) == 6
  by_name = {(c.lower, c.higher): c for c in pairs}
  assert ("rope_pre", "rope_post") in by_name and ("rope_post", "rope_pre") not in by_name
  assert by_name[("rope_pre", "rope_post")].test.difference == pytest.approx(-0.3)
  assert all(c.test.difference <= 0 for c in pairs)
  # One family: each comparison's holm_p is Holm's over all 9 raw p.
  assert [c.holm_p for c in pairs] == significance.holm([c.test.p for c in pairs])
  rows[0] = row("rope_pre", status="partial", **{fields[0]: "pre", fields[1]: "rope"})
  assert not any("rope_pre" in (c.lower, c.higher) for c in significance.comparisons(rows, fields))


def test_a_pair_of_paired_replicas_gets_the_paired_test():
  """The replicas of points with one seed, replica count and data section
  pair up (RULE): their comparison is the paired t-test of the per-replica
  losses; with another seed, Welch's. Both against scipy."""
  field = "model.position"
  rope, alibi = row("rope", mean=1.0, **{field: "rope"}), row("alibi", mean=1.2, **{field: "alibi"})
  alibi.eval_losses = (1.12, 1.31)  # differences -0.07, -0.26 from rope's
  (paired,) = significance.comparisons([rope, alibi], [field])
  want = stats.ttest_rel(rope.eval_losses, alibi.eval_losses)
  assert paired.test.paired and paired.test.p == pytest.approx(want.pvalue, rel=1e-9)
  rope.trained_config = {**rope.trained_config, "seed": 1}
  (unpaired,) = significance.comparisons([rope, alibi], [field])
  want = stats.ttest_ind(rope.eval_losses, alibi.eval_losses, equal_var=False)
  assert not unpaired.test.paired and unpaired.test.p == pytest.approx(want.pvalue, rel=1e-9)


def test_points_trained_apart_pair_by_the_configs_they_trained_with(sweep_dir, points):  # noqa: F811
  """A narrowed sweep may train a point with another seed or replica count
  (--config.base.seed=7): its config.json says so, the sweep's config does
  not. Such points were compared as paired (another seed), or the summary
  died on a paired test of 3 and 2 replicas (a traceback)."""
  rope_pre, learned_pre = sweep_dir / points[0].name, sweep_dir / points[2].name
  config = json.loads((learned_pre / "config.json").read_text())
  (learned_pre / "config.json").write_text(json.dumps({**config, "seed": 7}))
  rows = [results.summarize_point(p, sweep_dir / p.name) for p in points]
  (seeded,) = significance.comparisons(rows, ["model.position", "model.norm_placement"])
  want = stats.ttest_ind([2.0, 2.5], [2.3, 2.7], equal_var=False)
  assert not seeded.test.paired and seeded.test.p == pytest.approx(want.pvalue, rel=1e-9)
  # Three replicas where the other has two: Welch's, of 3 and 2 losses.
  (learned_pre / "config.json").write_text(json.dumps({**config, "replicas": 3}))
  metrics = [json.loads(line) for line in (learned_pre / "metrics.jsonl").read_text().splitlines()]
  last = metrics[-1]
  last.update({"eval_loss/2": 2.5, "eval_loss": (2.3 + 2.7 + 2.5) / 3})
  for row in metrics:  # every replica's values at every logged step
    for key in [k for k in row if k.endswith("/1")]:
      row.setdefault(key[:-1] + "2", row[key])
  (learned_pre / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
  rows = [results.summarize_point(p, sweep_dir / p.name) for p in points]
  (counted,) = significance.comparisons(rows, ["model.position", "model.norm_placement"])
  want = stats.ttest_ind([2.0, 2.5], [2.3, 2.7, 2.5], equal_var=False)
  assert not counted.test.paired and counted.test.p == pytest.approx(want.pvalue, rel=1e-9)
  assert rows[0].point.name == rope_pre.name and rows[0].replicas == 2 and rows[2].replicas == 3


def test_results_md_states_the_rule_and_each_pairs_test(sweep_dir, points):  # noqa: F811
  """The fixture's finished points: RoPE and learned, both Pre-LN (the others
  diverged or are partial): one comparison, scipy's on their replicas."""
  _, md_path = results.write_results(summaries(sweep_dir, points), sweep_dir)
  text = md_path.read_text()
  assert f"Holm-adjusted p < {significance.ALPHA} over its 1 comparisons" in text
  (line,) = [line for line in text.splitlines() if line.startswith("| model.position |")]
  cells = [cell.strip() for cell in line.strip("|").split("|")]
  want = stats.ttest_rel([2.0, 2.5], [2.3, 2.7])  # one sweep's points: paired replicas
  assert cells[1].endswith("(rope)") and cells[2].endswith("(learned)")
  assert float(cells[3]) == pytest.approx(2.25 - 2.5, abs=5e-5) and cells[4] == "yes"
  # Printed to 3 significant figures: within half a unit of the last.
  assert float(cells[7]) == pytest.approx(want.pvalue, rel=5e-3)
  assert float(cells[8]) == pytest.approx(want.pvalue, rel=5e-3)  # a family of one
  assert cells[9] == "no"


def test_welch_of_one_replica_with_a_std_or_an_infinite_mean_gives_no_t():
  """A side of one replica has no spread to weigh even when a std is given
  (its Welch-Satterthwaite df divides by n - 1 = 0: a ZeroDivisionError
  without the size check), and an infinite mean (a diverged point's loss)
  with finite stds leaves t and p undefined (t = inf gave p = 0,
  'resolved')."""
  single = significance.welch(1.0, 0.1, 1, 2.0, 0.1, 3)
  assert (single.difference, single.t, single.df, single.p) == (1.0 - 2.0, None, None, None)
  infinite = significance.welch(math.inf, 0.1, 3, 2.0, 0.1, 3)
  assert infinite.difference == math.inf
  assert (infinite.t, infinite.df, infinite.p, infinite.ci) == (None, None, None, None)
