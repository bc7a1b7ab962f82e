"""Files of a work directory that are corrupt or long (txf.rundir.workdir's
readers, run_record.json, metrics.jsonl, wandb_run_id.txt, config.json).

A corrupt file is either one line naming it (config.json, wandb_run_id.txt)
or read past: an unreadable metrics row is skipped, a run record that does
not read as one is set aside (run_record.json.corrupt) with a line saying
so, never overwritten. Reading a long file costs what is needed: a resume
parses the record's last entry and the metrics rows after its step, and a
sweep's summary parses each metrics row once.
"""

import json
import os
import re

import ml_collections
import pytest

from conftest import tiny_config
from txf.runconfig.run_config import ConfigError, parse, to_json
from txf.rundir import metrics, record, trackers
from txf.rundir.resume import read_run_config
from txf.rundir.workdir import WorkdirError
from txf.sweep import figures, grid, runner
from txf.train import loop

NOT_UTF8 = b'[{"a": "\xff"}]'  # the reporter's printf '[{"a": "\xff"}]'


@pytest.fixture(scope="module")
def run_config():
  return parse(tiny_config()).with_vocabulary(260, None)


def json_loads_counter(monkeypatch, counted):
  """Wraps json.loads: the arguments for which `counted(argument)` holds are
  appended to the returned list."""
  parsed, loads = [], json.loads

  def counting(text, *args, **kwargs):
    if counted(text):
      parsed.append(text)
    return loads(text, *args, **kwargs)

  monkeypatch.setattr(json, "loads", counting)
  return parsed


def is_metrics_row(text):
  return text[:7] in ('{"step"', b'{"step"')


# --- corrupt files -------------------------------------------------------------------


@pytest.mark.parametrize("content", [NOT_UTF8, None], ids=["not_utf8", "a_directory"])
def test_an_unreadable_config_json_is_an_error_naming_the_file(tmp_path, content):
  """Invalid UTF-8 was one line without the file's name, a directory a traceback."""
  path = tmp_path / "config.json"
  path.write_bytes(content) if content is not None else path.mkdir()
  with pytest.raises(ValueError, match=rf"^{path}: (not UTF-8 text|cannot be read \(Is a dir)"):
    read_run_config(tmp_path)


@pytest.mark.parametrize(
  "content",
  [NOT_UTF8, b'[{"start": "2026', b'{"start": 1}\n', None],
  ids=["not_utf8", "not_json", "not_a_list", "a_directory"],
)
def test_a_record_that_does_not_read_is_set_aside_and_a_new_one_started(
  tmp_path, run_config, content
):
  """It was a traceback (invalid UTF-8, a directory) or silently overwritten
  (invalid JSON), losing the entries it held."""
  path = tmp_path / record.RECORD_FILE
  path.write_bytes(content) if content is not None else path.mkdir()
  with pytest.raises(ValueError, match=rf"^{path}: "):
    record.read_record(tmp_path)
  for aside_name, corrupt in [(".corrupt", content), (".corrupt.1", NOT_UTF8)]:
    lines = []
    record.RunRecord(tmp_path, log=lines.append).start(run_config, 4, config_file="c.py")
    aside = tmp_path / (record.RECORD_FILE + aside_name)
    (line,) = lines
    assert line.startswith(f"{path}: ") and f"moved to {aside.name}" in line
    assert aside.is_dir() if corrupt is None else aside.read_bytes() == corrupt
    (entry,) = record.read_record(tmp_path)
    assert entry["start_step"] == 4 and entry["config_file"] == "c.py"
    path.write_bytes(NOT_UTF8)  # a second corrupt record goes beside the first


def test_a_third_corrupt_record_is_set_aside_beside_the_first_two(tmp_path, run_config):
  path = tmp_path / record.RECORD_FILE
  for name in (".corrupt", ".corrupt.1"):
    (tmp_path / (record.RECORD_FILE + name)).write_text(f"the record set aside as {name}")
  path.write_bytes(NOT_UTF8)
  lines = []
  record.RunRecord(tmp_path, log=lines.append).start(run_config, 4)
  assert lines[0].endswith(f"moved to {record.RECORD_FILE}.corrupt.2; the record starts again")
  assert (tmp_path / (record.RECORD_FILE + ".corrupt.2")).read_bytes() == NOT_UTF8
  for name in (".corrupt", ".corrupt.1"):
    assert (tmp_path / (record.RECORD_FILE + name)).read_text() == f"the record set aside as {name}"


