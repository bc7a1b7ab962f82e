"""Tests for txf.sweep.runner and experiments/sweep.py: toy sweeps end to end."""

import csv
import importlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
from etils import epath

from conftest import REPO, checkpoint_steps, flatten, load_config, tiny_config
from full_disk import read_only
from tensorboard_files import read_hparams
from txf.analysis.extrapolation import check_num_tokens
from txf.runconfig import run_config
from txf.rundir.metrics import read_metrics
from txf.rundir.workdir import WorkdirError, WorkdirLock
from txf.sweep import figures, grid, results, runner
from txf.sweep.grid import GridError
from txf.train import loop

ROOT = REPO
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TOY_STEPS = 10
TOY_GRID = {"model.position": ["rope", "alibi"], "model.norm_placement": ["pre"]}
TOY_NAMES = ["position=rope,norm_placement=pre", "position=alibi,norm_placement=pre"]


REPLICAS = 2


def toy_sweep(fields=None, **sweep):
  """Toy points of REPLICAS seed replicas each."""
  config = ml_collections.ConfigDict()
  config.base = tiny_config(steps=TOY_STEPS)
  config.base.replicas = REPLICAS
  config.grid = grid.make_grid(fields or TOY_GRID)
  # A window at 16 x seq_len: the toy evaluator's 264 tokens hold none, which
  # the sweep refuses before training where it extrapolates (the hooks here
  # only write a file).
  config.sweep = ml_collections.ConfigDict({"extrapolate_tokens": 16 * 32 + 1, **sweep})
  return config


def fake_extrapolate(calls, tokens=None):
  """An extrapolation hook writing the documented file with made-up losses;
  appends each run directory to `calls` and each num_tokens to `tokens`."""

  def extrapolate(workdir, *, num_tokens, log):
    calls.append(workdir)
    if tokens is not None:
      tokens.append(num_tokens)
    (epath.Path(workdir) / results.EXTRAPOLATION_FILE).write_text(
      json.dumps({"lengths": [32, 64], "loss": {"sliding": [3.0, 3.5]}, "applicable": [True, True]})
    )

  return extrapolate


def read_csv(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def final_eval_loss(workdir):
  return [row["eval_loss"] for row in read_metrics(workdir) if "eval_loss" in row][-1]


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory, compilation_cache_dir):
  """A two-point, two-replica toy sweep: point 1 alone (index=1), then the
  whole sweep.

  Returns a dict: workdir; index_result, index_listing (run_sweep's return
  and the workdir's entries after index=1); lines and calls (the full run's
  log lines and extrapolation hook calls).
  """
  workdir = tmp_path_factory.mktemp("sweep")
  index_result = runner.run_sweep(toy_sweep(), workdir, index=1, log=lambda line: None)
  index_listing = sorted(os.listdir(workdir))
  lines, calls = [], []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  return dict(
    workdir=workdir,
    index_result=index_result,
    index_listing=index_listing,
    lines=lines,
    calls=calls,
  )


@pytest.mark.slow  # its fixture trains a sweep
def test_index_runs_exactly_one_point_and_writes_no_results(finished_sweep):
  assert finished_sweep["index_result"] is None
  assert finished_sweep["index_listing"] == [TOY_NAMES[1]]


@pytest.mark.slow  # its fixture trains a sweep
def test_a_full_sweep_trains_every_point_and_writes_every_output(finished_sweep):
  workdir, lines, calls = (finished_sweep[key] for key in ("workdir", "lines", "calls"))
  assert [str(call) for call in calls] == [str(workdir / name) for name in TOY_NAMES]
  for name in TOY_NAMES:
    point_dir = workdir / name
    saved = json.loads((point_dir / "config.json").read_text())
    assert saved["train"]["steps"] == TOY_STEPS
    assert saved["model"]["position"] == name.split(",")[0].split("=")[1]
    assert str(TOY_STEPS) in os.listdir(point_dir / "checkpoints")
    assert results.point_status(point_dir) == "done"
  table = read_csv(workdir / results.RESULTS_CSV)
  assert [row["point"] for row in table] == TOY_NAMES
  for row, name in zip(table, TOY_NAMES):
    assert float(row["eval_loss"]) == pytest.approx(final_eval_loss(workdir / name), rel=1e-12)
    final = [r for r in read_metrics(workdir / name) if "eval_loss" in r][-1]
    replica_losses = [final[f"eval_loss/{r}"] for r in range(REPLICAS)]
    assert float(row["eval_loss_std"]) == pytest.approx(np.std(replica_losses, ddof=1), rel=1e-9)
    assert row["replicas"] == str(REPLICAS)
    assert (row["status"], row["diverged"], row["sliding@64"]) == ("done", "no", "3.5")
  markdown = (workdir / results.RESULTS_MD).read_text()
  assert all(f"| {name} |" in markdown for name in TOY_NAMES)
  for png in (
    figures.LOSS_CURVES_PNG,
    figures.TRAIN_LOSS_CURVES_PNG,
    "extrapolation_sliding.png",
  ):
    assert (workdir / png).read_bytes().startswith(PNG_MAGIC)
  # TOY_GRID holds Pre-LN alone: no Pre- vs Post-LN figure to draw.
  assert not (workdir / figures.PRE_VS_POST_PNG).exists()
  # Point 1 trained alone first: the full run trains only point 0, and
  # extrapolates both.
  assert [line for line in lines if line.startswith("point ")] == [
    f"point 0 ({TOY_NAMES[0]}): training",
    f"point 0 ({TOY_NAMES[0]}): length extrapolation",
    f"point 1 ({TOY_NAMES[1]}): done, skipped",
    f"point 1 ({TOY_NAMES[1]}): length extrapolation",
  ]
  # Progress: point i of N with the elapsed time, and an ETA once a point
  # has trained (point 1 was skipped: it does not count).
  progress = [line for line in lines if line.startswith("sweep: ") and " points, " in line]
  assert len(progress) == 2
  assert re.fullmatch(
    rf"sweep: 1 of 2 points, point 0 \({TOY_NAMES[0]}\) \| elapsed \d+s", progress[0]
  )
  assert re.fullmatch(
    rf"sweep: 2 of 2 points, point 1 \({TOY_NAMES[1]}\) \| elapsed \d+s \| eta \d+s", progress[1]
  )


def test_sweep_progress_line_counts_the_points_left_at_the_mean_point_time():
  point = grid.Point(index=4, name="position=rope", overrides={}, config=None)
  assert runner.format_sweep_progress(5, 12, point, 1100.0, []) == (
    "sweep: 5 of 12 points, point 4 (position=rope) | elapsed 18m20s"
  )
  # 8 points left (this one included) at a mean of 600 s.
  assert runner.format_sweep_progress(5, 12, point, 1100.0, [500.0, 700.0]) == (
    "sweep: 5 of 12 points, point 4 (position=rope) | elapsed 18m20s | eta 1h20m"
  )


