"""Head masks and ablation through the model (txf.analysis.ablation) and the
attention analysis of a trained run (txf.trained.head_analysis, python -m
experiments.analyze).

The independent way to silence head h of a layer: zero that head's rows
[h, :, :] of the layer's output-projection kernel [H, Dh, D] (its bias is
not per head), which removes exactly the head's contribution to the output.
JAX's persistent compilation cache is on, as in test_train_setup.py.
"""

import csv
import hashlib
import io
import json
import math
import pathlib
import re
import shutil
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from etils import epath
from faulty_command import assert_only_its_checks_refuse

from conftest import tiny_config
from full_disk import full_disk
from txf.analysis import ablation
from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.composition import composition_scores
from txf.analysis.head_scores import (
  attention_entropy,
  in_distribution_ids,
  induction_probe,
  induction_score,
)
from txf.models import ModelConfig, build
from txf.runconfig.run_config import ConfigError, parse
from txf.rundir.workdir import WorkdirLock
from txf.storage import WriteError
from txf.train import loop
from txf.train.run_setup import load_run
from txf.trained import head_analysis
from txf.trained.head_analysis import (
  ANALYSIS_DIR,
  SCORES_CSV,
  SCORES_MD,
  analyze_run,
  attention_png,
  format_head_progress,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = dict(vocab_size=32, d_model=18, num_heads=3, num_layers=2, max_len=12)
KEY = jax.random.PRNGKey(0)
# The masked and the kernel-zeroed model add the same terms (0 * w vs o * 0);
# XLA may still order the sums differently.
TOL = dict(atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module", autouse=True)
def _compilation_cache(compilation_cache_dir):
  return compilation_cache_dir


def plain(params):
  """Unboxed params as a nested dict of numpy arrays (a copy)."""
  return jax.tree_util.tree_map(np.array, jax.device_get(nn.meta.unbox(params)))


def zero_head(params, stack, name, layer, head, scanned):
  """A copy of `params` with head `head` of block `layer`'s `name` attention
  in `stack` silenced by zeroing its output-kernel rows."""
  params = plain(params)
  block = "blocks" if scanned else f"block_{layer}"
  kernel = params[stack][block][name]["out"]["kernel"]
  kernel[(layer, head) if scanned else head] = 0.0
  return params


def tiny_model(family, scanned):
  """(model, random numpy params, inputs) of a tiny model: 2 layers of 3 heads
  per stack. The params are drawn here (shapes from the model's init,
  traced only): compiling the init would cost more than the test."""
  decoder_layers = dict(num_decoder_layers=2) if family == "encoder_decoder" else {}
  cfg = ModelConfig(
    **TINY,
    **decoder_layers,
    family=family,
    head="mlm" if family == "encoder" else "lm",
    scan_layers=scanned,
  )
  model = build(cfg)
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 32, size=(2, 7)), jnp.int32)
  inputs = (tokens, tokens[:, :5]) if family == "encoder_decoder" else (tokens,)
  variables = jax.eval_shape(model.init, KEY, *inputs)
  assert set(variables) == {"params"}  # no mask variable is created
  rng = np.random.default_rng(1)
  # numpy arrays, as zero_head's: the reference applies reuse one compilation.
  params = jax.tree_util.tree_map(
    lambda leaf: rng.normal(0.0, 0.5, leaf.shape).astype(leaf.dtype),
    nn.meta.unbox(variables["params"]),
  )
  return model, params, inputs


# family -> (stack, attention module, kind) of its attention layers
LAYERS = {
  "decoder": [("stack", "self_attention", "self")],
  "encoder_decoder": [
    ("encoder", "self_attention", "encoder_self"),
    ("decoder", "self_attention", "decoder_self"),
    ("decoder", "cross_attention", "cross"),
  ],
}


# Unscanned: every kind; scanned (one [L, H] mask sliced by nn.scan): a decoder.
@pytest.mark.parametrize("family,scanned", [("encoder_decoder", False), ("decoder", True)])
def test_a_head_mask_zeroes_exactly_that_head(family, scanned):
  model, params, inputs = tiny_model(family, scanned)
  apply = jax.jit(model.apply)
  unmasked = np.asarray(apply({"params": params}, *inputs))
  ones = ablation.head_mask(params, {})
  np.testing.assert_array_equal(
    np.asarray(apply({"params": params, "head_mask": ones}, *inputs)), unmasked
  )
  layer, head = 1, 2
  for stack, name, kind in LAYERS[family]:
    assert ablation.attention_shapes(params)[kind] == (2, 3)
    mask_LxH = np.ones((2, 3), np.float32)
    mask_LxH[layer, head] = 0.0
    masked = apply(
      {"params": params, "head_mask": ablation.head_mask(params, {kind: mask_LxH})}, *inputs
    )
    reference = apply({"params": zero_head(params, stack, name, layer, head, scanned)}, *inputs)
    np.testing.assert_allclose(np.asarray(masked), np.asarray(reference), **TOL)
    assert np.abs(np.asarray(masked) - unmasked).max() > 1e-4, kind  # the head mattered


def test_attention_kinds_of_each_family():
  assert list(ablation.attention_shapes(tiny_model("encoder_decoder", False)[1])) == [
    "encoder_self",
    "decoder_self",
    "cross",
  ]
  assert list(ablation.attention_shapes(tiny_model("decoder", True)[1])) == ["self"]


