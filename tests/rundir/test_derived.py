"""txf.rundir.derived: which outputs of a run's checkpoints a run that
trains on from a step moves aside, and where they go."""

import json

from txf.rundir.derived import (
  ANALYSIS_DIR,
  ANALYSIS_RECORD,
  EXTRAPOLATION_FILE,
  EXTRAPOLATION_PNG,
  PER_POSITION_PNG,
  derived_after,
  move_aside,
)


def outputs(workdir, extrapolation_step, analysis_step):
  """An extrapolation (with its figures) and an analysis of those steps;
  a str step is written as that text (a damaged record)."""
  workdir.mkdir(exist_ok=True)
  for path, step in (
    (workdir / EXTRAPOLATION_FILE, extrapolation_step),
    (workdir / ANALYSIS_DIR / ANALYSIS_RECORD, analysis_step),
  ):
    path.parent.mkdir(exist_ok=True)
    text = step if isinstance(step, str) else json.dumps({"step": step, "files": []})
    path.write_text(text)
  for name in (EXTRAPOLATION_PNG, PER_POSITION_PNG):
    (workdir / name).write_bytes(b"png")


def test_outputs_of_the_step_trained_from_stay_and_later_ones_are_found_with_their_files(
  tmp_path,
):
  outputs(tmp_path, 8, 8)
  assert derived_after(tmp_path, 8) == []  # the end of the range: its own step stays
  assert derived_after(tmp_path, 7) == [
    tmp_path / EXTRAPOLATION_FILE,
    tmp_path / EXTRAPOLATION_PNG,
    tmp_path / PER_POSITION_PNG,
    tmp_path / ANALYSIS_DIR,
  ]
  outputs(tmp_path, 4, 9)
  assert derived_after(tmp_path, 8) == [tmp_path / ANALYSIS_DIR]
  (tmp_path / PER_POSITION_PNG).unlink()  # a record without a figure: only what is there
  assert derived_after(tmp_path, 3)[:2] == [
    tmp_path / EXTRAPOLATION_FILE,
    tmp_path / EXTRAPOLATION_PNG,
  ]
  assert derived_after(tmp_path / "none", 0) == []


def test_a_record_that_names_no_step_is_found_whatever_the_step(tmp_path):
  for damaged in ("{not json", json.dumps({"loss": {}}), json.dumps({"step": True}), "[8]"):
    outputs(tmp_path, damaged, 0)
    assert derived_after(tmp_path, 10**9)[0] == tmp_path / EXTRAPOLATION_FILE, damaged
    assert tmp_path / ANALYSIS_DIR not in derived_after(tmp_path, 0)


def test_moved_aside_never_over_an_earlier_move(tmp_path):
  outputs(tmp_path, 8, 8)
  first = move_aside(derived_after(tmp_path, 4))
  assert [p.name for p in first] == [
    f"{EXTRAPOLATION_FILE}.dropped",
    f"{EXTRAPOLATION_PNG}.dropped",
    f"{PER_POSITION_PNG}.dropped",
    f"{ANALYSIS_DIR}.dropped",
  ]
  assert (
    json.loads((tmp_path / f"{ANALYSIS_DIR}.dropped" / ANALYSIS_RECORD).read_text())["step"] == 8
  )
  outputs(tmp_path, 6, 6)
  second = move_aside(derived_after(tmp_path, 4))
  assert [p.name for p in second][::3] == [
    f"{EXTRAPOLATION_FILE}.dropped-2",
    f"{ANALYSIS_DIR}.dropped-2",
  ]
  assert json.loads((tmp_path / f"{EXTRAPOLATION_FILE}.dropped").read_text())["step"] == 8
  assert json.loads((tmp_path / f"{EXTRAPOLATION_FILE}.dropped-2").read_text())["step"] == 6
  assert derived_after(tmp_path, 0) == []