@pytest.mark.slow  # its fixture trains a sweep
def test_each_point_gives_tensorboard_its_swept_fields_and_final_metrics(finished_sweep):
  for name in TOY_NAMES:
    hparams, metric_tags = read_hparams(finished_sweep["workdir"] / name / "tb")
    swept = dict(field.split("=") for field in name.split(","))
    assert hparams["model.position"] == swept["position"]
    assert hparams["model.norm_placement"] == swept["norm_placement"]
    assert hparams["replicas"] == REPLICAS and hparams["model.d_model"] == 32
    assert {"eval/loss", "eval/loss_std", "eval/loss/0"} <= set(metric_tags)


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_a_rerun_skips_finished_points(finished_sweep):
  workdir = finished_sweep["workdir"]
  metrics = [workdir / name / "metrics.jsonl" for name in TOY_NAMES]
  before = [path.stat().st_mtime_ns for path in metrics]
  lines, calls = [], []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  assert [line for line in lines if line.startswith("point ")] == [
    f"point {i} ({name}): done, skipped" for i, name in enumerate(TOY_NAMES)
  ]
  assert calls == []  # extrapolation.json already there
  assert [path.stat().st_mtime_ns for path in metrics] == before


@pytest.mark.slow  # its fixture trains a sweep
def test_a_rerun_changing_a_finished_points_model_is_refused(finished_sweep):
  """As txf-run refuses it, before anything runs or is written; it was
  skipped as done, and the results rewritten from the old runs."""
  workdir = finished_sweep["workdir"]
  written = {path: path.stat().st_mtime_ns for path in workdir.rglob("*") if path.is_file()}
  sweep = toy_sweep()
  sweep.base.model.d_model *= 2
  with pytest.raises(GridError) as raised:
    runner.run_sweep(sweep, workdir, log=lambda line: None)
  assert str(raised.value).startswith(
    f"point 0 ({TOY_NAMES[0]}): model.d_model: differs from the run already in "
    f"{workdir / TOY_NAMES[0]} "
  )
  assert {path: path.stat().st_mtime_ns for path in workdir.rglob("*") if path.is_file()} == written


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_sweep_extrapolate_false_skips_the_extrapolation_hook(finished_sweep, tmp_path):
  workdir = tmp_path / "copy"
  shutil.copytree(finished_sweep["workdir"], workdir)
  for name in TOY_NAMES:
    (workdir / name / results.EXTRAPOLATION_FILE).unlink()
  calls = []
  runner.run_sweep(
    toy_sweep(extrapolate=False),
    workdir,
    log=lambda line: None,
    extrapolate=fake_extrapolate(calls),
  )
  assert calls == []
  tokens = []
  runner.run_sweep(
    toy_sweep(extrapolate_tokens=600),
    workdir,
    log=lambda line: None,
    extrapolate=fake_extrapolate(calls, tokens),
  )
  assert [pathlib.Path(call).name for call in calls] == TOY_NAMES
  assert tokens == [600, 600]  # sweep.extrapolate_tokens reaches the hook
  # One scored on other tokens (txf-extrapolate run by hand) is not the
  # sweep's: the rerun took it as the point's; it is recomputed now.
  record = workdir / TOY_NAMES[0] / results.EXTRAPOLATION_FILE
  record.write_text(json.dumps({**json.loads(record.read_text()), "num_tokens": 512}))
  calls, lines = [], []
  runner.run_sweep(
    toy_sweep(extrapolate_tokens=600),
    workdir,
    log=lines.append,
    extrapolate=fake_extrapolate(calls),
  )
  assert [pathlib.Path(call).name for call in calls] == TOY_NAMES[:1]
  assert (
    f"point 0 ({TOY_NAMES[0]}): extrapolation.json scores 512 validation tokens, the sweep's "
    "sweep.extrapolate_tokens is 600: out of date"
  ) in lines


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_summarize_only_rebuilds_the_results_from_disk(finished_sweep, monkeypatch, tmp_path):
  workdir = finished_sweep["workdir"]
  expected = (workdir / results.RESULTS_CSV).read_text()
  (workdir / results.RESULTS_CSV).unlink()
  monkeypatch.setattr(runner.loop, "run", lambda *args, **kwargs: pytest.fail("trained"))
  lines = []
  rows = runner.run_sweep(toy_sweep(), workdir, summarize_only=True, log=lines.append)
  assert [row.status for row in rows] == ["done", "done"]
  assert (workdir / results.RESULTS_CSV).read_text() == expected
  assert not [line for line in lines if "trained with" in line]
  # A point retrained with another learning rate (--resume_step, a field its
  # checkpoints do not depend on) was summarised and skipped without a word.
  changed = copy_of(finished_sweep, tmp_path / "lr")
  config = json.loads((changed / TOY_NAMES[1] / "config.json").read_text())
  lr = config["train"]["learning_rate"]
  config["train"]["learning_rate"] = lr / 10
  (changed / TOY_NAMES[1] / "config.json").write_text(json.dumps(config))
  for summarize_only in (True, False):
    lines = []
    runner.run_sweep(toy_sweep(), changed, summarize_only=summarize_only, log=lines.append)
    assert [line for line in lines if "trained with" in line] == [
      f"point 1 ({TOY_NAMES[1]}): trained with train.learning_rate {lr / 10!r} (the sweep's "
      f"{lr!r}): its row is that run's"
    ]
  # Overrides its points did not train with: refused as training refuses
  # them (its tables would name other runs), before anything is written.
  other = toy_sweep()
  other.base.model.d_model *= 2
  workdir = copy_of(finished_sweep, tmp_path)
  (workdir / results.RESULTS_CSV).unlink()
  refused = (
    rf"^point 0 \({TOY_NAMES[0]}\): model\.d_model: differs from the run already in "
    r".*; summarize with the overrides it trained with$"
  )
  with pytest.raises(GridError, match=refused):
    runner.run_sweep(other, workdir, summarize_only=True, log=lambda line: None)
  assert not (workdir / results.RESULTS_CSV).exists()


def copy_of(finished_sweep, tmp_path):
  """A copy of the finished toy sweep's directory to break."""
  workdir = tmp_path / "copy"
  shutil.copytree(finished_sweep["workdir"], workdir)
  return workdir


def point_lines(lines):
  return [line for line in lines if line.startswith(("point ", "sweep "))]


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_a_sigterm_stops_the_sweep_in_its_point_and_a_rerun_resumes(finished_sweep, tmp_path):
  workdir = copy_of(finished_sweep, tmp_path)
  expected = final_eval_loss(workdir / TOY_NAMES[0])
  shutil.rmtree(workdir / TOY_NAMES[0])  # point 0 trains again, point 1 is done
  (workdir / results.RESULTS_CSV).unlink()
  lines = []

  def log(line):  # the scheduler's SIGTERM, as point 0 logs step 3
    lines.append(line)
    if line.startswith(f"step 3/{TOY_STEPS} "):
      os.kill(os.getpid(), signal.SIGTERM)

  assert (
    runner.run_sweep(toy_sweep(), workdir, log=log, extrapolate=fake_extrapolate(calls := []))
    is None
  )
  assert point_lines(lines) == [
    f"point 0 ({TOY_NAMES[0]}): training",
    f"sweep preempted in point 0 ({TOY_NAMES[0]}), which is saved; rerun the same command "
    "to resume",
  ]
  assert checkpoint_steps(workdir / TOY_NAMES[0]) == [3] and calls == []
  assert not (workdir / results.RESULTS_CSV).exists()
  lines = []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  assert f"resumed from step 3 in {workdir / TOY_NAMES[0] / 'checkpoints'}" in lines
  assert final_eval_loss(workdir / TOY_NAMES[0]) == pytest.approx(expected, rel=1e-6)
  assert [row["status"] for row in read_csv(workdir / results.RESULTS_CSV)] == ["done"] * 2