@pytest.mark.parametrize(
  "masks,message",
  [
    ({"cross": np.ones((2, 3))}, r"masks: the model has no 'cross' attention"),
    ({"self": np.ones((3, 2))}, r"masks\['self'\] must be \[L, H\] = \(2, 3\)"),
  ],
)
def test_head_mask_refuses_a_wrong_kind_or_shape(masks, message):
  _, params, _ = tiny_model("decoder", False)
  with pytest.raises(ValueError, match=message):
    ablation.head_mask(params, masks)


def test_ablation_loss_fns_refuse_no_batches():
  model, params, _ = tiny_model("decoder", False)
  loss_sums = lambda model, params, batch: (jnp.float32(0), jnp.float32(1))
  with pytest.raises(ValueError, match="^batches: "):
    ablation.ablation_loss_fns(model, params, [], loss_sums)


# --- trained runs ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory):
  """A 2-layer, 2-head RoPE decoder trained 2 steps, its layers under nn.scan."""
  workdir = tmp_path_factory.mktemp("decoder")
  loop.run(
    parse(
      tiny_config(
        "rope", steps=2, train__warmup_steps=1, model__num_layers=2, model__scan_layers=True
      )
    ),
    workdir,
    log=lambda line: None,
  )
  return workdir


@pytest.fixture(scope="module")
def seq2seq_run(tmp_path_factory):
  """A 2-head encoder-decoder of 1 encoder and 2 decoder layers (the second
  decoder layer's self-attention reads the source through the first's
  cross-attention) trained 2 steps."""
  workdir = tmp_path_factory.mktemp("seq2seq")
  loop.run(
    parse(tiny_config("seq2seq", steps=2, train__warmup_steps=1, model__num_decoder_layers=2)),
    workdir,
    log=lambda line: None,
  )
  return workdir


@pytest.fixture(scope="module")
def post_ln_replicas_run(tmp_path_factory):
  """A 2-layer, 2-head unscanned Post-LN RoPE decoder of two seed replicas,
  trained 2 steps with both checkpoints kept."""
  workdir = tmp_path_factory.mktemp("post_ln_replicas")
  config = tiny_config(
    "rope",
    steps=2,
    train__warmup_steps=1,
    train__checkpoint_every=1,
    train__max_to_keep=2,
    model__num_layers=2,
    model__norm_placement="post",
  )
  config.replicas = 2
  loop.run(parse(config), workdir, log=lambda line: None)
  return workdir


@pytest.fixture(scope="module")
def encoder_run(tmp_path_factory):
  """A 1-layer, 2-head masked-LM encoder trained 2 steps."""
  workdir = tmp_path_factory.mktemp("encoder")
  loop.run(
    parse(tiny_config("encoder_mlm", steps=2, train__warmup_steps=1)),
    workdir,
    log=lambda line: None,
  )
  return workdir


def digests(directory):
  """{relative path: sha256} of the run's files outside analysis/ (but the
  lock's note of its holder, which the command rewrites as it holds it)."""
  return {
    str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
    for p in sorted(pathlib.Path(directory).rglob("*"))
    if p.is_file() and ANALYSIS_DIR not in p.relative_to(directory).parts and p.name != ".lock"
  }


