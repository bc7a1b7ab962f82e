"""The run setup (txf.train.run_setup): a trained run evaluated at a new length
through load_run, the resume guard, and the benchmark built on the setup.

One tiny RoPE run is trained once for the module (compilation dominates;
JAX's persistent compilation cache is on, as in test_train_loop.py).
"""

import dataclasses
import hashlib
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
import types

import jax
import numpy as np
import pytest

from conftest import REPO, load_config, restore_state, tiny_config
from txf import decode, hardware
from txf.analysis import flops_per_token
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir import record
from txf.rundir.checkpoint import Checkpointer, checkpoint_directory
from txf.rundir.resume import (
  config_changes,
  keep_run_warmup,
  prepare_resume,
  read_run_config,
  write_config,
)
from txf.train import loop, run_setup
from txf.train.run_setup import fit_vocabulary, load_run, setup_run
from txf.train.step import model_inputs

STEPS = 4


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Work directory of a tiny RoPE run trained STEPS steps at seq_len 32."""
  workdir = tmp_path_factory.mktemp("run")
  loop.run(parse(tiny_config("rope", steps=STEPS)), workdir, log=lambda line: None)
  return workdir


def digests(directory):
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(pathlib.Path(directory).rglob("*"))
    if p.is_file()
  }


def reference_eval_loss(setup, params):
  """Token-weighted mean cross-entropy over the eval batches, in float64 numpy
  from the model's logits (independent of the eval step and its sums)."""
  loss_sum = count = 0.0
  for batch in setup.eval_data:
    logits = np.asarray(
      setup.model.apply({"params": params}, batch["inputs"], deterministic=True), np.float64
    )
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    picked = np.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
    loss_sum += float(np.sum(-picked * batch["weights"]))
    count += float(np.sum(batch["weights"]))
  return loss_sum / count


@pytest.mark.slow  # its fixture trains a run
def test_load_run_evaluates_at_twice_the_training_length(trained):
  before = digests(trained)
  run = load_run(trained, {"data.seq_len": 64, "eval.num_batches": 2})
  assert run.step == STEPS
  assert run.setup.run.data.seq_len == 64
  assert next(iter(run.setup.eval_data))["inputs"].shape == (8, 64)

  saved = restore_state(trained, STEPS)["params"]  # orbax directly, not the Checkpointer
  leaves, tree = jax.tree.flatten(run.params)
  saved_leaves, saved_tree = jax.tree.flatten(saved)
  assert tree == saved_tree and len(leaves) > 3
  for leaf, saved_leaf in zip(leaves, saved_leaves):
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(saved_leaf))

  result = run.setup.evaluate(run.params)
  assert math.isfinite(result["eval_loss"])
  # float32 logits and sums against a float64 reference over 2 x 8 x 64 tokens.
  assert result["eval_loss"] == pytest.approx(reference_eval_loss(run.setup, run.params), rel=1e-5)
  assert result["eval_perplexity"] == pytest.approx(math.exp(result["eval_loss"]), rel=1e-9)
  assert digests(trained) == before  # config.json and checkpoints untouched


@pytest.mark.slow  # its fixture trains a run
@pytest.mark.parametrize(
  "overrides, field",
  [
    ({"model.d_model": 64}, "model.d_model"),
    ({"model.position": "alibi"}, "model.position"),
    ({"seed": 1}, "seed"),
    ({"data.max_corpus_bytes": 100_000}, "data.max_corpus_bytes"),
    ({"data.tokenizer": "sentencepiece"}, "data.tokenizer"),
    ({"data.bogus": 1}, "data.bogus"),
    ({"bogus.seq_len": 1}, "bogus.seq_len"),
  ],
)
def test_load_run_refuses_what_the_checkpoint_depends_on(trained, overrides, field):
  before = digests(trained)
  with pytest.raises(ConfigError, match=rf"^{field}: ") as refused:
    load_run(trained, overrides)
  assert digests(trained) == before
  # A run read, not resumed: "use a new --workdir" (a resume's advice) was no remedy.
  assert "--workdir" not in str(refused.value)
  if "differs from the run already in" in str(refused.value):
    assert str(refused.value).endswith("; its checkpoints depend on it")


