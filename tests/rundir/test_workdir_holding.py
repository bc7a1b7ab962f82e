"""txf.rundir.workdir.holding: a run refused while it sets up leaves its work
directory as it found it, and a lock taken on a lock file such a run
removed meanwhile locks nothing."""

import pytest

from full_disk import full_disk
from txf.rundir import workdir
from txf.rundir.workdir import WorkdirError, WorkdirLock


def test_a_lock_on_a_lock_file_removed_meanwhile_is_refused(tmp_path, monkeypatch):
  """The second run opened .lock, then the first, refused while it set up,
  removed it (and its directory) and let go: the flock the second then
  takes is on a file no one else sees, so a third run could lock beside it."""
  first = WorkdirLock(tmp_path)
  first.acquire()
  flock = workdir.fcntl.flock

  def first_lets_go_before(handle, operation):  # between the second's open and flock
    if operation != workdir.fcntl.LOCK_UN and first._file is not None:
      (tmp_path / workdir.LOCK_FILE).unlink()
      first.release()
    return flock(handle, operation)

  monkeypatch.setattr(workdir.fcntl, "flock", first_lets_go_before)
  with pytest.raises(WorkdirError, match=rf"^{tmp_path}: in use by another run, which was just"):
    WorkdirLock(tmp_path).acquire()
  monkeypatch.undo()
  with WorkdirLock(tmp_path):  # the next one takes it
    pass


def test_a_run_refused_under_the_lock_leaves_the_directory_as_it_found_it(tmp_path):
  made = tmp_path / "runs" / "run"
  with pytest.raises(ValueError), workdir.holding(made):
    raise ValueError("config error")
  assert list(tmp_path.iterdir()) == []  # the directories it made, gone
  held = tmp_path / "held"
  held.mkdir()
  (held / workdir.LOCK_FILE).write_text('{"pid": 1}\n')  # a run's that ended
  with pytest.raises(ValueError), workdir.holding(held):
    raise ValueError("config error")
  assert [path.name for path in held.iterdir()] == [workdir.LOCK_FILE]
  assert (held / workdir.LOCK_FILE).read_text() == '{"pid": 1}\n'  # its note, as it was
  with pytest.raises(ValueError), workdir.holding(made):
    (made / "tokenizer.model").write_text("trained")
    raise ValueError("config error")
  # It wrote: what it wrote, its lock file with it, is kept.
  assert sorted(path.name for path in made.iterdir()) == [workdir.LOCK_FILE, "tokenizer.model"]


def test_a_directory_made_on_a_full_disk_is_removed_with_the_refusal(tmp_path):
  """A full disk lets a directory be made but no file be written in it: the
  run's checkpoints/ (and its work directory) were left behind by a run
  refused there. check_writable removes the directories it made, and
  holding then its work directory; a directory that was there stays."""
  made = tmp_path / "runs" / "run"
  with full_disk(r"write-probe", 2), pytest.raises(WorkdirError, match="No space left"):
    with workdir.holding(made):
      workdir.check_writable(made / "checkpoints")
  assert list(tmp_path.iterdir()) == []
  kept = tmp_path / "kept"
  kept.mkdir()
  with full_disk(r"write-probe", 1), pytest.raises(WorkdirError, match="No space left"):
    workdir.check_writable(kept / "a" / "b")
  assert kept.is_dir() and list(kept.iterdir()) == []


def test_an_output_file_that_is_a_directory_or_a_link_to_nothing_is_refused_before_the_run(
  tmp_path,
):
  """A metrics.jsonl linking to nothing failed the run's first write, after
  the data was read and the model built; a directory in its place was refused."""
  from txf.rundir.metrics import METRICS_FILE, check_outputs

  check_outputs(tmp_path)
  (tmp_path / METRICS_FILE).symlink_to(tmp_path / "gone" / METRICS_FILE)
  refused = r"metrics\.jsonl: a link into .*gone, which does not exist$"
  with pytest.raises(WorkdirError, match=refused):
    check_outputs(tmp_path)
  (tmp_path / "gone").mkdir()  # the first append makes the file: not refused
  check_outputs(tmp_path)
  (tmp_path / METRICS_FILE).unlink()
  (tmp_path / METRICS_FILE).mkdir()
  with pytest.raises(WorkdirError, match=r"metrics\.jsonl: exists and is not a file$"):
    check_outputs(tmp_path)
