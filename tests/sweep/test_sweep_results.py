"""Tests for txf.sweep.results on a hand-written sweep directory (no training).

Expected values are computed here by hand from the written numbers: mean, and
the sample standard deviation (ddof=1), which for two values a, b is
|a - b| / sqrt(2).
"""

import csv
import dataclasses
import io
import json
import math
import os
import re
import signal

import ml_collections
import numpy as np
import pytest

from conftest import gone_pid, load_config
from full_disk import files_in, full_disk
from txf import storage
from txf.runconfig.run_config import parse, to_json
from txf.rundir.checkpoint import PreemptionGuard
from txf.rundir.workdir import WorkdirError
from txf.storage import WriteError, write_files
from txf.sweep import figures, grid, results, runner

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 4


def write_run(workdir, rows, *, steps=STEPS):
  """A run directory: config.json (configs/rope.py's, trained `steps`, of
  as many replicas as the rows hold: `name/r` keys) and metrics.jsonl `rows`."""
  workdir.mkdir(parents=True)
  if steps is not None:
    config = load_config("rope")
    config.train.steps = steps
    indices = [int(key.rpartition("/")[2]) for row in rows for key in row if "/" in key]
    config.replicas = max(indices, default=0) + 1
    (workdir / "config.json").write_text(json.dumps(to_json(parse(config))))
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def replica_row(step, name, values, **extra):
  """A metrics row as a run of len(values) vmapped replicas logs it."""
  return {
    "step": step,
    name: float(np.mean(values)),
    **{f"{name}/{r}": value for r, value in enumerate(values)},
    **extra,
  }


def write_extrapolation(workdir, applicable, **extra):
  losses = {"non_overlapping": [2.0, 2.5, 3.5], "sliding": [1.9, 2.2, 3.0]}
  losses = {p: [v if ok else None for v, ok in zip(vs, applicable)] for p, vs in losses.items()}
  (workdir / results.EXTRAPOLATION_FILE).write_text(
    json.dumps({"lengths": [8, 16, 32], "loss": losses, "applicable": applicable, **extra})
  )


@pytest.fixture
def sweep_config():
  """Four points whose configs hold only what a summary reads."""
  base = ml_collections.ConfigDict(
    dict(replicas=2, model=dict(position="rope", norm_placement="pre"), train=dict(steps=STEPS))
  )
  config = ml_collections.ConfigDict(dict(base=base))
  config.grid = grid.make_grid(
    {"model.position": ["rope", "learned"], "model.norm_placement": ["pre", "post"]}
  )
  return config


@pytest.fixture
def points(sweep_config):
  return grid.expand(sweep_config)


@pytest.fixture
def sweep_dir(tmp_path, points):
  """Four points of two replicas each: done (with extrapolation), diverged,
  done (learned table: longer lengths not applicable), partial."""
  rope_pre, rope_post, learned_pre, learned_post = (tmp_path / p.name for p in points)
  write_run(
    rope_pre,
    [
      replica_row(2, "loss", [3.0, 3.2], tokens_per_sec=1000.0),
      replica_row(2, "eval_loss", [3.1, 3.3]),
      replica_row(4, "loss", [2.2, 2.6], tokens_per_sec=1200.0),
      replica_row(4, "eval_loss", [2.0, 2.5]),
    ],
  )
  write_extrapolation(rope_pre, [True, True, True])
  write_run(rope_post, [replica_row(2, "loss", [3.0, 3.0], tokens_per_sec=900.0)])
  results.mark_diverged(rope_post, "non-finite loss by step 3")
  write_run(
    learned_pre,
    [
      replica_row(2, "loss", [2.9, 3.1], tokens_per_sec=800.0),
      replica_row(2, "eval_loss", [3.0, 3.0]),
      replica_row(4, "loss", [2.4, 2.4], tokens_per_sec=1000.0),
      replica_row(4, "eval_loss", [2.3, 2.7]),
    ],
  )
  write_extrapolation(learned_pre, [True, False, False])
  write_run(
    learned_post,
    [
      replica_row(2, "loss", [3.1, 3.3], tokens_per_sec=700.0),
      replica_row(2, "eval_loss", [3.2, 3.4]),
    ],
  )
  return tmp_path


def test_point_status_of_each_state(sweep_dir, points, tmp_path):
  assert [results.point_status(sweep_dir / p.name) for p in points] == [
    "done",
    "diverged",
    "done",
    "partial",
  ]
  assert results.point_status(tmp_path / "never_started") == "missing"
  (tmp_path / "empty").mkdir()
  assert results.point_status(tmp_path / "empty") == "missing"
  write_run(tmp_path / "no_config", [{"step": 4, "eval_loss": 2.0}], steps=None)
  assert results.point_status(tmp_path / "no_config") == "partial"
  # A train row at the last step without its eval row is not done yet.
  write_run(tmp_path / "no_final_eval", [{"step": 4, "loss": 2.0}])
  assert results.point_status(tmp_path / "no_final_eval") == "partial"


def test_summary_of_replicas_is_mean_and_sample_std(sweep_dir, points):
  row = results.summarize_point(points[0], sweep_dir / points[0].name)
  assert row.status == "done" and not row.diverged and row.replicas == 2
  assert row.train_loss.mean == pytest.approx(2.4, rel=1e-12)
  assert row.train_loss.std == pytest.approx(0.4 / math.sqrt(2), rel=1e-12)
  assert row.eval_loss.mean == pytest.approx(2.25, rel=1e-12)
  assert row.eval_loss.std == pytest.approx(0.5 / math.sqrt(2), rel=1e-12)
  e_a, e_b = math.exp(2.0), math.exp(2.5)
  assert row.eval_perplexity.mean == pytest.approx((e_a + e_b) / 2, rel=1e-12)
  assert row.eval_perplexity.std == pytest.approx((e_b - e_a) / math.sqrt(2), rel=1e-12)
  assert row.tokens_per_sec == pytest.approx(1100.0, rel=1e-12)
  assert row.extrapolation.lengths == (8, 16, 32)
  assert row.extrapolation.loss["sliding"] == (1.9, 2.2, 3.0)


# Each point's replicas' final accuracies; [] logs no accuracy.
WIDTH_ACCURACIES = {
  "family=decoder,d_model=32": [0.5, 0.7],
  "family=decoder,d_model=128": [0.9, 1.0],
  "family=lstm,d_model=32": [],
  "family=lstm,d_model=128": [0.1, 0.3],
}


def width_sweep(tmp_path):
  """The summaries of a family x d_model grid, each point a run of 2
  replicas whose final evaluation logged its WIDTH_ACCURACIES."""
  base = ml_collections.ConfigDict(
    dict(replicas=2, model=dict(family="decoder", d_model=32), train=dict(steps=STEPS))
  )
  config = ml_collections.ConfigDict(dict(base=base))
  config.grid = grid.make_grid({"model.family": ["decoder", "lstm"], "model.d_model": [32, 128]})
  points = grid.expand(config)
  for point in points:
    row = replica_row(STEPS, "eval_loss", [2.0, 2.2])
    if WIDTH_ACCURACIES[point.name]:
      row.update(replica_row(STEPS, "eval_accuracy", WIDTH_ACCURACIES[point.name]))
    write_run(tmp_path / point.name, [row])
  return [results.summarize_point(p, tmp_path / p.name) for p in points]


def test_final_accuracy_is_the_replicas_mean_and_std_in_every_table(tmp_path):
  rows = width_sweep(tmp_path)
  first = rows[0].eval_accuracy
  assert first.mean == pytest.approx(0.6, rel=1e-12)
  assert first.std == pytest.approx(0.2 / math.sqrt(2), rel=1e-12)
  assert rows[2].eval_accuracy is None
  csv_path, md_path = results.write_results(rows, tmp_path)
  table = list(csv.DictReader(csv_path.read_text().splitlines()))
  assert [row["eval_accuracy"] for row in table] == ["0.6", "0.95", "", "0.2"]
  assert float(table[3]["eval_accuracy_std"]) == pytest.approx(0.2 / math.sqrt(2), rel=1e-12)
  assert "| val accuracy |" in md_path.read_text() and "0.9500 ± 0.0707" in md_path.read_text()