def test_a_resume_names_every_field_it_changes_and_the_learning_rate_it_moves(tmp_path):
  # A finished 30-step run (warmup 60, clamped to 30) continued to 600 steps
  # keeps the warmup it finished (a longer one would halve the learning rate
  # at step 30), said in one line; what else it changes, in another.
  config = load_config("rope")
  config.train.steps = 30
  write_config(parse(config), tmp_path)
  saved = read_run_config(tmp_path)
  run = parse(config)
  assert config_changes(run, saved) == [] and loop._changes_line(run, saved) is None
  assert keep_run_warmup(run, saved, 30) is run
  config.train.steps = 600
  config.train.decay = "linear"
  config.train.learning_rate = 1e-3
  config.eval.sample_prompt = "class "
  extended = parse(config)
  assert extended.train.warmup_steps == 60 and extended.notes == ()
  run = keep_run_warmup(extended, saved, 30)
  assert run.train == dataclasses.replace(extended.train, warmup_steps=30)
  assert run.notes == (
    "train.warmup_steps: 60 -> 30, the warmup this run finished by step 30 (a "
    "longer one would lower the learning rate at step 31 from 1.000e-03 to 5.000e-04); to "
    "warm up again, train in a new --workdir with train.init_from=<this run>",
  )
  assert config_changes(run, saved) == [
    ("train.steps", 30, 600),
    ("train.learning_rate", 3e-3, 1e-3),
    ("train.decay", "cosine", "linear"),
    ("eval.sample_prompt", "def ", "class "),
  ]
  setup = types.SimpleNamespace(run=run)
  line = loop._changes_line(run, saved) + loop._learning_rate_change(setup, saved, 30)
  assert line == (
    "changed from the run's config.json: train.steps 30 -> 600, train.learning_rate 0.003 -> "
    "0.001, train.decay 'cosine' -> 'linear', eval.sample_prompt 'def ' -> 'class '; learning "
    "rate at step 31: 3.000e-03 -> 1.000e-03"
  )
  # Step 31 as metrics.jsonl numbers it: its row logs the rate of the update
  # that made step 31, schedule(30) (the message said step 30, whose row
  # holds schedule(29)).
  assert float(saved.schedule(30)) == pytest.approx(3e-3)
  assert float(run.schedule(30)) == pytest.approx(1e-3)
  config.train.learning_rate = 3e-3  # the same learning rate at step 30: not in the line
  setup.run = keep_run_warmup(parse(config), saved, 30)
  assert loop._learning_rate_change(setup, saved, 30) == ""
  # Any longer warmup keeps the run's finished one (a config file's cannot
  # be told from one asked for); so does the extended run, which records
  # the kept warmup, when it resumes again (preempted at step 300);
  # a shorter one, or a resume inside the run's warmup, is the config's.
  config.train.warmup_steps = 90
  assert keep_run_warmup(parse(config), saved, 30).train.warmup_steps == 30
  config.train.warmup_steps = 60
  extended = keep_run_warmup(parse(config), saved, 30)
  write_config(extended, tmp_path / "extended")
  again = keep_run_warmup(parse(config), read_run_config(tmp_path / "extended"), 300)
  assert again.train == extended.train and len(again.notes) == 1
  # The step the warmup ended, not the resumed one (it said 'finished by step 300').
  assert again.notes[0].startswith(
    "train.warmup_steps: 60 -> 30, the warmup this run finished by step 30 ("
  )
  # Rerun at its end (600 of 600): kept for the record, no note of a rate at
  # step 601 that is never trained (it read 'would lower ... from 3.000e-04 to 3.000e-03').
  finished = keep_run_warmup(parse(config), read_run_config(tmp_path / "extended"), 600)
  assert finished.train == extended.train and finished.notes == ()
  for changes, start in [(dict(warmup_steps=20), 30), (dict(warmup_steps=60), 29)]:
    config.train.update(changes)
    run = parse(config)
    assert keep_run_warmup(run, saved, start) is run
  assert config_changes(parse(load_config("rope")), read_run_config(tmp_path / "new")) == []


