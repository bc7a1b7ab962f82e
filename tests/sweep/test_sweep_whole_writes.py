"""Files written whole or not at all: the one atomic writer
(txf.storage.write_files) on a full disk, txf-analyze's figures and
tables through it, and a sweep's summary, whose SIGTERM as it starts exits 0
(its in-process tests: test_sweep_results)."""

import errno
import os
import subprocess
import sys

import pytest

from conftest import REPO, output_lines
from full_disk import files_in, full_disk
from txf.analysis.phase_change import write_training_csv
from txf.analysis.plots import line_plot_figure, save_figure
from txf.storage import WriteError, write_files

# runner.summarize's line when a SIGTERM comes before its files are written.
PREEMPTED = (
  "sweep preempted before its results were written (results.csv, results.md and the "
  "plots are as they were); rerun the same command to write them"
)


def contents(directory):
  """{name: bytes} of the files directly in `directory`."""
  return {p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()}


def test_a_set_of_files_is_replaced_all_or_none_on_a_full_disk(tmp_path):
  old = {tmp_path / "a.csv": "old a\n", tmp_path / "b.png": b"old b"}
  write_files(old)
  with (
    full_disk(files_in(tmp_path), 2),  # the second file's write fails
    pytest.raises(WriteError, match=f"^{tmp_path / 'b.png'}: No space left on device$"),
  ):
    write_files({tmp_path / "a.csv": "new a\n", tmp_path / "b.png": b"new b"})
  assert contents(tmp_path) == {"a.csv": b"old a\n", "b.png": b"old b"}  # a too: no temporary


def test_write_files_creates_the_missing_parent_directories(tmp_path):
  deep, other = tmp_path / "a" / "b" / "c.json", tmp_path / "d" / "e.txt"
  assert write_files({deep: "{}", other: b"e"}) == [deep, other]
  assert (deep.read_text(), other.read_bytes()) == ("{}", b"e")


def test_each_file_reaches_the_disk_before_its_rename_and_the_renames_before_the_return(
  tmp_path, monkeypatch
):
  # Without the syncs a crash could keep a rename and lose its data: an
  # empty file where the old one was.
  events = []
  real_fsync, real_replace = os.fsync, os.replace
  monkeypatch.setattr(
    os,
    "fsync",
    lambda fd: (events.append(("sync", os.readlink(f"/proc/self/fd/{fd}"))), real_fsync(fd))[1],
  )
  monkeypatch.setattr(
    os, "replace", lambda a, b: (events.append(("rename", os.fspath(a))), real_replace(a, b))[1]
  )
  first, second = tmp_path / "a.json", tmp_path / "sub" / "b.json"
  write_files({first: "1", second: "2"})
  renamed = [name for kind, name in events if kind == "rename"]
  assert len(renamed) == 2 and all(name.endswith(".tmp") for name in renamed)
  for name in renamed:  # synced before any rename
    assert events.index(("sync", name)) < events.index(("rename", renamed[0]))
  last_rename = events.index(("rename", renamed[-1]))
  synced_after = {name for kind, name in events[last_rename:] if kind == "sync"}
  assert synced_after == {str(tmp_path), str(tmp_path / "sub")}
  assert (first.read_text(), second.read_text()) == ("1", "2")


def figure_writer(path):
  save_figure(
    line_plot_figure({"a": ([1, 2], [3.0, 2.0])}, title="t", xlabel="x", ylabel="y"), path
  )


def table_writer(path):
  training = {
    "steps": [1, 2],
    "loss": [3.0, 2.0],
    "accuracy": [0.1, 0.2],
    **{name: [[[0.5]], [[0.6]]] for name in ("previous_token", "induction", "k_composition")},
  }
  write_training_csv(training, path)


@pytest.mark.parametrize("write", [figure_writer, table_writer])
def test_txf_analyzes_figures_and_tables_meet_a_full_disk_in_one_line_and_keep_the_old(
  tmp_path, write
):
  """Before, save_figure and write_training_csv wrote in place: OSError (a
  traceback) and a cut file."""
  path = tmp_path / "out"
  path.write_bytes(b"the previous version")
  with full_disk(files_in(tmp_path), 1), pytest.raises(WriteError) as error:
    write(path)
  assert str(error.value) == f"{path}: {os.strerror(errno.ENOSPC)}"
  assert contents(tmp_path) == {"out": b"the previous version"}


@pytest.mark.slow  # a subprocess
def test_cli_sigterm_as_the_summary_starts_exits_0_naming_the_rerun(tmp_path):
  """txf-sweep --summarize in a process that gets SIGTERM as it reads the
  first point: before, exit 143 (killed); the tables and plots, if it had
  got further, out of step."""
  script = (
    "import os, runpy, signal, sys\n"
    "from txf.sweep import results\n"
    "read = results.summarize_point\n"
    "def preempted(*args, **kwargs):\n"
    "  os.kill(os.getpid(), signal.SIGTERM)\n"
    "  return read(*args, **kwargs)\n"
    "results.summarize_point = preempted\n"
    f"sys.argv = ['sweep', '--config=configs/sweeps/pe_ln.py', '--workdir={tmp_path}', "
    "'--summarize']\n"
    "runpy.run_module('experiments.sweep', run_name='__main__')"
  )
  point = tmp_path / "position=sinusoidal,norm_placement=pre"
  point.mkdir()
  (point / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0, "loss/0": 5.0, "loss/1": 5.0}\n')
  done = subprocess.run(
    [sys.executable, "-c", script],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert done.returncode == 0, done.stderr
  assert output_lines(done.stdout)[-1] == PREEMPTED
  assert os.listdir(tmp_path) == [point.name]  # nothing written