def test_accuracy_vs_width_draws_one_line_per_family_at_its_widths(tmp_path):
  rows = width_sweep(tmp_path)
  figure = figures.accuracy_vs_width_figure(rows)
  (axes,) = figure.axes
  lines = {bars.get_label(): bars.lines[0] for bars in axes.containers}  # errorbar's
  assert sorted(lines) == ["LSTM", "Transformer decoder"]
  data = {label: np.asarray(line.get_xydata(), float) for label, line in lines.items()}
  np.testing.assert_allclose(data["Transformer decoder"][:, 0], [32, 128])
  np.testing.assert_allclose(data["Transformer decoder"][:, 1], [0.6, 0.95])
  np.testing.assert_allclose(data["LSTM"][:, 1], [np.nan, 0.2])  # no accuracy: a gap
  assert axes.get_xscale() == "log" and "accuracy" in axes.get_ylabel()
  path = figures.plot_accuracy_vs_width(rows, tmp_path)
  assert path.name == figures.ACCURACY_VS_WIDTH_PNG
  assert_png(path)
  with pytest.raises(ValueError, match="^model.num_layers: not a grid field"):
    figures.accuracy_vs_width_figure(rows, width_field="model.num_layers")


# (family, width, learning rate) -> replicas' final accuracies: the best rate
# differs by width, and the decoder's best at 32 is not its best at 128.
TUNED_ACCURACIES = {
  ("decoder", 32, 0.001): [0.2, 0.4],
  ("decoder", 32, 0.01): [0.5, 0.7],
  ("decoder", 128, 0.001): [0.9, 1.0],
  ("decoder", 128, 0.01): [0.1, 0.1],
  ("lstm", 32, 0.001): [],
  ("lstm", 32, 0.01): [0.3, 0.5],
  ("lstm", 128, 0.001): [0.25, 0.35],
  ("lstm", 128, 0.01): [0.2, 0.2],
}


def tuned_rows(tmp_path, accuracy=lambda value: value):
  """Summaries of a family x width x learning-rate grid whose replicas reach
  `accuracy` of TUNED_ACCURACIES' values (none where it lists none)."""
  base = ml_collections.ConfigDict(
    dict(
      replicas=2,
      model=dict(family="decoder", d_model=32),
      train=dict(steps=STEPS, learning_rate=0.003),
    )
  )
  config = ml_collections.ConfigDict(dict(base=base))
  config.grid = grid.make_grid(
    {
      "model.family": ["decoder", "lstm"],
      "model.d_model": [32, 128],
      "train.learning_rate": [0.001, 0.01],
    }
  )
  rows = []
  for point in grid.expand(config):
    accuracies = TUNED_ACCURACIES[tuple(point.overrides.values())]
    row = replica_row(STEPS, "eval_loss", [2.0, 2.2])
    if accuracies:
      row.update(replica_row(STEPS, "eval_accuracy", [accuracy(a) for a in accuracies]))
    write_run(tmp_path / point.name, [row])
    rows.append(results.summarize_point(point, tmp_path / point.name))
  return rows


def test_accuracy_vs_width_shows_each_width_at_its_best_learning_rate(tmp_path):
  rows = tuned_rows(tmp_path)
  figure = figures.accuracy_vs_width_figure(rows)
  (axes,) = figure.axes
  lines = {bars.get_label(): bars.lines[0] for bars in axes.containers}
  assert sorted(lines) == ["LSTM", "Transformer decoder"]  # one line per family, not per rate
  data = {label: np.asarray(line.get_xydata(), float) for label, line in lines.items()}
  np.testing.assert_allclose(data["Transformer decoder"], [[32, 0.6], [128, 0.95]])
  np.testing.assert_allclose(data["LSTM"], [[32, 0.4], [128, 0.3]])
  marks = sorted((text.xy, text.get_text()) for text in axes.texts)
  assert marks == [
    ((32, 0.4), "lr 0.01"),
    ((32, 0.6), "lr 0.01"),
    ((128, 0.3), "lr 0.001"),
    ((128, 0.95), "lr 0.001"),
  ]
  assert "best learning rate" in " ".join(figure.get_suptitle().split())
  # Without the tuned field in the grid, no marks and the plain title.
  untuned = figures.accuracy_vs_width_figure(rows, tuned_field="model.num_layers")
  assert len(untuned.axes[0].containers) == 4 and not untuned.axes[0].texts


def test_summary_of_a_single_run_has_no_std(tmp_path, points):
  write_run(
    tmp_path / "single",
    [{"step": 4, "loss": 2.5, "tokens_per_sec": 500.0}, {"step": 4, "eval_loss": 2.25}],
  )
  row = results.summarize_point(points[0], tmp_path / "single", replicas=1)
  assert (row.train_loss.mean, row.train_loss.std) == (2.5, None)
  assert row.eval_perplexity.mean == pytest.approx(math.exp(2.25), rel=1e-12)
  assert row.eval_perplexity.std is None and row.extrapolation is None


def test_summary_of_a_diverged_point_has_no_final_losses(sweep_dir, points):
  row = results.summarize_point(points[1], sweep_dir / points[1].name, replicas=2)
  assert row.diverged and row.status == "diverged"
  assert row.train_loss is None and row.eval_loss is None
  assert row.tokens_per_sec == 900.0


def test_rows_of_a_resumed_run_replace_earlier_ones_at_the_same_step(tmp_path, points):
  write_run(
    tmp_path / "resumed",
    [
      {"step": 4, "loss": 9.0},
      {"step": 4, "eval_loss": 9.0},
      {"step": 4, "loss": 2.0},
      {"step": 4, "eval_loss": 1.5},
    ],
  )
  row = results.summarize_point(points[0], tmp_path / "resumed", replicas=1)
  assert (row.train_loss.mean, row.eval_loss.mean) == (2.0, 1.5)


def test_a_missing_replica_value_is_an_error_naming_it(tmp_path, points):
  write_run(
    tmp_path / "run", [{"step": 4, "loss": 2.0, "loss/0": 2.0}, {"step": 4, "eval_loss": 2.0}]
  )
  with pytest.raises(ValueError, match=r"step 4 has 'loss' but not 'loss/1' \(replicas=2\)"):
    results.summarize_point(points[0], tmp_path / "run", replicas=2)
  with pytest.raises(ValueError, match="replicas must be >= 1"):
    results.summarize_point(points[0], tmp_path / "run", replicas=0)


def test_a_malformed_extrapolation_file_is_an_error_naming_the_key(tmp_path):
  (tmp_path / results.EXTRAPOLATION_FILE).write_text(
    json.dumps({"lengths": [8, 16], "loss": {"sliding": [2.0]}, "applicable": [True, True]})
  )
  with pytest.raises(ValueError, match=r"loss\.sliding has 1 entries for 2 lengths"):
    results.read_extrapolation(tmp_path)
  (tmp_path / results.EXTRAPOLATION_FILE).write_text(json.dumps({"lengths": [8]}))
  with pytest.raises(ValueError, match="missing 'loss'"):
    results.read_extrapolation(tmp_path)


def summaries(sweep_dir, points):
  return [results.summarize_point(p, sweep_dir / p.name, replicas=2) for p in points]


def test_results_csv_holds_the_hand_computed_values(sweep_dir, points):
  csv_path, _ = results.write_results(summaries(sweep_dir, points), sweep_dir)
  with open(csv_path, newline="") as f:
    table = list(csv.DictReader(f))
  assert [row["point"] for row in table] == [p.name for p in points]
  rope_pre, rope_post, learned_pre, learned_post = table
  assert (rope_pre["model.position"], rope_pre["model.norm_placement"]) == ("rope", "pre")
  assert float(rope_pre["eval_loss"]) == pytest.approx(2.25, rel=1e-12)
  assert float(rope_pre["eval_loss_std"]) == pytest.approx(0.5 / math.sqrt(2), rel=1e-12)
  assert float(rope_pre["train_ppl"]) == pytest.approx(
    (math.exp(2.2) + math.exp(2.6)) / 2, rel=1e-12
  )
  assert float(rope_pre["tokens_per_sec"]) == pytest.approx(1100.0, rel=1e-12)
  assert [rope_pre[f"sliding@{n}"] for n in (8, 16, 32)] == ["1.9", "2.2", "3.0"]
  assert [learned_pre[f"non_overlapping@{n}"] for n in (8, 16, 32)] == ["2.0", "n/a", "n/a"]
  assert float(learned_pre["eval_loss_std"]) == pytest.approx(0.4 / math.sqrt(2), rel=1e-12)
  assert (rope_post["diverged"], rope_post["status"], rope_post["eval_loss"]) == (
    "yes",
    "diverged",
    "",
  )
  assert learned_post["status"] == "partial" and learned_post["diverged"] == "no"
  assert float(learned_post["eval_loss"]) == pytest.approx(3.3, rel=1e-12)
  assert learned_post["sliding@8"] == ""  # not evaluated


