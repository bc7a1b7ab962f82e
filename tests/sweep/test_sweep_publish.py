"""Tests for txf.sweep.publish, and the sweep's refusal of a run trained
longer than its point, on a committed sweep's raw outputs
(docs/data/t5_distance: 4 points, 3 replicas, each with its extrapolation)."""

import json
import os
import pathlib
import re
import shutil

import pytest

from conftest import gone_pid
from full_disk import full_disk, read_only
from txf import configs, storage
from txf.rundir.workdir import WorkdirError
from txf.storage import WriteError
from txf.sweep import grid, results, runner
from txf.sweep.grid import GridError
from txf.sweep.publish import RAW_FILES, publish
from txf.sweep.results import is_flat, late_improvement

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "data" / "t5_distance"
# What a run directory holds besides its raw outputs; none of it is published.
# Its final checkpoint (the points trained 1800 steps) makes a point done.
NOT_RAW = ("checkpoints/1800/state", "samples.txt", "tb/events.out.tfevents.1", "loss_curves.png")


@pytest.fixture(scope="module")
def points():
  return grid.expand(configs.load(ROOT / "txf" / "configs" / "sweeps" / "t5_distance.py"))


def sweep_workdir(tmp_path, points) -> pathlib.Path:
  """The committed points as a sweep's run directories hold them: raw outputs
  beside checkpoints, samples, event files and plots."""
  workdir = tmp_path / "runs"
  for point in points:
    shutil.copytree(DATA / point.name, workdir / point.name)
    for name in NOT_RAW:
      (workdir / point.name / name).parent.mkdir(parents=True, exist_ok=True)
      (workdir / point.name / name).write_text("not a raw output")
  return workdir


def test_publish_copies_only_the_raw_outputs_and_tabulates_them_as_committed(tmp_path, points):
  lines = []
  rows = publish(points, sweep_workdir(tmp_path, points), tmp_path / "data", log=lines.append)
  published = tmp_path / "data"
  assert sorted(os.listdir(published)) == sorted(
    [point.name for point in points] + [results.RESULTS_CSV, results.RESULTS_MD]
  )
  for point in points:
    committed = sorted(os.listdir(DATA / point.name))
    assert sorted(os.listdir(published / point.name)) == committed
    assert set(committed) <= set(RAW_FILES)
    for name in committed:
      assert (published / point.name / name).read_bytes() == (DATA / point.name / name).read_bytes()
  # The table is the sweep's own summary of the copies: the committed one.
  assert (published / results.RESULTS_MD).read_text() == (DATA / results.RESULTS_MD).read_text()
  assert [row.status for row in rows] == ["done"] * len(points)
  assert lines[-1].startswith(f"published {len(points)} points into {published}: ")


@pytest.mark.parametrize("destination", [".", "..", "data/.."])
def test_publishing_over_the_current_directory_is_refused_naming_it(
  tmp_path, points, monkeypatch, destination
):
  """--publish=. was a traceback ('PosixGPath('.') has an empty name'); the
  staged copy would replace the directory the shell stands in."""
  workdir = sweep_workdir(tmp_path, points)
  (tmp_path / "data").mkdir()
  monkeypatch.chdir(tmp_path / "data")
  named = os.path.abspath(destination)
  with pytest.raises(WorkdirError, match=rf"^{re.escape(named)} holds the current directory"):
    publish(points, workdir, destination)
  assert os.listdir(tmp_path / "data") == []
  publish(points, workdir, "published", log=lambda line: None)  # 'X/..'-free: as asked
  assert results.RESULTS_CSV in os.listdir(tmp_path / "data" / "published")


def test_a_diverged_point_is_published_with_its_divergence_record(tmp_path, points):
  workdir = sweep_workdir(tmp_path, points)
  results.mark_diverged(workdir / points[1].name, "loss is nan at step 40")
  rows = publish(points, workdir, tmp_path / "data", log=lambda line: None)
  assert [row.status for row in rows] == ["done", "diverged", "done", "done"]
  record = json.loads((tmp_path / "data" / points[1].name / results.DIVERGED_FILE).read_text())
  assert record == {"error": "loss is nan at step 40"}