@pytest.mark.slow  # its fixture trains a sweep
def test_a_sigterm_while_a_point_sets_up_says_nothing_of_it_is_saved(
  finished_sweep, tmp_path, monkeypatch
):
  """It said 'which is saved' of a point with no directory, right after the
  run's own 'nothing trained or saved'."""
  workdir = copy_of(finished_sweep, tmp_path)
  shutil.rmtree(workdir / TOY_NAMES[0])

  def setup_receiving_a_sigterm(run, point_dir):
    os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(loop, "setup_run", setup_receiving_a_sigterm)
  lines = []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate([]))
  assert point_lines(lines)[-1] == (
    f"sweep preempted in point 0 ({TOY_NAMES[0]}), before it trained (nothing of it saved); "
    "rerun the same command to resume"
  )
  assert not (workdir / TOY_NAMES[0]).exists()


@pytest.mark.slow  # its fixture trains a sweep
def test_a_ctrl_c_saves_the_point_and_stops_the_sweep_as_an_interrupt(finished_sweep, tmp_path):
  """It said 'sweep preempted' and txf-sweep exited 0, as after a SIGTERM:
  a shell or a scheduler took the Ctrl-C'd sweep for one that succeeded."""
  workdir = copy_of(finished_sweep, tmp_path)
  shutil.rmtree(workdir / TOY_NAMES[0])
  lines = []

  def log(line):  # Ctrl-C as point 0 logs step 3
    lines.append(line)
    if line.startswith(f"step 3/{TOY_STEPS} "):
      os.kill(os.getpid(), signal.SIGINT)

  with pytest.raises(KeyboardInterrupt):  # txf-sweep: 'interrupted', exit 130
    runner.run_sweep(toy_sweep(), workdir, log=log, extrapolate=fake_extrapolate([]))
  assert point_lines(lines)[-1] == (
    f"sweep interrupted in point 0 ({TOY_NAMES[0]}), which is saved; rerun the same command "
    "to resume"
  )
  assert checkpoint_steps(workdir / TOY_NAMES[0]) == [3]