def test_prepare_resume_keeps_a_finished_warmup_only_where_there_are_checkpoints(tmp_path):
  config = load_config("rope")
  config.train.steps = 30
  write_config(parse(config), tmp_path)
  config.train.steps = 600
  run, saved = prepare_resume(parse(config), tmp_path)
  assert saved.train.warmup_steps == 30 and run.train.warmup_steps == 60  # nothing trained
  with pytest.raises(
    ValueError, match=r"^resume_step: no checkpoint at step 30 in .* \(steps: none\)$"
  ):
    prepare_resume(parse(config), tmp_path, resume_step=30)
  with Checkpointer(checkpoint_directory(tmp_path)) as checkpointer:
    checkpointer.save(30, {"step": np.int32(30)}, {"data": {}})
  run, _ = prepare_resume(parse(config), tmp_path, resume_step=30)
  assert run.train.warmup_steps == 30 and len(run.notes) == 1
  assert prepare_resume(parse(config), tmp_path / "new") == (parse(config), None)


def test_a_start_that_died_before_its_first_checkpoint_does_not_set_the_kept_warmup(tmp_path):
  """config.json is the latest start's, written before it trains: a resume
  asking warmup 10 that died before saving left it there, and the next
  resume kept warmup 10 as 'the warmup this run finished' for a checkpoint
  trained with 30 (a 30-step run: its warmup of 60 clamped to 30)."""
  config = load_config("rope")
  config.train.steps = 30
  trained = parse(config)
  write_config(trained, tmp_path)
  first = record.RunRecord(tmp_path, log=lambda line: None)
  first.start(trained, 0)
  first.end("finished", 30)
  with Checkpointer(checkpoint_directory(tmp_path)) as checkpointer:
    checkpointer.save(30, {"step": np.int32(30)}, {"data": {}})
  config.train.steps, config.train.warmup_steps = 600, 10
  died = parse(config)
  write_config(died, tmp_path)
  record.RunRecord(tmp_path, log=lambda line: None).start(died, 30)  # no end: it died
  config.train.warmup_steps = 60
  run, saved = prepare_resume(parse(config), tmp_path)
  assert saved.train.warmup_steps == 10  # config.json, as the died start wrote it
  assert run.train.warmup_steps == 30 and "finished by step 30" in run.notes[0]


def test_load_run_needs_a_run(tmp_path):
  with pytest.raises(ConfigError, match="^workdir: .* holds no run"):
    load_run(tmp_path)


@pytest.mark.slow  # trains runs (and its fixture one)
def test_rerun_at_a_new_length_evaluates_and_keeps_config_json(trained):
  """A finished run started again with another seq_len and batch size (24:
  the saved data position, 4 batches of 8, is no boundary of batches of 24)
  trains nothing and evaluates there, as load_run does."""
  config_json = (trained / "config.json").read_bytes()
  lines = []
  result = loop.run(
    parse(tiny_config("rope", steps=STEPS, data__seq_len=64, data__batch_size=24)),
    trained,
    log=lines.append,
  )
  assert f"already trained to step {STEPS} of {STEPS}" in lines
  changed = "changed from the run's config.json: data.seq_len 32 -> 64, data.batch_size 8 -> 24"
  assert changed in lines
  evaluation = load_run(trained, {"data.seq_len": 64, "data.batch_size": 24})
  assert result == evaluation.setup.evaluate(evaluation.params)
  assert (trained / "config.json").read_bytes() == config_json
  assert json.loads(config_json)["data"]["seq_len"] == 32


@pytest.mark.slow  # trains runs (and its fixture one)
def test_a_run_from_a_txf_run_says_which_run_and_step_it_starts_from(trained, tmp_path):
  config = tiny_config("rope", steps=1, train__init_from=str(trained))
  lines = []
  loop.run(parse(config), tmp_path, log=lines.append)
  assert lines.count(f"initialised from the txf run in {trained}, step {STEPS}") == 1
  lines.clear()  # finished: its parameters are its checkpoint's now
  loop.run(parse(config), tmp_path, log=lines.append)
  assert "already trained to step 1 of 1" in lines
  assert not any(line.startswith("initialised from") for line in lines)
  lines.clear()  # a run drawn from its seed says nothing of the kind
  loop.run(parse(tiny_config("rope", steps=1)), tmp_path / "fresh", log=lines.append)
  assert not any(line.startswith("initialised from") for line in lines)