def read_csv(workdir):
  return list(csv.DictReader(io.StringIO((workdir / ANALYSIS_DIR / SCORES_CSV).read_text())))


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_analyzes_a_decoder_run(decoder_run, commands):
  before = digests(decoder_run)
  done = commands.run(
    "experiments.analyze", f"--workdir={decoder_run}", "--num_batches=1", timeout=300
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert digests(decoder_run) == before  # config.json, checkpoints, metrics untouched
  out = decoder_run / ANALYSIS_DIR
  assert (out / attention_png("self")).read_bytes().startswith(PNG_MAGIC)
  assert "| layer | head | previous_token | induction |" in done.stdout
  assert done.stdout == (out / SCORES_MD).read_text()
  # Progress on stderr (stdout is the table alone): the first compiles as a
  # stage, then a line per head's ablation.
  L, H = 2, 2  # decoder_run's layers and heads
  # Each stamped with the wall-clock time: 'YYYY-MM-DD HH:MM:SS analyze: ...'.
  stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (analyze: .*)$")
  progress = [stamp.match(line)[1] for line in done.stderr.splitlines() if "analyze: " in line]
  compiling = "analyze: attention maps and the baseline loss on 1 batch"
  assert progress[0] == f"{compiling} ..." and progress[1].startswith(f"{compiling}: done in ")
  assert [line.split(" | ")[0] for line in progress[2:]] == [
    f"analyze: self head L{layer}H{head} ({1 + layer * H + head} of {L * H})"
    for layer in range(L)
    for head in range(H)
  ]

  rows = read_csv(decoder_run)
  assert [(row["attention"], int(row["layer"]), int(row["head"])) for row in rows] == [
    ("self", 0, 0),
    ("self", 0, 1),
    ("self", 1, 0),
    ("self", 1, 1),
  ]
  T = 32  # tiny_config's seq_len
  for row in rows:
    assert 0.0 <= float(row["previous_token"]) <= 1.0
    assert 0.0 <= float(row["induction"]) <= 1.0  # a causal decoder has an induction score
    # The head's score at its worst probe period (a maximum passed the range check).
    at_periods = [float(value) for name, value in row.items() if name.startswith("induction_p")]
    assert len(at_periods) >= 2 and float(row["induction"]) == min(at_periods)
    assert 0.0 <= float(row["entropy_nats"]) <= math.log(T)
    assert 0.0 <= float(row["distance_tokens"]) <= T - 1

  # Deltas against the run's own evaluator on kernel-zeroed params.
  run = load_run(decoder_run)
  # The last line on stderr names the files written.
  assert done.stderr.splitlines()[-1] == "wrote " + ", ".join(
    str(out / name) for name in (attention_png("self"), SCORES_MD, SCORES_CSV, "analysis.json")
  )
  record = json.loads((out / head_analysis.ANALYSIS_RECORD).read_text())
  assert record == {
    "step": run.step,
    "replica": 0,
    "num_batches": 1,
    "probe_seed": 0,
    "periods": record["periods"],  # the probe's defaults (test_probe_periods)
    "files": [attention_png("self"), SCORES_CSV, SCORES_MD],
    "group_ablation": None,
  }
  assert len(record["periods"]) == 2
  baseline = run.setup.evaluate(plain(run.params))["eval_loss"]
  for row in rows:
    layer, head = int(row["layer"]), int(row["head"])
    ablated = run.setup.evaluate(
      zero_head(run.params, "stack", "self_attention", layer, head, scanned=True)
    )["eval_loss"]
    assert float(row["ablation_delta_loss"]) == pytest.approx(ablated - baseline, abs=1e-5)
  assert any(abs(float(row["ablation_delta_loss"])) > 1e-4 for row in rows)


@pytest.mark.slow  # its fixture trains a run
def test_analysis_of_an_encoder_run_has_no_induction_score(encoder_run):
  """No causal attention, so no probe periods: the induction column is n/a
  (it was `analyze error: need at least one array to stack`, exit 2, after
  the heatmap was written); the other scores are the batch's."""
  record = analyze_run(encoder_run)
  assert record["periods"] is None
  saved = json.loads((encoder_run / ANALYSIS_DIR / head_analysis.ANALYSIS_RECORD).read_text())
  assert (saved["periods"], saved["probe_seed"]) == (None, None)  # no probe was drawn
  with pytest.raises(ValueError, match="^periods: the model has no causal self-attention"):
    analyze_run(encoder_run, periods=[3, 5])
  rows = read_csv(encoder_run)
  assert [(row["attention"], int(row["layer"]), int(row["head"])) for row in rows] == [
    ("self", 0, 0),
    ("self", 0, 1),
  ]
  for row in rows:
    assert math.isnan(float(row["induction"]))
    assert 0.0 <= float(row["previous_token"]) <= 1.0
    assert math.isfinite(float(row["ablation_delta_loss"]))
  assert "- induction: n/a (the model has no causal self-attention)" in record["table"]


def analysis_files(workdir):
  """{name: bytes} of the run's analysis/ directory."""
  out = pathlib.Path(workdir) / ANALYSIS_DIR
  return {p.name: p.read_bytes() for p in sorted(out.iterdir())} if out.exists() else {}


@pytest.mark.slow  # its fixture trains a run
def test_a_failure_while_computing_leaves_the_previous_analysis(encoder_run, monkeypatch):
  """Every file is written after every score is computed: a failure in the
  ablation (after the heatmaps were drawn) leaves analysis/ as it was (the
  heatmap was written first, beside the old scores)."""
  analyze_run(encoder_run)
  # Marked, as this analysis's heatmap would be drawn the same again.
  (encoder_run / ANALYSIS_DIR / attention_png("self")).write_bytes(b"the earlier heatmap")
  before = analysis_files(encoder_run)

  def failing(*args, **kwargs):
    raise RuntimeError("the ablation failed")

  monkeypatch.setattr(head_analysis, "head_ablation", failing)
  with pytest.raises(RuntimeError, match="the ablation failed"):
    analyze_run(encoder_run, seed=1)
  assert analysis_files(encoder_run) == before


@pytest.mark.slow  # its fixture trains a run
def test_a_full_disk_while_writing_leaves_the_previous_analysis(encoder_run):
  """The files are written as one set: a write failing at the second file
  (a full disk) left the first one new beside the others old."""
  analyze_run(encoder_run)
  (encoder_run / ANALYSIS_DIR / attention_png("self")).write_bytes(b"the earlier heatmap")
  before = analysis_files(encoder_run)
  with full_disk(re.escape(str(encoder_run / ANALYSIS_DIR)), 2), pytest.raises(WriteError):
    analyze_run(encoder_run, seed=1)
  assert analysis_files(encoder_run) == before


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_refuses_only_what_its_checks_refuse(encoder_run, commands):
  """A ValueError from the checks is one line and exit 2; one raised after
  them is a fault of txf's: its traceback and exit 1 (it was `analyze error:
  ...`, exit 2, reading as a refused flag)."""
  assert_only_its_checks_refuse(
    commands,
    "txf.commands.analyze",
    "txf.trained.head_analysis",
    "analyze",
    encoder_run,
    "--periods=3,5",
    "analyze",
  )


@pytest.mark.slow  # its fixture trains a run
def test_analysis_of_an_encoder_decoder_run(seq2seq_run):
  before = digests(seq2seq_run)
  record = analyze_run(seq2seq_run)
  assert digests(seq2seq_run) == before
  for kind in ("encoder_self", "decoder_self", "cross"):
    png = seq2seq_run / ANALYSIS_DIR / attention_png(kind)
    assert png.read_bytes().startswith(PNG_MAGIC)
  rows = read_csv(seq2seq_run)
  kinds = [(row["attention"], int(row["layer"]), int(row["head"])) for row in rows]
  layers = {"encoder_self": 1, "decoder_self": 2, "cross": 2}
  assert kinds == [
    (kind, layer, head)
    for kind in ("encoder_self", "decoder_self", "cross")
    for layer in range(layers[kind])
    for head in range(2)
  ]
  for row in rows:
    causal, cross = row["attention"] == "decoder_self", row["attention"] == "cross"
    assert math.isnan(float(row["induction"])) != causal  # decoder self-attention only
    assert math.isnan(float(row["previous_token"])) == cross  # self-attention only
    assert math.isfinite(float(row["ablation_delta_loss"]))
  # Two blocks fit the decoder's 24 positions (configs/seq2seq.py) up to 12.
  assert record["periods"] == [12, 11]
  assert "| 0 | 0 | n/a | n/a |" in record["table"]  # cross: no previous-token, no induction

  # The ablation of the cross-attention against the kernel-zeroed evaluator.
  run = load_run(seq2seq_run)
  baseline = run.setup.evaluate(plain(run.params))["eval_loss"]
  assert record["baseline_loss"] == pytest.approx(baseline, abs=1e-5)
  ablated = run.setup.evaluate(
    zero_head(run.params, "decoder", "cross_attention", 0, 1, scanned=False)
  )["eval_loss"]
  assert record["scores"]["cross"]["ablation_delta_loss"][0][1] == pytest.approx(
    ablated - baseline, abs=1e-5
  )


@pytest.mark.slow  # its fixture trains a run
@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(num_batches=0), "^num_batches: must be"),
    # Past the split: it read the batches there were, without a word.
    (dict(num_batches=10**5), r"^num_batches: the validation split holds only \d+ batches of"),
    (dict(periods=[17, 5]), r"^periods: 17 must be in 2\.\.16"),
    (dict(periods=[5]), r"^periods: two or more probe periods are needed"),
    # Two different ones given, one twice: it said two different ones were needed.
    (dict(periods=[5, 4, 5]), r"^periods: 5 given twice, got \[5, 4, 5\]$"),
    (
      dict(ablate="L2H0"),
      r"^ablate: L2H0 is not a head of the model \(layers 0\.\.1, heads 0\.\.1\)$",
    ),
    (dict(ablate="L0H2"), r"^ablate: L0H2 is not a head of the model"),
    (dict(ablate="L0H1,L0H1"), r"^ablate: L0H1 is named twice$"),
    (dict(ablate="L0-H1"), r"^ablate: 'L0-H1' is not a head; expected L<layer>H<head>"),
    (dict(ablate=""), r"^ablate: '' is not a head"),
    (dict(circuits=True), r"^circuits: path patching needs unscanned layers"),
    (dict(checkpoints=True), r"^checkpoints: the run in .* kept 1 checkpoint\(s\)"),
  ],
)
def test_bad_arguments_are_refused_naming_them(decoder_run, kwargs, message):
  with pytest.raises(ValueError, match=message):
    analyze_run(decoder_run, **kwargs)