@pytest.mark.slow  # its fixture trains a sweep
def test_a_sigterm_during_an_extrapolation_stops_the_sweep_and_a_rerun_redoes_it(
  finished_sweep, tmp_path, sigterm_is_caught
):
  """Before, the SIGTERM killed the sweep (exit 143) without a word."""
  workdir = copy_of(finished_sweep, tmp_path)
  for name in TOY_NAMES:
    (workdir / name / results.EXTRAPOLATION_FILE).unlink()
  (workdir / results.RESULTS_CSV).unlink()
  lines, calls = [], []
  writes = fake_extrapolate(calls)

  def preempted(run_dir, *, num_tokens, log):  # the scheduler's SIGTERM, mid-way
    os.kill(os.getpid(), signal.SIGTERM)
    log("extrapolate: length 32 (1 of 2, 1x) | ...")
    writes(run_dir, num_tokens=num_tokens, log=log)

  assert runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=preempted) is None
  assert sigterm_is_caught == []  # the sweep's guard took it
  assert point_lines(lines)[-2:] == [
    f"point 0 ({TOY_NAMES[0]}): length extrapolation",
    f"sweep preempted in point 0 ({TOY_NAMES[0]})'s length extrapolation; "
    "rerun the same command to resume (an extrapolation cut short is computed again)",
  ]
  assert calls == [] and not (workdir / results.RESULTS_CSV).exists()
  runner.run_sweep(toy_sweep(), workdir, log=lambda line: None, extrapolate=writes)
  assert [pathlib.Path(call).name for call in calls] == TOY_NAMES
  assert [row["status"] for row in read_csv(workdir / results.RESULTS_CSV)] == ["done"] * 2


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_a_cut_extrapolation_file_is_recomputed_and_reported_in_one_line(finished_sweep, tmp_path):
  workdir = copy_of(finished_sweep, tmp_path)
  path = workdir / TOY_NAMES[0] / results.EXTRAPOLATION_FILE
  path.write_text(path.read_text()[:30])
  lines = []
  rows = runner.run_sweep(toy_sweep(), workdir, summarize_only=True, log=lines.append)
  assert rows[0].extrapolation is None and rows[1].extrapolation is not None
  (line,) = [line for line in lines if str(path) in line]
  assert (
    line.startswith(f"{path}: not valid JSON (")
    and line.endswith("; read as missing (a sweep rerun recomputes it)")
    and "\n" not in line
  )
  calls = []
  rows = runner.run_sweep(
    toy_sweep(), workdir, log=lambda line: None, extrapolate=fake_extrapolate(calls)
  )
  assert [str(call) for call in calls] == [str(path.parent)]
  assert rows[0].extrapolation == rows[1].extrapolation


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_lost_end_of_run_writes_are_completed_on_rerun(finished_sweep, tmp_path):
  workdir = copy_of(finished_sweep, tmp_path)
  cut, unconfigured = (workdir / name for name in TOY_NAMES)
  metrics = (cut / "metrics.jsonl").read_text().splitlines(keepends=True)
  final = json.loads(metrics[-1])
  assert final["step"] == TOY_STEPS and "eval_loss" in final
  (cut / "metrics.jsonl").write_text("".join(metrics[:-1]) + metrics[-1][:20])
  config_json = (unconfigured / "config.json").read_text()
  (unconfigured / "config.json").unlink()
  lines = []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate([]))
  assert [line for line in lines if line.startswith("point ")] == [
    f"point {i} ({name}): training" for i, name in enumerate(TOY_NAMES)
  ]
  assert final_eval_loss(cut) == pytest.approx(final["eval_loss"], rel=1e-6)
  assert (unconfigured / "config.json").read_text() == config_json
  table = read_csv(workdir / results.RESULTS_CSV)
  assert [row["status"] for row in table] == ["done"] * 2
  assert float(table[0]["eval_loss"]) == pytest.approx(final["eval_loss"], rel=1e-6)


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_a_point_killed_before_its_final_checkpoint_is_trained_again(finished_sweep, tmp_path):
  """Killed after its final eval row, while orbax wrote its final checkpoint:
  before, the point was 'done' for good (skipped, its extrapolation taken
  from an older checkpoint, refused by --publish)."""
  workdir = copy_of(finished_sweep, tmp_path)
  cut = workdir / TOY_NAMES[0]
  expected = final_eval_loss(cut)
  final = cut / "checkpoints" / str(TOY_STEPS)
  final.rename(final.with_name(f"{TOY_STEPS}.orbax-checkpoint-tmp"))  # the save cut short
  (cut / results.EXTRAPOLATION_FILE).unlink()
  assert results.point_status(cut, steps=TOY_STEPS) == "partial"
  lines, calls = [], []
  runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  assert [line for line in lines if line.startswith("point ")] == [
    f"point 0 ({TOY_NAMES[0]}): training",
    f"point 0 ({TOY_NAMES[0]}): length extrapolation",
    f"point 1 ({TOY_NAMES[1]}): done, skipped",
  ]
  assert TOY_STEPS in checkpoint_steps(cut) and [str(call) for call in calls] == [str(cut)]
  assert final_eval_loss(cut) == pytest.approx(expected, rel=1e-6)  # the same run, retrained
  assert [row["status"] for row in read_csv(workdir / results.RESULTS_CSV)] == ["done"] * 2


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_raising_train_steps_continues_every_finished_point(finished_sweep, tmp_path):
  workdir = copy_of(finished_sweep, tmp_path)
  for name in TOY_NAMES:  # extrapolated at the old final step
    path = workdir / name / results.EXTRAPOLATION_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "step": TOY_STEPS}))
  steps = TOY_STEPS + 4
  sweep = toy_sweep()
  sweep.base.train.steps = steps
  lines, calls = [], []
  runner.run_sweep(sweep, workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  for name in TOY_NAMES:
    assert checkpoint_steps(workdir / name)[-1] == steps
    assert json.loads((workdir / name / "config.json").read_text())["train"]["steps"] == steps
    assert f"resumed from step {TOY_STEPS} in {workdir / name / 'checkpoints'}" in lines
  assert [pathlib.Path(call).name for call in calls] == TOY_NAMES  # stale ones recomputed
  table = read_csv(workdir / results.RESULTS_CSV)
  assert [float(row["eval_loss"]) for row in table] == [
    pytest.approx(final_eval_loss(workdir / name), rel=1e-12) for name in TOY_NAMES
  ]


@pytest.mark.slow  # trains a sweep (and its fixture one)
def test_a_second_sweep_is_refused_while_the_first_extrapolates_a_point(finished_sweep, tmp_path):
  workdir = copy_of(finished_sweep, tmp_path)
  (workdir / TOY_NAMES[0] / results.EXTRAPOLATION_FILE).unlink()
  calls = []
  with WorkdirLock(workdir / TOY_NAMES[0]):  # the first sweep, extrapolating point 0
    with pytest.raises(WorkdirError, match=f"^{workdir / TOY_NAMES[0]}: in use by another run"):
      runner.run_sweep(
        toy_sweep(), workdir, log=lambda line: None, extrapolate=fake_extrapolate(calls)
      )
  assert calls == []


@pytest.mark.slow  # its fixture trains a sweep
def test_a_read_only_sweep_is_refused_in_one_line_before_anything_runs(finished_sweep, tmp_path):
  """A finished sweep made read-only, rerun (its point 0 lacking its
  extrapolation) or summarized: before, the rerun met a raw OSError taking
  point 0's lock and the summary a write error at its first table."""
  workdir = copy_of(finished_sweep, tmp_path)
  (workdir / TOY_NAMES[0] / results.EXTRAPOLATION_FILE).unlink()
  calls = []
  for summarize_only in (False, True):
    with (
      read_only(workdir),
      pytest.raises(
        WorkdirError, match=rf"^{workdir}: not a writable directory \(Read-only file system\)$"
      ),
    ):
      runner.run_sweep(
        toy_sweep(),
        workdir,
        summarize_only=summarize_only,
        log=lambda line: None,
        extrapolate=fake_extrapolate(calls),
      )
  assert calls == []


@pytest.mark.slow  # its fixture trains a sweep
def test_a_read_only_point_is_refused_in_one_line_before_it_is_extrapolated(
  finished_sweep, tmp_path
):
  workdir = copy_of(finished_sweep, tmp_path)
  point = workdir / TOY_NAMES[0]
  (point / results.EXTRAPOLATION_FILE).unlink()
  calls = []
  with (
    read_only(point),
    pytest.raises(
      WorkdirError, match=rf"^{point}: not a writable directory \(Read-only file system\)$"
    ),
  ):
    runner.run_sweep(
      toy_sweep(), workdir, log=lambda line: None, extrapolate=fake_extrapolate(calls)
    )
  assert calls == []


@pytest.mark.slow  # its fixture trains a sweep
def test_a_read_only_later_point_is_refused_before_an_earlier_one_trains(finished_sweep, tmp_path):
  """Before, point 0 trained first and the sweep stopped at point 1."""
  workdir = copy_of(finished_sweep, tmp_path)
  shutil.rmtree(workdir / TOY_NAMES[0])  # to train
  point = workdir / TOY_NAMES[1]
  (point / results.EXTRAPOLATION_FILE).unlink()  # to extrapolate
  lines, calls = [], []
  with (
    read_only(point),
    pytest.raises(
      WorkdirError, match=rf"^{point}: not a writable directory \(Read-only file system\)$"
    ),
  ):
    runner.run_sweep(toy_sweep(), workdir, log=lines.append, extrapolate=fake_extrapolate(calls))
  assert calls == [] and point_lines(lines) == [] and not (workdir / TOY_NAMES[0]).exists()


def started(point_dir):
  """Makes `point_dir` a point of REPLICAS replicas that started training:
  one logged step."""
  point_dir.mkdir(parents=True)
  row = {"step": 1, "loss": 5.0, **{f"loss/{r}": 5.0 for r in range(REPLICAS)}}
  (point_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def test_summarize_only_where_no_point_ran_is_refused_and_creates_nothing(tmp_path):
  """A mistyped --workdir: before, the directory was created with tables of
  'missing' points, exit 0."""
  workdir = tmp_path / "typo"
  with pytest.raises(
    WorkdirError, match=rf"^{workdir}: no point of this sweep has run there: nothing to summarize$"
  ):
    runner.run_sweep(toy_sweep(), workdir, summarize_only=True, log=lambda line: None)
  assert os.listdir(tmp_path) == []


def test_summarize_only_before_any_point_evaluated_writes_the_tables_and_no_plots(tmp_path):
  started(tmp_path / TOY_NAMES[0])
  rows = runner.run_sweep(toy_sweep(), tmp_path, summarize_only=True, log=lambda line: None)
  assert [row.status for row in rows] == ["partial", "missing"]
  assert sorted(os.listdir(tmp_path)) == [TOY_NAMES[0], results.RESULTS_CSV, results.RESULTS_MD]


@pytest.mark.parametrize(
  "fields, message",
  [
    (
      {"model.position": ["rope", "bogus"]},
      r"^point 1 \(position=bogus\): model.position: 'bogus' is not one of",
    ),
    ({"model.num_heads": [2, 3]}, r"^point 1 \(num_heads=3\): model.num_heads"),
    # (A warmup longer than the run is clamped, not refused: a negative one is.)
    ({"train.warmup_steps": [2, -1]}, r"^point 1 \(warmup_steps=-1\): train.warmup_steps"),
    # ALiBi reads no rope_base: its two points were trained, and compared, as two.
    (
      {"model.position": ["alibi", "rope"], "model.options.rope_base": [10_000.0, 500.0]},
      r"^point 1 \(position=alibi,rope_base=500.0\) trains the same run as point 0 "
      r"\(position=alibi,rope_base=10000.0\): model.options.rope_base is read by no entry",
    ),
    # Both warmups are longer than the run: clamped to the same one.
    (
      {"train.warmup_steps": [2000, 3000]},
      r"^point 1 \(warmup_steps=3000\) trains the same run as point 0 \(warmup_steps=2000\): "
      r"their train.warmup_steps resolve to the same run config$",
    ),
  ],
)
def test_an_invalid_point_stops_the_sweep_before_anything_trains(
  tmp_path, monkeypatch, fields, message
):
  monkeypatch.setattr(runner.loop, "run", lambda *args, **kwargs: pytest.fail("trained"))
  with pytest.raises(GridError, match=message):
    runner.run_sweep(toy_sweep(fields), tmp_path, log=lambda line: None)
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
  "sweep, message",
  [
    (dict(seeds=3), r"sweep.seeds: unknown field .*; seeds per point are base.replicas"),
    (dict(extrapolate_tokens=0), r"sweep.extrapolate_tokens"),
    (dict(extrapolate="no"), r"sweep.extrapolate: must be True or False"),
    (dict(seed=1), r"sweep.seed: unknown field"),
  ],
)
def test_bad_sweep_settings_are_rejected_naming_the_field(tmp_path, sweep, message):
  with pytest.raises(GridError, match=message):
    runner.run_sweep(toy_sweep(**sweep), tmp_path, log=lambda line: None)
  assert os.listdir(tmp_path) == []


def test_the_python_entry_takes_one_mode(tmp_path):
  for modes, named in [
    (dict(dry_run=True, summarize_only=True), "dry_run and summarize_only"),
    (dict(summarize_only=True, publish_to=tmp_path / "data"), "summarize_only and publish_to"),
  ]:
    with pytest.raises(ValueError, match=f"^{named}: choose one mode$"):
      runner.run_sweep(toy_sweep(), tmp_path / "sweep", **modes)
  assert os.listdir(tmp_path) == []


def test_too_few_extrapolation_tokens_stop_the_sweep_before_anything_trains(tmp_path, monkeypatch):
  monkeypatch.setattr(runner.loop, "run", lambda *args, **kwargs: pytest.fail("trained"))
  seq_len = toy_sweep().base.data.seq_len
  with pytest.raises(
    GridError,
    match=rf"^sweep.extrapolate_tokens: point 0 .*no window of "
    rf"{16 * seq_len + 1} tokens",
  ):
    runner.run_sweep(
      toy_sweep(extrapolate_tokens=16 * seq_len),
      tmp_path,
      log=lambda line: None,
      extrapolate=fake_extrapolate([]),
    )
  assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
  "base, message",
  [
    ("encoder_mlm", r"data.task: length extrapolation needs a causal language model"),
    ("mqar", r"data.name: length extrapolation scores a text stream"),
  ],
)
def test_a_sweep_extrapolation_cannot_score_stops_before_anything_trains(
  tmp_path, monkeypatch, base, message
):
  """A classifier's or a generated task's sweep trained point 0, then stopped
  at its extrapolation."""
  monkeypatch.setattr(runner.loop, "run", lambda *args, **kwargs: pytest.fail("trained"))
  config = toy_sweep()
  config.base = tiny_config(base, steps=TOY_STEPS)
  with pytest.raises(GridError, match=rf"^point 0 \(.*\): {message}.*--noextrapolate"):
    runner.run_sweep(config, tmp_path, log=lambda line: None, extrapolate=fake_extrapolate([]))
  assert os.listdir(tmp_path) == []
  # Without extrapolation it passes its checks (and trains: here, the fake).
  with pytest.raises(pytest.fail.Exception, match="trained"):
    runner.run_sweep(config, tmp_path, log=lambda line: None)