@pytest.mark.slow  # its fixture trains a run
def test_a_run_from_a_txf_run_of_another_tokenizer_is_refused_before_loading_it(
  trained, tmp_path, monkeypatch
):
  """The tokenizer is checked against the one the source run recorded
  (check_recorded_tokenizer, from init_from_model) before its checkpoint is read."""
  source = tmp_path / "source"
  shutil.copytree(trained, source)
  entries = json.loads((source / record.RECORD_FILE).read_text())
  recorded = {entry["tokenizer"]["sha256"] for entry in entries if "tokenizer" in entry}
  assert len(recorded) == 1  # the record holds the run's tokenizer
  for entry in entries:
    entry.get("tokenizer", {})["sha256"] = "0" * 64
  (source / record.RECORD_FILE).write_text(json.dumps(entries))
  monkeypatch.setattr(run_setup, "load_trained", lambda directory: pytest.fail("loaded"))
  config = tiny_config("rope", steps=1, train__init_from=str(source))
  with pytest.raises(ConfigError) as error:
    setup_run(parse(config), tmp_path / "new")
  assert str(error.value) == (
    f"train.init_from: the tokenizer's contents (sha256 {recorded.pop()}) differ from those "
    f"{source} trained with ({'0' * 64}): its ids would differ"
  )


@pytest.mark.slow  # trains runs (and its fixture one)
def test_training_on_in_batches_the_data_position_cannot_continue_is_refused(trained):
  config_json = (trained / "config.json").read_bytes()
  with pytest.raises(ConfigError, match=r"^data\.batch_size: .*does not continue"):
    loop.run(
      parse(tiny_config("rope", steps=2 * STEPS, data__batch_size=24)),
      trained,
      log=lambda line: None,
    )
  assert (trained / "config.json").read_bytes() == config_json


@pytest.mark.slow  # trains runs (and its fixture one)
def test_resume_with_another_model_is_refused(trained):
  with pytest.raises(ConfigError, match=r"^model\.d_model: differs from the run"):
    loop.run(parse(tiny_config("rope", steps=2 * STEPS, model__d_model=64)), trained)


