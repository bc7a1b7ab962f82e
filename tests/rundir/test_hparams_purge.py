"""The HParams record a run's TensorBoard files keep across sessions, read
as TensorBoard reads them: file by file, a SessionLog START at step s (a
resumed session's purge step) hides the events written before it at steps
>= s (tensorboard's EventAccumulator._CheckForRestartAndMaybePurge). A
session that trains again the step a record was written at must write it
again; one that does not must not write a second."""

import itertools

import pytest
from tensorboardX.proto.event_pb2 import SessionLog

from tensorboard_files import read_tensorboard_events
from txf.rundir import metrics, sinks

HPARAMS = {"model.d_model": 64, "train.steps": 6}
FINAL = {"eval_loss": 2.5}
SESSION_START = "_hparams_/session_start_info"


def kept_records(workdir):
  """The steps of the hparams session_start_info records TensorBoard keeps."""
  kept = []
  for event in read_tensorboard_events(workdir / metrics.TENSORBOARD_DIR):
    if event.HasField("session_log") and event.session_log.status == SessionLog.START:
      kept = [step for step in kept if step < event.step]
    kept += [event.step for value in event.summary.value if value.tag == SESSION_START]
  return kept


def session(workdir, start_step, steps, hparams=HPARAMS):
  """A session of a run training from `start_step` (None: a fresh start) to
  `steps`, writing the hparams at its end, as txf.train.loop does."""
  with metrics.MetricsWriter(workdir, start_step=start_step) as writer:
    for step in range((start_step or 0) + 1, steps + 1):
      writer.write(step, {"loss": 1.0 / step})
    writer.write_hparams(steps, hparams, FINAL)


@pytest.fixture(params=["local", "mirrored"])
def tensorboard_kind(request, monkeypatch, tmp_path):
  """Local event files, or those a work directory on object storage gets:
  written elsewhere and copied in (sinks.MirroredTensorBoard), here into a
  local directory (made first: an object store has none to make). Each
  session starts in a second of its own, as a run's do: the event files are
  read in the order of their names, which begin with that second."""
  seconds = itertools.count(1_800_000_000)
  monkeypatch.setattr(sinks.time, "time", lambda: next(seconds))
  if request.param == "mirrored":
    (tmp_path / metrics.TENSORBOARD_DIR).mkdir()
    monkeypatch.setattr(metrics, "tensorboard", sinks.MirroredTensorBoard)
  return request.param


def test_a_run_trained_again_from_an_earlier_step_keeps_its_hparams(tmp_path, tensorboard_kind):
  session(tmp_path, None, 6)
  assert kept_records(tmp_path) == [6]
  session(tmp_path, 3, 6)  # txf-run --resume_step=3 of the finished run
  assert kept_records(tmp_path) == [6]
  session(tmp_path, 6, 6)  # its end completed again: the record is kept, none added
  assert kept_records(tmp_path) == [6]


def test_a_preempted_run_resumed_before_its_last_record_keeps_one(tmp_path, tensorboard_kind):
  session(tmp_path, None, 6)
  session(tmp_path, 5, 6)  # resumed from the checkpoint before the record's step
  session(tmp_path, 2, 6)
  assert kept_records(tmp_path) == [6]
  session(tmp_path, 6, 9, {**HPARAMS, "train.steps": 9})  # extended: a record of its own
  assert kept_records(tmp_path) == [6, 9]