def test_a_grid_over_replicas_is_the_one_replicas_column(tmp_path, sweep_config):
  """--grid=replicas=1,2 wrote a results.csv with two 'replicas' columns."""
  sweep_config.grid = grid.make_grid({"replicas": [1, 2]})
  points = grid.expand(sweep_config)
  for point in points:
    write_run(
      tmp_path / point.name,
      [
        replica_row(
          point.overrides["replicas"], "eval_loss", [2.0, 2.2][: point.overrides["replicas"]]
        )
      ],
    )
  rows = [results.summarize_point(p, tmp_path / p.name) for p in points]
  csv_path, _ = results.write_results(rows, tmp_path)
  with open(csv_path, newline="") as f:
    header, *table = list(csv.reader(f))
  assert header.count("replicas") == 1
  assert [line[header.index("replicas")] for line in table] == ["1", "2"]


def test_results_md_formats_mean_plus_minus_std(sweep_dir, points):
  _, md_path = results.write_results(summaries(sweep_dir, points), sweep_dir)
  lines = md_path.read_text().splitlines()
  assert "sample std (ddof=1)" in lines[0]
  header = [cell.strip() for cell in lines[2].strip("|").split("|")]
  table = lines[4 : 4 + len(points)]
  cells = [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in table]
  assert len(cells) == 4
  assert cells[0]["val loss"] == "2.2500 ± 0.3536"
  assert cells[0]["tokens/s"] == "1,100"
  assert cells[0]["sliding @32"] == "3.0000"
  assert cells[2]["sliding @16"] == "n/a"
  assert (cells[1]["diverged"], cells[1]["val loss"]) == ("yes", "")


def test_a_classifiers_throughput_is_its_own_column_in_examples_per_second(
  tmp_path, sweep_dir, points
):
  """A classifier logs examples_per_sec, not tokens_per_sec: its throughput
  was a blank tokens/s cell; LM sweeps keep their columns as they were."""
  write_run(
    tmp_path / "classify",
    [
      {"step": 2, "loss": 2.5, "examples_per_sec": 300.0},
      {"step": 4, "loss": 2.0, "examples_per_sec": 500.0},
      {"step": 4, "eval_loss": 2.25},
    ],
  )
  row = results.summarize_point(points[0], tmp_path / "classify", replicas=1)
  assert (row.examples_per_sec, row.tokens_per_sec) == (400.0, None)
  (tmp_path / "classify_results").mkdir()
  csv_path, md_path = results.write_results([row], tmp_path / "classify_results")
  (table,) = list(csv.DictReader(io.StringIO(csv_path.read_text())))
  assert (table["examples_per_sec"], table["tokens_per_sec"]) == ("400.0", "")
  lines = md_path.read_text().splitlines()
  header = [cell.strip() for cell in lines[2].strip("|").split("|")]
  cells = dict(zip(header, (c.strip() for c in lines[4].strip("|").split("|"))))
  assert (cells["examples/s"], cells["tokens/s"]) == ("400", "")
  assert "examples/s: a classifier's training examples per second" in lines[0]
  lm_csv, lm_md = results.write_results(summaries(sweep_dir, points), sweep_dir)
  assert "examples_per_sec" not in lm_csv.read_text() and "examples/s" not in lm_md.read_text()


def test_results_md_says_what_its_extrapolation_and_difference_columns_hold(sweep_dir, points):
  """A review read an extrapolation column at 1x against val loss and found
  them apart, unexplained, and a 'difference' without units or direction."""
  for point in points[:3:2]:  # the two with extrapolation.json: 4,096 tokens each
    path = sweep_dir / point.name / results.EXTRAPOLATION_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_tokens": 4096}))
  _, md_path = results.write_results(summaries(sweep_dir, points), sweep_dir)
  note = md_path.read_text().splitlines()[0]
  assert "Extrapolation columns: loss at that evaluation length over the first 4,096 " in note
  assert "a stalled run is flat too" in note
  assert "(difference: the lower mean minus the higher, nats)" in md_path.read_text()
  # Without extrapolation there are no such columns to explain.
  for point in points:
    (sweep_dir / point.name / results.EXTRAPOLATION_FILE).unlink(missing_ok=True)
  _, md_path = results.write_results(summaries(sweep_dir, points), sweep_dir)
  assert "Extrapolation columns" not in md_path.read_text()


def test_late_improvement_is_the_relative_fall_over_the_last_fifth():
  steps = list(range(100, 1001, 100))
  loss = [3.0, 2.8, 2.6, 2.5, 2.4, 2.2, 2.1, 2.02, 2.01, 2.0]
  # The last fifth (800-1000) holds three evaluations: measured from 800.
  assert results.late_improvement(steps, loss) == pytest.approx(0.02 / 2.02, rel=1e-12)
  assert results.is_flat(results.late_improvement(steps, loss), loss[-1])  # 1.0% < 2%
  loss[7:] = [2.1, 2.05, 2.0]
  assert results.late_improvement(steps, loss) == pytest.approx(0.1 / 2.1, rel=1e-12)
  assert not results.is_flat(0.1 / 2.1, 2.0)
  assert results.is_flat(0.019, 2.0) and results.is_flat(-0.01, 2.0)
  # Near zero the fall in nats decides: a solved task's 0.002 -> 0.0001 (95%)
  # fell 0.0019 nats, flat; 0.2 -> 0.01 fell 0.19 nats, not flat; the
  # boundary at 0.01 nats (an 80% fall to 0.0024 is 0.0096 nats, to 0.0026 0.0104).
  assert results.is_flat(0.95, 0.0001) and not results.is_flat(0.95, 0.01)
  assert results.is_flat(0.8, 0.0024) and not results.is_flat(0.8, 0.0026)
  assert figures.flatness_mark(np.array(steps), np.array([*loss[:7], 0.002, 0.001, 0.0001])) == (
    "flat, -0.0019 nats"
  )
  # The same run evaluated every 200 steps: two evaluations in the last fifth
  # (800, 1000) measure two noisy numbers, so flatness is unknown.
  assert results.late_improvement(steps[1::2], loss[1::2]) is None
  assert results.evaluations_in_window(steps[1::2]) == 2
  # The case: a 20-step run still falling, evaluated every 4 steps.
  assert results.late_improvement([4, 8, 12, 16, 20], [4.91, 4.7, 4.5, 4.39, 4.34]) is None
  # With fewer evaluations required, the window starts at the latest before 80% (125).
  assert results.late_improvement([125, 250], [2.6, 2.3], min_evaluations=1) == pytest.approx(
    0.3 / 2.6, rel=1e-12
  )
  assert results.late_improvement([250], [2.3], min_evaluations=1) is None
  assert results.late_improvement([], []) is None
  assert results.is_flat(None, 2.0) is None
  # A final (or starting) loss that is not a number measures no fall: it was
  # NaN, so 'not flat' and a 'val change' of '+nan%'.
  for at in (-1, 7):
    broken = np.array(loss, np.float64)
    broken[at] = np.nan
    assert results.late_improvement(steps, broken) is None
    assert results.replicas_flat(np.array(steps), broken[:, None]) is None
    assert figures.flatness_mark(np.array(steps), broken) == "flat: unknown, a loss not finite"


def test_the_flat_rule_is_strict_at_both_its_bounds():
  """Flat: the late improvement under 2%, or the late fall under 0.01 nats;
  exactly at either bound is not flat."""
  assert results.is_flat(results.FLAT_TOLERANCE, 2.0) is False  # falls 0.041 nats
  assert results.is_flat(np.nextafter(results.FLAT_TOLERANCE, 0), 2.0) is True
  # 50% better over the last fifth, ending at 0.01: a fall of exactly 0.01 nats.
  assert results.late_fall(0.5, results.FLAT_ABSOLUTE) == results.FLAT_ABSOLUTE
  assert results.is_flat(0.5, results.FLAT_ABSOLUTE) is False
  assert results.is_flat(0.5, 0.99 * results.FLAT_ABSOLUTE) is True


