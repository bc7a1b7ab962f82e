"""What a resume compares with the run it resumes (txf.rundir.resume): the
fields fit_vocabulary derives from the data fields compare as derived, and
a run whose config.json was lost is held to its run_record.json."""

import json
import shutil

import pytest

from conftest import tiny_config
from txf.runconfig.run_config import ConfigError, parse, to_json
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


# A value other than the default for each field a resume may change.
CHANGED = {
  "dropout_rate": 0.1,
  "attention_dropout_rate": 0.1,
  "dtype": "bfloat16",
  "attention_impl": "chunked",
  "remat": True,
  "max_len": 64,
}


@pytest.mark.parametrize("field", resume.FREE_MODEL_FIELDS)
def test_a_resume_may_change_how_the_model_computes_not_its_parameters(tmp_path, field):
  """model.remat (to fit memory), the attention kernel, the compute dtype,
  dropout and a RoPE model's max_len leave the checkpoint as it is: a resume
  may change them (they were refused with the whole model section). A
  learned position table's max_len is the checkpoint's shape: refused."""
  assert set(CHANGED) == set(resume.FREE_MODEL_FIELDS)
  saved = parse(tiny_config("rope"))
  run = parse(tiny_config("rope", **{f"model__{field}": CHANGED[field]}))
  assert [name for name, _, _ in resume.config_changes(run, saved)] == [f"model.{field}"]
  resume.check_resumable(run, saved, tmp_path)
  learned = dict(model__position="learned")
  saved = parse(tiny_config("rope", **learned))
  run = parse(tiny_config("rope", **learned, **{f"model__{field}": CHANGED[field]}))
  if field == "max_len":
    with pytest.raises(ValueError, match=r"^model\.max_len: differs from the run"):
      resume.check_resumable(run, saved, tmp_path)
  else:
    resume.check_resumable(run, saved, tmp_path)


def test_a_resume_compares_the_data_order_as_the_streams_it_draws(tmp_path):
  """An explicit data.seed equal to the run's seed (what None resolves to)
  and data.seed_per_replica with one replica read the same batches: not
  changes (both were refused as differing from the run)."""
  saved = parse(tiny_config("rope"))
  assert saved.data.seed is None and saved.replicas == 1
  for same in (dict(data__seed=saved.seed), dict(data__seed_per_replica=True)):
    run = parse(tiny_config("rope", **same))
    assert resume.config_changes(run, saved) == []
    resume.check_resumable(run, saved, tmp_path)
  other = parse(tiny_config("rope", data__seed=saved.seed + 1))
  with pytest.raises(ValueError, match=r"^data\.seed: differs from the run"):
    resume.check_resumable(other, saved, tmp_path)
  config = tiny_config("rope")
  config.replicas = 2
  saved = parse(config)
  config.data.seed_per_replica = True
  own = parse(config)
  with pytest.raises(ValueError, match=r"^data\.seed_per_replica: differs from the run"):
    resume.check_resumable(own, saved, tmp_path)


def test_a_run_is_resumed_and_read_only_with_the_tokenizer_it_trained_with(tmp_path):
  """A tokenizer.json edited between starts (the ids of 'a' and 'b'
  swapped) was used by the resume and by load_run without a word: the
  weights read other ids than they were trained on. Refused naming
  data.tokenizer, before anything is written; the same file again resumes."""
  from txf.data import tokenizers
  from txf.train.run_setup import load_run

  tokenizer_dir = tmp_path / "tokenizer"
  tokenizer_dir.mkdir()
  for name, text in tokenizers.hf_tokenizer_files(tokenizers.ByteTokenizer()).items():
    (tokenizer_dir / name).write_text(text)
  config = tiny_config(steps=2, data__tokenizer="hf", data__tokenizer_path=str(tokenizer_dir))
  workdir = tmp_path / "run"
  loop.run(parse(config), workdir, log=lambda line: None)
  original = (tokenizer_dir / "tokenizer.json").read_text()
  edited = json.loads(original)
  vocab = edited["model"]["vocab"]
  vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
  (tokenizer_dir / "tokenizer.json").write_text(json.dumps(edited))
  before = {path.name: path.read_bytes() for path in workdir.iterdir() if path.is_file()}
  config.train.steps = 4
  refused = (
    r"^data\.tokenizer_path: the tokenizer's contents \(sha256 \w+\) differ from those .* trained"
  )
  with pytest.raises(ConfigError, match=refused):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert {path.name: path.read_bytes() for path in workdir.iterdir() if path.is_file()} == before
  with pytest.raises(ConfigError, match=refused):
    load_run(workdir)
  (tokenizer_dir / "tokenizer.json").write_text(original)
  loop.run(parse(config), workdir, log=lambda line: None)
  assert load_run(workdir).step == 4