@pytest.mark.slow  # its fixture trains a run
def test_more_validation_batches_than_the_device_holds_are_refused_before_reading_them(
  decoder_run, monkeypatch
):
  """Generated data (induction, MQAR) has no split's end: --num_batches=10**12
  read batches until memory ran out, without a line. Refused from the first
  batch's size, the others never read."""
  run = load_run(decoder_run)
  first = next(iter(run.setup.eval_data))
  batch_bytes = sum(np.asarray(value).nbytes for value in first.values())
  read = []
  monkeypatch.setattr(head_analysis, "list", lambda batches: read.append(1) or [], raising=False)
  with pytest.raises(ValueError, match=r"^num_batches: 1,000,000,000,000 validation batches"):
    head_analysis.check_analysis(decoder_run, num_batches=10**12)
  assert read == []
  gib = 10**12 * batch_bytes / 2**30
  with pytest.raises(ValueError, match=rf"need {gib:,.1f} GiB on one device"):
    head_analysis.check_analysis(decoder_run, num_batches=10**12)


def test_group_ablation_zeroes_exactly_the_named_heads(decoder_run):
  record = analyze_run(decoder_run, ablate="L0H1,L1H0", num_batches=1)
  group = record["group_ablation"]
  assert group["heads"] == ["L0H1", "L1H0"]
  # Reference: both heads' output-kernel rows zeroed, the run's own evaluator.
  run = load_run(decoder_run, {"eval.num_batches": 1})
  zeroed = zero_head(
    zero_head(run.params, "stack", "self_attention", 0, 1, scanned=True),
    "stack",
    "self_attention",
    1,
    0,
    scanned=True,
  )
  for name, params in (("baseline", plain(run.params)), ("ablated", zeroed)):
    metrics = run.setup.evaluate(params)
    assert group[name]["loss"] == pytest.approx(metrics["eval_loss"], abs=1e-5)
    assert group[name]["accuracy"] == pytest.approx(metrics["eval_accuracy"], abs=1e-6)
  assert group["ablated"]["loss"] != pytest.approx(group["baseline"]["loss"], abs=1e-4)
  assert "## Group ablation of L0H1, L1H0 (self attention)" in record["table"]


