"""Faults during a run: a failed checkpoint write, two runs on one work
directory, a resume with a changed optimizer, lost checkpoints, SIGKILL
between a log and a checkpoint. Each test reproduces the fault and checks the
exit status, the one-line message, that the process ends within a bound, and
that nothing already written changed."""

import hashlib
import json
import pathlib
import re
import shutil
import signal
import subprocess
import threading
import time

import pytest

from conftest import (
  REPO,
  checkpoint_steps,
  cli_command,
  cli_env,
  tiny_config as tiny,
  truncate_state_files,
)
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.metrics import read_metrics
from txf.train import loop

pytestmark = pytest.mark.slow  # subprocess runs: ~1-2 minutes in all


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


def digests(directory):
  """sha256 of every file (but the lock, which records its latest holder)."""
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(pathlib.Path(directory).rglob("*"))
    if p.is_file() and p.name != ".lock"
  }


def start(workdir, config, log_path, cache):
  log_file = open(log_path, "w")  # a file, not a pipe: it never fills up
  process = subprocess.Popen(
    cli_command("rope", workdir, config),
    cwd=REPO,
    stdout=log_file,
    stderr=subprocess.STDOUT,
    env=cli_env(cache),
  )
  log_file.close()
  return process


def has_checkpoint(workdir, step):
  return (workdir / "checkpoints").is_dir() and step in checkpoint_steps(workdir)


def wait_for(predicate, process, log_path, seconds=300):
  deadline = time.monotonic() + seconds
  while not predicate():
    assert process.poll() is None, log_path.read_text()[-3000:]
    assert time.monotonic() < deadline, f"timed out; log:\n{log_path.read_text()[-3000:]}"
    time.sleep(0.05)


def last_line(log_path):
  return log_path.read_text().strip().splitlines()[-1]


def endless(**fields):
  return tiny(steps=100_000, **fields)


def put_in_the_way(directory: pathlib.Path, scratch: pathlib.Path) -> None:
  """Puts a file where `directory` was. The run may make the directory again
  (its next checkpoint) between the test's rename and this: a file renamed
  over it fails then, so the new directory goes and the rename is tried again
  (bounded)."""
  scratch.write_text("in the way")
  for _ in range(100):
    try:
      scratch.rename(directory)
      return
    except IsADirectoryError:
      shutil.rmtree(directory, ignore_errors=True)
  pytest.fail(f"{directory} kept coming back")


def test_failed_checkpoint_write_stops_the_run_promptly(tmp_path, compilation_cache_dir):
  """The checkpoint directory becomes unusable mid-run (as when a mount goes
  read-only): the run ends with exit 1 and one line naming the path and cause,
  instead of hanging in orbax's threads; the finalised checkpoint is intact."""
  workdir, log_path = tmp_path / "run", tmp_path / "log.txt"
  process = start(workdir, endless(train__checkpoint_every=2), log_path, compilation_cache_dir)
  try:
    wait_for(lambda: has_checkpoint(workdir, 2), process, log_path)
    before = digests(workdir / "checkpoints" / "2")
    (workdir / "checkpoints").rename(tmp_path / "kept")
    put_in_the_way(workdir / "checkpoints", tmp_path / "in_the_way")
    returncode = process.wait(timeout=60)
  finally:
    process.kill()
  line = last_line(log_path)
  assert returncode == 1, log_path.read_text()[-3000:]
  assert line.startswith("checkpoint error: ") and str(workdir / "checkpoints") in line, line
  # What is wrong with the directory, as the run saw it when the save
  # failed: the file in the way; or, the failure between the move and the
  # file, no such directory, or one the save made again (put_in_the_way
  # removes it). What orbax said about the file it was writing varies with
  # the moment (a save in progress: NOT_FOUND, no OS reason).
  assert line.endswith(
    tuple(
      f"; the directory now: {problem}"
      for problem in (
        "Not a directory",
        "No such file or directory",
        "not the directory the run opened (that one was moved or removed)",
      )
    )
  ), line
  assert digests(tmp_path / "kept" / "2") == before


def test_second_run_on_a_workdir_is_refused_and_a_killed_ones_lock_is_not_stale(
  tmp_path, compilation_cache_dir
):
  workdir = tmp_path / "run"
  first_log, second_log = tmp_path / "first.txt", tmp_path / "second.txt"
  first = start(workdir, endless(), first_log, compilation_cache_dir)
  try:
    wait_for(lambda: "step 2/" in first_log.read_text(), first, first_log)
    second = start(workdir, endless(), second_log, compilation_cache_dir)
    assert second.wait(timeout=120) == 2
    line = last_line(second_log)
    assert line.startswith(f"workdir error: {workdir}: in use by another run"), line
    assert f'"pid": {first.pid}' in line and '"host": ' in line, line
    assert first.poll() is None  # the first run goes on undisturbed
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()
  steps = [row["step"] for row in read_metrics(workdir) if "loss" in row]
  assert steps == list(range(1, len(steps) + 1))  # one writer: no interleaved rows
  # SIGKILL leaves the lock file behind; the lock itself died with the process.
  assert (workdir / ".lock").exists()
  result = loop.run(parse(tiny(steps=4)), workdir, log=lambda line: None)
  assert result["eval_loss"] > 0


def test_resume_with_a_changed_optimizer_names_the_field_and_writes_nothing(tmp_path):
  workdir = tmp_path / "run"
  loop.run(parse(tiny(steps=4, train__checkpoint_every=4)), workdir, log=lambda line: None)
  before = digests(workdir)
  with pytest.raises(
    ConfigError,
    match=r"^train\.grad_clip_norm: 1\.0 -> 0\.0 changes the "
    r"optimizer state",
  ):
    loop.run(
      parse(tiny(steps=8, train__checkpoint_every=4, train__grad_clip_norm=0.0)),
      workdir,
      log=lambda line: None,
    )
  assert digests(workdir) == before  # config.json, metrics, checkpoints untouched