@pytest.mark.slow  # trains three runs
def test_a_run_reads_its_own_copy_of_an_hf_tokenizer_once_its_path_has_moved(tmp_path):
  """data.tokenizer_path and train.init_from name directories outside the
  run (a Hub cache): moved (another machine, another home), the run could
  neither resume (data.tokenizer_path: differs) nor be read (no
  tokenizer.json there; the starting checkpoint's config.json missing).
  A new run keeps its tokenizer's files; a resume may name where they moved
  to, not another tokenizer; the starting checkpoint is not read again."""
  from txf.data import tokenizers
  from txf.data.pipeline import HF_TOKENIZER_COPY
  from txf.train.run_setup import load_run, setup_run

  tokenizer_dir = tmp_path / "cache" / "tokenizer"
  tokenizer_dir.mkdir(parents=True)
  for name, text in tokenizers.hf_tokenizer_files(tokenizers.ByteTokenizer()).items():
    (tokenizer_dir / name).write_text(text)
  # A tokenizer.json under another name (data.tokenizer_path names the file).
  (tokenizer_dir / "tokenizer.json").rename(tokenizer_dir / "my_tokenizer")
  start = tmp_path / "cache" / "start"
  base = dict(data__tokenizer="hf", data__tokenizer_path=str(tokenizer_dir / "my_tokenizer"))
  loop.run(parse(tiny_config(steps=1, **base)), start, log=lambda line: None)
  config = tiny_config(steps=2, train__init_from=str(start), **base)
  workdir = tmp_path / "run"
  loop.run(parse(config), workdir, log=lambda line: None)
  kept = workdir / HF_TOKENIZER_COPY
  assert {path.name: path.read_bytes() for path in kept.iterdir()} == {
    path.name: path.read_bytes() for path in tokenizer_dir.iterdir()
  }
  moved = tmp_path / "elsewhere"
  (tmp_path / "cache").rename(moved)
  trained = load_run(workdir)
  assert trained.step == 2
  assert trained.setup.run.data.tokenizer_path == str(tokenizer_dir / "my_tokenizer")
  config.data.tokenizer_path = str(moved / "tokenizer" / "my_tokenizer")
  config.train.init_from = str(moved / "start")
  config.train.steps = 4
  loop.run(parse(config), workdir, log=lambda line: None)
  assert resume.read_run_config(workdir).data.tokenizer_path == config.data.tokenizer_path
  # Set up to restore: a fresh state would not start from train.init_from.
  setup = setup_run(parse(config), workdir)
  assert setup.started_from is None
  with pytest.raises(ConfigError, match=r"^train\.init_from: .* was not read, as .* held check"):
    setup.init()
  # Another tokenizer at the new path: the record's contents refuse it.
  other = tmp_path / "other"
  shutil.copytree(moved / "tokenizer", other)
  edited = json.loads((other / "my_tokenizer").read_text())
  vocab = edited["model"]["vocab"]
  vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
  (other / "my_tokenizer").write_text(json.dumps(edited))
  config.data.tokenizer_path = str(other / "my_tokenizer")
  config.train.steps = 6
  with pytest.raises(ConfigError, match=r"^data\.tokenizer_path: the tokenizer's contents"):
    loop.run(parse(config), workdir, log=lambda line: None)
  # Without checkpoints nothing checks the contents: the path is held.
  saved = resume.read_run_config(workdir)
  with pytest.raises(ValueError, match=r"^data\.tokenizer_path: differs from the run"):
    resume.check_resumable(parse(config), saved, workdir, trained=False)
  # A run that recorded no tokenizer contents is held to its path.
  (workdir / RECORD_FILE).unlink()
  with pytest.raises(ValueError, match=r"^data\.tokenizer_path: differs from the run"):
    resume.check_resumable(parse(config), saved, workdir)


def test_a_run_whose_checkpoints_link_to_nothing_is_refused_not_started_afresh(tmp_path):
  """checkpoints/ a link to an unmounted disk: the resume trained from step
  0, moving the run's metrics aside and creating the link's target."""
  config = tiny_config(steps=2)
  workdir = tmp_path / "run"
  loop.run(parse(config), workdir, log=lambda line: None)
  (workdir / "checkpoints").rename(tmp_path / "elsewhere")
  (workdir / "checkpoints").symlink_to(tmp_path / "unmounted" / "checkpoints")
  metrics = (workdir / "metrics.jsonl").read_bytes()
  config.train.steps = 4
  with pytest.raises(
    ConfigError, match=r"checkpoints: a link to .*unmounted.*, which does not exist"
  ):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert (workdir / "metrics.jsonl").read_bytes() == metrics
  assert not (tmp_path / "unmounted").exists()