@pytest.mark.slow  # its fixture trains a run
def test_circuits_refuse_an_encoder_decoder(seq2seq_run):
  for flag in ("circuits", "checkpoints"):
    with pytest.raises(ValueError, match=f"^{flag}: needs a decoder language model; the run's "):
      analyze_run(seq2seq_run, **{flag: True})


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_refuses_a_run_still_training_in_one_line(decoder_run, commands):
  """Another process holds the run (here this one, as a training run would):
  before, the command analysed it and wrote analysis/ into the live run."""
  with WorkdirLock(decoder_run):
    before = digests(decoder_run)
    done = commands.run(
      "experiments.analyze", f"--workdir={decoder_run}", "--num_batches=1", timeout=300
    )
  assert done.returncode == 2, done.stderr[-3000:]
  holder = (decoder_run / ".lock").read_text().strip()
  assert done.stderr.strip().splitlines() == [
    f"workdir error: {decoder_run}: in use by another run ({holder}); "
    "wait for it to finish or use another --workdir"
  ]
  assert digests(decoder_run) == before


def test_a_directory_without_a_run_is_refused(tmp_path):
  with pytest.raises(ConfigError, match="^workdir: .* holds no run"):
    analyze_run(tmp_path)


@pytest.mark.slow  # a command
def test_the_command_fails_in_one_line_without_a_run(commands, tmp_path):
  done = commands.run("experiments.analyze", f"--workdir={tmp_path}", timeout=300)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines() == [
    f"analyze error: workdir: {tmp_path} holds no run ({tmp_path}/config.json does not exist)"
  ]


def test_head_progress_line_has_the_head_its_place_and_an_eta():
  line = format_head_progress("self", 1, 0, 2, 4, 0.01234, 10.0)
  # Head 5 of 8 after 10 s: 3 more at 2 s each.
  assert line == "analyze: self head L1H0 (5 of 8) | loss_delta +0.0123 | elapsed 10s | eta 6s"


def _settings(step, replica=0, num_batches=4, probe_seed=0, periods=(23, 19)):
  return dict(
    step=step,
    replica=replica,
    num_batches=num_batches,
    probe_seed=probe_seed,
    periods=list(periods),
  )


def _analysis_dir(tmp_path, settings, names):
  """An analysis directory holding `names` (text 'step N') and its record."""
  out = epath.Path(tmp_path)
  for name in names:
    (out / name).write_text(f"step {settings['step']}")
  (out / head_analysis.ANALYSIS_RECORD).write_text(json.dumps({**settings, "files": names}))
  return out


def _record(out):
  return json.loads((out / head_analysis.ANALYSIS_RECORD).read_text())


def test_a_rerun_at_another_checkpoint_removes_what_it_does_not_write_again(tmp_path):
  """A plain rerun at step 60 after --circuits --checkpoints at step 40 left
  step 40's circuits.json, figures and training_scores.csv beside a
  head_scores.md of step 60, unsaid."""
  out = _analysis_dir(
    tmp_path,
    _settings(40),
    ["head_scores.md", "circuits.json", "composition.png", "training_scores.csv"],
  )
  (out / "notes.md").write_text("mine")  # not an analysis file: kept
  (out / "head_scores.md").write_text("step 60")  # this analysis's
  lines = []
  head_analysis._settle(out, _settings(60), [out / "head_scores.md"], _record(out), lines.append)
  assert sorted(path.name for path in out.iterdir()) == [
    "analysis.json",
    "head_scores.md",
    "notes.md",
  ]
  assert lines == [
    "removed circuits.json, composition.png, training_scores.csv of the analysis of "
    "step 40, replica 0, num_batches 4, probe_seed 0, periods [23, 19] (not computed "
    "for step 60, replica 0, num_batches 4, probe_seed 0, periods [23, 19])"
  ]
  assert _record(out) == {**_settings(60), "files": ["head_scores.md"], "group_ablation": None}


@pytest.mark.parametrize(
  "changed",
  [dict(replica=1), dict(num_batches=1), dict(probe_seed=3), dict(periods=(20, 17))],
  ids=["replica", "num_batches", "probe_seed", "periods"],
)
def test_a_rerun_of_another_replica_or_probe_at_the_checkpoint_removes_the_others(
  tmp_path, changed
):
  """They were kept and listed as one analysis of the step: replica 1's
  circuits beside replica 0's head_scores.md, another probe's induction
  scores beside these (the probe draws its ids from every validation batch
  read: --circuits --num_batches=1, then --ablate over 4 batches, kept
  circuits of one probe beside head scores of another)."""
  out = _analysis_dir(tmp_path, _settings(40), ["head_scores.md", "circuits.json"])
  lines = []
  now = _settings(40, **changed)
  head_analysis._settle(out, now, [out / "head_scores.md"], _record(out), lines.append)
  assert not (out / "circuits.json").exists() and len(lines) == 1
  assert lines[0].startswith("removed circuits.json of the analysis of step 40")
  assert _record(out) == {**now, "files": ["head_scores.md"], "group_ablation": None}