def test_a_non_finite_replica_makes_the_mean_and_std_non_finite():
  # Dropped, the surviving replicas' mean would pass for every seed's.
  stat = results.Stat.of([2.0, np.nan, 1.0])
  assert np.isnan(stat.mean) and np.isnan(stat.std)
  assert results.Stat.of([2.0, 1.0]) == results.Stat(1.5, np.std([2.0, 1.0], ddof=1))


def test_a_point_is_flat_only_where_every_replica_is():
  """ln_warmup's Post-LN point at 1e-2 with warmup, in shape: one seed
  stalled (its loss rising 0.05%), two still falling 3-4% over the last
  fifth; their mean falls 1.75%, under the 2% criterion. The point is not
  flat (it was called flat from the mean), and its curve's label says why."""
  steps_N = np.arange(100, 1001, 100)
  stalled = [4.0] * 9 + [4.002]
  falling = [[2.07] * 8 + [2.035, 2.0], [2.16] * 8 + [2.12, 2.08]]  # 3.4%, 3.7% from step 800
  loss_NxR = np.stack([stalled, *falling], axis=1)
  mean_N = loss_NxR.mean(axis=1)
  assert results.is_flat(results.late_improvement(steps_N, mean_N), mean_N[-1])
  assert [
    results.is_flat(results.late_improvement(steps_N, loss_N), loss_N[-1]) for loss_N in loss_NxR.T
  ] == [True, False, False]
  assert results.replicas_flat(steps_N, loss_NxR) is False
  assert results.replicas_flat(steps_N, loss_NxR[:, :1]) is True
  assert results.replicas_flat(steps_N[1::2], loss_NxR[1::2]) is None  # too few evaluations
  improvement = 100 * results.late_improvement(steps_N, mean_N)
  assert figures.flatness_mark(steps_N, mean_N, flat=False) == (
    f"not flat: a replica falls, mean {-improvement:+.1f}%"
  )
  assert figures.flatness_mark(steps_N, mean_N, flat=True) == f"flat, {-improvement:+.1f}%"
  # The other way: the mean still falls 2.3% (a seed flat by nats near zero
  # beside one flat at 1.9%) while every seed is flat: the label says so.
  seeds_NxR = np.stack([[3.058] * 8 + [3.03, 3.0], [0.0599] * 8 + [0.055, 0.05]], axis=1)
  assert results.replicas_flat(steps_N, seeds_NxR) is True
  mean_N = seeds_NxR.mean(axis=1)
  assert not results.is_flat(results.late_improvement(steps_N, mean_N), mean_N[-1])
  improvement = 100 * results.late_improvement(steps_N, mean_N)
  assert figures.flatness_mark(steps_N, mean_N, flat=True) == (
    f"flat: every replica, mean {-improvement:+.1f}%"
  )


def test_results_tables_report_the_flattening_criterion(sweep_dir, points, monkeypatch):
  # Two evaluations (steps 2 and 4): one in the last fifth, too few for a verdict.
  rows = summaries(sweep_dir, points)
  assert [row.late_improvement for row in rows] == [None] * 4
  csv_path, md_path = results.write_results(rows, sweep_dir)
  with open(csv_path, newline="") as f:
    assert [row["flat"] for row in csv.DictReader(f)] == ["unknown", "", "unknown", "unknown"]
  lines = md_path.read_text().splitlines()
  assert "less than 2%" in lines[0] and "judged only with at least 3 evaluations" in lines[0]
  # With one evaluation enough (as a run evaluated often would have them):
  monkeypatch.setattr(results, "FLAT_MIN_EVALUATIONS", 1)
  rows = summaries(sweep_dir, points)
  assert rows[0].late_improvement == pytest.approx((3.2 - 2.25) / 3.2, rel=1e-12)
  assert rows[1].late_improvement is None  # diverged
  assert rows[3].late_improvement is None  # one evaluation: none before the last fifth
  csv_path, md_path = results.write_results(rows, sweep_dir)
  with open(csv_path, newline="") as f:
    table = list(csv.DictReader(f))
  assert float(table[0]["late_improvement"]) == pytest.approx((3.2 - 2.25) / 3.2, rel=1e-12)
  assert [row["flat"] for row in table] == ["no", "", "no", "unknown"]
  lines = md_path.read_text().splitlines()
  header = [cell.strip() for cell in lines[2].strip("|").split("|")]
  first = dict(zip(header, (c.strip() for c in lines[4].strip("|").split("|"))))
  assert (first["val change, last fifth"], first["flat"]) == ("-29.7%", "no")


def test_write_results_rejects_no_rows(tmp_path):
  with pytest.raises(ValueError, match="^rows: no points"):
    results.write_results([], tmp_path)


class FakeLinePlot:
  """Stands in for txf.analysis.plots.line_plot_figure: records the call, returns a Figure."""

  def __init__(self):
    self.calls = []

  def __call__(
    self,
    series,
    title,
    xlabel,
    ylabel,
    logx=False,
    styles=None,
    bounds=(None, None),
    legend_below=False,
  ):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    self.calls.append(
      dict(
        series=series,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        logx=logx,
        styles=styles,
        bounds=bounds,
        legend_below=legend_below,
      )
    )
    figure = Figure()
    FigureCanvasAgg(figure)
    for label, (x, y, _) in series.items():
      figure.add_subplot().plot(x, y, label=label)
    return figure


def assert_png(path):
  data = path.read_bytes()
  assert data[:8] == PNG_MAGIC and len(data) > 1000


def test_loss_curves_plot_mean_and_std_per_point(sweep_dir, points, monkeypatch):
  line_plot = FakeLinePlot()
  path = figures.plot_loss_curves(summaries(sweep_dir, points), sweep_dir, line_plot=line_plot)
  assert_png(path)
  (call,) = line_plot.calls
  # Labelled in words, with the flattening verdict: unknown, one evaluation
  # (step 4) in the last fifth of each.
  # The verdict short, the window and the rule once, in the title.
  assert list(call["series"]) == [
    "RoPE, Pre-LN (flat: unknown, 1 evaluation)",
    "learned, Pre-LN (flat: unknown, 1 evaluation)",
    "learned, Post-LN (flat: unknown, 1 evaluation)",
  ]
  assert "the mean's change over the last fifth of training" in call["title"]
  assert "flat: every replica < 2% or 0.01 nats better there" in call["title"]
  assert "unknown with < 3 evaluations there" in call["title"]
  # A loss is >= 0: the band is clipped there; the legend below the axes.
  assert call["bounds"] == (0.0, None) and call["legend_below"]
  assert "clipped at 0" in call["title"]
  assert "; diverged, not drawn: RoPE, Post-LN" in call["title"]
  steps, mean, std = next(iter(call["series"].values()))
  np.testing.assert_array_equal(steps, [2, 4])
  np.testing.assert_allclose(mean, [3.2, 2.25], rtol=1e-12)
  np.testing.assert_allclose(std, [0.2 / math.sqrt(2), 0.5 / math.sqrt(2)], rtol=1e-12)
  assert "step" in call["xlabel"] and "nats/token" in call["ylabel"] and not call["logx"]
  assert set(call["styles"]) == set(call["series"])
  # With one evaluation enough: rope_pre (3.2 -> 2.25) and learned_pre (3.0 ->
  # 2.5) improved by 29.7% and 16.7%; learned_post has no evaluation before.
  monkeypatch.setattr(results, "FLAT_MIN_EVALUATIONS", 1)
  figures.plot_loss_curves(summaries(sweep_dir, points), sweep_dir, line_plot=line_plot)
  assert list(line_plot.calls[-1]["series"]) == [
    "RoPE, Pre-LN (not flat, -29.7%)",
    "learned, Pre-LN (not flat, -16.7%)",
    "learned, Post-LN (flat: unknown, 1 evaluation)",
  ]
  monkeypatch.undo()

  path = figures.plot_loss_curves(
    summaries(sweep_dir, points), sweep_dir, metric="loss", line_plot=line_plot
  )
  assert path.name == figures.TRAIN_LOSS_CURVES_PNG
  train = line_plot.calls[-1]
  # The diverged point is not drawn (before, its blow-up set the axis: to
  # 5e11 in a reviewer's sweep), and the title says so.
  assert "training loss" in train["ylabel"]
  assert list(train["series"]) == ["RoPE, Pre-LN", "learned, Pre-LN", "learned, Post-LN"]
  assert "; diverged, not drawn: RoPE, Post-LN" in train["title"]
  assert "flat" not in train["title"]
  steps, mean, std = train["series"]["RoPE, Pre-LN"]
  np.testing.assert_array_equal(steps, [2, 4])
  np.testing.assert_allclose(mean, [3.1, 2.4], rtol=1e-12)
  np.testing.assert_allclose(std, [0.2 / math.sqrt(2), 0.4 / math.sqrt(2)], rtol=1e-12)
  with pytest.raises(ValueError, match="metric: 'accuracy'"):
    figures.plot_loss_curves(
      summaries(sweep_dir, points), sweep_dir, metric="accuracy", line_plot=line_plot
    )


