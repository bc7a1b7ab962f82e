"""End-to-end tests of the experiment runner (txf.train.loop.run and
`python -m experiments.run`): artifacts, config errors, exact resume,
preemption, corrupt checkpoints, learning in every model family, divergence.

Runs are tiny (d_model 32, one layer, seq_len 32, a few steps); their cost is
XLA compilation, so this module turns on JAX's persistent compilation cache
(in a temporary directory, for this module and its subprocesses only): runs of
the same program -- a resumed run, a rerun, a CLI run of an in-process config
-- compile once. The configs here use train.decay='constant', whose compiled
step does not depend on train.steps, so reruns with more steps share it too.
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time

import jax
import numpy as np
import pytest

from conftest import (
  REPO,
  assert_same_states,
  checkpoint_steps,
  cli_command,
  cli_env,
  output_lines,
  restore_state,
  sigterm_at,
  tiny_config as tiny,
  truncate_state_files,
  without_timings,
)
from txf.runconfig.run_config import parse
from txf.rundir.checkpoint import PreemptionGuard
from txf.rundir.metrics import read_metrics
from txf.rundir.record import read_record
from txf.rundir.resume import prepare_resume, read_run_config
from txf.train import loop
from txf.train.run_setup import setup_run


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


def run_quietly(config, workdir):
  lines = []
  result = loop.run(parse(config), workdir, log=lines.append)
  return result, "\n".join(lines)


def train_rows(workdir):
  return [row for row in read_metrics(workdir) if "loss" in row]


def file_digests(directory):
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(pathlib.Path(directory).rglob("*"))
    if p.is_file()
  }


# --- the command line --------------------------------------------------------


def txf_run(commands, workdir, config, *flags):
  """`python -m experiments.run` of `config` (rope's, changed) in `workdir`,
  forked from the module's command server; its CompletedProcess."""
  _, _, module, *args = cli_command("rope", workdir, config, *flags)
  return commands.run(module, *args, timeout=300)


@pytest.mark.slow
def test_cli_end_to_end(tmp_path, commands):
  workdir = tmp_path / "run"
  config = tiny(
    steps=12, train__log_every=3, train__checkpoint_every=6, eval__every=6, eval__sample_tokens=8
  )
  done = txf_run(commands, workdir, config)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "step 12/12" in done.stdout
  # The first step says it compiles, then that it ran, before the first
  # step of the log cadence (3).
  steps = [line.split(" (")[0] for line in output_lines(done.stdout) if line.startswith("step ")]
  assert steps[:3] == [
    "step 1/12: compiling the train step",
    steps[1],
    "step 3/12",
  ]
  assert re.fullmatch(r"step 1/12: compiled and ran in \d+s", steps[1])

  assert checkpoint_steps(workdir) == [6, 12]
  saved = json.loads((workdir / "config.json").read_text())
  assert saved["model"]["d_model"] == 32 and saved["train"]["steps"] == 12
  assert saved["model"]["position"] == "rope"

  rows = read_metrics(workdir)
  assert [r["step"] for r in rows if "loss" in r] == [3, 6, 9, 12]
  assert all(np.isfinite(r["loss"]) for r in rows if "loss" in r)
  # The rate of the update that made step s: the schedule's at s - 1 (it
  # counts updates from 0); the 4 warmup steps make the two differ at step 3.
  schedule = parse(config).schedule
  for r in rows:
    if "loss" in r:
      assert r["learning_rate"] == pytest.approx(float(schedule(r["step"] - 1)), rel=1e-6)
  assert schedule(2) != schedule(3)
  evals = [r for r in rows if "eval_loss" in r]
  assert [r["step"] for r in evals] == [6, 12]
  for record in evals:
    assert 0 < record["eval_loss"] < 20 and 0 <= record["eval_accuracy"] <= 1
    assert record["eval_perplexity"] == pytest.approx(np.exp(record["eval_loss"]))

  events = list((workdir / "tb").glob("events.out.tfevents.*"))
  assert events and all(e.stat().st_size > 0 for e in events)
  samples = (workdir / "samples.txt").read_text()
  assert "=== step 6 ===" in samples and "=== step 12 ===" in samples
  assert len(samples.split("=== step 12 ===\n")[1].strip()) > 0

  # --resume_step reaches the run: a step with no checkpoint is refused in
  # one line, exit 2, before anything is written.
  before = file_digests(workdir)
  refused = txf_run(commands, workdir, config, "--resume_step=7")
  assert refused.returncode == 2, refused.stderr[-3000:]
  assert refused.stderr.strip().splitlines()[-1] == (
    f"config error: resume_step: no checkpoint at step 7 in {workdir / 'checkpoints'} "
    "(steps: 6, 12)"
  )
  assert file_digests(workdir) == before


@pytest.mark.slow
@pytest.mark.parametrize(
  "fields, extra, field",
  [
    ({}, ["--config.model.bogus=1"], "model.bogus"),  # unknown override
    ({"model__num_heads": 3}, [], "model.num_heads"),  # 3 does not divide 32
  ],
)
def test_cli_config_error(tmp_path, commands, fields, extra, field):
  workdir = tmp_path / "run"
  done = txf_run(commands, workdir, tiny(**fields), *extra)
  assert done.returncode == 2, done.stderr[-3000:]
  last_line = done.stderr.strip().splitlines()[-1]
  assert last_line.startswith("config error: ") and field in last_line, done.stderr[-3000:]
  assert not (workdir / "checkpoints").exists()


@pytest.mark.slow
def test_sigterm_saves_exits_0_and_resumes(tmp_path, compilation_cache_dir):
  workdir, total = tmp_path / "run", 100_000
  config = tiny(steps=total, train__log_every=10, train__checkpoint_every=total)
  log_path = tmp_path / "log.txt"
  with open(log_path, "w") as log_file:  # a file, not a pipe: it never fills up
    process = subprocess.Popen(
      cli_command("rope", workdir, config),
      cwd=REPO,
      stdout=log_file,
      stderr=subprocess.STDOUT,
      env=cli_env(compilation_cache_dir),
    )
    try:
      deadline = time.monotonic() + 300
      while f"step 10/{total}" not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < deadline, "no progress line within 300 s"
        time.sleep(0.1)
      process.send_signal(signal.SIGTERM)
      returncode = process.wait(timeout=120)
    finally:
      if process.poll() is None:
        process.kill()
        process.wait()
  text = log_path.read_text()
  assert returncode == 0, text[-3000:]
  saved = int(re.search(r"preempted: saved step (\d+)", text).group(1))
  assert 10 <= saved < total
  assert checkpoint_steps(workdir) == [saved]
  assert max(r["step"] for r in train_rows(workdir)) <= saved

  # The same config with a reachable end: resumes there and finishes.
  result, text = run_quietly(
    tiny(steps=saved + 5, train__log_every=10, train__checkpoint_every=total), workdir
  )
  assert f"resumed from step {saved}" in text
  assert set(result) == {"eval_loss", "eval_accuracy", "eval_perplexity"}
  assert checkpoint_steps(workdir) == [saved, saved + 5]  # max_to_keep=2
  assert train_rows(workdir)[-1]["step"] == saved + 5


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_run_sets_up_stops_it_at_once_writing_nothing(
  tmp_path, monkeypatch, signum
):
  """A preemption's grace period is shorter than a large model's setup: a
  signal while it sets up stops it there (the setup is not finished), with
  nothing to save and nothing written; the guard says which it was."""
  finished = []

  def setup_receiving_a_signal(run, workdir):
    os.kill(os.getpid(), signum)
    finished.append(setup_run(run, workdir))  # not reached: the handler raises first

  monkeypatch.setattr(loop, "setup_run", setup_receiving_a_signal)
  lines, workdir = [], tmp_path / "run"
  with PreemptionGuard() as guard:
    result = loop.run(parse(tiny()), workdir, log=lines.append, preemption=guard)
  assert result == {} and finished == [] and guard.requested
  assert guard.interrupted == (signum == signal.SIGINT)
  reason = "interrupted" if signum == signal.SIGINT else "preempted"
  assert lines == [
    f"{reason} while the run set up: nothing trained or saved; rerun the same command"
  ]
  assert not workdir.exists() or list(workdir.iterdir()) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_the_run_starts_stops_it_with_its_line(tmp_path, signum):
  """A signal between the guard's install and loop.run (txf-run parsing its
  config) stops the run before its setup starts, with the same one line:
  it raised "generator didn't yield", exit 1."""
  lines, workdir = [], tmp_path / "run"
  with PreemptionGuard() as guard:
    os.kill(os.getpid(), signum)
    result = loop.run(parse(tiny()), workdir, log=lines.append, preemption=guard)
  reason = "interrupted" if signum == signal.SIGINT else "preempted"
  assert result == {} and guard.reason == reason
  assert lines == [
    f"{reason} while the run set up: nothing trained or saved; rerun the same command"
  ]
  assert not workdir.exists()


def test_a_signal_after_a_run_refused_while_it_set_up_waits_for_its_caller(tmp_path, monkeypatch):
  """A run refused while it sets up (a config error) hands the guard back
  deferring: a SIGTERM after it (txf-run saying the error, a sweep going on
  to its next point) is the caller's to read from `requested`; left stopping
  at once it raised StoppedBeforeTraining wherever the caller was."""

  def refused(run, workdir):
    raise loop.ConfigError("model.d_model: refused")

  monkeypatch.setattr(loop, "setup_run", refused)
  with PreemptionGuard() as guard:
    with pytest.raises(loop.ConfigError, match="refused"):
      loop.run(parse(tiny()), tmp_path / "run", log=lambda line: None, preemption=guard)
    os.kill(os.getpid(), signal.SIGTERM)  # raised here, in the caller, if still at once
    assert guard.requested and guard.reason == "preempted"


def test_a_signal_after_the_setup_wrote_a_tokenizer_removes_it(tmp_path, monkeypatch):
  """A sentencepiece model trained by a setup the signal stopped was left
  behind, and a later run in the directory read it as its own whatever its
  corpus; what was there before stays."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine\n")

  def setup_training_a_tokenizer(run, workdir):
    (workdir / "sentencepiece_512.model").write_bytes(b"trained here")
    os.kill(os.getpid(), signal.SIGTERM)

  monkeypatch.setattr(loop, "setup_run", setup_training_a_tokenizer)
  lines = []
  with PreemptionGuard() as guard:
    assert loop.run(parse(tiny()), workdir, log=lines.append, preemption=guard) == {}
  assert lines == [
    "preempted while the run set up: nothing trained or saved; rerun the same command"
  ]
  assert sorted(os.listdir(workdir)) == ["notes.txt"]


def test_a_ctrl_c_that_reaches_the_loop_is_recorded_as_interrupted(tmp_path):
  """A second Ctrl-C (the first's save under way) raised KeyboardInterrupt
  through the loop: its record said 'KeyboardInterrupt', where the docs
  name a Ctrl-C 'interrupted'."""
  lines, workdir = [], tmp_path / "run"

  def log(line):
    lines.append(line)
    if line.startswith("step 2/"):
      raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    loop.run(parse(tiny(steps=4)), workdir, log=log)
  (entry,) = read_record(workdir)
  assert entry["ended"] == "interrupted" and entry["end_step"] == 2


def test_a_sigterm_at_the_last_step_says_the_run_is_finished(tmp_path, sigterm_is_caught):
  """It said `rerun the same command to resume`, with nothing left to resume."""
  lines, workdir = [], tmp_path / "run"
  loop.run(parse(tiny(steps=2)), workdir, log=sigterm_at(2, lines))
  assert "preempted at the last step: saved step 2, the run is finished" in lines
  assert not any("rerun" in line for line in lines) and sigterm_is_caught == []
  (entry,) = read_record(workdir)
  assert entry["ended"] == "finished" and checkpoint_steps(workdir) == [2]


# --- resume and checkpoints (in-process) --------------------------------------


@pytest.mark.slow  # trains a run
def test_interrupted_run_resumes_exactly(tmp_path, sigterm_is_caught):
  """Steps 1-12 in one go == steps 1-3, preempted, then 4-12 resumed: the same
  final state bit for bit, and the same metrics at every step. The cut is
  inside the 4-step warmup, so the resumed learning rate depends on the
  restored step count; evals at 2, 4, ..., 12."""
  config = tiny(steps=12, eval__every=2, train__checkpoint_every=3)  # preempted at a save step
  straight, interrupted = tmp_path / "straight", tmp_path / "interrupted"
  expected, _ = run_quietly(config, straight)

  lines = []
  partial = loop.run(parse(config), interrupted, log=sigterm_at(3, lines))
  assert any(line.startswith("preempted: saved step 3") for line in lines), lines
  assert sigterm_is_caught == []  # the runner's guard took it, not the fallback
  evals = without_timings([r for r in read_metrics(interrupted) if "eval_loss" in r])
  assert [r.pop("step") for r in evals] == [2] and partial == evals[0]  # its last eval
  assert checkpoint_steps(interrupted) == [3]
  assert max(r["step"] for r in read_metrics(interrupted)) == 3
  (entry,) = read_record(interrupted)  # the run record says how it stopped
  assert entry["ended"] == "preempted" and entry["end_step"] == 3

  result, text = run_quietly(config, interrupted)
  assert "resumed from step 3" in text
  # The first step after the resume compiles; logged every step, the
  # cadence's line says it ran.
  assert "step 4/12: compiling the train step" in text and "compiled and ran" not in text
  assert "changed from the run's config.json" not in text  # the same config
  assert result == expected
  assert [e["ended"] for e in read_record(interrupted)] == ["preempted", "finished"]
  assert without_timings(read_metrics(interrupted)) == without_timings(read_metrics(straight))
  assert [r["step"] for r in train_rows(straight)] == list(range(1, 13))

  final_a, final_b = restore_state(straight, 12), restore_state(interrupted, 12)
  assert_same_states(final_a, final_b)
  assert int(final_a["step"]) == 12


# After a failed restore, orbax's tensorstore sometimes completes a future on an
# already-closed asyncio loop (a harmless "Event loop is closed" in a thread).
@pytest.mark.slow  # trains a run
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_corrupt_latest_checkpoint_falls_back(tmp_path, caplog):
  workdir = tmp_path / "run"
  run_quietly(tiny(steps=8, train__checkpoint_every=4), workdir)
  assert checkpoint_steps(workdir) == [4, 8]
  first_rows = train_rows(workdir)
  truncate_state_files(workdir / "checkpoints" / "8")

  result, text = run_quietly(tiny(steps=12, train__checkpoint_every=4), workdir)
  assert "resumed from step 4" in text
  # Said before training; train.decay='constant': the learning rate does not move.
  assert "\nchanged from the run's config.json: train.steps 8 -> 12\n" in text
  assert "step 8" in caplog.text  # the checkpointer's warning names the bad step
  assert (workdir / "checkpoints" / "8.corrupt").is_dir()
  assert checkpoint_steps(workdir) == [8, 12]
  assert "eval_loss" in result
  rows = train_rows(workdir)
  # Steps 5-8 were trained again: their first rows moved aside, one row per step.
  assert [r["step"] for r in rows] == list(range(1, 13))
  dropped = [
    json.loads(line) for line in (workdir / "metrics.dropped.jsonl").read_text().splitlines()
  ]
  assert [r["step"] for r in dropped if "loss" in r] == [5, 6, 7, 8]
  # Retrained from step 4's state and data position: the same losses.
  assert [r["loss"] for r in rows[4:8]] == [r["loss"] for r in first_rows[4:8]]


@pytest.mark.slow  # trains a run, resumes it twice
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_fallback_inside_the_warmup_trains_as_resuming_from_that_step(tmp_path):
  """Trained 8 steps with a warmup of 6 and extended to 12 with one of 12: from
  step 8 the warmup of 6, finished, stays; step 8 corrupt, the run restores
  step 4, inside it, and trains with the warmup of 12 as --resume_step=4
  does (it kept the newest step's 6)."""
  first = tmp_path / "first"
  run_quietly(tiny(steps=8, train__warmup_steps=6, train__checkpoint_every=4), first)
  explicit, fallback = tmp_path / "explicit", tmp_path / "fallback"
  shutil.copytree(first, explicit)
  shutil.copytree(first, fallback)
  truncate_state_files(fallback / "checkpoints" / "8")
  extended = tiny(steps=12, train__warmup_steps=12, train__checkpoint_every=4)
  # A setup of the caller's, made for the newest step, cannot be set up again.
  callers = tmp_path / "callers"
  shutil.copytree(fallback, callers)
  prepared, _ = prepare_resume(parse(extended), callers)
  assert prepared.train.warmup_steps == 6
  with pytest.raises(loop.ConfigError, match=r"^checkpoint step 4 restored in place of a newer"):
    loop.run(parse(extended), callers, log=lambda line: None, setup=setup_run(prepared, callers))
  loop.run(parse(extended), explicit, log=lambda line: None, resume_step=4)
  _, text = run_quietly(extended, fallback)
  assert "resumed from step 4" in text and "the warmup this run finished" not in text
  assert text.count("resumed from step") == 1 and "train.warmup_steps 6 -> 12" in text
  assert read_run_config(fallback).train.warmup_steps == 12
  assert without_timings(train_rows(fallback)) == without_timings(train_rows(explicit))
  assert_same_states(restore_state(fallback, 12), restore_state(explicit, 12))


@pytest.mark.slow  # trains a run
def test_resume_step_retrains_from_it_and_keeps_the_best_and_every_nth(tmp_path):
  """Trained to 8 (saves every 2, evals every 2; keeps the newest, every 4th
  and the best eval_loss), then resumed from step 4: steps 5-8 retrained from
  step 4's state and data position give the same losses, and what the resume
  replaces (checkpoints, metrics rows) is moved aside, not deleted."""
  workdir = tmp_path / "run"
  keep = dict(eval__every=2, train__checkpoint_every=2, train__max_to_keep=1, train__keep_every=4)
  run_quietly(tiny(steps=8, train__keep_best=1, **keep), workdir)
  evals = {r["step"]: r for r in read_metrics(workdir) if "eval_loss" in r}
  best = min(evals, key=lambda step: evals[step]["eval_loss"])
  assert checkpoint_steps(workdir) == sorted({4, 8, best})
  for step in checkpoint_steps(workdir):  # ranked by the eval at their step
    saved = json.loads((workdir / "checkpoints" / str(step) / "metrics" / "metrics").read_text())
    assert saved["eval_loss"] == evals[step]["eval_loss"]
  first_rows = train_rows(workdir)

  with pytest.raises(
    loop.ConfigError, match=r"^resume_step: no checkpoint at step 3 in .*\(steps: "
  ):
    loop.run(parse(tiny(steps=8, **keep)), workdir, log=lambda line: None, resume_step=3)
  # Refused before a checkpoint moves: nothing left to train from step 4, or
  # step 4's data position in batches of 12 (it read 4 batches of 8).
  kept = checkpoint_steps(workdir)
  for config, refusal in [
    (tiny(steps=4, **keep), r"^resume_step: 4 is not before train\.steps=4"),
    (tiny(steps=8, data__batch_size=12, **keep), r"^data\.batch_size: the data position of"),
  ]:
    with pytest.raises(loop.ConfigError, match=refusal):
      loop.run(parse(config), workdir, log=lambda line: None, resume_step=4)
    assert checkpoint_steps(workdir) == kept
  # What txf-extrapolate and txf-analyze derived from step 8: another
  # model's once steps 5-8 train again (a sweep's table put its losses beside
  # the new run's); an analysis of step 4 is of the weights that stay.
  (workdir / "extrapolation.json").write_text(json.dumps({"step": 8}))
  (workdir / "analysis").mkdir()
  (workdir / "analysis" / "analysis.json").write_text(json.dumps({"step": 4, "files": []}))
  lines = []
  loop.run(parse(tiny(steps=8, **keep)), workdir, log=lines.append, resume_step=4)
  moved = ", ".join(f"{step}.dropped" for step in sorted({8, best}) if step > 4)
  assert (
    f"resumed from step 4 in {workdir / 'checkpoints'}; the later steps moved to {moved}" in lines
  )
  assert (
    "moved extrapolation.json to extrapolation.json.dropped (of a checkpoint after step 4, "
    "whose step training writes again)"
  ) in lines
  assert json.loads((workdir / "extrapolation.json.dropped").read_text()) == {"step": 8}
  assert not (workdir / "extrapolation.json").exists() and (workdir / "analysis").is_dir()
  rows = train_rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, 9))
  assert [r["loss"] for r in rows] == [r["loss"] for r in first_rows]
  dropped = [
    json.loads(line) for line in (workdir / "metrics.dropped.jsonl").read_text().splitlines()
  ]
  assert [r["step"] for r in dropped if "loss" in r] == [5, 6, 7, 8]
  assert (workdir / "checkpoints" / "8.dropped" / "state").is_dir()
  assert checkpoint_steps(workdir) == [4, 8]  # without keep_best now: 4 (every 4th), 8


@pytest.mark.slow  # trains a run
def test_more_evaluation_batches_than_the_split_holds_are_said(tmp_path):
  """Each evaluation read the batches the split holds, without a word: its
  metrics were of fewer than eval.num_batches."""
  tiny_split = dict(data__max_corpus_bytes=2_800, eval__num_batches=50)
  _, text = run_quietly(tiny(steps=1, **tiny_split), tmp_path / "run")
  held = setup_run(parse(tiny(steps=1, **tiny_split))).eval_data.num_batches
  assert 1 <= held < 50
  assert f"eval.num_batches=50: the validation split holds {held} batches of 8; " in text
  _, text = run_quietly(tiny(steps=1, **{**tiny_split, "eval__num_batches": held}), tmp_path / "b")
  assert "the validation split holds" not in text


@pytest.mark.slow  # trains a run
def test_a_longer_seq_len_past_the_position_taken_is_refused_naming_it(tmp_path):
  """Twice the seq_len halves the windows of an epoch: a run that took more
  than the new epoch holds cannot continue. The refusal named
  data.batch_size, which had not changed, beside a 'damaged' checkpoint."""
  workdir = tmp_path / "run"
  small = dict(data__max_corpus_bytes=2_800, train__checkpoint_every=8)  # ~10 batches an epoch
  run_quietly(tiny(steps=8, **small), workdir)  # 64 windows of 33 tokens taken
  with pytest.raises(loop.ConfigError, match=r"^data\.seq_len: the data position of checkpoint"):
    run_quietly(tiny(steps=12, data__seq_len=64, **small), workdir)
  assert checkpoint_steps(workdir) == [8]


@pytest.mark.slow  # trains a run
def test_resume_step_says_what_the_steps_it_retrains_were_first_trained_with(tmp_path):
  """Steps 5-8 first trained with train.steps 8 (a cosine's end), then the
  run went on to 12: --resume_step=4 retrains them on the 12-step schedule.
  config.json says 12 already, so nothing said so."""
  workdir, keep = (
    tmp_path / "run",
    dict(train__checkpoint_every=4, train__decay="cosine", train__max_to_keep=5),
  )
  run_quietly(tiny(steps=8, **keep), workdir)
  run_quietly(tiny(steps=12, **keep), workdir)
  lines = []
  loop.run(parse(tiny(steps=12, **keep)), workdir, log=lines.append, resume_step=4)
  assert (
    "resume_step: steps 5 on were first trained with train.steps 8; they are trained again "
    "with train.steps 12"
  ) in lines
  lines = []  # back to 8 again: steps 9 on were trained with this config (12) only
  loop.run(parse(tiny(steps=12, **keep)), workdir, log=lines.append, resume_step=8)
  assert not [line for line in lines if line.startswith("resume_step:")]


@pytest.mark.slow  # trains a run
def test_divergence_raises_and_keeps_the_last_checkpoint(tmp_path):
  workdir = tmp_path / "run"
  run_quietly(tiny(steps=8, train__checkpoint_every=4), workdir)
  before = file_digests(workdir / "checkpoints" / "8")

  with pytest.raises(loop.TrainingDiverged) as info:
    run_quietly(tiny(steps=16, train__checkpoint_every=4, train__learning_rate=1e6), workdir)
  diverged = int(re.search(r"by step (\d+)", str(info.value)).group(1))
  assert 8 < diverged <= 16
  assert all(step < diverged for step in checkpoint_steps(workdir))
  assert file_digests(workdir / "checkpoints" / "8") == before
  for leaf in jax.tree.leaves(restore_state(workdir, 8)):
    assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
  assert not any(np.isnan(r["loss"]) for r in train_rows(workdir))


# --- every family learns -------------------------------------------------------


@pytest.mark.slow  # trains a run
@pytest.mark.parametrize(
  "name, steps, batch_size, margin",
  [
    ("rope", 30, 8, 0.5),
    ("encoder_mlm", 20, 16, 0.5),
    ("encoder_classify", 40, 16, 0.15),  # 10 labels: mostly learns their prior this soon
    ("seq2seq", 20, 8, 0.5),
  ],
)
def test_family_learns(tmp_path, name, steps, batch_size, margin):
  """Mean of the last 3 logged train losses is clearly below the first 3
  (averaged: single small batches are noisy, MLM's especially). Margins are
  about half the smallest drop seen over seeds 0-3."""
  config = tiny(name, steps=steps, data__batch_size=batch_size, train__learning_rate=3e-3)
  result, _ = run_quietly(config, tmp_path / "run")
  losses = [r["loss"] for r in train_rows(tmp_path / "run")]
  assert len(losses) == steps and all(np.isfinite(losses))
  first, last = np.mean(losses[:3]), np.mean(losses[-3:])
  assert last < first - margin, losses
  assert np.isfinite(result["eval_loss"]) and 0 <= result["eval_accuracy"] <= 1


BAND_STEPS, BAND_EVAL_BATCHES = 100, 16
BAND = (2.74, 3.22)


@pytest.mark.slow  # trains a run
def test_decoder_eval_loss_lands_in_a_narrow_band(tmp_path):
  """The end-to-end decoder run reaches the eval loss its seeds reach (the
  old check accepted anything in (0, 20)).

  Config: configs/rope.py at test size (`tiny`), 100 steps at lr 3e-3, batch
  8, eval over 16 batches. Measured eval losses for seeds 0-4 (2026-11-23):
  2.996, 3.071, 2.915, 2.957, 2.953; mean 2.978, sample std 0.059. Band =
  mean +- max(4 std, 0.1) = [2.74, 3.22]. Only seed 0 runs here.

  At this length the band catches runs that fail to learn, not subtle wiring:
  seed 0 with RoPE on the queries only reached 3.015, without the attention
  scale 3.036, with the residuals dropped 3.130 -- all inside (the layer
  references catch those).
  """
  config = tiny(
    "rope",
    steps=BAND_STEPS,
    data__batch_size=8,
    train__learning_rate=3e-3,
    eval__num_batches=BAND_EVAL_BATCHES,
  )
  assert config.seed == 0
  result, _ = run_quietly(config, tmp_path / "run")
  assert BAND[0] < result["eval_loss"] < BAND[1], result


@pytest.mark.slow  # trains a run
def test_rerunning_a_finished_run_trains_nothing_and_reports_the_same_eval(tmp_path):
  config = tiny("rope", steps=4)
  first, _ = run_quietly(config, tmp_path)
  again, log_text = run_quietly(config, tmp_path)
  assert "already trained to step 4 of 4" in log_text
  assert again == first
  # The evaluation is printed, not only returned: a rerun at a new length shows its loss.
  assert f"eval @ 4 (data.seq_len={config.data.seq_len}" in log_text
  assert f"eval_loss={again['eval_loss']:.4f}" in log_text.split("already trained")[1]
  assert checkpoint_steps(tmp_path) == [4]
  # train.steps lowered past the step trained to: 'the run is finished' was not why.
  lowered, log_text = run_quietly(tiny("rope", steps=2), tmp_path)
  assert "already trained to step 4 of 2" in log_text
  assert "not written: train.steps=2 is past)" in log_text and lowered == first


class _SlowToLower:
  """A jitted function whose `lower` (what the loop's background compilation
  calls) takes `seconds` longer."""

  def __init__(self, jitted, seconds):
    self._jitted, self._seconds = jitted, seconds

  def __call__(self, *args, **kwargs):
    return self._jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    time.sleep(self._seconds)
    return self._jitted.lower(*args, **kwargs)


@pytest.mark.slow  # trains a run
def test_the_evaluation_compiles_beside_the_first_step_and_is_done_by_the_second(tmp_path):
  """Compiling beside the timed steps cost them on a GPU (1.4 s of steps
  51-250 on an H200): however long the evaluation takes to compile, no step
  after the first is dispatched while it does."""
  setup = setup_run(parse(tiny(steps=4)))
  compiling, train_step = [], setup.train_step

  def step(state, batch):
    compiling.append(any(t.name == loop.COMPILE_THREAD for t in threading.enumerate()))
    return train_step(state, batch)

  slow = dataclasses.replace(
    setup, train_step=step, eval_step=_SlowToLower(setup.eval_step, seconds=2.0)
  )
  result = loop.run(slow.run, tmp_path, log=lambda line: None, setup=slow)
  assert compiling[0] and compiling[1:] == [False] * 3
  assert "eval_loss" in result