def test_a_record_without_what_it_analysed_is_taken_for_another_analysis(tmp_path):
  """A record of session 27 ({step, files}) cannot say its replica or probe."""
  out = epath.Path(tmp_path)
  (out / "circuits.json").write_text("step 40")
  (out / head_analysis.ANALYSIS_RECORD).write_text(
    json.dumps({"step": 40, "files": ["circuits.json"]})
  )
  lines = []
  head_analysis._settle(out, _settings(40), [], _record(out), lines.append)
  assert not (out / "circuits.json").exists()
  assert lines == [
    "removed circuits.json of the analysis of step 40, replica not recorded, num_batches "
    "not recorded, probe_seed not recorded, periods not recorded (not computed for step 40, "
    "replica 0, num_batches 4, probe_seed 0, periods [23, 19])"
  ]


def test_a_rerun_at_the_same_checkpoint_adds_to_its_analysis(tmp_path):
  """docs/induction.md's recipe: --circuits --checkpoints, then --ablate, at
  one checkpoint: the second keeps the first's files."""
  first = ["head_scores.md", "circuits.json", "training_scores.csv"]
  out = _analysis_dir(tmp_path, _settings(600), first)
  lines = []
  head_analysis._settle(out, _settings(600), [out / "head_scores.md"], _record(out), lines.append)
  assert lines == []
  assert {path.name for path in out.iterdir()} == {*first, "analysis.json"}
  # The record lists them in OUTPUTS' order.
  assert _record(out)["files"] == ["head_scores.md", "circuits.json", "training_scores.csv"]


def test_files_of_an_analysis_without_a_record_are_kept_and_said(tmp_path):
  out = epath.Path(tmp_path)
  (out / "circuits.json").write_text("step ?")
  lines = []
  head_analysis._settle(out, _settings(60), [], None, lines.append)
  assert (out / "circuits.json").exists()
  assert lines == ["kept circuits.json of an earlier analysis (what it analysed is not recorded)"]
  # Not recorded as this step's: a later rerun at step 60 must not take it for one.
  assert _record(out) == {**_settings(60), "files": [], "group_ablation": None}


def test_a_rerun_reads_again_only_the_kept_files_its_record_lists_and_that_are_there(tmp_path):
  """circuits.md of a rerun at the same settings (--checkpoints after
  --circuits) re-reads the circuits.json or training_scores.csv it keeps:
  only those the record lists as this analysis's (a file of an analysis that
  recorded nothing, kept and said, was read into circuits.md as this step's)
  and that are still there (one deleted since: a FileNotFoundError's
  traceback instead of a report without it)."""
  text = lambda path: path.read_text()  # noqa: E731
  unrecorded = epath.Path(tmp_path / "unrecorded")
  unrecorded.mkdir()
  (unrecorded / "circuits.json").write_text("step ?")
  head_analysis._settle(unrecorded, _settings(60), [], None, lambda line: None)
  kept = head_analysis._same_settings(_record(unrecorded), _settings(60))
  assert kept is not None  # the record is of these settings; the file is not its
  assert head_analysis._kept_file(unrecorded, kept, "circuits.json", text) is None
  listed = tmp_path / "listed"
  listed.mkdir()
  out = _analysis_dir(listed, _settings(60), ["circuits.json", "training_scores.csv"])
  (out / "circuits.json").unlink()
  kept = head_analysis._same_settings(_record(out), _settings(60))
  assert head_analysis._kept_file(out, kept, "circuits.json", text) is None
  assert head_analysis._kept_file(out, kept, "training_scores.csv", text) == "step 60"
  other = head_analysis._same_settings(_record(out), _settings(60, replica=1))
  assert head_analysis._kept_file(out, other, "training_scores.csv", text) is None


@pytest.mark.parametrize("text", ["[]", '{"step": 4}', '{"step": 4, "files": ["x.png"]}', "{"])
def test_a_damaged_analysis_record_is_refused_naming_it(tmp_path, text):
  (tmp_path / head_analysis.ANALYSIS_RECORD).write_text(text)
  with pytest.raises(ValueError, match=r"analysis\.json: not"):
    head_analysis._read_record(epath.Path(tmp_path))


@pytest.mark.slow  # its fixture trains a run
def test_a_run_whose_mesh_this_machine_lacks_is_read_on_the_devices_it_has(decoder_run, tmp_path):
  """A run trained with parallel.fsdp x tensor = 2 x 2 (4 devices) is read
  here, on 1: the commands that read trained runs (txf-generate, -export,
  -extrapolate, -analyze, -embed, train.init_from) refused it ('does not
  divide the 1 devices'), though its parameters restore onto any mesh."""
  copy = tmp_path / "trained_on_four"
  shutil.copytree(decoder_run, copy)
  config = json.loads((copy / "config.json").read_text())
  config["parallel"] = {"data": 1, "fsdp": 2, "tensor": 2}
  (copy / "config.json").write_text(json.dumps(config))
  assert len(jax.devices()) == 1
  read = load_run(copy, {"eval.num_batches": 1})
  assert read.setup.mesh.devices.size == 1
  own = load_run(decoder_run, {"eval.num_batches": 1})
  assert read.setup.evaluate(read.params) == own.setup.evaluate(own.params)
  # config.json still says how the run was trained.
  assert json.loads((copy / "config.json").read_text())["parallel"]["fsdp"] == 2


# --- what the analysis reads, recorded; its checks ----------------------------------------


