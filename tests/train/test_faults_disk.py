"""A disk that fills up under a run (issue 28): each writer the run owns --
metrics.jsonl, TensorBoard events, samples.txt, config.json, a checkpoint --
fails with ENOSPC at its Nth write (tests/full_disk.py). The run must stop at
once (a deadline turns a hang into a failure) with one error naming the file
and the reason, keep every good checkpoint, and, rerun once the disk has
room, finish with exactly an uninterrupted run's numbers. Also: a failed
asynchronous save never deletes the last good checkpoint, and reading a run
(load_run) creates nothing and says so when its checkpoints are being
replaced by a run training there."""

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys

import jax
import pytest

from conftest import (
  REPO,
  checkpoint_steps,
  cli_env,
  cli_overrides,
  tiny_config,
  without_timings,
)
from full_disk import full_disk
from tensorboard_files import read_tensorboard_scalars
from txf import storage
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir import checkpoint, resume
from txf.rundir.checkpoint import CheckpointWriteError
from txf.rundir.metrics import read_metrics
from txf.storage import WriteError
from txf.train import loop, run_setup

# A restore that failed (a checkpoint replaced while read) leaves orbax's read
# coroutines to the garbage collector, which reports them in whichever test
# runs then.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

ENOSPC = "No space left on device"
# Where each writer's files are (a regular expression over the path).
METRICS = r"/metrics\.jsonl$"
EVENTS = r"/tb/events\.out\.tfevents\."
SAMPLES = r"/samples\.txt$"
CONFIG = r"/\.?config\.json(\.[\w-]+\.tmp)?$"  # config.json, or its temporary
CHECKPOINT = r"checkpoint-tmp.*/extras[^/]*/metadata$"  # orbax's JSON item, in its commit
DEADLINE_SECONDS = 120  # a tiny run takes seconds: past this, it hangs


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


@contextlib.contextmanager
def deadline(seconds=DEADLINE_SECONDS):
  """Raises TimeoutError in the main thread if the block is still running
  after `seconds`, and every second after (a hung writer's cleanup hangs too),
  so a run that hangs fails the test instead of hanging the suite."""

  def expire(signum, frame):
    raise TimeoutError(f"still running after {seconds} s: the run hangs")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.setitimer(signal.ITIMER_REAL, seconds, 1.0)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def config(steps=8):
  """Checkpoints every 2 steps keeping 1 (a failed save must not take the
  last good one), an evaluation with a sample every 4 steps."""
  return tiny_config(
    steps=steps,
    train__checkpoint_every=2,
    train__max_to_keep=1,
    eval__every=4,
    eval__sample_tokens=4,
  )


def rows(workdir):
  return without_timings(read_metrics(workdir))


def train(workdir, steps=8):
  with deadline():
    return loop.run(parse(config(steps)), workdir, log=lambda line: None)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """(final eval, metrics rows) of the run trained without a fault."""
  workdir = tmp_path_factory.mktemp("uninterrupted")
  return train(workdir), rows(workdir)


def assert_resumes_exactly(workdir, uninterrupted, resumed_from):
  lines = []
  with deadline():
    result = loop.run(parse(config()), workdir, log=lines.append)
  assert f"resumed from step {resumed_from} in" in "\n".join(lines), lines
  assert (result, rows(workdir)) == uninterrupted


def fails_writing(pattern, workdir, after, error_type=WriteError, slow_finalize=0.0, steps=8):
  """Trains `steps` with the disk full from the `after`-th write to
  `pattern`'s files; the error the run stopped with (and the paths that failed)."""
  with full_disk(pattern, after, slow_finalize) as disk, pytest.raises(error_type) as error:
    train(workdir, steps)
  assert disk.failed, "the fault was never met"
  return str(error.value), disk.failed