@pytest.mark.parametrize(
  "name, base, field, value",
  [
    ("rope", dict(data__tokenizer="sentencepiece"), "sp_vocab_size", 300),
    ("rope", {}, "tokenizer", "sentencepiece"),
    ("encoder_mlm", {}, "mlm_probability", 0.25),
    ("mqar", {}, "num_kv_pairs", 3),
  ],
)
def test_a_resume_may_not_change_the_data_its_checkpoints_and_tokenizer_came_from(
  tmp_path, name, base, field, value
):
  """The sentencepiece model's vocabulary, the tokenizer, the masking and a
  generated task's examples define the stream the checkpoints trained on."""
  assert field not in resume.FREE_DATA_FIELDS
  saved = parse(tiny_config(name, **base))
  run = saved.override({f"data.{field}": value})
  assert resume.config_changes(run, saved)[0] == (
    f"data.{field}",
    getattr(saved.data, field),
    value,
  )
  for trained in (True, False):
    with pytest.raises(ValueError, match=rf"^data\.{field}: differs from the run already in "):
      resume.check_resumable(run, saved, tmp_path, trained=trained)


def test_a_resume_from_a_step_inside_the_warmup_takes_the_warmup_asked_for(tmp_path, monkeypatch):
  """The run's warmup (30 steps) is kept only where the step resumed from
  is past it: --resume_step=4 retrains from inside it, not from step 30, the
  newest checkpoint."""
  resume.write_config(parse(tiny_config(steps=30, train__warmup_steps=30)), tmp_path)
  monkeypatch.setattr(resume, "saved_steps", lambda workdir: [4, 30])
  longer = parse(tiny_config(steps=600, train__warmup_steps=60))
  run, saved = resume.prepare_resume(longer, tmp_path, resume_step=4)
  assert run == longer and saved.train.warmup_steps == 30
  for resume_step in (None, 30):
    run, _ = resume.prepare_resume(longer, tmp_path, resume_step=resume_step)
    assert run.train.warmup_steps == 30 and len(run.notes) == 1


def test_what_the_steps_a_resume_step_retrains_were_trained_with_is_the_last_start_of_them(
  tmp_path,
):
  """run_record.json: a start that trained 0-8 (or crashed, no end_step),
  then --resume_step=4 retraining 5-12 with another learning rate: steps 5
  on were last trained by that start, not the first."""
  first, later = parse(tiny_config(steps=8)), parse(tiny_config(train__learning_rate=1e-2))
  entry = lambda run, start, end: dict(start_step=start, end_step=end, config=to_json(run))
  write = lambda *entries: (tmp_path / RECORD_FILE).write_text(json.dumps(entries))
  now = parse(tiny_config())
  for first_end in (None, 8):
    write(entry(first, 0, first_end), entry(later, 4, 12))
    for step in (4, 6):
      assert resume.changes_since_step(now, tmp_path, step) == [
        ("train.learning_rate", 1e-2, now.train.learning_rate)
      ]
  assert resume.changes_since_step(now, tmp_path, 12) == []  # no start trained 13 on
  write(entry(first, 0, 12))
  assert resume.changes_since_step(now, tmp_path, 4) == [("train.steps", 8, 12)]


def test_the_config_a_run_is_held_to_names_the_file_it_was_read_from(tmp_path):
  run = parse(tiny_config())
  assert resume.read_held_config(tmp_path, trained=False) == (None, resume.CONFIG_FILE)
  (tmp_path / RECORD_FILE).write_text(json.dumps([dict(config=to_json(run))]))
  assert resume.read_held_config(tmp_path, trained=True) == (run, RECORD_FILE)
  resume.write_config(run, tmp_path)
  assert resume.read_held_config(tmp_path, trained=True) == (run, resume.CONFIG_FILE)


@pytest.mark.parametrize("sections", [("model",), ("train",), ()])
def test_a_config_json_without_both_model_and_train_is_not_a_run(tmp_path, sections):
  """A Hugging Face model's config.json (or another tool's) is not a txf
  run: without a run_record.json or checkpoints beside it, it is not one."""
  (tmp_path / resume.CONFIG_FILE).write_text(json.dumps({name: {} for name in sections}))
  assert not resume.is_run_directory(tmp_path)
  (tmp_path / resume.CONFIG_FILE).write_text(json.dumps({"model": {}, "train": {}}))
  assert resume.is_run_directory(tmp_path)