@pytest.mark.slow  # trains a sweep
def test_a_diverging_point_is_recorded_and_the_sweep_goes_on(tmp_path, compilation_cache_dir):
  lines = []
  rows = runner.run_sweep(
    toy_sweep({"train.learning_rate": [1e6, 1e-3]}), tmp_path, log=lines.append
  )
  diverged, healthy = (tmp_path / f"learning_rate={lr}" for lr in ("1000000.0", "0.001"))
  assert "non-finite" in json.loads((diverged / results.DIVERGED_FILE).read_text())["error"]
  assert results.point_status(healthy) == "done"
  assert [(row.status, row.diverged) for row in rows] == [("diverged", True), ("done", False)]
  assert [row["diverged"] for row in read_csv(tmp_path / results.RESULTS_CSV)] == ["yes", "no"]
  assert any(line.startswith("point 0 (learning_rate=1000000.0): diverged") for line in lines)


@pytest.mark.parametrize(
  "name, count",
  [
    ("pe_ln", 12),
    ("pe_ln_gpu", 12),
    ("ln_warmup", 8),
    ("t5_distance", 4),
    ("pe_ln_seeds", 6),
    ("pe_ln_confirm", 6),
    ("mqar_scale", 6),
    ("mqar_steps", 3),
    ("mqar_linear", 6),
    ("mqar_linear_steps", 1),
    ("mqar_lr", 24),
    ("mqar_lstm_lr", 12),
  ],
)
def test_each_shipped_sweep_config_expands_and_validates(name, count):
  config = load_config(f"sweeps.{name}")
  points = grid.expand(config)
  assert len(points) == count
  grid.validate(points, runner.check_point_config)
  replicas = {
    "pe_ln": 2,
    "pe_ln_gpu": 2,
    "ln_warmup": 3,
    "t5_distance": 3,
    "pe_ln_seeds": 3,
    "pe_ln_confirm": 3,
    "mqar_scale": 3,
    "mqar_steps": 3,
    "mqar_linear": 3,
    "mqar_linear_steps": 3,
    "mqar_lr": 3,
    "mqar_lstm_lr": 3,
  }
  assert config.base.replicas == replicas[name]  # seeds
  # The sweeps made for the findings page's seed rule vary the data order too.
  own = name not in ("pe_ln", "pe_ln_gpu")
  assert config.base.data.seed_per_replica == own
  if config.sweep.get("extrapolate_tokens"):  # one window at 16x (checked before training)
    check_num_tokens(config.sweep.extrapolate_tokens, config.base.data.seq_len)
  reference = runner.load_run_config(config.sweep.run_config)  # a shipped name: from anywhere
  for point in points:  # every point has an exact txf-run command
    grid.command_for(point, config.sweep.run_config, "runs/x", reference=reference)
  if name in ("pe_ln", "pe_ln_gpu"):
    assert {p.overrides["model.position"] for p in points} == {
      "sinusoidal",
      "learned",
      "rope",
      "alibi",
      "t5_bias",
      "none",
    }
    assert {p.overrides["model.norm_placement"] for p in points} == {"pre", "post"}
    # The flat column is only exact when an evaluation opens the last fifth
    # (results.late_improvement) and one closes it.
    steps, every = config.base.train.steps, config.base.eval.every
    window_start = steps * (1 - results.FLAT_FRACTION)
    assert window_start == int(window_start) and int(window_start) % every == 0 == steps % every
    # ... and enough evaluations fall in it for a verdict.
    assert (steps - window_start) // every + 1 >= results.FLAT_MIN_EVALUATIONS


