"""Work-directory lock, writability check, and metrics/samples past a resume step."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import gone_pid
from full_disk import files_in, full_disk, read_only
from txf import storage
from txf.rundir import metrics
from txf.rundir.workdir import WorkdirError, WorkdirLock, check_writable


def test_second_lock_is_refused_naming_the_holder(tmp_path):
  with WorkdirLock(tmp_path):
    with pytest.raises(WorkdirError, match=rf"in use by another run .*\"pid\": {os.getpid()}"):
      WorkdirLock(tmp_path).acquire()
  # Released on exit: a later run takes it.
  with WorkdirLock(tmp_path):
    pass


@pytest.mark.slow  # a subprocess
def test_lock_of_a_killed_process_does_not_block(tmp_path):
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      textwrap.dedent(f"""
          import sys, time
          from txf.rundir.workdir import WorkdirLock
          lock = WorkdirLock({str(tmp_path)!r})
          lock.acquire()
          print("locked", flush=True)
          time.sleep(60)
      """),
    ],
    stdout=subprocess.PIPE,
    text=True,
    cwd=os.getcwd(),
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirError, match=f'"pid": {holder.pid}'):
      WorkdirLock(tmp_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    with WorkdirLock(tmp_path):  # the stale lock file does not block
      pass
  finally:
    holder.kill()


def test_check_writable_names_the_directory_and_cause(tmp_path):
  check_writable(tmp_path / "new" / "dir")
  assert (tmp_path / "new" / "dir").is_dir()
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(
    WorkdirError, match=rf"{blocker}/run: not a writable directory \(Not a directory\)"
  ):
    check_writable(blocker / "run")
  with pytest.raises(WorkdirError, match=rf"{blocker}: exists and is not a directory"):
    check_writable(blocker)


def test_a_link_to_a_directory_not_made_yet_has_its_target_made(tmp_path):
  """A workdir linked to scratch space before the run: it was refused as
  'not a writable directory (File exists)', mkdir taking the link for a file."""
  link = tmp_path / "run"
  link.symlink_to(tmp_path / "scratch" / "run")
  check_writable(link)
  assert (tmp_path / "scratch" / "run").is_dir() and link.is_symlink()
  assert os.listdir(tmp_path / "scratch" / "run") == []  # the probe removed


def test_a_write_probe_that_fails_leaves_nothing_behind(tmp_path):
  """On a full disk the probe's file is created and its write fails: it is
  removed all the same."""
  with (
    full_disk(files_in(tmp_path), 0),
    pytest.raises(
      WorkdirError, match=rf"^{tmp_path}: not a writable directory \(No space left on device\)$"
    ),
  ):
    check_writable(tmp_path)
  assert os.listdir(tmp_path) == []


def test_the_lock_of_a_read_only_directory_is_a_one_line_workdir_error(tmp_path):
  with (
    read_only(tmp_path),
    pytest.raises(
      WorkdirError, match=rf"^{tmp_path}: not a writable directory \(Read-only file system\)$"
    ),
  ):
    WorkdirLock(tmp_path).acquire()


def test_a_lock_file_that_cannot_be_opened_is_named_not_its_directory(tmp_path):
  """It was 'not a writable directory' for a directory that is one."""
  (tmp_path / ".lock").mkdir()
  with pytest.raises(WorkdirError, match=rf"^cannot lock {tmp_path}/\.lock: Is a directory$"):
    WorkdirLock(tmp_path).acquire()


def test_taking_the_lock_removes_the_temporaries_a_killed_holder_left(tmp_path):
  """A run killed between writing run_record.json's temporary and renaming
  it left the temporary; whoever holds the lock next removes it (and only
  such temporaries: not one a live process of this host writes, a
  txf-export into the run's directory, which takes no lock; not one in a
  directory a link leads to, outside the run's)."""
  # Older txf's form, and today's (naming its writer: a gone process).
  gone, live = (f"{storage._HOST}-{pid}-0123456789ab" for pid in (gone_pid(), os.getpid()))
  stale = [".run_record.json.0123456789ab.tmp", f".config.json.{gone}.tmp"]
  kept = ["run_record.json", ".notes.tmp", ".run_record.json.tmp", "x.0123456789ab.tmp"]
  kept += [f".hf.{live}.tmp", "elsewhere"]
  for name in stale + kept[:-2]:
    (tmp_path / name).write_text("{")
  (tmp_path / f".hf.{live}.tmp").mkdir()
  # txf-analyze's files, and txf-export's staged directory, killed the same way.
  (tmp_path / "analysis").mkdir()
  (tmp_path / "analysis" / f".head_scores.md.{gone}.tmp").write_text("|")
  (tmp_path / "analysis" / "head_scores.md").write_text("|")
  (tmp_path / f".model.{gone}.tmp").mkdir()
  outside = tmp_path.parent / f"{tmp_path.name}_outside"
  outside.mkdir()
  (outside / f".config.json.{gone}.tmp").write_text("{")
  (tmp_path / "elsewhere").symlink_to(outside)
  with WorkdirLock(tmp_path):
    assert sorted(os.listdir(tmp_path)) == sorted([".lock", "analysis", *kept])
    assert os.listdir(tmp_path / "analysis") == ["head_scores.md"]
  assert os.listdir(outside) == [f".config.json.{gone}.tmp"]


def test_without_the_lock_only_the_temporaries_of_gone_writers_are_removed(tmp_path):
  """A sweep's directory and txf-export's --out parent have no lock: a
  killed summary's temporaries, or a killed export's staged model, stayed
  for good; one being written by a live process must stay."""
  dead_pid = gone_pid()
  names = {
    f".results.csv.{storage._HOST}-{dead_pid}-0123456789ab.tmp": False,
    f".results.csv.{storage._HOST}-{os.getpid()}-0123456789ab.tmp": True,  # alive
    f".results.csv.00000000-{dead_pid}-0123456789ab.tmp": True,  # another host's
    ".results.csv.0123456789ab.tmp": True,  # older form: its writer unknown
  }
  for name in names:
    (tmp_path / name).write_text("a,b")
  (tmp_path / f".hf.{storage._HOST}-{dead_pid}-ba9876543210.tmp").mkdir()
  storage.remove_stale_temporaries(tmp_path, held=False)
  assert sorted(os.listdir(tmp_path)) == sorted(name for name, kept in names.items() if kept)


@pytest.mark.parametrize("held", [True, False])
def test_a_temporary_of_another_users_live_process_is_kept(tmp_path, monkeypatch, held):
  """A pid that os.kill may not signal (PermissionError: another user's
  process, in a shared directory) is a live writer: its temporary, renamed
  over its file at any moment, stays."""
  other_user = 4242

  def kill(pid, sig):
    if pid == other_user:
      raise PermissionError(1, "Operation not permitted")
    raise ProcessLookupError(3, "No such process")

  monkeypatch.setattr(os, "kill", kill)
  writing = f".results.csv.{storage._HOST}-{other_user}-0123456789ab.tmp"
  gone = f".results.csv.{storage._HOST}-4243-0123456789ab.tmp"
  for name in (writing, gone):
    (tmp_path / name).write_text("a,b")
  storage.remove_stale_temporaries(tmp_path, held=held)
  assert os.listdir(tmp_path) == [writing]


def _write_history(workdir, steps, sample_steps):
  with metrics.MetricsWriter(workdir) as writer:
    for step in steps:
      writer.write(step, {"loss": float(step)})
    for step in sample_steps:
      writer.write_sample(step, f"text {step}\nmore {step}")


def test_writer_at_start_step_moves_later_records_aside(tmp_path):
  _write_history(tmp_path, [1, 2, 3, 4, 5], [2, 4])
  with metrics.MetricsWriter(tmp_path, start_step=3) as writer:
    assert writer.dropped == {"metrics.jsonl": 2, "samples.txt": 1}
    writer.write(4, {"loss": 40.0})
  assert [row["step"] for row in metrics.read_metrics(tmp_path)] == [1, 2, 3, 4]
  assert metrics.read_metrics(tmp_path)[-1]["loss"] == 40.0
  dropped = (tmp_path / "metrics.dropped.jsonl").read_text().splitlines()
  assert [line.count('"step"') for line in dropped] == [1, 1]
  assert '"step": 4' in dropped[0] and '"step": 5' in dropped[1]
  assert (tmp_path / "samples.txt").read_text() == "=== step 2 ===\ntext 2\nmore 2\n"
  assert (tmp_path / "samples.dropped.txt").read_text() == "=== step 4 ===\ntext 4\nmore 4\n"


def test_writer_at_step_zero_moves_a_whole_history(tmp_path):
  _write_history(tmp_path, [1, 2], [2])
  with metrics.MetricsWriter(tmp_path, start_step=0) as writer:
    assert writer.dropped == {"metrics.jsonl": 2, "samples.txt": 1}
  assert metrics.read_metrics(tmp_path) == []
  assert (tmp_path / "samples.txt").read_text() == ""


def test_writer_without_start_step_keeps_everything(tmp_path):
  _write_history(tmp_path, [1, 2], [2])
  with metrics.MetricsWriter(tmp_path) as writer:
    assert writer.dropped == {}
  assert [row["step"] for row in metrics.read_metrics(tmp_path)] == [1, 2]
  assert not (tmp_path / "metrics.dropped.jsonl").exists()
