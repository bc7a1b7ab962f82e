"""What a resume compares with the run it resumes (txf.rundir.resume): the
fields fit_vocabulary derives from the data fields compare as derived, and
a run whose config.json was lost is held to its run_record.json."""

import pytest

from conftest import tiny_config
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir import resume
from txf.rundir.record import RECORD_FILE
from txf.train import loop


def test_a_classifier_resumes_with_the_command_that_started_it(tmp_path):
  """ListOps' 10 labels become model.num_classes (fit_vocabulary), which
  config.json records; the command line still carries the default 2."""
  run = parse(tiny_config("encoder_classify"))
  assert run.model.num_classes == 2
  saved = run.with_vocabulary(20, 10)  # as fit_vocabulary fits it
  resume.check_resumable(run, saved, tmp_path)
  assert resume.config_changes(run, saved) == []
  # A run whose dataset gave other labels is another run: still refused.
  other = run.with_vocabulary(20, 7)
  with pytest.raises(ValueError, match=r"^model\.num_classes: differs from the run"):
    resume.check_resumable(run, other, tmp_path)


def test_a_run_that_lost_its_config_json_is_held_to_its_record(tmp_path):
  """With config.json deleted, a resume that changed the seed was accepted
  and config.json rewritten with it: run_record.json holds the run's config."""
  workdir = tmp_path / "run"
  config = tiny_config(steps=2)
  loop.run(parse(config), workdir, log=lambda line: None)
  (workdir / resume.CONFIG_FILE).unlink()
  config.seed += 1
  record = workdir / RECORD_FILE
  with pytest.raises(ConfigError, match=rf"^seed: differs from the run .*\(see {record}\)"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert not (workdir / resume.CONFIG_FILE).exists()
  record.unlink()  # nothing says what the checkpoints were trained with
  with pytest.raises(ConfigError, match=r"^workdir: .* holds checkpoints but no config\.json or"):
    loop.run(parse(config), workdir, log=lambda line: None)