def run_cli(commands, *args):
  return commands.run("experiments.sweep", *args, cwd=ROOT, timeout=120)


@pytest.mark.slow  # a command
def test_cli_dry_run_prints_every_points_run_command(commands, tmp_path):
  done = run_cli(commands, "--config=configs/sweeps/pe_ln.py", f"--workdir={tmp_path}", "--dry_run")
  assert done.returncode == 0, done.stderr
  # The installed command (python -m experiments.run: a checkout's), said once.
  printed = [line.strip() for line in done.stdout.splitlines() if line.startswith("  txf-run ")]
  assert len(printed) == 12
  assert done.stdout.splitlines()[-1] == (
    "(in a checkout, python -m experiments.run takes the place of txf-run)"
  )
  assert printed[7] == (
    "txf-run --config=base "
    f"--workdir={tmp_path}/position=alibi,norm_placement=post --config.eval.every=120 "
    "--config.eval.sample_tokens=0 --config.model.d_model=64 "
    "--config.model.norm_placement=post --config.model.position=alibi "
    "--config.replicas=2 --config.train.checkpoint_every=900 --config.train.log_every=120 "
    "--config.train.steps=1800 --config.train.warmup_steps=180"
  )
  assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a command
def test_cli_config_error_is_one_line_naming_the_point_and_exit_2(commands, tmp_path):
  done = run_cli(
    commands,
    "--config=configs/sweeps/pe_ln.py",
    f"--workdir={tmp_path}",
    "--config.base.model.num_heads=3",
  )
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [done.stderr.strip()]
  assert done.stderr.startswith(
    "config error: point 0 (position=sinusoidal,norm_placement=pre): model.num_heads"
  )
  assert os.listdir(tmp_path) == []


