"""The typed run config all the way down (issue 56): one parse of each
section per run, config.json as the serialised RunConfig (read back equal),
and every config.json format written since runs were first written still
read, resumed, evaluated, extrapolated, analysed and exported.

tests/fixtures/run_1c066fd was made at commit 1c066fd (a worktree of it, its
own txf on PYTHONPATH) with
  python -m experiments.run --config=configs/learned.py --workdir=DIR \
    --config.model.d_model=16 --config.model.num_heads=2 --config.model.num_layers=1 \
    --config.model.use_bias=True --config.model.scale_logits=False \
    --config.data.batch_size=4 --config.data.seq_len=16 --config.data.max_corpus_bytes=100000 \
    --config.train.steps=2 --config.train.warmup_steps=1 --config.train.log_every=1 \
    --config.train.checkpoint_every=2 --config.eval.every=2 --config.eval.num_batches=1 \
    --config.eval.sample_tokens=0
(its tb/ left out): a GPT-2-shaped decoder, so that it exports, and the
config.json format of its day (model.rope_base and the other fields since
moved into model.options, no model.attention).
"""

import collections
import dataclasses
import json
import shutil
import subprocess

import jax
import numpy as np
import pytest

from conftest import FIXTURES, REPO, load_config, tiny_config
from txf import configs
from txf.data.spec import DataSpec
from txf.layers.model_config import ModelConfig
from txf.runconfig.run_config import (
  ConfigError,
  EvalConfig,
  ParallelConfig,
  RunConfig,
  TrainConfig,
  parse,
  to_json,
)
from txf.rundir import resume
from txf.rundir.metrics import read_metrics
from txf.rundir.resume import is_run_directory
from txf.sweep import grid
from txf.train import loop
from txf.train.run_setup import load_run, load_trained
from txf.trained.export import export_run
from txf.trained.extrapolate import extrapolate_run
from txf.trained.head_analysis import analyze_run

RUN_CONFIGS = [name for name in configs.names() if not name.startswith("sweeps/")]
SWEEP_CONFIGS = [name for name in configs.names() if name.startswith("sweeps/")]
# Runs written by earlier txf (the first format, 1c066fd's, and a classifier
# of 2ed814c's, which recorded num_classes 2 for ListOps' 10), committed as fixtures.
OLD_RUNS = ["run_822e561", "run_1c066fd", "run_2ed814c_classify"]


def committed_runs():
  """Every committed directory holding a txf run's config.json."""
  files = subprocess.run(
    ["git", "ls-files", "*config.json"], cwd=REPO, capture_output=True, text=True, check=True
  ).stdout.split()
  directories = sorted({(REPO / file).parent for file in files})
  return [directory for directory in directories if is_run_directory(directory)]


def shipped(name):
  """A shipped run config, loaded as --config=NAME loads it."""
  if name == "pretrained":
    return configs.load(configs.find(name), str(FIXTURES / "hf" / "gpt2"))
  return configs.load(configs.find(name))


# ---------------------------------------------------------------------------
# config.json: the serialised RunConfig, read back equal.


@pytest.mark.parametrize("name", RUN_CONFIGS)
def test_every_shipped_config_round_trips_through_json(name):
  run = parse(shipped(name))
  text = json.dumps(to_json(run))
  assert parse(json.loads(text)) == run
  assert resume.from_json(json.loads(text)) == run  # the migration leaves today's format alone


@pytest.mark.parametrize("name", SWEEP_CONFIGS)
def test_every_shipped_sweep_point_round_trips_through_json(name):
  for point in grid.expand(configs.load(configs.find(name))):
    run = parse(point.config)
    assert parse(json.loads(json.dumps(to_json(run)))) == run, point.name


def test_with_vocabulary_round_trips_and_equality_compares_every_section():
  run = parse(tiny_config()).with_vocabulary(260, None)
  assert parse(to_json(run)) == run and run.model.vocab_size == 260
  for changed in (
    dataclasses.replace(run, seed=1),
    dataclasses.replace(run, train=dataclasses.replace(run.train, steps=13)),
    dataclasses.replace(run, data=dataclasses.replace(run.data, seq_len=16)),
    run.override({"model.vocab_size": 300}),
  ):
    assert changed != run and parse(to_json(changed)) == changed