def test_a_corrupt_metrics_line_is_read_past(tmp_path, caplog):
  """Random bytes appended to metrics.jsonl were a UnicodeDecodeError on
  resume and on the rerun of a finished run."""
  with metrics.MetricsWriter(tmp_path) as writer:
    for step in (1, 2, 3):
      writer.write(step, {"loss": 1.0 / step})
  path = tmp_path / metrics.METRICS_FILE
  with open(path, "ab") as f:
    f.write(b"\xff\xfe\x00garbage\x9c\n")
  assert [row["step"] for row in metrics.read_metrics(tmp_path)] == [1, 2, 3]
  assert "line 4" in caplog.text
  assert [row["step"] for row in metrics.read_metrics(tmp_path, since=3)] == [3]
  # A resume from step 2 moves step 3 aside and the unreadable line after it
  # with it (kept in metrics.dropped.jsonl, not left before the new rows).
  with metrics.MetricsWriter(tmp_path, start_step=2) as writer:
    writer.write(3, {"loss": 0.5})
  assert writer.dropped == {metrics.METRICS_FILE: 2}
  assert b"garbage" not in path.read_bytes()
  assert b"garbage" in (tmp_path / metrics.DROPPED_METRICS_FILE).read_bytes()
  assert [row["loss"] for row in metrics.read_metrics(tmp_path)] == [1.0, 0.5, 0.5]


@pytest.mark.parametrize(
  "content, message",
  [(b"../x\n", r"not a wandb run id \('\.\./x'\)"), (b"\x8f\xff\x00\x13", "not UTF-8 text")],
)
def test_a_corrupt_wandb_run_id_is_an_error_naming_the_file(tmp_path, content, message):
  """It was wandb's UsageError or a UnicodeDecodeError, after the run had
  written its lock and checkpoints/."""
  path = tmp_path / trackers.WANDB_ID_FILE
  path.write_bytes(content)
  with pytest.raises(ValueError, match=rf"^{path}: {message}"):
    trackers.check_trackers(("wandb",), tmp_path)


@pytest.mark.slow  # two tiny runs
def test_a_run_resumes_past_a_corrupt_record_and_metrics_line(tmp_path, compilation_cache_dir):
  workdir = tmp_path / "run"
  loop.run(parse(tiny_config(steps=4)), workdir, log=lambda line: None)
  (workdir / record.RECORD_FILE).write_bytes(NOT_UTF8)
  with open(workdir / metrics.METRICS_FILE, "ab") as f:
    f.write(b"\xff\xfe\x00garbage")
  lines = []
  loop.run(parse(tiny_config(steps=6)), workdir, log=lines.append)
  assert any("run_record.json: not UTF-8 text" in line for line in lines)
  assert (workdir / f"{record.RECORD_FILE}.corrupt").read_bytes() == NOT_UTF8
  (entry,) = record.read_record(workdir)
  assert entry["start_step"] == 4 and entry["ended"] == "finished"
  assert any(row["step"] == 6 and "eval_loss" in row for row in metrics.read_metrics(workdir))
  # Run again, finished: the rerun reads past the line too.
  loop.run(parse(tiny_config(steps=6)), workdir, log=lines.append)
  assert lines[-1].startswith("eval @ 6 (") and "the run is finished" in lines[-1]