@pytest.mark.slow  # a subprocess
def test_cli_full_disk_is_one_line_naming_the_file_and_exit_1(tmp_path):
  # The sweep command in a process whose second file written in tmp_path
  # (after the writability probe) meets a full disk (tests/full_disk.py).
  script = (
    "import runpy, sys; sys.path.insert(0, 'tests'); import full_disk\n"
    f"sys.argv = ['sweep', '--config=configs/sweeps/pe_ln.py', '--workdir={tmp_path}', "
    "'--summarize']\n"
    f"with full_disk.full_disk(full_disk.files_in({str(tmp_path)!r}), 2):\n"
    "  runpy.run_module('experiments.sweep', run_name='__main__')"
  )
  point = "position=sinusoidal,norm_placement=pre"
  started(tmp_path / point)
  done = subprocess.run(
    [sys.executable, "-c", script],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert done.returncode == 1, done.stderr
  assert done.stderr.strip() == (
    f"write error: {tmp_path / results.RESULTS_CSV}: No space left on device"
  )
  assert os.listdir(tmp_path) == [point]  # no cut file, no temporary


def test_a_sentencepiece_point_is_checked_without_training_its_tokenizer(monkeypatch):
  from txf.data.tokenizers import SentencePieceTokenizer

  def trains(*args, **kwargs):
    raise AssertionError("the check trained a sentencepiece tokenizer")

  monkeypatch.setattr(SentencePieceTokenizer, "train", trains)
  config = load_config("rope")
  config.data.update(dict(tokenizer="sentencepiece", sp_vocab_size=300))
  runner.check_point_config(config)
  config.train.b1 = 3.0
  with pytest.raises(ValueError, match=r"^train\.b1: must be in \[0, 1\)"):
    runner.check_point_config(config)


@pytest.mark.parametrize("setting", ["cpu", "gpu"])
def test_the_t5_distance_sweep_tabulates_where_each_max_distance_puts_the_last_bucket(setting):
  """Each setting's docstring table, recomputed from the bucketing; its
  distances hold the training length and 4x it; the gpu setting is
  pe_ln_gpu's T5 Pre-LN point, with 3 seeds of both kinds."""
  from txf.ops.positional import relative_position_bucket

  module = importlib.import_module("txf.configs.sweeps.t5_distance")
  config = module.get_config(setting)
  seq_len = config.base.data.seq_len
  assert config.base.model.position == "t5_bias" and config.base.model.norm_placement == "pre"
  assert config.base.replicas == 3 and config.base.data.seed_per_replica
  source = load_config("sweeps.pe_ln" if setting == "cpu" else "sweeps.pe_ln_gpu")
  assert seq_len == source.base.data.seq_len == {"cpu": 128, "gpu": 256}[setting]
  assert config.base.train.steps == source.base.train.steps
  table = module.__doc__.split(f"{setting}, training length {seq_len}")[1].split("\n\n")[0]
  rows = re.findall(r"^  (\d+) +(\d+) +(\d+) +([\d,]+)$", table, re.M)
  distance = np.arange(16 * seq_len)
  for max_distance, last, trained, untrained in rows:
    bucket = np.asarray(
      relative_position_bucket(-distance, bidirectional=False, max_distance=int(max_distance))
    )
    seen = np.unique(bucket[:seq_len])
    assert distance[bucket == bucket.max()].min() == int(last)
    assert len(seen) == int(trained)
    assert np.sum(~np.isin(bucket, seen)) == int(untrained.replace(",", ""))
  distances = [p.overrides["model.options.t5_max_distance"] for p in grid.expand(config)]
  assert [int(row[0]) for row in rows] == distances
  assert seq_len in distances and 4 * seq_len in distances
  grid.validate(grid.expand(config), runner.check_point_config)
  with pytest.raises(ValueError, match="setting 'tpu' is not one of"):
    module.get_config("tpu")


def test_the_seeds_rerun_is_pe_lns_points_with_three_seeds_of_both_kinds():
  """sweeps/pe_ln_seeds reruns points of sweeps/pe_ln: each of its points is
  one of pe_ln's, and its base config is pe_ln's but for the seeds."""
  seeds, original = load_config("sweeps.pe_ln_seeds"), load_config("sweeps.pe_ln")
  original_points = [p.overrides for p in grid.expand(original)]
  assert all(p.overrides in original_points for p in grid.expand(seeds))
  rerun = flatten(seeds.base.to_dict())
  assert {k: v for k, v in flatten(original.base.to_dict()).items() if rerun[k] != v} == {
    "replicas": 2,
    "data.seed_per_replica": False,
  }


def test_the_confirmation_reruns_the_seeds_rerun_on_seeds_neither_sweep_used():
  """sweeps/pe_ln_confirm is sweeps/pe_ln_seeds (same points) but for its first
  seed, and its replicas' seeds (init and data order) are disjoint from those
  of pe_ln and pe_ln_seeds."""
  confirm, seeds = load_config("sweeps.pe_ln_confirm"), load_config("sweeps.pe_ln_seeds")
  original = load_config("sweeps.pe_ln")
  assert [p.overrides for p in grid.expand(confirm)] == [p.overrides for p in grid.expand(seeds)]
  rerun = flatten(confirm.base.to_dict())
  assert {k: v for k, v in flatten(seeds.base.to_dict()).items() if rerun[k] != v} == {"seed": 0}

  def used(config):
    run = run_config.parse(runner.load_run_config(config.sweep.run_config))
    base = config.base
    run = run.override(
      {
        "seed": base.seed,
        "replicas": base.replicas,
        "data.seed_per_replica": base.data.seed_per_replica,
      }
    )
    return set(run.seeds) | set(run.data_seeds)

  assert used(confirm) == {3, 4, 5}
  assert used(confirm).isdisjoint(used(seeds) | used(original))


def test_the_mqar_scale_sweep_has_a_cpu_and_a_gpu_setting():
  """Zoology's axes: the GPU setting is the harder task at wider models; both
  settings' points pass the run's checks; another name is refused."""
  module = importlib.import_module("txf.configs.sweeps.mqar_scale")
  cpu, gpu = module.get_config(), module.get_config("gpu")
  for config in (cpu, gpu):
    grid.validate(grid.expand(config), runner.check_point_config)
  assert (cpu.base.data.num_kv_pairs, cpu.base.data.num_symbols, cpu.base.data.seq_len) == (
    8,
    64,
    64,
  )
  assert (gpu.base.data.num_kv_pairs, gpu.base.data.num_symbols, gpu.base.data.seq_len) == (
    64,
    8192,
    512,
  )
  widths = lambda config: sorted({p.overrides["model.d_model"] for p in grid.expand(config)})
  assert widths(cpu) == [32, 64, 128] and widths(gpu) == [64, 128, 256, 512]
  with pytest.raises(ValueError, match="setting 'tpu' is not one of"):
    module.get_config("tpu")


def test_the_long_ln_warmup_differs_in_its_length_alone():
  """sweeps/ln_warmup:long trains twice the steps with the same warmup share,
  evaluation share and grid otherwise; an unknown setting is refused."""
  module = importlib.import_module("txf.configs.sweeps.ln_warmup")
  short, long = module.get_config(), module.get_config("long")
  scaled = {"train.steps", "train.checkpoint_every", "eval.every"}
  flat_short, flat_long = flatten(short.base.to_dict()), flatten(long.base.to_dict())
  assert {k for k in flat_short if flat_short[k] != flat_long[k]} == scaled
  assert all(flat_long[k] == 2 * flat_short[k] for k in scaled)
  for config in (short, long):
    points = [p.overrides for p in grid.expand(config)]
    steps = config.base.train.steps
    assert sorted({p["train.warmup_steps"] for p in points}) == [0, steps // 10]
  with pytest.raises(ValueError, match="setting 'tpu' is not one of"):
    module.get_config("tpu")


def test_the_mqar_control_is_mqar_scales_points_trained_three_times_as_long():
  """sweeps/mqar_steps reruns points of sweeps/mqar_scale, of both families;
  its base config differs in the training length only (steps, and the
  warmup, evaluations and checkpoints that scale with it)."""
  control, original = load_config("sweeps.mqar_steps"), load_config("sweeps.mqar_scale")
  original_points = [p.overrides for p in grid.expand(original)]
  points = [p.overrides for p in grid.expand(control)]
  assert all(p in original_points for p in points)
  assert {p["model.family"] for p in points} == {"decoder", "lstm"}
  rerun = flatten(control.base.to_dict())
  changed = {k: (v, rerun[k]) for k, v in flatten(original.base.to_dict()).items() if rerun[k] != v}
  assert changed == {
    "train.steps": (1500, 4500),
    "train.warmup_steps": (150, 450),
    "train.log_every": (150, 450),
    "train.checkpoint_every": (750, 2250),
    "eval.every": (150, 450),
  }


@pytest.mark.parametrize("setting", [None, "gpu"])
def test_mqar_linear_varies_only_the_attention_of_mqar_scales_decoders(setting):
  """Its softmax points are mqar_scale's decoder points (same configs, so the
  same seeds and batches); its linear points differ in model.attention alone."""
  linear, original = (
    importlib.import_module(f"txf.configs.sweeps.{name}").get_config(setting)
    for name in ("mqar_linear", "mqar_scale")
  )
  assert flatten(linear.base.to_dict()) == flatten(original.base.to_dict())
  decoders = [p.overrides for p in grid.expand(original) if p.overrides["model.family"] != "lstm"]
  points = [p.overrides for p in grid.expand(linear)]
  for attention in ("softmax", "linear"):
    widths = [p["model.d_model"] for p in points if p["model.attention"] == attention]
    assert widths == [p["model.d_model"] for p in decoders]
  grid.validate(grid.expand(linear), runner.check_point_config)


@pytest.mark.parametrize(
  ("name", "source", "family"),
  [("mqar_lr", "mqar_linear", "decoder"), ("mqar_lstm_lr", "mqar_scale", "lstm")],
)
def test_the_learning_rate_sweeps_are_their_sources_points_at_three_rates(name, source, family):
  """sweeps/mqar_lr (mqar_linear's decoders) and sweeps/mqar_lstm_lr
  (mqar_scale's LSTMs): their points at configs/mqar.py's rate are the
  source's points of that family (same base config and overrides), so those
  runs are shared; the rates bracket that rate on both sides."""
  tuned, original = load_config(f"sweeps.{name}"), load_config(f"sweeps.{source}")
  assert flatten(tuned.base.to_dict()) == flatten(original.base.to_dict())
  rate = original.base.train.learning_rate
  points = [p.overrides for p in grid.expand(tuned)]
  configs = {p.name: p.config for p in grid.expand(tuned)}
  assert {c.model.family for c in configs.values()} == {family}
  at_rate = [
    {k: v for k, v in p.items() if k != "train.learning_rate"}
    for p in points
    if p["train.learning_rate"] == rate
  ]
  sources = [p.overrides for p in grid.expand(original)]
  sources = [p for p in sources if p.get("model.family", "decoder") == family]
  assert at_rate == sources
  rates = sorted({p["train.learning_rate"] for p in points})
  assert rates[0] < rate < rates[-1]


def test_the_linear_attention_control_has_the_softmax_controls_schedule():
  """sweeps/mqar_linear_steps is mqar_linear's widest linear point with
  mqar_steps' base config (its steps, warmup, evaluations)."""
  control, linear = load_config("sweeps.mqar_linear_steps"), load_config("sweeps.mqar_linear")
  (point,) = [p.overrides for p in grid.expand(control)]
  assert point == {"model.attention": "linear", "model.d_model": 128}
  assert point in [p.overrides for p in grid.expand(linear)]
  softmax_control = load_config("sweeps.mqar_steps")
  assert flatten(control.base.to_dict()) == flatten(softmax_control.base.to_dict())


def test_a_sweep_whose_evaluator_holds_no_window_at_16x_is_refused_before_training(tmp_path):
  """Without sweep.extrapolate_tokens a point is extrapolated on its
  evaluator's tokens (eval.num_batches x batch_size x (seq_len + 1): 264
  here, where 16 x 32 needs 513): it trained, then stopped the sweep with a
  traceback."""
  # 513 tokens need 2 batches of 8 windows of 33 tokens.
  refused = r"^eval.num_batches: point 0 \(.*\): its 264 evaluation tokens .* give 2 batches"
  with pytest.raises(grid.GridError, match=refused):
    runner.run_sweep(
      toy_sweep(extrapolate_tokens=None),
      tmp_path / "sweep",
      log=lambda line: None,
      extrapolate=fake_extrapolate([]),
    )
  assert not (tmp_path / "sweep").exists()
  # A summary extrapolates nothing: not refused (it found no point, here).
  with pytest.raises(WorkdirError, match="no point of this sweep has run there"):
    runner.run_sweep(
      toy_sweep(extrapolate_tokens=None),
      tmp_path,
      summarize_only=True,
      log=lambda line: None,
      extrapolate=fake_extrapolate([]),
    )


def test_an_extrapolation_refused_after_training_is_one_line_naming_the_point(
  finished_sweep, tmp_path
):
  """A validation split shorter than sweep.extrapolate_tokens is found only
  when the point is extrapolated: a traceback, exit 1, before."""
  workdir = tmp_path / "copy"
  shutil.copytree(finished_sweep["workdir"], workdir)
  (workdir / TOY_NAMES[0] / results.EXTRAPOLATION_FILE).unlink()

  def short_split(run_dir, *, num_tokens, log):
    raise ValueError(
      f"num_tokens: the validation split holds only 200 tokens, asked for {num_tokens}"
    )

  with pytest.raises(
    grid.GridError, match=rf"^point 0 \({TOY_NAMES[0]}\): extrapolation: num_tokens"
  ):
    runner.run_sweep(toy_sweep(), workdir, log=lambda line: None, extrapolate=short_split)


def finished(point, point_dir):
  """Makes `point_dir` a finished point of REPLICAS replicas without training:
  the point's config.json and metrics ending in an eval row at its
  train.steps (no checkpoints folder: its metrics alone say it is done)."""
  point_dir.mkdir(parents=True, exist_ok=True)
  (point_dir / "config.json").write_text(
    json.dumps(run_config.to_json(run_config.parse(point.config)))
  )
  steps = point.config.train.steps
  row = {"step": steps, "eval_loss": 4.0, **{f"eval_loss/{r}": 4.0 for r in range(REPLICAS)}}
  (point_dir / "metrics.jsonl").write_text(json.dumps(row) + "\n")


def recording_run(calls, write=None):
  """A stand-in for loop.run that trains nothing: appends each run
  directory to `calls`, then calls `write(workdir)` (what the run leaves)."""

  def run(config, workdir, **kwargs):
    calls.append(epath.Path(workdir))
    if write is not None:
      write(epath.Path(workdir))

  return run


def no_summary(monkeypatch):
  """runner.summarize replaced by one returning a marker list (plots take
  seconds); returns the marker."""
  marker = ["summarized"]
  monkeypatch.setattr(runner, "summarize", lambda *args, **kwargs: marker)
  return marker


def test_a_diverged_point_is_skipped_on_rerun(tmp_path, monkeypatch):
  """A point the sweep marked diverged is not trained again (it would
  diverge again, spending its whole run): the rerun logs it skipped."""
  calls, lines = [], []
  monkeypatch.setattr(runner.loop, "run", recording_run(calls))
  point_dir = tmp_path / TOY_NAMES[0]
  point_dir.mkdir()
  results.mark_diverged(point_dir, "non-finite loss by step 3")
  runner.run_sweep(toy_sweep(), tmp_path, index=0, log=lines.append)
  assert calls == []
  assert f"point 0 ({TOY_NAMES[0]}): diverged, skipped" in lines


def test_a_point_left_partial_without_a_signal_stops_the_sweep_as_preempted(tmp_path, monkeypatch):
  """A multi-process run learns of a preemption from JAX, not the sweep's
  guard: its loop.run returns with the point saved but unfinished. The
  sweep must stop there (a preemption, to rerun) rather than go on to the
  next point and summarize."""
  calls, lines = [], []
  monkeypatch.setattr(runner.loop, "run", recording_run(calls, write=started))
  no_summary(monkeypatch)
  assert runner.run_sweep(toy_sweep(), tmp_path, log=lines.append) is None
  assert calls == [tmp_path / TOY_NAMES[0]]
  assert lines[-1] == (
    f"sweep preempted in point 0 ({TOY_NAMES[0]}), which is saved; rerun the same command to resume"
  )


def test_a_read_only_unfinished_point_is_refused_before_anything_trains(tmp_path, monkeypatch):
  """A started point the sweep would train on, read-only, stops the sweep in
  one line before any point trains (not when its turn comes)."""
  calls = []
  monkeypatch.setattr(runner.loop, "run", recording_run(calls))
  point = tmp_path / TOY_NAMES[1]
  started(point)
  with (
    read_only(point),
    pytest.raises(
      WorkdirError, match=rf"^{point}: not a writable directory \(Read-only file system\)$"
    ),
  ):
    runner.run_sweep(toy_sweep(), tmp_path, log=lambda line: None)
  assert calls == []


def test_a_read_only_finished_extrapolated_point_is_left_alone(tmp_path, monkeypatch):
  """A point with nothing left to do (trained, extrapolated) is only read:
  its directory being read-only does not stop the sweep."""
  train_calls, extrapolate_calls = [], []
  monkeypatch.setattr(runner.loop, "run", recording_run(train_calls))
  marker = no_summary(monkeypatch)
  points = grid.expand(toy_sweep())
  for point in points:
    finished(point, tmp_path / point.name)
    fake_extrapolate([])(tmp_path / point.name, num_tokens=None, log=None)
  with read_only(tmp_path / TOY_NAMES[0]):
    rows = runner.run_sweep(
      toy_sweep(),
      tmp_path,
      log=lambda line: None,
      extrapolate=fake_extrapolate(extrapolate_calls),
    )
  assert rows is marker and train_calls == [] and extrapolate_calls == []


def test_the_eta_is_the_mean_time_of_the_points_trained_not_of_those_skipped(tmp_path, monkeypatch):
  """A point already done takes ~0 s to skip: counted in the mean, it
  halved the ETA of a sweep resumed after its first point. The line for
  the third point gives the one trained point's time for the one left."""
  fields = {"model.position": ["rope", "alibi", "sinusoidal"], "model.norm_placement": ["pre"]}
  points = grid.expand(toy_sweep(fields))
  now, point_s = [0.0], 600.0
  monkeypatch.setattr(runner.time, "perf_counter", lambda: now[0])

  def train(point_dir):
    now[0] += point_s
    finished(next(p for p in points if p.name == point_dir.name), point_dir)

  monkeypatch.setattr(runner.loop, "run", recording_run([], write=train))
  no_summary(monkeypatch)
  finished(points[0], tmp_path / points[0].name)
  lines = []
  runner.run_sweep(toy_sweep(fields), tmp_path, log=lines.append)
  progress = [line for line in lines if line.startswith("sweep: ")]
  assert progress[2] == runner.format_sweep_progress(3, 3, points[2], point_s, [point_s])