def test_an_override_is_parsed_as_any_config_and_reads_what_it_makes_read():
  run = parse(tiny_config())
  assert run.data.sp_vocab_size is None  # the byte tokenizer reads none
  assert run.override({"data.seq_len": 64}) == parse(tiny_config(data__seq_len=64))
  sentencepiece = run.override({"data.tokenizer": "sentencepiece"})
  assert sentencepiece.data.sp_vocab_size == DataSpec().sp_vocab_size == 1024
  assert run.override({"data.seed": 5}).data.seed == 5
  with pytest.raises(ConfigError, match=r"^data\.bogus: unknown field$"):
    run.override({"data.bogus": 1})
  with pytest.raises(ConfigError, match=r"^model\.max_len: "):
    parse(tiny_config("learned", model__max_len=32)).override({"data.seq_len": 64})
  # Another encoding with a setting of its own, in one override as on the
  # command line: 'unknown field' (the options held only rope's settings).
  t5 = run.override({"model.position": "t5_bias", "model.options.t5_num_buckets": 16})
  assert t5.model.options == {"t5_num_buckets": 16, "t5_max_distance": 128}
  with pytest.raises(ConfigError, match=r"^model\.options\.typo: not a setting of any"):
    run.override({"model.options.typo": 1})


@pytest.mark.parametrize(
  "config, message",
  [
    ({"model": "x"}, r"^model: a section of fields \(a dict\), got 'x'$"),
    ({"eval": 3}, r"^eval: a section of fields \(a dict\), got 3$"),
    ({"eval": {"sample_prompt": 5}}, r"^eval\.sample_prompt: a string, got 5$"),
  ],
)
def test_a_section_or_prompt_of_another_type_is_a_config_error(config, message):
  """A TypeError from vars(), an AttributeError, or (the prompt) one from the
  tokenizer when the run set up."""
  with pytest.raises(ConfigError, match=message):
    parse(config)


def test_the_base_config_is_built_from_the_sections_defaults():
  base = load_config("base")
  for name, cls in [
    ("data", DataSpec),
    ("train", TrainConfig),
    ("eval", EvalConfig),
    ("parallel", ParallelConfig),
  ]:
    for field in dataclasses.fields(cls):
      default = field.default
      given = base[name][field.name]
      assert given == (",".join(default) if isinstance(default, tuple) else default), field.name
  model = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name != "options"}
  assert {**model, "vocab_size": None} == {k: base.model[k] for k in model}
  assert (base.seed, base.replicas) == (RunConfig.seed, RunConfig.replicas)
  # What a config leaves out is the declared default: an empty config is base.py's.
  assert parse({}) == parse(base).with_vocabulary(260, None)


# ---------------------------------------------------------------------------
# One parse of each section per run.


@pytest.fixture
def constructions(monkeypatch):
  """Counts each section's dataclass constructions (a parse of the section,
  and its checks)."""
  counts = collections.Counter()
  for cls in (ModelConfig, DataSpec, TrainConfig, EvalConfig, ParallelConfig):
    init = cls.__init__

    def counting(self, *args, _init=init, _name=cls.__name__, **kwargs):
      counts[_name] += 1
      _init(self, *args, **kwargs)

    monkeypatch.setattr(cls, "__init__", counting)
  return counts


SECTIONS = ("ModelConfig", "DataSpec", "TrainConfig", "EvalConfig", "ParallelConfig")


@pytest.mark.slow  # trains runs
def test_a_run_parses_each_section_once_and_a_resume_once_more_for_config_json(
  tmp_path, constructions
):
  config = tiny_config(steps=2)
  loop.run(parse(config), tmp_path, log=lambda line: None)
  assert constructions == dict.fromkeys(SECTIONS, 1)  # the command line's parse, and no other
  constructions.clear()
  config.train.steps = 3
  loop.run(parse(config), tmp_path, log=lambda line: None)
  # And config.json's, read once; the optimizer-state check builds a train
  # section with each changed train field reverted (train.steps, and the
  # warmup fitted to it), to compare the optimizer states they make.
  assert constructions == {**dict.fromkeys(SECTIONS, 2), "TrainConfig": 2 + 2}


# ---------------------------------------------------------------------------
# Every format since the first.


@pytest.mark.parametrize(
  "directory", committed_runs(), ids=lambda path: str(path.relative_to(REPO))
)
def test_every_committed_config_json_reads_and_round_trips(directory):
  saved = resume.read_run_config(directory)
  assert saved is not None
  assert resume.from_json(json.loads(json.dumps(to_json(saved)))) == saved
  assert resume.config_changes(saved, saved) == []
  recorded = json.loads((directory / resume.CONFIG_FILE).read_text())
  assert saved.seed == recorded["seed"] and saved.train.steps == recorded["train"]["steps"]
  assert saved.model.d_model == recorded["model"]["d_model"]
  assert saved.data.seq_len == recorded["data"]["seq_len"]


def test_the_committed_formats_include_the_first_and_1c066fds():
  directories = {path.name for path in committed_runs()}
  assert set(OLD_RUNS) <= directories


