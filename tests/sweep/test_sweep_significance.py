"""txf.sweep.significance: Welch's test against scipy's on the raw samples, the
pairs a grid gives, and results.md's comparison section."""

import types

import numpy as np
import pytest
from scipy import stats
from test_sweep_results import points, summaries, sweep_dir  # noqa: F401 (fixtures)

from txf.sweep import results, significance
from txf.sweep.results import Stat


@pytest.mark.parametrize(
  "a, b",
  [
    ([1.0, 1.2, 0.9], [1.5, 1.4, 1.7, 1.6]),  # unequal sizes
    ([2.0, 2.5], [2.3, 2.7]),  # two seeds each, as the findings' sweeps
    ([0.90, 0.91], [0.5, 1.5, 1.2]),  # spreads 50x apart: Welch's df near n - 1 of the wide one
  ],
)
def test_welch_from_summaries_equals_scipy_on_the_raw_samples(a, b):
  """From mean, std and n alone, the t, df and p scipy's ttest_ind(equal_var=False)
  computes from the samples; rtol 1e-9."""
  sa, sb = Stat.of(a), Stat.of(b)
  got = significance.welch(sa.mean, sa.std, len(a), sb.mean, sb.std, len(b))
  want = stats.ttest_ind(a, b, equal_var=False)
  assert got.difference == pytest.approx(np.mean(a) - np.mean(b), rel=1e-12)
  assert got.t == pytest.approx(want.statistic, rel=1e-9)
  assert got.df == pytest.approx(want.df, rel=1e-9)
  assert got.p == pytest.approx(want.pvalue, rel=1e-9)
  assert got.resolved == (want.pvalue < 0.05)


def test_the_rule_decides_at_alpha_and_needs_two_replicas_a_side():
  far = significance.welch(1.0, 0.01, 3, 2.0, 0.01, 3)
  near = significance.welch(1.0, 0.5, 2, 1.1, 0.5, 2)
  assert far.resolved and far.p < significance.ALPHA and not near.resolved
  single = significance.welch(1.0, None, 1, 2.0, 0.1, 3)
  assert (single.t, single.p, single.resolved) == (None, None, False)
  exact = significance.welch(1.0, 0.0, 2, 2.0, 0.0, 2)  # no noise at all, different means
  assert exact.p == 0.0 and exact.resolved
  assert significance.welch(1.0, 0.0, 2, 1.0, 0.0, 2).p is None


def row(name, status="done", mean=1.0, std=0.1, replicas=2, **overrides):
  point = types.SimpleNamespace(name=name, overrides=overrides)
  loss = None if mean is None else Stat(mean, std)
  return types.SimpleNamespace(point=point, status=status, eval_loss=loss, replicas=replicas)


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
  rows[0] = row("rope_pre", status="partial", **{fields[0]: "pre", fields[1]: "rope"})
  assert not any("rope_pre" in (c.lower, c.higher) for c in significance.comparisons(rows, fields))


def test_results_md_states_the_rule_and_each_pairs_test(sweep_dir, points):  # noqa: F811
  """The fixture's finished points: RoPE and learned, both Pre-LN (the others
  diverged or are partial): one comparison, scipy's on their replicas."""
  _, md_path = results.write_results(summaries(sweep_dir, points), sweep_dir)
  text = md_path.read_text()
  assert significance.RULE in text
  (line,) = [line for line in text.splitlines() if line.startswith("| model.position |")]
  cells = [cell.strip() for cell in line.strip("|").split("|")]
  want = stats.ttest_ind([2.0, 2.5], [2.3, 2.7], equal_var=False)
  assert cells[1].endswith("(rope)") and cells[2].endswith("(learned)")
  assert float(cells[3]) == pytest.approx(2.25 - 2.5, abs=5e-5)
  assert float(cells[6]) == pytest.approx(want.pvalue, rel=1e-3)
  assert cells[7] == "no"
