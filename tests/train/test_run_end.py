"""How a run's end is recorded and completed: run_record.json's end_step
for a run an error stopped, and a lost final evaluation completed in place
of the one it replaces (metrics.jsonl, samples.txt, TensorBoard)."""

import json
import re

import pytest
from tensorboardX.proto.event_pb2 import SessionLog

from conftest import tiny_config, without_timings
from tensorboard_files import read_tensorboard_events
from txf.runconfig.run_config import parse
from txf.rundir import metrics, resume
from txf.train import loop


def test_a_run_stopped_by_an_error_records_the_step_it_reached(tmp_path):
  """end_step is null only where the process died (docs/running.md)."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=8, train__learning_rate=1e6)
  with pytest.raises(loop.TrainingDiverged) as info:
    loop.run(parse(config), workdir, log=lambda line: None)
  reached = int(re.search(r"by step (\d+);", str(info.value)).group(1))
  entry = json.loads((workdir / "run_record.json").read_text())[-1]
  assert entry["ended"] == "TrainingDiverged" and entry["end_step"] == reached


def kept_points(workdir):
  """[(tag, step)] of every summary value TensorBoard keeps of the run's event
  files: file by file, a SessionLog START at step s hides the events written
  before it at steps >= s (as tests/rundir/test_hparams_purge.py reads them)."""
  kept = []
  for event in read_tensorboard_events(workdir / metrics.TENSORBOARD_DIR):
    if event.HasField("session_log") and event.session_log.status == SessionLog.START:
      kept = [(tag, step) for tag, step in kept if step < event.step]
    kept += [(value.tag, event.step) for value in event.summary.value]
  return kept


@pytest.mark.parametrize("lost", ["cut_off_row", "config_json"])
def test_a_completed_final_evaluation_replaces_the_lost_one(tmp_path, lost):
  """The run's last eval row cut off (a kill as it was written), or its
  config.json lost: the run completes its final evaluation at step 4, which
  duplicated the sample at step 4 in samples.txt and TensorBoard's points at
  step 4 (and the eval row, where only config.json was lost), and kept the
  cut-off row in metrics.jsonl."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=4, train__log_every=2, eval__every=2, eval__sample_tokens=4)
  loop.run(parse(config), workdir, log=lambda line: None)
  rows, points = metrics.read_metrics(workdir), sorted(kept_points(workdir))
  if lost == "cut_off_row":
    path = workdir / metrics.METRICS_FILE
    text = path.read_text()
    path.write_text(text[: text.rindex("\n", 0, -1) + 20])  # the eval row at 4, cut
  else:
    (workdir / resume.CONFIG_FILE).unlink()
  lines = []
  loop.run(parse(config), workdir, log=lines.append)
  assert any("completing its final evaluation" in line for line in lines), lines
  assert [step for step, _ in metrics.read_samples(workdir)] == [2, 4]
  after = (workdir / metrics.METRICS_FILE).read_text().splitlines()
  assert [json.loads(line)["step"] for line in after] == [row["step"] for row in rows]
  assert without_timings(json.loads(line) for line in after)[:-1] == without_timings(rows)[:-1]
  assert sorted(kept_points(workdir)) == points  # each point once, the hparams' too


def files(workdir):
  """{name: bytes} of the run's files (but .lock, which each start rewrites)."""
  return {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("lost", ["cut_off_row", "config_json"])
def test_an_end_completed_under_changed_fields_is_refused_before_anything_is_written(
  tmp_path, lost
):
  """Completing the lost end under another config evaluated and wrote
  config.json with it: a 4-step run's lost config.json came back saying
  data.seq_len 64, or train.steps 2 and a warmup of 2 (which a later
  extension kept), and its valid final evaluation was moved aside."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=4, train__log_every=2, eval__every=2, eval__sample_tokens=4)
  loop.run(parse(config), workdir, log=lambda line: None)
  path = workdir / metrics.METRICS_FILE
  if lost == "cut_off_row":
    path.write_text(path.read_text()[: path.read_text().rindex("\n", 0, -1) + 20])
  else:
    (workdir / resume.CONFIG_FILE).unlink()
  before = files(workdir)
  for field, value in (("data__seq_len", 64), ("steps", 2)):
    fields = dict(steps=4, train__log_every=2, eval__every=2, eval__sample_tokens=4)
    changed = parse(tiny_config(**{**fields, field: value}))
    name = "data.seq_len" if field == "data__seq_len" else "train.steps"
    if lost == "cut_off_row" and name == "train.steps":
      # config.json there: trained past train.steps=2, it only evaluates (written: nothing).
      assert loop.run(changed, workdir, log=lambda line: None)
    else:
      with pytest.raises(
        loop.ConfigError, match=rf"^{name}(, [a-z_.]+)*: the run in .* trained to step 4, "
      ):
        loop.run(changed, workdir, log=lambda line: None)
    assert files(workdir) == before
  lines = []
  loop.run(parse(config), workdir, log=lines.append)  # as it trained: completed
  assert any("completing its final evaluation" in line for line in lines), lines


def test_a_lost_evaluation_at_the_step_a_run_trains_on_from_is_evaluated_again(tmp_path):
  """A 4-step run whose eval row at 4 was cut off, extended to 6 steps: the
  evaluation at 4 (due: eval.every 2) is done again from the checkpoint, the
  cut row moved aside; it was left mid-file and step 4 had no evaluation."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=4, train__log_every=2, eval__every=2, eval__sample_tokens=4)
  loop.run(parse(config), workdir, log=lambda line: None)
  rows = metrics.read_metrics(workdir)
  path = workdir / metrics.METRICS_FILE
  text = path.read_text()
  path.write_text(text[: text.rindex("\n", 0, -1) + 20])  # the eval row at 4, cut
  lines = []
  config.train.steps = 6
  loop.run(parse(config), workdir, log=lines.append)
  assert "the evaluation at step 4 was lost: evaluating it again" in lines, lines
  # The cut row said as what it was, step 4's evaluation (not a record logged
  # after the step training continues from, as a resume's are).
  moved = "moved 1 record of metrics.jsonl of the evaluation at step 4 (evaluated again)"
  assert f"{moved} to its .dropped file" in lines, lines
  after = [json.loads(line) for line in path.read_text().splitlines()]  # each line reads
  assert [row["step"] for row in after] == [row["step"] for row in rows] + [6, 6]
  assert without_timings(after[:4]) == without_timings(rows)  # step 4's, as first evaluated
  assert [step for step, _ in metrics.read_samples(workdir)] == [2, 4, 6]


def test_no_evaluation_is_said_lost_where_none_was_due_as_the_run_trained(tmp_path):
  """Resumed from step 2 of a run evaluated every 4 steps, with eval.every
  2: 'the evaluation at step 2 was lost: evaluating it again' (none was due
  there), and an eval row at 2 the run never had."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=4, train__log_every=2, eval__every=4, train__checkpoint_every=2)
  config.train.max_to_keep = 3
  loop.run(parse(config), workdir, log=lambda line: None)
  config.eval.every = 2
  lines = []
  loop.run(parse(config), workdir, log=lines.append, resume_step=2)
  assert not any("was lost" in line for line in lines), lines
  evaluated = [row["step"] for row in metrics.read_metrics(workdir) if metrics.is_eval_row(row)]
  assert evaluated == [4]