@pytest.mark.slow  # restores a run
def test_a_classifier_written_before_the_typed_config_evaluates_as_it_logged(tmp_path):
  """Its config.json records the config's num_classes, 2; its model was
  built with ListOps' 10 labels. Every reader refused it (model.num_classes:
  differs); a classifier recording another count is still refused."""
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURES / "run_2ed814c_classify", workdir)
  saved = resume.read_run_config(workdir)
  assert saved.model.num_classes == 2 and saved.data.name == "listops"
  trained = load_run(workdir)
  logged = [row for row in read_metrics(workdir) if "eval_loss" in row][-1]
  assert trained.step == logged["step"] == 4
  evaluated = trained.setup.evaluate(trained.params)
  assert evaluated["eval_loss"] == pytest.approx(logged["eval_loss"], rel=1e-5)
  other = saved.override({"model.num_classes": 7})
  assert [name for name, _, _ in resume.config_changes(saved, other)] == ["model.num_classes"]


def test_the_migration_renames_moves_and_adds_as_its_table_says():
  old = json.loads((FIXTURES / "run_822e561" / resume.CONFIG_FILE).read_text())
  assert {"min_len", "max_len"} <= set(old["data"]) and "replicas" not in old
  migrated = resume.migrate(json.loads(json.dumps(old)))
  assert migrated["data"]["min_example_len"] == old["data"]["min_len"]
  assert "min_len" not in migrated["data"] and migrated["replicas"] == 1
  assert migrated["model"]["options"]["rope_base"] == old["model"]["rope_base"]
  assert "rope_base" not in migrated["model"]
  assert migrated["train"]["trackers"] == "" and migrated["model"]["attention"] == "softmax"
  top = resume.migrate({"init_from": "runs/a", "train": {}})  # before train.init_from
  assert top["train"]["init_from"] == "runs/a" and "init_from" not in top
  today = to_json(parse(load_config("rope")))
  assert resume.migrate(json.loads(json.dumps(today))) == today  # today's format: unchanged
  # Fields an older run set where its model never read them (refused since).
  unread = json.loads(json.dumps(today))
  unread["model"].update(pooling="mean", num_classes=7, share_embeddings=False)
  migrated = resume.migrate(unread)["model"]
  assert (migrated["pooling"], migrated["num_classes"], migrated["share_embeddings"]) == (
    "cls",
    2,
    True,
  )
  assert resume.from_json(unread).model == parse(load_config("rope")).model
  classify = json.loads(json.dumps(to_json(parse(load_config("encoder_classify")))))
  classify["model"].update(pooling="mean", num_classes=7)
  assert resume.migrate(classify)["model"]["pooling"] == "mean"  # read there: kept


def test_the_migration_gives_each_field_added_since_the_value_its_runs_had():
  """A config.json of the first format (its sections, none of the fields
  added since, data.min_len / data.max_len off their defaults) under today's
  names, each added field at the value the runs written before it had (not
  read from MIGRATIONS: what the table must say)."""
  first = {
    "seed": 0,
    "model": {},
    "data": {"min_len": 3, "max_len": 9},
    "train": {},
    "eval": {},
    "parallel": {},
  }
  assert resume.migrate(first) == {
    "seed": 0,
    "replicas": 1,
    "model": {
      "gelu_approximate": True,
      "embed_norm": False,
      "num_token_types": 0,
      "scale_attention": True,
      "init": "txf",
      "attention": "softmax",
      "options": {},
    },
    "data": {
      "min_example_len": 3,
      "max_example_len": 9,
      "num_symbols": 32,
      "num_kv_pairs": 8,
      "read_threads": 4,
      "attend_across_documents": False,
      "seed_per_replica": False,
      "tfds_eval_split": "validation",
    },
    "train": {"loss_chunk_len": 0, "trackers": "", "keep_every": 0, "keep_best": 0},
    "eval": {},
    "parallel": {},
  }


def test_replicas_read_one_data_stream_unless_each_has_its_own():
  shared = parse(tiny_config(data__seed=7)).override({"replicas": 3})
  assert shared.seeds == (0, 1, 2) and shared.data_seed == 7
  assert not shared.own_batches and shared.data_seeds == (7,)
  own = shared.override({"data.seed_per_replica": True})
  assert own.own_batches and own.data_seeds == (7, 8, 9)
  single = parse(tiny_config(data__seed_per_replica=True))  # one replica: one stream
  assert not single.own_batches and single.data_seeds == (0,)


def test_a_run_of_the_old_format_resumes_without_a_change(tmp_path):
  """The command that made run_1c066fd, under today's field names: the same
  run (nothing its checkpoints depend on changed), and no field changed."""
  saved = resume.read_run_config(FIXTURES / "run_1c066fd")
  config = old_run_config(steps=2)
  resume.check_resumable(parse(config), saved, FIXTURES / "run_1c066fd")
  assert resume.config_changes(parse(config), saved) == []