def test_a_config_error_is_what_a_corrupt_wandb_id_stops_a_run_with(tmp_path):
  config = tiny_config(steps=4, train__trackers="wandb")
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / trackers.WANDB_ID_FILE).write_text("../x\n")
  with pytest.raises(ConfigError, match=r"wandb_run_id\.txt: not a wandb run id"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert sorted(p.name for p in workdir.iterdir()) == [trackers.WANDB_ID_FILE]


@pytest.mark.parametrize(
  "name, kind",
  [
    (metrics.METRICS_FILE, "file"),
    (metrics.SAMPLES_FILE, "file"),
    (metrics.DROPPED_METRICS_FILE, "file"),
    (metrics.DROPPED_SAMPLES_FILE, "file"),
    (metrics.TENSORBOARD_DIR, "directory"),
  ],
)
def test_an_output_of_the_wrong_kind_is_one_error_before_the_run_starts(tmp_path, name, kind):
  """metrics.jsonl or samples.txt a directory was an IsADirectoryError
  traceback at the writer's start, tb/ a file a write error (exit 1); now a
  WorkdirError naming it (exit 2), nothing else written."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / name).mkdir() if kind == "file" else (workdir / name).write_text("x")
  with pytest.raises(WorkdirError, match=rf"^{workdir / name}: exists and is not a {kind}$"):
    loop.run(parse(tiny_config(steps=4)), workdir, log=lambda line: None)
  assert [p.name for p in workdir.iterdir()] == [name]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through read-only permissions")
@pytest.mark.parametrize(
  "name, message",
  [
    (metrics.METRICS_FILE, "not writable (Permission denied)"),
    (metrics.TENSORBOARD_DIR, "not a writable directory (Permission denied)"),
    ("checkpoints", "not a writable directory (Permission denied)"),
  ],
)
def test_a_read_only_output_is_one_workdir_error_before_the_run_starts(tmp_path, name, message):
  """A finished run's metrics.jsonl read-only: a write error (exit 1) after
  the run set up; a read-only checkpoints/ a checkpoint error (exit 1)."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  path = workdir / name
  path.mkdir() if name != metrics.METRICS_FILE else path.write_text("")
  path.chmod(0o500 if path.is_dir() else 0o400)
  try:
    with pytest.raises(WorkdirError, match=rf"^{path}: {re.escape(message)}$"):
      loop.run(parse(tiny_config(steps=4)), workdir, log=lambda line: None)
  finally:
    path.chmod(0o700)


# --- long files: what a read costs -------------------------------------------------


def test_a_start_parses_only_the_records_last_entry(tmp_path, run_config, monkeypatch):
  """A 71 MB record (20,000 entries) made a resume parse and re-encode every
  entry, twice (91 s instead of 44 s, 1.3 GB)."""
  path = tmp_path / record.RECORD_FILE
  for step in range(3):  # the layout RunRecord writes
    start = record.RunRecord(tmp_path, log=print)
    start.start(run_config, step)
    start.end("finished", step + 1)
  entries = record.read_record(tmp_path) * 100  # 300 entries
  path.write_text(json.dumps(entries, indent=1) + "\n")
  before = path.read_text()
  # The record's text: whole ('[...') or an entry of it ('\n {...').
  parsed = json_loads_counter(monkeypatch, lambda text: str(text).startswith(("[", "\n {")))
  new = record.RunRecord(tmp_path, log=print)
  new.start(run_config, 7)
  new.end("finished", 9)
  assert len(parsed) == 1 and len(parsed[0]) < len(before) / 250  # the last entry only
  monkeypatch.undo()
  after = path.read_text()
  assert after.startswith(before.rstrip()[: -len("\n]")] + ",\n {")  # kept byte for byte
  read = record.read_record(tmp_path)
  assert read[:-1] == entries and read[-1]["start_step"] == 7 and read[-1]["end_step"] == 9
  assert after == json.dumps(read, indent=1) + "\n"  # the layout json.dumps gives


def test_a_resume_parses_only_the_metrics_rows_after_its_step(tmp_path, monkeypatch):
  path = tmp_path / metrics.METRICS_FILE
  path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(1, 1001)))
  parsed = json_loads_counter(monkeypatch, is_metrics_row)
  assert [row["step"] for row in metrics.read_metrics(tmp_path, since=996)] == [
    996,
    997,
    998,
    999,
    1000,
  ]
  assert len(parsed) <= 2 * 5 + 1
  parsed.clear()
  assert metrics.drop_records_after(tmp_path, 990) == {metrics.METRICS_FILE: 10}
  assert len(parsed) <= 2 * 10 + 1
  monkeypatch.undo()
  assert [row["step"] for row in metrics.read_metrics(tmp_path)] == list(range(1, 991))


def test_a_sweep_summary_parses_each_metrics_row_once(tmp_path, monkeypatch):
  """--summarize read every point's metrics.jsonl five times (100k rows: 62 s)."""
  sweep = ml_collections.ConfigDict(
    dict(base=dict(replicas=1, model=dict(position="rope"), train=dict(steps=40)))
  )
  sweep.grid = grid.make_grid({"model.position": ["rope", "alibi"]})
  points = grid.expand(sweep)
  rows = 0
  for point in points:
    point_dir = tmp_path / point.name
    point_dir.mkdir()
    (point_dir / "config.json").write_text(json.dumps(to_json(parse(tiny_config(steps=40)))))
    lines = [{"step": s, "loss": 3.0 - s / 100, "tokens_per_sec": 1e3} for s in range(1, 41)]
    lines += [{"step": s, "eval_loss": 3.0 - s / 90} for s in range(10, 41, 10)]
    lines.sort(key=lambda row: row["step"])
    (point_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
    rows += len(lines)
  parsed = json_loads_counter(monkeypatch, is_metrics_row)
  summaries = runner.summarize(points, tmp_path, log=lambda line: None)
  # Each row once, and the rows from train.steps on for each point's status.
  assert rows <= len(parsed) <= rows + 2 * 2 * 3
  assert [row.status for row in summaries] == ["done", "done"]
  assert (tmp_path / figures.TRAIN_LOSS_CURVES_PNG).exists()
