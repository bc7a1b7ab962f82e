"""Tests of a run's record (txf.rundir.record, run_record.json), the wall time
of metrics rows, the hyperparameters TensorBoard gets at a run's end, and the
check of train.trackers."""

import datetime
import json
import platform
import sys

import jax
import pytest

from conftest import tiny_config as tiny
from tensorboard_files import read_hparams, read_tensorboard_events
from txf.data import corpus
from txf.runconfig.run_config import ConfigError, parse, to_json
from txf.rundir import record
from txf.rundir.metrics import TENSORBOARD_DIR, read_metrics
from txf.rundir.resume import CONFIG_FILE
from txf.train import loop


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


def _time(text):
  return datetime.datetime.fromisoformat(text)


@pytest.mark.slow
def test_record_holds_each_start_of_a_run_and_hparams_its_end(tmp_path):
  workdir = tmp_path / "run"
  loop.run(
    parse(tiny(steps=4)), workdir, log=lambda line: None, hparams={"train.learning_rate": 0.01}
  )
  config_json = (workdir / CONFIG_FILE).read_text()
  (first,) = record.read_record(workdir)
  assert first["start_step"] == 0 and first["end_step"] == 4 and first["ended"] == "finished"
  assert _time(first["start"]) <= _time(first["end"])
  assert first["argv"] == sys.argv
  env = first["environment"]
  assert env["versions"]["jax"] == jax.__version__ and env["versions"]["flax"]
  assert env["versions"]["orbax-checkpoint"] and env["versions"]["optax"]
  assert env["process_count"] == 1 and env["device_kind"] == jax.devices()[0].device_kind
  assert env["python"] == platform.python_version()
  # Run from this checkout: its commit (or None where git is missing).
  git = first["git"]
  assert git is None or (len(git["commit"]) == 40 and isinstance(git["dirty"], bool))
  assert git == record.git_state()
  # The built-in corpus, described and hashed.
  data = first["data"]
  assert data["name"] == "pystdlib" and data["corpus"] == corpus.corpus_fingerprint()
  assert data["corpus"]["python"] == platform.python_version() and data["corpus"]["files"] > 100
  assert data["fields"]["max_corpus_bytes"] == 200_000 and len(data["sha256"]) == 64
  # The run's config (config.json's): derived fields filled in.
  model = first["config"]["model"]
  assert model["vocab_size"] == 260 and model["head_dim"] == 16 and model["d_ff"] == 128
  assert first["config"]["train"]["steps"] == 4 and first["config"]["train"]["trackers"] == []

  # Metrics rows carry their wall time.
  rows = read_metrics(workdir)
  assert all(_time(first["start"]).timestamp() - 1 <= row["time"] for row in rows)

  # TensorBoard's hparams: every resolved field, the ones passed, the final metrics.
  hparams, metric_tags = read_hparams(workdir / TENSORBOARD_DIR)
  assert hparams["model.d_model"] == 32 and hparams["model.head_dim"] == 16
  assert hparams["train.learning_rate"] == 0.01 and hparams["seed"] == 0
  assert hparams["train.warmup_steps"] == 4 and hparams["data.batch_size"] == 8
  assert hparams["eval.num_batches"] == 1 and hparams["replicas"] == 1
  assert {
    f"{section}.{name}"
    for section in ("model", "data", "train", "eval")
    for name in first["config"][section]
  } | {"seed", "replicas"} == set(hparams)
  assert "eval/loss" in metric_tags

  # Resumed with more steps: a second entry, the first kept as it was.
  loop.run(parse(tiny(steps=6)), workdir, log=lambda line: None)
  first_again, second = record.read_record(workdir)
  assert first_again == first
  assert second["start_step"] == 4 and second["end_step"] == 6 and second["ended"] == "finished"
  assert second["config"]["train"]["steps"] == 6
  # config.json is the run's RunConfig serialised: the record's config.
  assert json.loads((workdir / CONFIG_FILE).read_text()) == second["config"]
  assert json.loads(config_json) == first["config"]


@pytest.mark.slow
def test_a_failed_start_records_how_it_ended(tmp_path, monkeypatch):
  workdir = tmp_path / "run"

  def fail(*args, **kwargs):
    raise MemoryError  # the error's type (a Ctrl-C's is 'interrupted': test_train_loop)

  monkeypatch.setattr(loop, "_train", fail)
  with pytest.raises(MemoryError):
    loop.run(parse(tiny(steps=4)), workdir, log=lambda line: None)
  (entry,) = record.read_record(workdir)
  assert entry["ended"] == "MemoryError" and entry["end"] is not None
  assert not [e for e in read_tensorboard_events(workdir / TENSORBOARD_DIR) if e.summary.value]


def test_git_state_is_none_outside_a_checkout_or_without_git(tmp_path, monkeypatch):
  package = tmp_path / "txf"
  package.mkdir()
  assert record.git_state.__wrapped__(str(package)) is None
  monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
  assert record.git_state.__wrapped__() is None


def test_corpus_fingerprint_follows_the_contents(tmp_path):
  (tmp_path / "a.py").write_text("x = 1\n")
  (tmp_path / "b.py").write_text("y = 2\n")
  before = corpus.corpus_fingerprint.__wrapped__(str(tmp_path))
  assert before["files"] == 2 and before["bytes"] == 12
  (tmp_path / "b.py").write_text("y = 3\n")
  after = corpus.corpus_fingerprint.__wrapped__(str(tmp_path))
  assert after["bytes"] == 12 and after["sha256"] != before["sha256"]


@pytest.mark.parametrize("trackers", ["nope", "wandb,nope", ["wandb", 3], 5])
def test_unknown_tracker_is_a_config_error_before_anything_is_written(tmp_path, trackers):
  config = tiny(steps=4)
  config.train.trackers = trackers if isinstance(trackers, str) else ""
  if not isinstance(trackers, str):
    config.train.unlock()
    del config.train["trackers"]
    config.train.trackers = trackers
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"train\.trackers"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert not workdir.exists() or not any(workdir.iterdir())


def test_a_later_command_reads_the_records_last_entry(tmp_path):
  """The config, tokenizer and choices a later command holds the run to are
  its last start's: the first start's tokenizer (another sha256) and config
  are history."""
  first, last = parse(tiny(steps=4)), parse(tiny(steps=8))
  entry = lambda run, sha256: dict(
    config=to_json(run),
    tokenizer=dict(kind="hf", sha256=sha256),
    choices=record.registered_choices(run),
  )
  entries = [entry(first, "a" * 64), entry(last, "b" * 64)]
  (tmp_path / record.RECORD_FILE).write_text(json.dumps(entries))
  assert record.recorded_tokenizer(tmp_path) == dict(kind="hf", sha256="b" * 64)
  assert record.recorded_config(tmp_path)["train"]["steps"] == 8
  record.check_recorded_tokenizer(tmp_path, "b" * 64, "data.tokenizer_path")
  with pytest.raises(ValueError) as error:
    record.check_recorded_tokenizer(tmp_path, "a" * 64, "data.tokenizer_path")
  assert str(error.value) == (
    f"data.tokenizer_path: the tokenizer's contents (sha256 {'a' * 64}) differ from those "
    f"{tmp_path} trained with ({'b' * 64}): its ids would differ"
  )


def test_a_files_corpus_is_recorded_as_the_files_source_it_read():
  """data.name='files:GLOB' reads TEXT's 'files' entry: recorded as that."""
  run = parse(tiny(data__name="files:/texts/*.txt"))
  assert record.registered_choices(run)["data.name"] == dict(
    name="files", module="txf.data.text", function="<lambda>", builtin=True, path=None
  )