@pytest.mark.slow  # its fixture trains a run
def test_analyses_over_other_numbers_of_batches_are_other_analyses(decoder_run):
  """The induction probe draws its ids from every validation batch read, so
  its tokens depend on num_batches; analysis.json did not record it, and
  `--circuits --num_batches=1` then `--ablate` over 4 batches kept circuits
  of one probe beside head scores of another as one analysis."""
  read = lambda: json.loads(
    (decoder_run / ANALYSIS_DIR / head_analysis.ANALYSIS_RECORD).read_text()
  )
  one = analyze_run(decoder_run, num_batches=1)
  first = read()
  two = analyze_run(decoder_run, num_batches=2)
  second = read()
  assert (first["num_batches"], second["num_batches"]) == (1, 2)
  # The probes differ, so the analyses must not pass for one.
  assert one["periods"] == two["periods"]
  assert not np.allclose(one["scores"]["self"]["induction"], two["scores"]["self"]["induction"])
  analyze_run(decoder_run)  # the run's own eval.num_batches (1) is recorded, not None
  assert read()["num_batches"] == 1


def test_probe_periods_fit_the_query_length_and_the_ids():
  """Periods run 2..min(length // 2, ids): two blocks of distinct tokens."""
  periods = head_analysis._probe_periods
  assert periods(None, 32, 100, [16, 2]) == [16, 2]  # both ends
  with pytest.raises(ValueError, match=r"^periods: 17 must be in 2\.\.16 "):
    periods(None, 32, 100, [17, 3])
  with pytest.raises(ValueError, match=r"^periods: 1 must be in 2\.\.16 "):
    periods(None, 32, 100, [1, 3])
  # Four in-distribution ids: blocks of 5 distinct tokens cannot be drawn.
  assert periods(None, 32, 4, [4, 3]) == [4, 3]
  with pytest.raises(ValueError, match=r"^periods: 5 must be in 2\.\.4 \(.* 4 in-distribution"):
    periods(None, 32, 4, [5, 3])


@pytest.mark.slow  # its fixture trains a run
def test_a_negative_seed_is_refused_before_anything_is_written(decoder_run):
  before = digests(decoder_run), analysis_files(decoder_run)
  with pytest.raises(ValueError, match=r"^seed: must be an integer >= 0"):
    analyze_run(decoder_run, seed=-1)
  assert (digests(decoder_run), analysis_files(decoder_run)) == before


@pytest.mark.slow  # its fixture trains a run
def test_an_ablation_of_a_model_without_causal_attention_is_refused(encoder_run):
  before = analysis_files(encoder_run)
  with pytest.raises(ValueError, match="^ablate: the model has no causal self-attention"):
    analyze_run(encoder_run, ablate="L0H0")
  assert analysis_files(encoder_run) == before


def test_scores_over_checkpoints_need_two_layers():
  """(Circuits refuse a Post-LN run: test_scores_over_checkpoints_of_a_post_ln_replica.)"""
  run = parse(tiny_config("rope", model__num_layers=1))
  setup = types.SimpleNamespace(run=run, task=run.data.task)
  for flag in ("checkpoints", "circuits"):
    with pytest.raises(ValueError, match=f"^{flag}: needs two or more layers to compose, the run"):
      head_analysis._check_circuits(setup, circuits=flag == "circuits")
  two = parse(tiny_config("rope", model__num_layers=2))
  head_analysis._check_circuits(types.SimpleNamespace(run=two, task="lm"), circuits=True)


@pytest.mark.slow  # its fixture trains a run
def test_encoder_decoder_scores_leave_padding_out_and_probe_on_the_source(seq2seq_run):
  """Entropy over the unpadded queries of each kind, and the decoder's
  induction probe beside the batch's own source, against the maps of the
  model applied here (not jitted: float32 sums in another order)."""
  record = analyze_run(seq2seq_run)
  run = load_run(seq2seq_run)
  setup, pad_id = run.setup, run.setup.run.model.pad_id
  batches = list(setup.eval_data)
  source, target = batches[0]["encoder_inputs"], batches[0]["decoder_inputs"]
  assert (source == pad_id).any() and (target == pad_id).any()
  maps = maps_by_kind(attention_maps(setup.model, run.params, source, target))
  queries = {"encoder_self": source, "decoder_self": target, "cross": target}
  for kind, tokens in queries.items():
    masked = [attention_entropy(w, query_mask=tokens != pad_id) for w in maps[kind]]
    np.testing.assert_allclose(record["scores"][kind]["entropy_nats"], masked, atol=1e-5)
    # Padded queries would change it by far more than the tolerance.
    assert np.abs(np.stack(masked) - [attention_entropy(w) for w in maps[kind]]).max() > 1e-3

  ids = in_distribution_ids(
    np.concatenate([batch["decoder_inputs"].ravel() for batch in batches]),
    setup.train_data.tokenizer.special_ids,
  )
  vocab_size, B = setup.run.model.vocab_size, len(target)
  for period in record["periods"]:
    probe = induction_probe(0, B, period, vocab_size, ids)

    def scores(encoder_inputs, period=period, probe=probe):
      layers = maps_by_kind(attention_maps(setup.model, run.params, encoder_inputs, probe))
      return np.stack([induction_score(w, period) for w in layers["decoder_self"]])

    recorded = np.asarray(record["scores"]["decoder_self"][f"induction_p{period}"])
    np.testing.assert_allclose(recorded, scores(source), atol=1e-5)
    # Layer 1 reads the source (through layer 0's cross-attention): another one moves it.
    assert np.abs(recorded[1] - scores(source[::-1])[1]).max() > 1e-4