def test_point_styles_colour_the_leading_fields_and_dash_the_last(points):
  """Grid position x norm_placement: one colour per position, one line
  style per norm placement."""
  styles = figures.point_styles(points)
  by_values = {tuple(p.overrides.values()): styles[p.name] for p in points}
  assert by_values[("rope", "pre")]["color"] == by_values[("rope", "post")]["color"]
  assert by_values[("rope", "pre")]["color"] != by_values[("learned", "pre")]["color"]
  assert by_values[("rope", "pre")]["linestyle"] == by_values[("learned", "pre")]["linestyle"]
  assert by_values[("rope", "pre")]["linestyle"] != by_values[("rope", "post")]["linestyle"]
  one_field = grid.expand(
    ml_collections.ConfigDict(
      dict(base=points[0].config, grid=grid.make_grid({"model.position": ["rope", "alibi"]}))
    )
  )
  colours = {style["color"] for style in figures.point_styles(one_field).values()}
  assert len(colours) == 2


def test_point_labels_are_words(points):
  assert list(figures.point_labels(points).values()) == [
    "RoPE, Pre-LN",
    "RoPE, Post-LN",
    "learned, Pre-LN",
    "learned, Post-LN",
  ]
  assert figures.value_words("model.position", "t5_bias") == "T5 bias"
  assert figures.value_words("model.position", "none") == "NoPE"
  assert figures.value_words("train.learning_rate", 0.003) == "learning rate 0.003"
  assert figures.value_words("train.warmup_steps", 30) == "warmup steps 30"
  assert figures.value_words("model.embed_norm", True) == "embed norm on"
  # Labels that would collide fall back to the point names.
  config = ml_collections.ConfigDict(dict(base=points[0].config))
  config.base.model.update(dict(dropout_rate=0.0))
  config.grid = grid.make_grid({"model.dropout_rate": [0.0, 0.1]})
  assert list(figures.point_labels(grid.expand(config)).values()) == [
    "dropout rate 0",
    "dropout rate 0.1",
  ]
  twins = [
    grid.Point(0, "a=x", {"a.rate": 1}, config.base),
    grid.Point(1, "b=x", {"b.rate": 1}, config.base),
  ]
  assert figures.point_labels(twins) == {"a=x": "a=x", "b=x": "b=x"}


def test_loss_curves_fit_their_title_and_legend_at_any_grid_size(tmp_path):
  """The PNGs as written: the title wrapped inside the figure, the legend
  inside it too, with 2 and with 12 curves."""
  from txf.analysis.plots import line_plot_figure

  title = (
    "Validation loss per point (mean ± std over 2 replicas); flat: < 2% better over the "
    "last fifth (unknown with < 3 evaluations there)"
  )
  for count in (2, 12):
    series = {
      f"curve {i}, Post-LN (not flat: -3.1% in the last fifth)": ([1, 2, 3], [3.0, 2.5, 2.0 + i])
      for i in range(count)
    }
    figure = line_plot_figure(series, title=title, xlabel="step", ylabel="loss")
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    inside = figure.bbox
    text = figure._suptitle
    assert " ".join(text.get_text().split()) == title
    for artist in (text, figure.axes[0].get_legend()):
      box = artist.get_window_extent(renderer)
      assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and box.y1 <= inside.y1, (count, box)


def test_extrapolation_plot_keeps_applicable_lengths_on_a_log_axis(sweep_dir, points):
  line_plot = FakeLinePlot()
  path = figures.plot_extrapolation(
    summaries(sweep_dir, points), sweep_dir, protocol="sliding", line_plot=line_plot
  )
  assert path.name == "extrapolation_sliding.png"
  assert_png(path)
  (call,) = line_plot.calls
  assert call["logx"] and "tokens" in call["xlabel"]
  lengths, losses, std = call["series"]["learned, Pre-LN"]
  np.testing.assert_array_equal(lengths, [8])
  np.testing.assert_array_equal(losses, [1.9])
  assert std is None and list(call["series"]) == ["RoPE, Pre-LN", "learned, Pre-LN"]


def test_per_position_plot_draws_each_point_that_has_one(sweep_dir, points):
  per_position = [3.0, 2.0, None, 1.5]  # null: no token scored at position 2
  write_extrapolation(
    sweep_dir / points[0].name,
    [True, True, False],
    per_position={"length": 4, "loss": per_position},
  )
  line_plot = FakeLinePlot()
  path = figures.plot_per_position(summaries(sweep_dir, points), sweep_dir, line_plot=line_plot)
  assert path.name == figures.PER_POSITION_PNG
  assert_png(path)
  (call,) = line_plot.calls
  ((label, (positions, losses, std)),) = call["series"].items()
  assert label == "RoPE, Pre-LN (4 tokens)" and std is None
  np.testing.assert_array_equal(positions, [0, 1, 2, 3])
  np.testing.assert_array_equal(losses, [3.0, 2.0, np.nan, 1.5])
  assert "position" in call["xlabel"] and "nats/token" in call["ylabel"]

  # Longer windows are averaged over equal spans of positions.
  figures.plot_per_position(summaries(sweep_dir, points), sweep_dir, bins=2, line_plot=line_plot)
  ((_, (positions, losses, _)),) = line_plot.calls[-1]["series"].items()
  np.testing.assert_array_equal(positions, [0.5, 2.5])
  np.testing.assert_array_equal(losses, [2.5, 1.5])  # the null position is left out

  write_extrapolation(
    sweep_dir / points[0].name,
    [True, True, False],
    per_position={"length": 5, "loss": per_position},
  )
  with pytest.raises(ValueError, match="per_position.loss has 4 entries for length 5"):
    results.read_extrapolation(sweep_dir / points[0].name)
  write_extrapolation(
    sweep_dir / points[0].name, [True, True, False], per_position={"loss": per_position}
  )
  with pytest.raises(ValueError, match="missing 'per_position.length'"):
    results.read_extrapolation(sweep_dir / points[0].name)


def test_pre_vs_post_bar_chart_is_written(sweep_dir, points):
  path = figures.plot_pre_vs_post(summaries(sweep_dir, points), sweep_dir)
  assert path.name == figures.PRE_VS_POST_PNG
  assert_png(path)
  with pytest.raises(ValueError, match="^model.window: not a grid field"):
    figures.plot_pre_vs_post(summaries(sweep_dir, points), sweep_dir, split_field="model.window")


def test_the_pre_vs_post_figure_is_drawn_only_when_the_grid_has_both_placements(sweep_dir, points):
  rows = summaries(sweep_dir, points)
  assert sweep_dir / figures.PRE_VS_POST_PNG in runner.summary_files(points, rows, sweep_dir)
  # --grid=model.norm_placement=pre: the field is in the grid with one value.
  pre = [
    index for index, point in enumerate(points) if point.overrides["model.norm_placement"] == "pre"
  ]
  assert len(pre) == 2
  files = runner.summary_files([points[i] for i in pre], [rows[i] for i in pre], sweep_dir)
  assert sweep_dir / results.RESULTS_CSV in files
  assert sweep_dir / figures.PRE_VS_POST_PNG not in files