def test_an_unfinished_point_is_named_and_nothing_is_published(tmp_path, points):
  workdir = sweep_workdir(tmp_path, points)
  metrics = workdir / points[3].name / "metrics.jsonl"
  rows = metrics.read_text().splitlines()
  metrics.write_text("\n".join(rows[: len(rows) // 2]) + "\n")  # stopped half way
  with pytest.raises(
    WorkdirError,
    match=rf"^{workdir}: point 3 \({points[3].name}\) is partial, not finished: nothing published$",
  ):
    publish(points, workdir, tmp_path / "data")
  assert not (tmp_path / "data").exists()


def test_a_destination_that_holds_anything_is_refused_and_kept(tmp_path, points):
  destination = tmp_path / "data"
  destination.mkdir()
  (destination / "notes.txt").write_text("mine")
  with pytest.raises(WorkdirError, match=rf"^{destination}: not empty: publish into a new"):
    publish(points, sweep_workdir(tmp_path, points), destination)
  assert os.listdir(destination) == ["notes.txt"]
  assert (destination / "notes.txt").read_text() == "mine"


def test_a_full_disk_publishes_nothing_in_one_line_and_a_rerun_works(tmp_path, points):
  """Before, a traceback, one point's files and a cut table were left, and the
  rerun was refused as 'not empty'."""
  workdir, destination = sweep_workdir(tmp_path, points), tmp_path / "data"
  # The last file of the publication, results.md, meets the full disk.
  tables = re.escape(str(tmp_path)) + r"/\.data\.[0-9a-f]+-\d+-[0-9a-f]+\.tmp/\.results\.md\."
  with (
    full_disk(tables, 1) as disk,
    pytest.raises(WriteError, match=f"^{destination}: No space left on device$"),
  ):
    publish(points, workdir, destination, log=lambda line: None)
  assert disk.failed and sorted(os.listdir(tmp_path)) == ["runs"]  # no data, no temporary
  killed = tmp_path / f".data.{storage._HOST}-{gone_pid()}-0123456789ab.tmp"  # a killed publish's
  killed.mkdir()
  publish(points, workdir, destination, log=lambda line: None)
  assert (destination / results.RESULTS_MD).read_text() == (DATA / results.RESULTS_MD).read_text()
  assert sorted(os.listdir(tmp_path)) == ["data", "runs"]


def test_a_destination_in_a_read_only_directory_is_refused_naming_it(tmp_path, points):
  """Before, the line named the hidden staging directory (.data.<hex>.tmp)."""
  workdir, parent = sweep_workdir(tmp_path, points), tmp_path / "read_only"
  parent.mkdir()
  destination = parent / "data"
  with (
    read_only(parent),
    pytest.raises(
      WorkdirError, match=rf"^{destination}: not a writable directory \(Read-only file system\)$"
    ),
  ):
    publish(points, workdir, destination, log=lambda line: None)
  assert os.listdir(parent) == []


def test_a_destination_that_is_a_file_is_refused_in_one_line_and_kept(tmp_path, points):
  """Before, a NotADirectoryError traceback."""
  destination = tmp_path / "data"
  destination.write_text("mine")
  with pytest.raises(WorkdirError, match=rf"^{destination}: exists and is not a directory$"):
    publish(points, sweep_workdir(tmp_path, points), destination)
  assert destination.read_text() == "mine"


def test_a_point_without_its_extrapolation_is_not_finished_and_nothing_published(tmp_path, points):
  """Before, it was published with empty extrapolation columns."""
  workdir = sweep_workdir(tmp_path, points)
  refused = (
    rf"^{workdir}: point 1 \({points[1].name}\) has no extrapolation.json of its final step as "
    r"the sweep evaluates it, so it is not finished \(rerun the sweep to extrapolate it\): "
    r"nothing published$"
  )
  # One txf-extrapolate wrote by hand, at other factors, is not the sweep's.
  record_path = workdir / points[1].name / results.EXTRAPOLATION_FILE
  record = json.loads(record_path.read_text())
  record_path.write_text(json.dumps({**record, "factors": [1, 2]}))
  with pytest.raises(WorkdirError, match=refused):
    publish(points, workdir, tmp_path / "data", log=lambda line: None)
  record_path.unlink()
  with pytest.raises(WorkdirError, match=refused):
    publish(points, workdir, tmp_path / "data")
  assert not (tmp_path / "data").exists()
  # A sweep that does not extrapolate publishes it.
  rows = publish(points, workdir, tmp_path / "data", extrapolated=False, log=lambda line: None)
  assert rows[1].extrapolation is None and rows[0].extrapolation is not None


def test_publish_leaves_out_an_extrapolation_summarize_leaves_out(tmp_path, points):
  """A point's extrapolation.json of other tokens than sweep.extrapolate_tokens
  (a txf-extrapolate by hand): --summarize leaves it out of the tables, and
  --publish --noextrapolate tabulated it, its table not the summary's."""
  workdir = sweep_workdir(tmp_path, points)
  record_path = workdir / points[1].name / results.EXTRAPOLATION_FILE
  record = json.loads(record_path.read_text())
  record_path.write_text(json.dumps({**record, "num_tokens": 2 * record["num_tokens"]}))
  lines = []
  rows = publish(
    points,
    workdir,
    tmp_path / "data",
    extrapolated=False,
    extrapolate_tokens=record["num_tokens"],
    log=lines.append,
  )
  assert rows[1].extrapolation is None and rows[0].extrapolation is not None
  assert any(f"scores {2 * record['num_tokens']} validation tokens" in line for line in lines)


def test_publish_refuses_a_sweep_its_points_did_not_train_as(tmp_path, points):
  """--config.base.model.d_model=... refused by --summarize (the points
  trained another model) was published, its table naming runs other than
  those the points trained; and a published sweep may be read-only."""
  workdir = sweep_workdir(tmp_path, points)
  sweep = configs.load(ROOT / "txf" / "configs" / "sweeps" / "t5_distance.py")
  sweep.base.model.d_model *= 2
  with pytest.raises(
    GridError, match=r"^point 0 \(.*\): .*model\.d_model.*publish with the overrides"
  ):
    runner.run_sweep(sweep, workdir, publish_to=tmp_path / "data", log=lambda line: None)
  assert not (tmp_path / "data").exists()
  sweep.base.model.d_model //= 2
  with read_only(workdir):
    rows = runner.run_sweep(sweep, workdir, publish_to=tmp_path / "data", log=lambda line: None)
  assert [row.status for row in rows] == ["done"] * len(points)
  assert (tmp_path / "data" / results.RESULTS_MD).read_text() == (
    DATA / results.RESULTS_MD
  ).read_text()


def trained_longer(workdir, point) -> int:
  """Makes `point`'s run in `workdir` one configured for twice the sweep's
  steps (still evaluated at the sweep's step count); returns the sweep's."""
  config = json.loads((workdir / point.name / "config.json").read_text())
  steps = config["train"]["steps"]
  config["train"]["steps"] = 2 * steps
  (workdir / point.name / "config.json").write_text(json.dumps(config))
  return steps


def test_a_point_trained_longer_than_the_sweeps_is_named_and_nothing_published(tmp_path, points):
  """A longer run evaluated at the sweep's step count too, so it read as done."""
  workdir = sweep_workdir(tmp_path, points)
  steps = trained_longer(workdir, points[2])
  with pytest.raises(
    WorkdirError,
    match=rf"^{workdir}: point 2 \({points[2].name}\) was trained for {2 * steps} steps, "
    rf"this sweep's point for {steps}: nothing published$",
  ):
    publish(points, workdir, tmp_path / "data")
  assert not (tmp_path / "data").exists()
  # Its checkpoint of the sweep's last step rotated away, its last one kept:
  # it read as 'partial, not finished', which is not why it is refused.
  checkpoints = workdir / points[2].name / "checkpoints"
  (checkpoints / str(steps)).rename(checkpoints / str(2 * steps))
  with pytest.raises(WorkdirError, match=rf"was trained for {2 * steps} steps"):
    publish(points, workdir, tmp_path / "data")


def test_the_sweep_refuses_to_summarise_a_point_trained_longer(tmp_path, points):
  """It skipped the point as done and tabulated the longer run's last values."""
  workdir = sweep_workdir(tmp_path, points)
  steps = trained_longer(workdir, points[2])
  sweep = configs.load(ROOT / "txf" / "configs" / "sweeps" / "t5_distance.py")
  with pytest.raises(
    GridError,
    match=rf"^point 2 \({points[2].name}\) was trained for {2 * steps} steps, this sweep's "
    rf"point for {steps} \({workdir / points[2].name}\): summarize with the overrides it "
    "trained with$",
  ):
    runner.run_sweep(sweep, workdir, summarize_only=True, log=lambda line: None)
  assert not (workdir / results.RESULTS_CSV).exists()


def test_the_sweep_refuses_to_summarise_a_point_trained_shorter(tmp_path, points):
  """A sweep trained with --config.base.train.steps=N, summarised without it:
  every finished point read as partial and the results written over."""
  workdir = sweep_workdir(tmp_path, points)
  config = json.loads((workdir / points[1].name / "config.json").read_text())
  steps = config["train"]["steps"]
  config["train"]["steps"] = steps // 2
  (workdir / points[1].name / "config.json").write_text(json.dumps(config))
  sweep = configs.load(ROOT / "txf" / "configs" / "sweeps" / "t5_distance.py")
  with pytest.raises(
    GridError,
    match=rf"^point 1 \({points[1].name}\) was trained for {steps // 2} steps, .*: summarize "
    "with the overrides it trained with, or train it on first$",
  ):
    runner.run_sweep(sweep, workdir, summarize_only=True, log=lambda line: None)
  assert not (workdir / results.RESULTS_CSV).exists()


def test_a_committed_point_is_flat_where_each_of_its_seeds_is(points):
  """The flat verdict against each replica's curve read straight from
  metrics.jsonl: t5_distance's four points have a flat mean (under 2% over
  the last fifth) but a seed still falling 2.1-2.5%, so none is flat."""
  for point in points:
    rows = [json.loads(line) for line in (DATA / point.name / "metrics.jsonl").open()]
    evaluations = {row["step"]: row for row in rows if "eval_loss" in row}
    steps = sorted(evaluations)
    seeds = [[evaluations[step][f"eval_loss/{r}"] for step in steps] for r in range(3)]
    mean = [sum(values) / 3 for values in zip(*seeds)]
    assert is_flat(late_improvement(steps, mean), mean[-1])
    each = [is_flat(late_improvement(steps, loss), loss[-1]) for loss in seeds]
    row = results.summarize_point(point, DATA / point.name, log=lambda line: None)
    assert row.flat is all(each) is False, point.name