def test_restart_without_checkpoints_moves_the_old_history_aside(tmp_path):
  workdir = tmp_path / "run"
  loop.run(parse(tiny(steps=4, train__checkpoint_every=4)), workdir, log=lambda line: None)
  old_rows = (workdir / "metrics.jsonl").read_text()
  for path in (workdir / "checkpoints").iterdir():
    for file in sorted(path.rglob("*"), reverse=True):
      file.unlink() if file.is_file() else file.rmdir()
    path.rmdir()
  lines = []
  loop.run(parse(tiny(steps=4, train__checkpoint_every=4)), workdir, log=lines.append)
  assert any("moved 5 records of metrics.jsonl logged after step 0" in line for line in lines)
  assert [row["step"] for row in read_metrics(workdir) if "loss" in row] == [1, 2, 3, 4]
  assert [row["step"] for row in read_metrics(workdir) if "eval_loss" in row] == [4]
  assert (workdir / "metrics.dropped.jsonl").read_text() == old_rows


def test_sigkill_between_a_log_and_a_checkpoint_keeps_one_row_per_step(
  tmp_path, compilation_cache_dir
):
  workdir, log_path = tmp_path / "run", tmp_path / "log.txt"
  process = start(workdir, endless(train__checkpoint_every=20), log_path, compilation_cache_dir)
  try:
    # Killed once checkpoint 20 is final and a few more steps are logged.
    wait_for(
      lambda: has_checkpoint(workdir, 20) and "step 23/" in log_path.read_text(), process, log_path
    )
  finally:
    process.send_signal(signal.SIGKILL)
    process.wait()
  logged = max(row["step"] for row in read_metrics(workdir))
  resumed_from = max(checkpoint_steps(workdir))
  assert logged > resumed_from  # the fault: steps logged after the last checkpoint
  lines = []
  loop.run(parse(tiny(steps=logged + 2, train__checkpoint_every=20)), workdir, log=lines.append)
  assert f"resumed from step {resumed_from}" in "\n".join(lines)
  train_steps = [row["step"] for row in read_metrics(workdir) if "loss" in row]
  assert train_steps == list(range(1, logged + 3))
  dropped = [
    json.loads(line)["step"]
    for line in (workdir / "metrics.dropped.jsonl").read_text().splitlines()
  ]
  assert dropped == list(range(resumed_from + 1, logged + 1))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_all_checkpoints_corrupt_is_one_line_exit_2(tmp_path, compilation_cache_dir):
  workdir = tmp_path / "run"
  config = tiny(steps=8, train__checkpoint_every=4)
  loop.run(parse(config), workdir, log=lambda line: None)
  for step in checkpoint_steps(workdir):
    truncate_state_files(workdir / "checkpoints" / str(step))
  before = digests(workdir)
  config.train.steps = 12
  done = subprocess.run(
    cli_command("rope", workdir, config),
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=cli_env(compilation_cache_dir),
  )
  # orbax logs each step's failure too (warnings, from its own threads): ours
  # is the one line that says what stops the run.
  errors = [line for line in done.stderr.splitlines() if line.startswith("checkpoint error: ")]
  assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
  line = errors[0]
  assert line.startswith(f"checkpoint error: No checkpoint in {workdir / 'checkpoints'}"), line
  assert "step 8: " in line and "step 4: " in line, line
  assert digests(workdir) == before


def test_divergence_before_any_checkpoint_says_so(tmp_path):
  with pytest.raises(loop.TrainingDiverged, match="no checkpoint had been written yet"):
    loop.run(
      parse(tiny(steps=8, train__learning_rate=1e6)), tmp_path / "run", log=lambda line: None
    )


def test_a_skipped_update_is_reported_before_a_checkpoint_holds_it(tmp_path):
  """Checked only at log steps (every 1000 here), the skipped non-finite
  updates were saved into the checkpoints every 2 steps unreported: a run
  preempted after such a save and resumed never reported them."""
  workdir = tmp_path / "run"
  config = tiny(steps=8, train__learning_rate=1e6, train__log_every=1000, train__checkpoint_every=2)
  with pytest.raises(loop.TrainingDiverged) as info:
    loop.run(parse(config), workdir, log=lambda line: None)
  found = re.search(r"by step (\d+);.* checkpoint \(step (\d+)\) is kept", str(info.value))
  diverged, kept = int(found.group(1)), int(found.group(2))
  assert diverged < 8 and diverged % 2 == 0  # at the save it would have reached, not the log
  assert max(checkpoint_steps(workdir)) == kept < diverged


def prefetch_threads_after(seconds=5.0):
  """The run's prefetch threads still alive after up to `seconds`."""
  deadline = time.monotonic() + seconds
  while True:
    alive = [t for t in threading.enumerate() if t.name == loop.PREFETCH_THREAD]
    if not alive or time.monotonic() > deadline:
      return alive
    time.sleep(0.05)


def test_no_prefetch_thread_outlives_its_run(tmp_path):
  """A sweep trains many runs in one process: neither a finished run (its
  producer blocked on a full queue) nor one that raised may leave its data
  thread behind."""
  loop.run(parse(tiny(steps=4)), tmp_path / "done", log=lambda line: None)
  assert prefetch_threads_after() == []
  with pytest.raises(loop.TrainingDiverged):
    loop.run(
      parse(tiny(steps=8, train__learning_rate=1e6)), tmp_path / "diverged", log=lambda line: None
    )
  assert prefetch_threads_after() == []