def test_pre_vs_post_axis_spans_the_losses_not_zero_and_its_legend_sits_beside_it(
  sweep_dir, points
):
  rows = summaries(sweep_dir, points)
  figure = figures.pre_vs_post_figure(rows)
  (axes,) = figure.axes
  low, high = axes.get_ylim()
  means = [row.eval_loss.mean for row in rows if row.eval_loss is not None]
  assert means and 0 < low < min(means) and high > max(means)
  renderer = figure.canvas.get_renderer()
  assert axes.get_legend().get_window_extent(renderer).x0 >= axes.get_window_extent(renderer).x1


def test_pre_vs_post_draws_every_setting_of_the_other_grid_fields(tmp_path):
  """Before, each (encoding, placement) column showed its first point only:
  with a learning-rate axis, half the points were silently not drawn."""
  base = ml_collections.ConfigDict(
    dict(
      replicas=2,
      model=dict(position="rope", norm_placement="pre"),
      train=dict(steps=STEPS, learning_rate=0.003),
    )
  )
  config = ml_collections.ConfigDict(dict(base=base))
  config.grid = grid.make_grid(
    {
      "model.position": ["rope", "alibi"],
      "model.norm_placement": ["pre", "post"],
      "train.learning_rate": [0.001, 0.01],
    }
  )
  rows, means = [], {}
  for index, point in enumerate(grid.expand(config)):
    means[tuple(point.overrides.values())] = mean = 2.0 + 0.1 * index
    write_run(tmp_path / point.name, [replica_row(STEPS, "eval_loss", [mean - 0.1, mean + 0.1])])
    rows.append(results.summarize_point(point, tmp_path / point.name))
  (axes,) = figures.pre_vs_post_figure(rows).axes
  drawn = {
    bars.get_label(): np.asarray(bars.lines[0].get_ydata(), float) for bars in axes.containers
  }
  words = {"pre": "Pre-LN", "post": "Post-LN"}
  expected = {
    f"{words[placement]}, learning rate {rate:g}": [
      means[(position, placement, rate)] for position in ("rope", "alibi")
    ]
    for placement in ("pre", "post")
    for rate in (0.001, 0.01)
  }
  assert drawn.keys() == expected.keys()
  for label, losses in expected.items():
    np.testing.assert_allclose(drawn[label], losses, rtol=1e-12)
  assert_png(figures.plot_pre_vs_post(rows, tmp_path))


def test_a_cut_extrapolation_file_reads_as_missing_with_one_line_naming_it(sweep_dir, points):
  path = sweep_dir / points[0].name / results.EXTRAPOLATION_FILE
  path.write_text(path.read_text()[:40])  # a writer killed mid-file
  lines = []
  row = results.summarize_point(points[0], path.parent, log=lines.append)
  assert row.extrapolation is None and row.status == "done"
  assert row.eval_loss.mean == pytest.approx(2.25, rel=1e-12)  # the rest of the row stands
  (line,) = lines
  assert line.startswith(f"{path}: not valid JSON") and "\n" not in line


def test_an_extrapolation_of_an_earlier_step_is_left_out_of_the_summary_in_one_line(
  sweep_dir, points
):
  """Before, the table put the extrapolation of an older checkpoint beside
  the final evaluation (a point killed before its final checkpoint)."""
  rope_pre, learned_pre = sweep_dir / points[0].name, sweep_dir / points[2].name
  write_extrapolation(rope_pre, [True, True, True], step=STEPS - 2)
  write_extrapolation(learned_pre, [True, False, False], step=STEPS)
  lines = []
  rows = [results.summarize_point(p, sweep_dir / p.name, log=lines.append) for p in points]
  assert rows[0].extrapolation is None and rows[0].eval_loss.mean == pytest.approx(2.25)
  assert rows[2].extrapolation.step == STEPS
  assert lines == [
    f"point 0 ({points[0].name}): extrapolation.json is of step {STEPS - 2}, the point is "
    f"trained to {STEPS}: left out of the summary (a sweep rerun recomputes it)"
  ]
  csv_text = runner.summary_files(points, rows, sweep_dir)[sweep_dir / results.RESULTS_CSV]
  table = {row["point"]: row for row in csv.DictReader(csv_text.splitlines())}
  assert table[points[0].name]["sliding@8"] == "" and table[points[2].name]["sliding@8"] == "1.9"


@pytest.mark.parametrize(
  "recorded, tokens, why",
  [
    (dict(factors=[1, 2]), None, r"is at factors \[1, 2\], the sweep's are \[1, 2, 4, 8, 16\]"),
    (dict(stride=[4, 3, 16]), None, r"slides by 3 at some length, not the sweep's half window"),
    (
      dict(num_tokens=2112),
      2048,
      r"scores 2112 validation tokens, the sweep's sweep.extrapolate_tokens is 2048",
    ),
  ],
  ids=["factors", "stride", "tokens"],
)
def test_an_extrapolation_the_sweep_did_not_ask_for_is_left_out_and_recomputed(
  sweep_dir, points, recorded, tokens, why
):
  """txf-extrapolate run by hand on a point (other --factors, --stride or
  --num_tokens) wrote its own extrapolation.json: the sweep took it as the
  point's, its columns beside the sweep's evaluations of the other points."""
  rope_pre, learned_pre = sweep_dir / points[0].name, sweep_dir / points[2].name
  # The sweep's own: default factors, half-window strides (4, 8, 16), its tokens.
  own = dict(step=STEPS, factors=[1, 2, 4, 8, 16], stride=[4, 8, 16], num_tokens=2048)
  write_extrapolation(rope_pre, [True, True, True], **{**own, **recorded})
  write_extrapolation(learned_pre, [True, True, False], **{**own, "stride": [4, 8, None]})
  lines = []
  rows = [
    results.summarize_point(p, sweep_dir / p.name, extrapolate_tokens=tokens, log=lines.append)
    for p in points
  ]
  assert rows[0].extrapolation is None and rows[2].extrapolation is not None
  assert len(lines) == 1
  assert re.fullmatch(
    rf"point 0 \({re.escape(points[0].name)}\): extrapolation.json {why}: left out of the "
    r"summary \(a sweep rerun recomputes it\)",
    lines[0],
  )
  assert results.needs_extrapolation(points[0], rope_pre, lines.append, tokens)
  assert lines[-1].endswith(": out of date")
  assert not results.needs_extrapolation(points[2], learned_pre, lines.append, tokens)
  # The sweep's tokens are compared only where it names them.
  if tokens is not None:
    assert results.needs_extrapolation(points[0], rope_pre, lines.append, None) is False


@pytest.mark.parametrize("failing", [results.RESULTS_CSV, results.RESULTS_MD])
def test_a_full_disk_while_writing_results_is_one_line_and_keeps_the_old_file(
  sweep_dir, points, failing
):
  rows = summaries(sweep_dir, points)
  written = results.write_results(rows, sweep_dir)
  before = {path.name: path.read_bytes() for path in written}
  (sweep_dir / points[0].name / results.EXTRAPOLATION_FILE).unlink()  # new tables differ
  nth_write = [results.RESULTS_CSV, results.RESULTS_MD].index(failing) + 1
  with full_disk(files_in(sweep_dir), nth_write), pytest.raises(WriteError) as error:
    results.write_results(summaries(sweep_dir, points), sweep_dir)
  assert str(error.value) == f"{sweep_dir / failing}: No space left on device"
  # Both as they were: the tables are replaced as one set (before, a full
  # disk on results.md left a new results.csv beside the old results.md).
  assert {path.name: path.read_bytes() for path in written} == before
  assert not [p for p in sweep_dir.iterdir() if p.name.endswith(".tmp")]


def test_a_full_disk_while_writing_a_plot_keeps_the_old_png(sweep_dir, points):
  path = figures.plot_pre_vs_post(summaries(sweep_dir, points), sweep_dir)
  before = path.read_bytes()
  with (
    full_disk(files_in(sweep_dir), 1),
    pytest.raises(WriteError, match=f"^{path}: No space left on device$"),
  ):
    figures.plot_pre_vs_post(
      summaries(sweep_dir, points),
      sweep_dir,
      group_field="model.norm_placement",
      split_field="model.position",
    )
  assert path.read_bytes() == before


def contents(directory):
  """{name: bytes} of the files directly in `directory`."""
  return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