@pytest.mark.slow  # trains runs (and its fixture one)
@pytest.mark.parametrize(
  "pattern, after, rows_to, events_to",
  [
    (METRICS, 3, 2, 2),  # step 3's row: after checkpoint 2
    (EVENTS, 6, 4, 3),  # the file version, the purge mark, the rows of steps 1-4
    (SAMPLES, 1, 4, 4),  # the sample of the evaluation at step 4
  ],
)
def test_a_full_disk_stops_the_run_at_once_and_the_rerun_resumes_exactly(
  tmp_path, uninterrupted, pattern, after, rows_to, events_to
):
  workdir = tmp_path / "run"
  message, failed = fails_writing(pattern, workdir, after)
  # One line: the file and the OS's reason.
  assert message == f"{failed[0]}: {ENOSPC}", message
  assert checkpoint_steps(workdir) == [2]
  # The record that failed was cut off again: every file holds whole records.
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  assert [row["step"] for row in map(json.loads, lines) if "loss" in row] == list(
    range(1, rows_to + 1)
  )
  assert {step for _, step in read_tensorboard_scalars(workdir / "tb")} == set(
    range(1, events_to + 1)
  )
  assert not (workdir / "samples.txt").exists() or not (workdir / "samples.txt").read_text()
  assert_resumes_exactly(workdir, uninterrupted, resumed_from=2)


@pytest.mark.slow  # trains runs (and its fixture one)
def test_a_full_disk_writing_config_json_changes_nothing(tmp_path, uninterrupted):
  workdir = tmp_path / "run"
  train(workdir, steps=4)  # a run to continue, with checkpoint 4
  before = (workdir / "config.json").read_text()
  with full_disk(CONFIG, 1), pytest.raises(WriteError) as error:
    train(workdir)
  assert str(error.value) == f"{workdir / 'config.json'}: {ENOSPC}"
  assert (workdir / "config.json").read_text() == before
  assert not list(workdir.glob(".config.json.*.tmp"))
  assert checkpoint_steps(workdir) == [4]
  assert_resumes_exactly(workdir, uninterrupted, resumed_from=4)


@pytest.mark.slow  # trains runs (and its fixture one)
def test_a_failed_checkpoint_save_keeps_the_last_good_one(tmp_path, uninterrupted):
  """The save of step 4 fails in orbax's background commit while the loop
  checks for errors at every step; orbax's finalize is slowed, so a loop
  that took the commit's error from it would let orbax delete step 2."""
  workdir = tmp_path / "run"
  message, failed = fails_writing(
    CHECKPOINT, workdir, after=2, error_type=CheckpointWriteError, slow_finalize=0.5
  )
  assert message.startswith(f"writing a checkpoint under {workdir / 'checkpoints'} failed: ")
  assert ENOSPC in message and failed[0] in message, message
  assert "\n" not in message
  assert checkpoint_steps(workdir) == [2]
  assert_resumes_exactly(workdir, uninterrupted, resumed_from=2)


@pytest.mark.slow  # trains a run
def test_a_failed_last_save_is_what_ended_the_run_in_its_record(tmp_path):
  """The save of the last step (4) fails: the record said 'finished' at step
  4, which no checkpoint holds."""
  workdir = tmp_path / "run"
  fails_writing(CHECKPOINT, workdir, after=2, error_type=CheckpointWriteError, steps=4)
  assert checkpoint_steps(workdir) == [2]
  last = json.loads((workdir / "run_record.json").read_text())[-1]
  assert last["ended"] == "CheckpointWriteError"


# --- the Checkpointer on its own --------------------------------------------------


def state(offset):
  return {"w": jax.numpy.arange(6.0) + offset, "count": jax.numpy.asarray(offset)}


def abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def test_polling_for_errors_never_lets_a_failed_save_delete_the_last_good_one(tmp_path):
  """Issue 28's harness: max_to_keep=1, save 1, a full disk, save 2, poll
  check_for_errors every millisecond while orbax's finalize is slowed."""
  with checkpoint.Checkpointer(tmp_path, max_to_keep=1) as ckpt:
    assert ckpt.save(1, state(1), {"step": 1})
    ckpt.wait_until_finished()
    with full_disk(CHECKPOINT, 1, slow_finalize=0.5), deadline(60):
      assert ckpt.save(2, state(2), {"step": 2})
      with pytest.raises(CheckpointWriteError, match=ENOSPC) as failed:
        while True:
          ckpt.check_for_errors()
    assert "the directory now" not in str(failed.value)  # nothing wrong with it
    ckpt.wait_until_finished()  # the error is reported once
    assert ckpt.latest_step() == 1
  assert [p.name for p in tmp_path.iterdir() if p.name.isdigit()] == ["1"]
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    step, restored, extras = ckpt.restore(abstract(state(0)))
  assert (step, extras) == (1, {"step": 1})
  assert float(restored["w"][0]) == 1.0


def test_a_failed_save_says_what_is_wrong_with_its_directory_now(tmp_path):
  """A file put where the checkpoint directory was: the error ends with the
  OS's reason for the directory itself, whatever orbax or tensorstore said
  about the file they were writing deep under it (a save in progress as the
  directory went may carry no OS reason: NOT_FOUND, "No ArrayMetadata").
  A new directory in its place is named as such (a full disk in the
  directory the run opened adds nothing: the test above)."""
  directory = tmp_path / "checkpoints"
  with checkpoint.Checkpointer(directory) as ckpt:
    assert ckpt.save(1, state(1), {"step": 1})
    ckpt.wait_until_finished()
    directory.rename(tmp_path / "kept")
    directory.write_text("in the way")
    with pytest.raises(CheckpointWriteError) as failed:
      ckpt.save(2, state(2), {"step": 2})
      ckpt.wait_until_finished()
    message = str(failed.value)
    assert message.startswith(f"writing a checkpoint under {directory} failed: "), message
    assert message.endswith("; the directory now: Not a directory"), message
    directory.unlink()
    directory.mkdir()  # a new directory where the run's was
    with full_disk(CHECKPOINT, 1), pytest.raises(CheckpointWriteError, match=ENOSPC) as full:
      ckpt.save(3, state(3), {"step": 3})
      ckpt.wait_until_finished()
    assert str(full.value).endswith(
      "; the directory now: not the directory the run opened (that one was moved or removed)"
    ), str(full.value)


def test_a_write_never_replaces_what_is_not_a_regular_file(tmp_path):
  """Every file txf writes is a new file renamed over its path: over a
  device or a pipe that replaced it (txf-compile --json=/dev/full made the
  device a JSON file, exit 0). A pipe stands for both here (a device node
  needs root); a regular file and a new path are written as before."""
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  with pytest.raises(WriteError, match=rf"^{fifo}: not a regular file \(a pipe\)"):
    storage.write_files({tmp_path / "new.json": "1", fifo: "2"})
  assert stat.S_ISFIFO(os.stat(fifo).st_mode) and sorted(os.listdir(tmp_path)) == ["fifo"]
  storage.write_file(tmp_path / "new.json", "1")
  storage.write_file(tmp_path / "new.json", "2")
  assert (tmp_path / "new.json").read_text() == "2"


def test_reading_creates_nothing(tmp_path):
  """experiments.extrapolate on a directory holding only config.json: the
  error, and no checkpoints/ directory made there."""
  workdir = tmp_path / "config_only"
  workdir.mkdir()
  resume.write_config(parse(tiny_config()), workdir)
  with pytest.raises(ConfigError, match="holds no checkpoint"):
    run_setup.load_run(workdir)
  assert [p.name for p in workdir.iterdir()] == ["config.json"]
  with checkpoint.Checkpointer(tmp_path / "none", read_only=True) as ckpt:
    assert ckpt.restore(abstract(state(0))) is None
  assert not (tmp_path / "none").exists()