def test_a_run_without_a_checkpoint_may_change_all_but_its_data(tmp_path):
  """A run that stopped before its first save (a model too large for the
  device) is corrected in place; its tokenizer's data fields stay held, and
  a run with checkpoints (run_1c066fd's) holds its model too."""
  run = parse(old_run_config(steps=2))
  resume.write_config(run, tmp_path)
  corrected = run.override({"model.d_model": 32, "seed": run.seed + 1})
  resumed, saved = resume.prepare_resume(corrected, tmp_path)
  assert resumed == corrected and saved is not None and saved.model.d_model == 16
  with pytest.raises(ValueError, match=r"^data\.max_corpus_bytes: differs from the run"):
    resume.prepare_resume(run.override({"data.max_corpus_bytes": 50_000}), tmp_path)
  reordered = run.override({"data.seed": run.seed + 7})  # the tokenizer does not depend on it
  assert resume.prepare_resume(reordered, tmp_path)[0] == reordered
  with pytest.raises(ValueError, match=r"^model\.d_model: differs from the run"):
    resume.prepare_resume(run.override({"model.d_model": 32}), FIXTURES / "run_1c066fd")


def old_run_config(steps):
  config = load_config("learned")
  config.model.update(dict(d_model=16, num_heads=2, num_layers=1, use_bias=True))
  config.model.scale_logits = False
  config.data.update(dict(batch_size=4, seq_len=16, max_corpus_bytes=100_000))
  config.train.update(dict(steps=steps, warmup_steps=1, log_every=1, checkpoint_every=2))
  config.eval.update(dict(every=2, num_batches=1, sample_tokens=0))
  return config


@pytest.mark.slow  # restores a run twice
def test_a_run_whose_config_json_is_lost_or_damaged_is_read_as_a_txf_run(tmp_path):
  """Its readers said a run whose config.json was lost holds no run, though
  txf-run resumes it from run_record.json's config; one whose config.json
  lost its model section was read as a Hugging Face directory ('architecture
  None is not supported'), not refused naming the section."""
  intact, lost, damaged = tmp_path / "intact", tmp_path / "lost", tmp_path / "damaged"
  for workdir in (intact, lost, damaged):
    shutil.copytree(FIXTURES / "run_1c066fd", workdir)
  (lost / resume.CONFIG_FILE).unlink()
  saved = json.loads((damaged / resume.CONFIG_FILE).read_text())
  del saved["model"]
  (damaged / resume.CONFIG_FILE).write_text(json.dumps(saved))
  hf = FIXTURES / "hf" / "gpt2"
  found = [is_run_directory(path) for path in (intact, lost, damaged, hf, tmp_path)]
  assert found == [True, True, True, False, False]
  read, original = load_run(lost), load_run(intact)
  assert read.step == original.step == 2 and read.setup.run == original.setup.run
  same = jax.tree.map(np.array_equal, read.params, original.params)
  assert all(jax.tree.leaves(same)) and len(jax.tree.leaves(same)) > 1
  with pytest.raises(ConfigError, match=rf"^{damaged}/config\.json: model: missing"):
    load_trained(damaged)
  (lost / "run_record.json").unlink()  # checkpoints that no config describes
  with pytest.raises(ConfigError, match=r"holds checkpoints but no config\.json or run_record"):
    load_run(lost)


@pytest.mark.slow  # restores, evaluates, trains, extrapolates, analyses and exports
def test_a_run_written_by_1c066fd_evaluates_resumes_extrapolates_analyses_and_exports(tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(FIXTURES / "run_1c066fd", workdir)
  logged = [row for row in read_metrics(workdir) if "eval_loss" in row][-1]

  trained = load_run(workdir)
  assert trained.step == 2 and trained.setup.run.model.vocab_size == 260
  result = trained.setup.evaluate(trained.params)
  np.testing.assert_allclose(result["eval_loss"], logged["eval_loss"], rtol=1e-5)

  record = extrapolate_run(workdir, factors=(1, 2), num_tokens=200)
  assert record["applicable"] == [True, True] and record["train_length"] == 16
  assert analyze_run(workdir, num_batches=1)["step"] == 2
  exported = export_run(workdir, tmp_path / "hf")
  assert "model.safetensors" in exported.files
  assert load_trained(workdir).step == 2

  lines = []
  loop.run(parse(old_run_config(steps=4)), workdir, log=lines.append)
  assert "resumed from step 2" in "\n".join(lines)
  (changes,) = [line for line in lines if line.startswith("changed from the run's config.json")]
  assert changes.startswith("changed from the run's config.json: train.steps 2 -> 4; learning")
  assert [row["step"] for row in read_metrics(workdir) if "loss" in row] == [1, 2, 3, 4]
  # config.json is today's format now, and reads back as the run that wrote it.
  rewritten = resume.read_run_config(workdir)
  assert to_json(rewritten) == json.loads((workdir / resume.CONFIG_FILE).read_text())
  assert rewritten.train.steps == 4 and rewritten.model.vocab_size == 260