@pytest.fixture
def summarized(sweep_dir, points):
  """sweep_dir with a summary written, then an input changed (point 0's
  extrapolation cut: it reads as missing, with a log line), so that a new
  summary would differ in its tables and figures. Returns the old files."""
  runner.summarize(points, sweep_dir, log=lambda line: None)
  before = contents(sweep_dir)
  path = sweep_dir / points[0].name / results.EXTRAPOLATION_FILE
  path.write_text(path.read_text()[:30])
  return before


def test_a_summary_names_its_unfinished_points_and_gives_them_no_verdict(sweep_dir, points):
  """A summary taken while points train said only 'wrote ...', and judged an
  unfinished curve's last fifth flat as a finished one's."""
  # The partial point, to train 100 steps, at 60: falling, then level so far.
  config = points[3].config.copy_and_resolve_references()
  config.train.steps = 100
  points = [*points[:3], dataclasses.replace(points[3], config=config)]
  rows = [replica_row(step, "eval_loss", [2.0 + 1 / step] * 2) for step in range(1, 61)]
  (sweep_dir / points[3].name / "metrics.jsonl").write_text(
    "".join(json.dumps(row) + "\n" for row in rows)
  )
  lines = []
  summary = runner.summarize(points, sweep_dir, log=lines.append)
  assert lines[-1] == (
    f"not finished: point 3 ({points[3].name}): their rows hold the last values they logged, "
    "with no flat verdict, and they take part in no comparison"
  )
  row = summary[3]
  assert (row.status, row.late_improvement) == ("partial", None)
  assert results.late_improvement(*row.curves["eval_loss"][:2]) is not None  # there was one
  table = {
    r["point"]: r for r in csv.DictReader(io.StringIO((sweep_dir / "results.csv").read_text()))
  }
  assert table[points[3].name]["flat"] == "unknown"


def test_a_summary_removes_a_killed_summarys_temporaries(sweep_dir, points):
  """No lock guards a sweep's directory: a summary killed mid-write left
  .results.csv.<hex>.tmp there for good; one a live process writes stays."""
  killed = f".results.csv.{storage._HOST}-{gone_pid()}-0123456789ab.tmp"
  writing = f".results.md.{storage._HOST}-{os.getpid()}-0123456789ab.tmp"
  for name in (killed, writing):
    (sweep_dir / name).write_text("a,b")
  runner.summarize(points, sweep_dir, log=lambda line: None)
  assert [p.name for p in sweep_dir.iterdir() if p.name.endswith(".tmp")] == [writing]


def test_a_summary_removes_the_plots_of_an_earlier_one_it_does_not_draw(sweep_dir, points):
  """Before, the plots of extrapolations since removed (and the Pre- vs
  Post-LN plot of a grid since narrowed) stayed beside the new tables."""
  runner.summarize(points, sweep_dir, log=lambda line: None)
  drawn = {"extrapolation_sliding.png", figures.PRE_VS_POST_PNG, figures.LOSS_CURVES_PNG}
  assert drawn <= contents(sweep_dir).keys()
  for point in points:
    (sweep_dir / point.name / results.EXTRAPOLATION_FILE).unlink(missing_ok=True)
  pre = [point for point in points if point.overrides["model.norm_placement"] == "pre"]
  (sweep_dir / "notes.png").write_bytes(b"the user's")  # not a summary's: stays
  lines = []
  runner.summarize(pre, sweep_dir, log=lines.append)
  assert sorted(contents(sweep_dir)) == sorted(
    [results.RESULTS_CSV, results.RESULTS_MD, figures.LOSS_CURVES_PNG]
    + [figures.TRAIN_LOSS_CURVES_PNG, "notes.png"]
  )
  stale = [
    sweep_dir / name
    for name in (
      figures.PRE_VS_POST_PNG,
      "extrapolation_non_overlapping.png",
      "extrapolation_sliding.png",
    )
  ]
  assert lines[-1] == (
    f"removed {', '.join(sorted(map(str, stale)))} (an earlier summary's: this one has "
    "no such plot)"
  )


def test_a_sigterm_as_the_summary_is_made_writes_none_of_it(
  sweep_dir, points, summarized, sigterm_is_caught
):
  lines = []

  def log(line):  # the scheduler's SIGTERM, as the summary reads point 0
    lines.append(line)
    os.kill(os.getpid(), signal.SIGTERM)

  with PreemptionGuard() as preemption:
    assert runner.summarize(points, sweep_dir, log=log, preemption=preemption) is None
  assert sigterm_is_caught == [] and preemption.requested  # the guard took it
  assert lines[-1] == (
    "sweep preempted before its results were written (results.csv, results.md and the "
    "plots are as they were); rerun the same command to write them"
  )
  assert contents(sweep_dir) == summarized  # tables and figures: the previous set


def test_a_sigterm_while_the_summary_is_written_leaves_the_whole_new_set(
  sweep_config, sweep_dir, summarized, sigterm_is_caught, monkeypatch
):
  """Before, results.csv and results.md were rewritten and the figures not."""

  def preempted_then_written(files):
    os.kill(os.getpid(), signal.SIGTERM)
    return write_files(files)

  monkeypatch.setattr(runner, "write_files", preempted_then_written)
  # These points' configs hold only what a summary reads: not a run to check.
  monkeypatch.setattr(runner, "check_point_config", lambda config: None)
  monkeypatch.setattr(runner, "check_resumable", lambda *args, **kwargs: None)
  monkeypatch.setattr(runner, "config_changes", lambda *args: [])
  rows = runner.run_sweep(sweep_config, sweep_dir, summarize_only=True, log=lambda line: None)
  assert rows is not None and sigterm_is_caught == []
  written = contents(sweep_dir)
  assert set(written) == set(summarized)
  changed = {name for name in written if written[name] != summarized[name]}
  # Point 0 lost its extrapolation: both tables and every figure drawn from
  # extrapolations change.
  assert {results.RESULTS_CSV, results.RESULTS_MD, "extrapolation_sliding.png"} <= changed


def test_a_summary_reads_the_replicas_config_json_records(sweep_dir, points):
  """Summarized with a sweep config asking for 3 replicas, points trained
  with 2 were read as 2 of 3 (the sweep config's count); now as on disk."""
  rows = runner.summarize(points, sweep_dir, log=lambda line: None)
  asked = [dataclasses.replace(p, config=p.config.copy_and_resolve_references()) for p in points]
  for point in asked:
    point.config.replicas = 3
  again = runner.summarize(asked, sweep_dir, log=lambda line: None)
  assert [r.replicas for r in again] == [r.replicas for r in rows] == [2, 2, 2, 2]
  assert [r.eval_loss for r in again] == [r.eval_loss for r in rows]


def test_a_summary_in_an_array_job_reads_every_point(sweep_config, sweep_dir, points, monkeypatch):
  """An array job's index (SLURM_ARRAY_TASK_ID) is the training's: with it
  set, --summarize returned after selecting one point and wrote nothing."""
  monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
  # These points' configs hold only what a summary reads: not a run to check.
  monkeypatch.setattr(runner, "check_point_config", lambda config: None)
  monkeypatch.setattr(runner, "check_resumable", lambda *args, **kwargs: None)
  monkeypatch.setattr(runner, "config_changes", lambda *args: [])
  rows = runner.run_sweep(sweep_config, sweep_dir, summarize_only=True, log=lambda line: None)
  assert [row.point.name for row in rows] == [point.name for point in points]
  assert (sweep_dir / results.RESULTS_MD).exists()


def test_a_point_whose_rows_lack_a_replica_is_one_error_naming_the_file(sweep_dir, points):
  metrics = sweep_dir / points[0].name / "metrics.jsonl"
  *earlier, last = metrics.read_text().splitlines()
  row = {key: value for key, value in json.loads(last).items() if not key.endswith("/1")}
  metrics.write_text("\n".join([*earlier, json.dumps(row)]) + "\n")
  with pytest.raises(WorkdirError, match=rf"^{re.escape(str(metrics.parent))}: metrics row .*"):
    runner.summarize(points, sweep_dir, log=lambda line: None)