@pytest.mark.slow  # its fixture trains a run
def test_scores_over_checkpoints_of_a_post_ln_replica(post_ln_replicas_run):
  """The last checkpoint's row is the analysed one's scores (induction: the
  lowest over the periods), of the replica asked for, its K-composition
  without a Pre-LN norm folded in."""
  workdir = post_ln_replicas_run
  with pytest.raises(ValueError, match=r"^circuits: path patching needs Pre-LN"):
    analyze_run(workdir, circuits=True)
  record = analyze_run(workdir, checkpoints=True, replica=1)
  training, scores = record["training"], record["scores"]["self"]
  assert list(training["steps"]) == [1, 2] and record["step"] == 2
  for name in ("induction", "previous_token"):
    np.testing.assert_allclose(training[name][-1], scores[name], atol=1e-6)
  by_period = [scores[f"induction_p{period}"] for period in record["periods"]]
  np.testing.assert_array_equal(scores["induction"], np.min(by_period, axis=0))
  assert not np.allclose(by_period[0], by_period[1])  # the minimum is not either

  run = load_run(workdir)
  params = [run.setup.replica_params(run.params, r) for r in (0, 1)]
  k_LxHxH = composition_scores(params[1], fold_norm=False)["k"]
  np.testing.assert_allclose(training["k_composition"][-1], k_LxHxH, rtol=1e-9)
  assert np.abs(k_LxHxH - composition_scores(params[1], fold_norm=True)["k"]).max() > 1e-3
  assert np.abs(k_LxHxH - composition_scores(params[0], fold_norm=False)["k"]).max() > 1e-3
  metrics = run.setup.evaluate(run.params)
  assert training["loss"][-1] == pytest.approx(metrics["eval_loss/1"], abs=1e-6)
  assert abs(metrics["eval_loss/1"] - metrics["eval_loss/0"]) > 1e-4


@pytest.mark.slow  # its fixture trains a run; a subprocess
def test_the_command_analyses_the_replica_and_probe_seed_it_is_given(
  post_ln_replicas_run, commands
):
  done = commands.run(
    "experiments.analyze",
    f"--workdir={post_ln_replicas_run}",
    "--seed=3",
    "--replica=1",
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  saved = json.loads(
    (post_ln_replicas_run / ANALYSIS_DIR / head_analysis.ANALYSIS_RECORD).read_text()
  )
  assert (saved["replica"], saved["probe_seed"]) == (1, 3)
  assert "# Attention heads at step 2 (replica 1 of 2, seed 1)" in done.stdout


@pytest.mark.slow  # trains a run and analyses it five times
def test_reruns_of_one_analysis_keep_each_others_reports(tmp_path):
  """--ablate, then --circuits, then --checkpoints at one checkpoint: each
  keeps the others' parts of head_scores.md and circuits.md (a rerun wrote
  them from its own part alone: the group ablation and one half of
  circuits.md were lost while their files were listed as kept); a new
  --ablate replaces the group; another --num_batches drops them all."""
  workdir = tmp_path / "run"
  config = tiny_config(
    "rope", steps=2, train__warmup_steps=1, model__num_layers=2, train__checkpoint_every=1
  )
  loop.run(parse(config), workdir, log=lambda line: None)
  out = workdir / ANALYSIS_DIR

  def report(name):
    return (out / name).read_text()

  analyze_run(workdir, ablate="L0H1", num_batches=1)
  group = report(SCORES_MD)[report(SCORES_MD).index("## Group ablation of L0H1") :]
  analyze_run(workdir, circuits=True, num_batches=1)
  assert report(SCORES_MD).endswith(group)
  circuits = report("circuits.md")
  assert circuits.startswith("# Circuits at step 2") and "When the circuit forms" not in circuits
  analyze_run(workdir, checkpoints=True, num_batches=1)
  assert report(SCORES_MD).endswith(group)
  both = report("circuits.md")
  assert both.startswith(circuits) and "## When the circuit forms" in both
  assert "(2 checkpoints, steps 1..2)" in both
  analyze_run(workdir, circuits=True, num_batches=1)
  assert report("circuits.md") == both
  # A damaged file the rerun keeps is refused by the checks, before any
  # model runs (it was read after the compute: a KeyError's traceback).
  for name, damaged, asked in (
    ("circuits.json", json.dumps({"step": 2}), dict(checkpoints=True)),
    ("training_scores.csv", "step,loss\n1,x\n", dict(circuits=True)),
  ):
    good = report(name)
    (out / name).write_text(damaged)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(out / name))}: not the {name} an"):
      head_analysis.check_analysis(workdir, num_batches=1, **asked)
    (out / name).write_text(good)
  analyze_run(workdir, ablate="L1H0", num_batches=1)
  assert "## Group ablation of L1H0" in report(SCORES_MD) and "L0H1" not in report(SCORES_MD)
  assert _record(out)["group_ablation"]["heads"] == ["L1H0"]
  analyze_run(workdir, num_batches=2)
  assert "Group ablation" not in report(SCORES_MD) and not (out / "circuits.md").exists()