@pytest.mark.slow  # trains runs (and its fixture one)
def test_a_resume_restores_the_checkpoint_under_a_changed_dtype_kernel_and_remat(trained, tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(trained, workdir)
  lines = []
  changed = dict(model__remat=True, model__attention_impl="chunked", model__dtype="bfloat16")
  loop.run(parse(tiny_config("rope", steps=STEPS + 2, **changed)), workdir, log=lines.append)
  assert f"resumed from step {STEPS} in {checkpoint_directory(workdir)}" in lines
  assert Checkpointer(checkpoint_directory(workdir)).latest_step() == STEPS + 2
  saved = json.loads((workdir / "config.json").read_text())["model"]
  assert (saved["remat"], saved["attention_impl"], saved["dtype"]) == (True, "chunked", "bfloat16")


@pytest.mark.slow  # a subprocess
def test_bench_times_the_training_step_and_writes_json(tmp_path):
  report_path = tmp_path / "bench.json"
  tiny = [
    "--config.model.d_model=32",
    "--config.model.num_heads=2",
    "--config.model.num_layers=1",
    "--config.data.seq_len=32",
    "--config.data.batch_size=8",
    "--config.data.max_corpus_bytes=200000",
  ]
  done = subprocess.run(
    [
      sys.executable,
      "-m",
      "benchmarks.run",
      "step",
      "--config=configs/rope.py",
      *tiny,
      "--steps=4",
      "--window=2",
      "--fresh_batches",
      f"--json={report_path}",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert "steps 3-4:" in done.stdout
  report = json.loads(report_path.read_text())
  config = tiny_config("rope")
  model_cfg = dict(config.model, vocab_size=260)  # the byte tokenizer's ids
  assert report["tokens_per_step"] == 8 * 32
  assert report["flops_per_token"] == pytest.approx(flops_per_token(model_cfg, 32), rel=1e-12)
  assert [(w["first_step"], w["last_step"]) for w in report["windows"]] == [(1, 2), (3, 4)]
  for window in report["windows"]:
    assert window["step_time"] > 0
    assert window["tokens_per_sec"] == pytest.approx(256 / window["step_time"], rel=1e-12)
    # A barely trained byte-level model: near uniform over 260 ids (ln 260 = 5.56).
    assert 3.0 < window["loss"] < 7.0
  assert min(w["step_time"] for w in report["windows"]) <= report["median_step_time"]


@pytest.mark.parametrize(
  "name,vocab_size,num_classes",
  [("rope", 260, None), ("encoder_classify", None, 10), ("mqar", None, None)],
)
def test_a_config_is_parsed_without_loading_data_and_set_up_from_the_parse_alone(
  name, vocab_size, num_classes, monkeypatch
):
  """fit_vocabulary takes the vocabulary from the tokenizer and the classes
  from the task, loading no data; setup_run then builds from the RunConfig."""
  from txf.data import pipeline
  from txf.train import run_setup as setup_module

  config = tiny_config(name, steps=STEPS)
  with monkeypatch.context() as patched:  # any data loaded fails
    patched.setattr(setup_module, "make_dataset", None)
    patched.setattr(pipeline.corpus, "load_corpus", None)
    run, tokenizer = fit_vocabulary(parse(config), None)
  assert run.model.vocab_size == (vocab_size or tokenizer.vocab_size)
  assert run.model.vocab_size == tokenizer.vocab_size
  if num_classes is not None:
    assert run.model.num_classes == num_classes
  setup = setup_run(run)
  batch = next(iter(setup.train_data))
  assert batch["inputs"].shape[0] == run.data.batch_size
  assert setup.train_data.vocab_size == run.model.vocab_size


def test_a_bad_field_is_refused_before_a_sentencepiece_tokenizer_is_trained(tmp_path):
  config = tiny_config("rope", steps=STEPS)
  config.data.update(dict(tokenizer="sentencepiece", sp_vocab_size=400))
  config.train.b1 = 1.5
  with pytest.raises(ConfigError, match=r"^train\.b1"):
    fit_vocabulary(parse(config), tmp_path)
  assert list(tmp_path.iterdir()) == []  # no tokenizer trained into the run's directory


def test_a_sample_prompt_of_no_tokens_or_foreign_symbols_is_refused_naming_it(tmp_path):
  """Both passed the config's check: the empty prompt trained, then failed at
  the first evaluation's sample, before any checkpoint; the symbols a
  generated task's vocabulary lacks were refused without naming the field.
  Training refuses the empty prompt; loading a run that has one does not
  (a run killed at its first sample, with checkpoints, is still read)."""
  config = tiny_config("rope", steps=STEPS, eval__sample_tokens=8, eval__sample_prompt="")
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"^eval\.sample_prompt: '' encodes to no tokens"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert not workdir.exists() or not any(workdir.iterdir())  # nothing trained or written
  assert fit_vocabulary(parse(config), None)[0].eval.sample_prompt == ""  # as load_run sets up
  config.eval.sample_tokens = 0  # no sample: no prompt to continue
  assert fit_vocabulary(parse(config), None)[0].eval.sample_prompt == ""
  config = tiny_config("induction", steps=STEPS, eval__sample_tokens=8, eval__sample_prompt="def ")
  with pytest.raises(ConfigError, match=r"^eval\.sample_prompt: .*outside the vocabulary"):
    fit_vocabulary(parse(config), None)


@pytest.mark.parametrize("replicas", [1, 2])
def test_abstract_state_carries_the_state_shardings(replicas):
  """Restoring onto another mesh or process count needs a target sharding on
  every leaf (orbax otherwise falls back to the saved topology and refuses)."""
  config = tiny_config("rope", steps=STEPS)
  config.replicas = replicas
  setup = setup_run(parse(config))
  leaves = jax.tree.leaves(setup.abstract_state)
  shardings = jax.tree.leaves(setup.state_sharding)
  assert len(leaves) == len(shardings)
  assert [leaf.sharding for leaf in leaves] == shardings


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_evaluate_weights_every_token_alike_across_batches():
  """eval_loss and eval_accuracy are means over all weighted tokens, not
  means of per-batch means: batches of unequal weight, and a weight-0 batch
  (the streamed evaluator pads up to eval.num_batches with them), count by
  their tokens. Compared with the token-weighted mean in float64."""
  setup = setup_run(parse(tiny_config("rope")))
  params = setup.init().params
  batch = jax.tree.map(np.asarray, next(iter(setup.eval_data)))
  weights_BxT = batch["weights"].astype(np.float32)
  few_BxT = weights_BxT * (np.arange(weights_BxT.shape[1]) < 3)  # 3 tokens a row
  zero_BxT = np.zeros_like(weights_BxT)
  batches = [dict(batch, weights=w) for w in (weights_BxT, few_BxT, zero_BxT)]
  result = dataclasses.replace(setup, eval_data=batches).evaluate(params)

  logits = np.asarray(
    setup.model.apply({"params": params}, *model_inputs(batch, "lm"), deterministic=True),
    np.float64,
  )
  log_probs = logits - logits.max(-1, keepdims=True)
  log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
  nll_BxT = -np.take_along_axis(log_probs, batch["targets"][..., None], -1)[..., 0]
  correct_BxT = logits.argmax(-1) == batch["targets"]
  total = sum(w.sum() for w in (weights_BxT, few_BxT, zero_BxT))
  loss = sum((nll_BxT * w).sum() for w in (weights_BxT, few_BxT)) / total
  accuracy = sum((correct_BxT * w).sum() for w in (weights_BxT, few_BxT)) / total
  np.testing.assert_allclose(result["eval_loss"], loss, rtol=1e-5)
  np.testing.assert_allclose(result["eval_accuracy"], accuracy, rtol=1e-5)
  np.testing.assert_allclose(result["eval_perplexity"], np.exp(loss), rtol=1e-5)


def test_a_run_past_the_devices_memory_is_refused_before_anything_is_written(tmp_path, monkeypatch):
  """check_memory's bound is the train state (counted here from the arrays
  init makes), then that state with the evaluations' sample cache beside
  it: a byte short of either is refused naming its field; both, not."""
  config = tiny_config("rope", steps=STEPS)
  config.eval.sample_tokens = 40
  setup = setup_run(parse(config))
  state = sum(np.asarray(x).nbytes for x in jax.tree.leaves(setup.init()))
  prompt_len = len(setup.train_data.tokenizer.encode(config.eval.sample_prompt))
  cache = decode.init_cache(setup.model, 1, decode.cache_length(prompt_len, 40))
  sample = sum(np.asarray(x).nbytes for x in jax.tree.leaves(cache))
  for limit, field in [(state - 1, "model"), (state + sample - 1, "eval.sample_tokens")]:
    monkeypatch.setattr(hardware, "memory_bytes", lambda device, limit=limit: limit)
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: .* need "):
      run_setup.check_memory(setup, samples=True)
  run_setup.check_memory(setup, samples=False)  # the state alone fits
  monkeypatch.setattr(hardware, "memory_bytes", lambda device: state + sample)
  run_setup.check_memory(setup, samples=True)

  monkeypatch.setattr(hardware, "memory_bytes", lambda device: state - 1)
  with pytest.raises(ConfigError, match="^model: "):
    loop.run(setup.run, tmp_path / "run", setup=setup)
  assert not (tmp_path / "run").exists()


def test_a_model_without_a_segment_mask_on_packed_rows_is_told_how_to_read_them():
  """A packed TFDS lm row feeds tokens, segment ids and positions: the LSTM's
  refusal now names the setting that feeds it the tokens alone."""
  from txf import models

  model = models.build(models.ModelConfig(family="lstm", vocab_size=20, d_model=8, num_layers=1))
  shape = jax.ShapeDtypeStruct((2, 8), np.int32)
  packed = dict(inputs=shape, targets=shape, weights=shape, segment_ids=shape, positions=shape)
  with pytest.raises(
    ValueError, match=r"feeds the model 3 inputs.*data\.attend_across_documents=True feeds"
  ):
    run_setup._check_model_inputs(model, "lstm", "lm", packed)
  run_setup._check_model_inputs(
    model, "lstm", "lm", dict(inputs=shape, targets=shape, weights=shape)
  )


def test_a_trained_run_whose_sentencepiece_model_is_gone_is_refused_not_trained_again(tmp_path):
  """load_run (txf-generate, txf-export, ...) and a resume trained a new
  model into the run and read the checkpoints with it: a reader writing into
  the run, on a corpus that may have changed since."""
  config = tiny_config("rope", steps=2)
  config.data.update(dict(tokenizer="sentencepiece", sp_vocab_size=400))
  workdir = tmp_path / "run"
  loop.run(parse(config), workdir, log=lambda line: None)
  model = workdir / "sentencepiece_400.model"
  model.unlink()
  for read in (lambda: load_run(workdir), lambda: loop.run(parse(config), workdir)):
    with pytest.raises(
      ConfigError, match=r"^data\.tokenizer: .* holds no sentencepiece_400\.model"
    ):
      read()
    assert not model.exists()