def test_a_metrics_row_or_extrapolation_record_of_the_wrong_shape_is_skipped_or_one_line(
  sweep_dir, points, caplog
):
  """A metrics.jsonl line holding [1], "x" or a step of "x", and an
  extrapolation.json that is a directory: tracebacks in a summary before."""
  point_dir = sweep_dir / points[0].name
  before = results.summarize_point(points[0], point_dir, log=lambda line: None)
  with open(point_dir / "metrics.jsonl", "a") as f:
    f.write('[1]\n"x"\n{"step": "x", "eval_loss": 1.0}\n')
  assert results.summarize_point(points[0], point_dir, log=lambda line: None) == before
  assert "not a row with an int step" in caplog.text
  (point_dir / results.EXTRAPOLATION_FILE).unlink()
  (point_dir / results.EXTRAPOLATION_FILE).mkdir()
  with pytest.raises(ValueError, match=r"extrapolation\.json: cannot be read \(Is a directory\)$"):
    results.read_extrapolation(point_dir)


# ---------------------------------------------------------------------------
# An outside review of the figures (2026-12-01): bands and bars inside the
# quantity's range, legends off the data, axes and legends in words.


def _overlaps(one, other):
  return one.x0 < other.x1 and other.x0 < one.x1 and one.y0 < other.y1 and other.y0 < one.y1


def _solved_by_one_replica(tmp_path):
  """Rows of a width grid where one replica of three solved MQAR (accuracy
  1, loss 0.0) and the others did not: mean - std < 0, mean + std > 1."""
  base = ml_collections.ConfigDict(
    dict(replicas=3, model=dict(family="decoder", d_model=32), train=dict(steps=STEPS))
  )
  config = ml_collections.ConfigDict(dict(base=base))
  config.grid = grid.make_grid({"model.family": ["decoder", "lstm"], "model.d_model": [32, 64]})
  rows = []
  for point in grid.expand(config):
    solved = point.overrides["model.family"] == "decoder"
    rows_written = [
      replica_row(step, "eval_loss", [0.0, 2.0, 2.1] if solved else [2.5, 2.6, 2.7])
      for step in (2, STEPS)
    ]
    rows_written[-1].update(
      replica_row(STEPS, "eval_accuracy", [1.0, 0.1, 0.12] if solved else [0.95, 0.97, 0.99])
    )
    write_run(tmp_path / point.name, rows_written)
    rows.append(results.summarize_point(point, tmp_path / point.name))
  return rows


def test_loss_bands_and_accuracy_bars_stay_inside_their_range(tmp_path):
  """Before, mqar_steps' band reached -0.5 nats/token and the accuracy bars
  ran below 0 and above 1, where one replica solved the task."""
  from txf.analysis.plots import line_plot_figure

  rows = _solved_by_one_replica(tmp_path)
  drawn = []
  figures.plot_loss_curves(
    rows,
    tmp_path,
    line_plot=lambda series, **options: (
      drawn.append(line_plot_figure(series, **options)) or drawn[-1]
    ),
  )
  (axes,) = drawn[0].axes
  bands = [vertices for band in axes.collections for vertices in band.get_paths()]
  assert bands and min(path.vertices[:, 1].min() for path in bands) >= 0.0
  figure = figures.accuracy_vs_width_figure(rows)
  ends = np.concatenate(
    [segments.get_segments() for bars in figure.axes[0].containers for segments in bars.lines[2]]
  )[:, :, 1]
  assert ends.min() >= 0.0 and ends.max() <= 1.0
  assert "clipped to 0..1" in figure.get_suptitle()


def test_sweep_legends_cover_no_data_and_say_fields_in_words(sweep_dir, points, tmp_path):
  """Before, the loss curves' legend sat over the curves (mqar_steps' LSTM),
  and the Pre-/Post-LN figure said 'model.position' and 'model.norm_placement'."""
  from txf.analysis.plots import line_plot_figure

  write_extrapolation(
    sweep_dir / points[0].name,
    [True, True, False],
    per_position={"length": 32, "loss": list(np.linspace(3.0, 2.0, 32))},
  )
  drawn = []
  record = lambda series, **options: drawn.append(line_plot_figure(series, **options)) or drawn[-1]
  rows = summaries(sweep_dir, points)
  figures.plot_loss_curves(rows, tmp_path, line_plot=record)
  figures.plot_per_position(rows, tmp_path, line_plot=record)
  assert "each point: the mean over 2 positions" in " ".join(drawn[1].get_suptitle().split())
  for figure in drawn:
    renderer = figure.canvas.get_renderer()
    (axes,) = figure.axes
    (legend,) = figure.legends + ([axes.get_legend()] if axes.get_legend() else [])
    assert not _overlaps(legend.get_window_extent(renderer), axes.get_window_extent(renderer))
  figure = figures.pre_vs_post_figure(rows)
  (axes,) = figure.axes
  assert axes.get_xlabel() == "position encoding"
  assert axes.get_legend().get_title().get_text() == "norm placement"


def test_tuned_values_are_named_and_written_inside_the_axes(tmp_path):
  """Before, '0.001' beside the last width's marker ran past the axes, and
  only the title's '(marked)' said it was a learning rate."""
  rows = tuned_rows(tmp_path, accuracy=lambda value: min(value + 0.6, 1.0))
  figure = figures.accuracy_vs_width_figure(rows)
  renderer = figure.canvas.get_renderer()
  (axes, *_) = figure.axes
  box = axes.get_window_extent(renderer)
  assert axes.texts
  for text in axes.texts:
    assert text.get_text().startswith("lr ")
    extent = text.get_window_extent(renderer)
    assert box.x0 <= extent.x0 and extent.x1 <= box.x1 and box.y0 <= extent.y0
    assert extent.y1 <= box.y1, text.get_text()


def test_an_extrapolation_record_one_entry_longer_than_its_lengths_is_refused(tmp_path):
  """Every per-length list must have exactly one entry per length: a longer
  `applicable` list is as malformed as a shorter one (read, its extra entry
  would shift no column but hide a record written for other lengths)."""
  write_extrapolation(tmp_path, [True, True, True, False])
  with pytest.raises(ValueError, match=r": applicable has 4 entries for 3 lengths$"):
    results.read_extrapolation(tmp_path)


def test_an_extrapolation_record_without_a_step_is_current(sweep_dir, points):
  """A record without `step` (written before records named their step) is
  taken as the final step's: a finished point holding one needs no
  extrapolation, logs nothing, and its row keeps it. Only a record of
  another step is out of date."""
  point, point_dir = points[0], sweep_dir / points[0].name
  assert "step" not in json.loads((point_dir / results.EXTRAPOLATION_FILE).read_text())
  lines = []
  assert results.needs_extrapolation(point, point_dir, lines.append) is False
  assert results.summarize_point(point, point_dir, log=lines.append).extrapolation.step is None
  assert lines == []


def test_throughput_is_the_mean_of_the_rows_that_log_it(tmp_path, points):
  """tokens_per_sec is the mean (as _mean_logged documents) over the rows
  that log it, not their median: a slow first interval (compiling) counts."""
  rates = [100.0, 200.0, 600.0]
  rows = [
    replica_row(step, "loss", [3.0, 3.0], tokens_per_sec=rate)
    for step, rate in zip(range(1, STEPS), rates, strict=True)
  ]
  write_run(tmp_path / "run", [*rows, replica_row(STEPS, "eval_loss", [2.0, 2.0])])
  row = results.summarize_point(points[0], tmp_path / "run")
  assert row.tokens_per_sec == pytest.approx(sum(rates) / len(rates))


def test_a_summarized_point_is_flat_only_where_every_replica_is(tmp_path, sweep_config):
  """summarize_point judges flatness per replica (replicas_flat), not on the
  mean curve: one seed stalled beside one still falling 3.4% over the last
  fifth averages to a fall under the 2% criterion, yet the point is not flat."""
  steps = 1000
  sweep_config.base.train.steps = steps
  point = grid.expand(sweep_config)[0]
  steps_N = list(range(100, steps + 1, 100))
  stalled, falling = [4.0] * 9 + [4.002], [2.07] * 8 + [2.035, 2.0]
  write_run(
    tmp_path / "run",
    [
      replica_row(s, "eval_loss", [a, b]) for s, a, b in zip(steps_N, stalled, falling, strict=True)
    ],
    steps=steps,
  )
  mean_N = np.mean([stalled, falling], axis=0)
  assert results.is_flat(results.late_improvement(steps_N, mean_N), mean_N[-1])  # the mean is
  row = results.summarize_point(point, tmp_path / "run")
  assert row.status == "done" and row.flat is False