def replacing_while_read(reader, writer, times):
  """Makes `reader`'s next `times` restores meet a step that a run training
  in the same directory (`writer`, max_to_keep=1) replaces as it is read."""
  manager = reader._manager
  restore, calls = manager.restore, []

  def restore_while_replaced(step, *args, **kwargs):
    if len(calls) < times:
      calls.append(step)
      latest = writer.latest_step()
      writer.save(latest + 1, state(latest + 1), {"step": latest + 1})
      writer.wait_until_finished()  # the new step is final, `step` deleted
    return restore(step, *args, **kwargs)

  manager.restore = restore_while_replaced
  return calls


def test_a_checkpoint_replaced_while_read_is_read_again(tmp_path, monkeypatch):
  monkeypatch.setattr(checkpoint, "REPLACED_WAIT_SECONDS", 0.0, raising=False)
  with checkpoint.Checkpointer(tmp_path, max_to_keep=1) as writer:
    writer.save(1, state(1), {"step": 1})
    writer.wait_until_finished()
    with checkpoint.Checkpointer(tmp_path) as reader:
      assert replacing_while_read(reader, writer, times=2) == []
      step, restored, extras = reader.restore(abstract(state(0)))
    assert (step, extras) == (3, {"step": 3})
    assert float(restored["w"][0]) == 3.0
    with checkpoint.Checkpointer(tmp_path) as reader:
      replacing_while_read(reader, writer, times=100)
      with pytest.raises(checkpoint.RestoreError) as error:
        reader.restore(abstract(state(0)))
  message = str(error.value)
  assert "changed while they were read" in message and "a run is probably training" in message
  assert "config probably differs" not in message
  assert [p.name for p in tmp_path.iterdir() if p.name.isdigit()] == [
    str(3 + checkpoint.REPLACED_RETRIES)
  ]


# --- the command line -------------------------------------------------------------


def run_cli(workdir, cache, pattern, after, *options, steps=8):
  command = [
    sys.executable,
    str(REPO / "tests" / "full_disk.py"),
    pattern,
    str(after),
    *options,
    "--",
    "--config=configs/rope.py",
    f"--workdir={workdir}",
    *cli_overrides(config(steps), "rope"),
  ]
  return subprocess.run(
    command, cwd=REPO, capture_output=True, text=True, timeout=300, env=cli_env(cache)
  )


@pytest.mark.slow
@pytest.mark.parametrize(
  "pattern, after, options, prefix",
  [
    (EVENTS, 6, (), "write error: "),
    (METRICS, 3, (), "write error: "),
    (CHECKPOINT, 2, ("--slow_finalize=0.5",), "checkpoint error: writing a checkpoint under "),
  ],
)
def test_cli_full_disk_is_one_line_and_exit_1(
  tmp_path, compilation_cache_dir, pattern, after, options, prefix
):
  """Exit 1 and, on stderr, the one line (no traceback, none of orbax's
  either); after a failed checkpoint (orbax's writer threads at the exit)
  the rerun without the fault finishes (the other faults' reruns are the
  in-process tests')."""
  workdir = tmp_path / "run"
  done = run_cli(workdir, compilation_cache_dir, pattern, after, *options)
  assert done.returncode == 1, done.stderr[-3000:]
  assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr[-3000:]
  line = done.stderr.strip()
  assert line.startswith(prefix) and ENOSPC in line, line
  assert str(workdir) in line, line
  assert checkpoint_steps(workdir) == [2]
  if pattern != CHECKPOINT:
    return
  rerun = subprocess.run(
    [
      sys.executable,
      "-m",
      "experiments.run",
      "--config=configs/rope.py",
      f"--workdir={workdir}",
      *cli_overrides(config(), "rope"),
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
    env=cli_env(compilation_cache_dir),
  )
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed from step 2" in rerun.stdout
  assert [row["step"] for row in read_metrics(workdir) if "loss" in row] == list(range(1, 9))
  assert json.loads((workdir / "config.json").read_text())["train"]["steps"] == 8
