"""Textbook experiments (txf.textbook) at toy size: each asserts the claim it
demonstrates. Timing claims are asserted only where the margin is large
(the cached decode step does ~100x less work than the uncached one); the
scaling laws are asserted on deterministic quantities (XLA's compiled
memory and FLOP counts). The two experiments that train are marked slow.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from etils import epath

from conftest import REPO, load_config
from txf import textbook
from txf.analysis import plots
from txf.analysis.counts import COMPONENTS
from txf.textbook import (
  heads,
  kv_cache,
  masks,
  param_counts,
  positions,
  quadratic,
  report,
  scaling,
  training,
)
from txf.train.run_setup import load_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_pngs(result, count):
  assert len(result["figures"]) == count
  for path in result["figures"]:
    with open(path, "rb") as file:
      assert file.read(8) == PNG_MAGIC, path


# ------------------------------------------------------------------ framework


def test_registry_names_items_and_modules():
  assert list(textbook.EXPERIMENTS) == [
    "scaling",
    "masks",
    "positions",
    "quadratic",
    "kv_cache",
    "param_counts",
    "lstm_vs_transformer",
    "heads",
  ]
  assert [e.item for e in textbook.EXPERIMENTS.values()] == [1, 2, 3, 4, 5, 6, 7, 8]
  assert {e.name: e.config for e in textbook.EXPERIMENTS.values() if e.config} == {
    "masks": "seq2seq",
    "lstm_vs_transformer": "base",
    "heads": "base",
  }
  with pytest.raises(ValueError, match="no textbook experiment 'nope'.*scaling, masks"):
    textbook.get("nope")


@pytest.mark.slow  # four commands
def test_command_lists_and_rejects_unknown_names(commands):
  def run_textbook(*args):
    return commands.run("experiments.textbook", *args)

  listed = run_textbook("--list")
  assert listed.returncode == 0, listed.stderr
  lines = listed.stdout.splitlines()
  # Numbered 1..8 without a gap (item 8 was skipped), names in one column.
  assert [line.split()[:3] for line in lines] == [
    [name, "item", f"{n}:"] for n, name in enumerate(textbook.EXPERIMENTS, 1)
  ]
  assert len({line.index(" item ") for line in lines}) == 1
  assert lines[-1].endswith("(trains the base config)")
  # Beside 'all' too: it ran every experiment, the name ignored.
  for names in (["nope"], ["all", "nope"]):
    unknown = run_textbook(*names)
    assert (unknown.returncode, unknown.stdout) == (2, ""), names
    assert unknown.stderr.strip().startswith("flag error: no textbook experiment 'nope'")
  # --list with names listed everything and ignored them, exit 0.
  named = run_textbook("--list", "nope")
  assert (named.returncode, named.stdout) == (2, "")
  assert (
    named.stderr.strip()
    == "flag error: --list lists every experiment; it takes no names (got nope)"
  )


@pytest.mark.slow  # a command
def test_an_out_dir_that_is_a_file_is_one_line_exit_2(commands, tmp_path):
  """It was a FileExistsError traceback."""
  out = tmp_path / "file"
  out.write_text("kept")
  done = commands.run("experiments.textbook", "scaling", "--quick", f"--out_dir={out}", timeout=300)
  assert done.returncode == 2, done.stderr
  assert done.stderr.strip() == f"flag error: out_dir: {out}: exists and is not a directory"
  assert out.read_text() == "kept"


# The full disk's writes under --out_dir: 1 the writability probe, 2 the
# figure (a plain write: was an OSError traceback), 3 the numbers (atomic).
@pytest.mark.slow  # a subprocess (~20 s)
@pytest.mark.parametrize(
  "after, written", [(2, "textbook_param_counts_components.png"), (3, "param_counts.json")]
)
def test_a_full_disk_under_out_dir_is_one_line_exit_1(tmp_path, after, written):
  out = tmp_path / "out"
  code = "\n".join(
    [
      "import runpy, sys",
      f"sys.path[:0] = [{str(REPO / 'tests')!r}, {str(REPO)!r}]",
      "from full_disk import files_in, full_disk",
      f"sys.argv = ['experiments.textbook', 'param_counts', '--quick', '--out_dir={out}']",
      f"with full_disk(files_in({str(out)!r}), {after}):",
      "  runpy.run_module('experiments.textbook', run_name='__main__', alter_sys=True)",
    ]
  )
  done = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert done.returncode == 1, done.stderr[-2000:]
  assert done.stderr.strip() == f"write error: {out / written}: No space left on device"


@pytest.mark.slow  # a command
def test_a_rerun_removes_its_experiments_figures_it_did_not_draw_and_runs_each_name_once(
  commands, tmp_path
):
  """An earlier run's figure of other settings (the heads grids are named by
  their probe period) stayed beside this run's numbers; another
  experiment's stays. A name given twice ran twice."""
  out = tmp_path / "out"
  out.mkdir()
  stale, other = out / "textbook_param_counts_p16.png", out / "textbook_scaling_p16.png"
  for path in (stale, other):
    path.write_bytes(PNG_MAGIC)
  done = commands.run(
    "experiments.textbook",
    "param_counts",
    "param_counts",
    "--quick",
    f"--out_dir={out}",
    timeout=300,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.count("## param_counts (item 6)") == 1
  assert f"removed {stale} (an earlier run's, not drawn by this one)" in done.stdout
  assert not stale.exists() and other.exists()
  assert (out / "textbook_param_counts_components.png").exists()


def test_stale_figures_are_the_experiments_own_and_not_drawn(tmp_path, monkeypatch):
  """Figures of the experiment not in this run's list, and not those of an
  experiment whose name begins with its name and '_' (heads_x's are not
  heads')."""
  from txf.commands import textbook as command

  monkeypatch.setitem(textbook.EXPERIMENTS, "heads_x", textbook.EXPERIMENTS["heads"])
  names = ["textbook_heads_scores.png", "textbook_heads_p16.png", "textbook_heads_x_p16.png"]
  names += ["textbook_scaling_p16.png"]
  for name in names:
    (tmp_path / name).write_bytes(PNG_MAGIC)
  drawn = [str(tmp_path / "textbook_heads_scores.png")]
  stale = command._stale_figures(epath.Path(tmp_path), "heads", drawn)
  assert [path.name for path in stale] == ["textbook_heads_p16.png"]


def test_loglog_slope_recovers_a_power_law():
  x = np.array([128, 256, 512, 1024])
  assert report.loglog_slope(x, 3.0 * x**2) == pytest.approx(2.0, abs=1e-12)
  assert report.loglog_slope(x, 0.5 * x) == pytest.approx(1.0, abs=1e-12)
  with pytest.raises(ValueError, match="positive"):
    report.loglog_slope([1, 2], [0.0, 1.0])


def test_derive_config_sets_fields_and_names_unknown_ones():
  base = load_config("base")
  config = training.derive_config(base, {"model.d_model": 48, "train.steps": 7})
  assert (config.model.d_model, config.train.steps) == (48, 7)
  assert base.model.d_model == 128  # the base is not changed
  with pytest.raises(ValueError, match="model.no_such_field: unknown field"):
    training.derive_config(base, {"model.no_such_field": 1})
  with pytest.raises(ValueError, match="train.steps"):
    training.derive_config(base, {"train.steps": "many"})


def test_heatmaps_share_one_colour_scale_and_leave_non_finite_blank(tmp_path):
  panels = {"a": np.array([[0.0, 1.0], [np.nan, 2.0]]), "b": np.array([[-np.inf, 4.0], [3.0, 0.5]])}
  figure = plots.heatmaps_figure(
    panels,
    title="t",
    xlabel="key",
    ylabel="query",
    colorbar_label="bias",
    columns=1,
    xticklabels=["x", "y"],
  )
  images = [axes.images[0] for axes in figure.axes if axes.images]
  assert [image.axes.get_title() for image in images] == ["a", "b"]
  assert all(image.get_clim() == (0.0, 4.0) for image in images)  # the finite range
  assert images[0].get_array().mask[1, 0] and images[1].get_array().mask[0, 0]
  assert figure.axes[-1].get_ylabel() == "bias"
  assert [t.get_text() for t in images[0].axes.get_xticklabels()] == ["x", "y"]
  path = plots.heatmaps(panels, tmp_path / "h.png", "t", xlabel="k", ylabel="q", colorbar_label="c")
  assert path.read_bytes()[:8] == PNG_MAGIC
  for bad, message in (
    ({}, "at least one"),
    ({"a": np.zeros(3)}, r"panels\['a'\]"),
    ({"a": np.zeros((2, 2)), "b": np.zeros((2, 3))}, r"panels\['b'\]"),
    ({"a": np.full((2, 2), np.nan)}, "no finite value"),
  ):
    with pytest.raises(ValueError, match=message):
      plots.heatmaps_figure(bad, title="t", xlabel="x", ylabel="y", colorbar_label="c")


# ------------------------------------------------------------ 1: 1/sqrt(d_k)


def test_scaling_keeps_variance_one_and_the_softmax_unsaturated(tmp_path):
  result = scaling.run(tmp_path, quick=True)
  d_k = np.array(result["d_k"])
  # 64 x 64 scores: the sample variance is within ~2.5% (1 std) of the truth.
  np.testing.assert_allclose(result["variance_scaled"], 1.0, rtol=0.1)
  np.testing.assert_allclose(result["variance_unscaled"], d_k, rtol=0.1)
  # Unscaled rows collapse onto one key and their gradients vanish with d_k;
  # scaled rows keep the same entropy and gradient at every d_k.
  assert np.all(np.diff(result["entropy_unscaled"]) < 0)
  assert result["entropy_unscaled"][-1] < 0.5 < 3.5 < min(result["entropy_scaled"])
  assert np.ptp(result["entropy_scaled"]) < 0.1
  assert result["max_gradient_unscaled"][-1] < result["max_gradient_scaled"][-1] / 3
  assert np.ptp(result["max_gradient_scaled"]) < 0.01
  assert_pngs(result, 3)


def test_largest_softmax_gradient_is_max_p_times_one_minus_p():
  """The autodiff Jacobian's largest entry per row is max_j p_j (1 - p_j)."""
  scores = np.random.default_rng(0).normal(scale=3.0, size=(9, 6))
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  closed_form = np.median((p * (1 - p)).max(-1))
  assert scaling._largest_jacobian_entry(scores) == pytest.approx(closed_form, rel=1e-5)


# ---------------------------------------------------------------- 2: masks


@pytest.mark.slow
def test_masks_are_exact_and_a_trained_encoder_decoder_aligns(tmp_path):
  result = masks.run(
    tmp_path, quick=True, base_config=load_config("seq2seq"), log=lambda line: None
  )
  for case in result["masks"].values():
    assert case["max_masked_weight"] == 0.0  # exactly
    assert case["max_row_sum_error"] < 1e-6
  cross = result["cross"]
  assert cross["expected_positions"] == [6, 5, 4, 3, 2]  # reverse of a 7-token source
  alignment = np.array(cross["alignment"])
  assert alignment.shape == (1, 2)  # the quick model's layers x heads
  # 150 steps: the best head already puts ~3x the uniform weight on the
  # source token to predict (0.43 measured; uniform 1/7).
  assert cross["best_alignment"] == alignment.max() > 2 * cross["uniform_alignment"]
  assert_pngs(result, 3)


def test_mask_weights_match_the_masks():
  cases = masks.mask_weights(10, 7)
  causal = np.tril(np.ones((10, 10), bool))
  padding = np.broadcast_to(np.arange(10) < 7, (10, 10))
  for name, expected in (
    ("causal", causal),
    ("padding", padding),
    ("causal + padding", causal & padding),
  ):
    np.testing.assert_array_equal(cases[name]["mask"], expected)
    assert np.all(cases[name]["weights"][~expected] == 0.0)
    assert np.all(cases[name]["weights"][expected] > 0.0)


# ------------------------------------------------------------ 3: positions


def test_positional_encodings_rotation_relative_and_alibi(tmp_path):
  result = positions.run(tmp_path, quick=True)
  # PE(p + k) = R_k PE(p) to 1e-5 (float32 encodings, positions < 64), and
  # to within the encodings' own rounding.
  assert max(result["rotation_error"]) < 1e-5
  assert max(result["rotation_error"]) <= 2 * result["encoding_error"] + 1e-7
  # Cosine similarity and RoPE scores depend on the offset only; added
  # sinusoids do not.
  assert result["similarity_toeplitz_deviation"] < 1e-5
  assert result["rope_toeplitz_deviation"] < 1e-5 * result["rope_score_scale"]
  assert result["absolute_toeplitz_deviation"] > 1.0
  slopes = result["alibi_slopes"]
  np.testing.assert_allclose(
    slopes, [2.0 ** (-8 * (h + 1) / len(slopes)) for h in range(len(slopes))], rtol=1e-6
  )
  assert_pngs(result, 6)


def test_shift_rotation_is_orthogonal_and_composes():
  r1, r2, r3 = (positions.shift_rotation(16, k) for k in (1, 2, 3))
  np.testing.assert_allclose(r3 @ r3.T, np.eye(16), atol=1e-12)
  np.testing.assert_allclose(r1 @ r2, r3, atol=1e-12)
  pe = positions.sinusoidal_float64(8, 16)
  np.testing.assert_allclose(pe[3:], pe[:5] @ r3.T, atol=1e-12)


# ------------------------------------------------------------ 4: quadratic


def test_attention_cost_exponents_from_compiled_memory_and_flops(tmp_path):
  result = quadratic.run(tmp_path, quick=True)
  # XLA's compiled temporary memory: [T, T] scores for xla, [T, chunk] for chunked.
  assert 1.8 <= result["xla_memory_exponent"] <= 2.2
  assert 0.8 <= result["chunked_memory_exponent"] <= 1.2
  assert result["chunked_temp_bytes"][-1] < result["xla_temp_bytes"][-1] / 4
  assert result["max_abs_difference"] < 1e-5
  ratio = result["flop_ratio"]
  assert ratio["closed_form"] == 256.0
  assert ratio["xla_cost_analysis"] == pytest.approx(256.0, rel=0.01)
  # PaLM's 6N + 12 L H Dh T per token, by hand for GPT-2 small (L 12, H 12,
  # Dh 64, d 768, d_ff 3072, V 50257; N: the weights a token multiplies).
  matmuls = 12 * (4 * 768**2 + 2 * 768 * 3072) + 768 * 50257
  per_sequence = [t * (6 * matmuls + 12 * 12 * 12 * 64 * t) for t in (2048, 32768)]
  expected = per_sequence[1] / per_sequence[0]
  assert ratio["gpt2_small_training_per_sequence"] == pytest.approx(expected, rel=1e-9)
  assert_pngs(result, 2)


# ------------------------------------------------------------- 5: KV cache


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_kv_cache_times_no_programs_first_call(monkeypatch):
  """Each compiled program is called, and its result waited for, before the
  clock first starts: the first call of each no-cache length (22 ms against
  1-2 ms) and of the cached step, dispatched but not waited for, were inside
  the timed steps. Programs and clock stubbed: an order, not a time."""
  import jax

  events = []

  class Waited:
    def __init__(self, what):
      self.what = what

    def block_until_ready(self):
      events.append(("waited", self.what))
      return self

    def __int__(self):
      return 5

  def uncached_step(model, params, length):
    return lambda params, tokens, last: events.append(("call", length)) or Waited(length)

  def cached_step(model, params, cache):
    return lambda params, token, cache: (
      events.append(("call", "cached"))
      or (
        Waited("cached"),
        cache,
      )
    )

  monkeypatch.setattr(kv_cache, "_uncached_step", uncached_step)
  monkeypatch.setattr(kv_cache, "_cached_step", cached_step)
  monkeypatch.setattr(kv_cache, "_flops", lambda compiled: 0.0)
  monkeypatch.setattr(kv_cache.decode, "init_cache", lambda model, batch, length: {})
  monkeypatch.setattr(
    jax, "block_until_ready", lambda tree: [leaf.block_until_ready() for leaf in tree[:1]]
  )
  monkeypatch.setattr(kv_cache.time, "perf_counter", lambda: events.append(("clock",)) or 0.0)
  kv_cache.uncached_steps(None, None, length=6, bucket=4)  # programs of 4 and 8 tokens
  kv_cache.cached_steps(None, None, length=3)
  for what in (4, 8, "cached"):
    first_clock = events.index(("clock",), events.index(("call", what)))
    assert ("waited", what) in events[:first_clock], (what, events)


def test_kv_cache_decodes_the_same_tokens_with_far_less_work(tmp_path):
  result = kv_cache.run(tmp_path, quick=True)
  assert result["same_tokens"]
  flops = result["step_flops"]
  assert flops["uncached"] > 50 * flops["cached"]  # deterministic (XLA's count)
  # The margin is ~100x in work; measured per token, ~5-10x.
  assert result["cached_per_token_at_longest"] < result["uncached_per_token_at_longest"]
  assert len(result["uncached_step_seconds"]) == len(result["cached_step_seconds"]) == 128
  assert_pngs(result, 2)


# ------------------------------------------------------- 6: parameter counts


def test_parameter_counts_equal_the_closed_forms(tmp_path):
  result = param_counts.run(tmp_path)
  for name in param_counts.ARCHITECTURES:
    entry = result[name]
    assert entry["counts"] == entry["closed_form"], name
    assert set(entry["counts"]) == {*COMPONENTS, "total"}
  assert result["gpt2"]["counts"]["total"] == 124_439_808  # GPT-2 small, as published
  d = 768
  bert_model = (
    result["bert"]["counts"]["total"] - result["bert"]["counts"]["head"] + 2 * d + 2 * d + d * d + d
  )  # + token types, embedding norm, pooler
  assert bert_model == 109_482_240  # Hugging Face BertModel
  assert_pngs(result, 1)


# ------------------------------------------------------------------- 9: heads


@pytest.mark.slow
def test_a_trained_lm_has_a_previous_token_head(tmp_path):
  result = heads.run(tmp_path, quick=True, base_config=load_config("base"), log=lambda line: None)
  previous = np.array(result["scores"]["previous_token"])
  assert previous.shape == (2, 2)
  layer, head = result["best"]["previous_token"]
  assert previous[layer, head] == previous.max()
  assert previous.max() > 1.5 * result["baselines"]["previous_token"]
  # The probe: two periods that fit the quick model's 32 tokens, its ids
  # exactly the non-special ids of the run's validation batch.
  assert result["periods"] == [16, 15]
  setup = load_run(tmp_path / "runs" / "heads_quick").setup
  validation = next(iter(setup.eval_data))["inputs"]
  specials = set(setup.train_data.tokenizer.special_ids)
  assert set(result["probe_ids"]) == set(np.unique(validation).tolist()) - specials
  assert len(result["probe_ids"]) < setup.run.model.vocab_size - len(specials)
  for p, tokens in result["probe_tokens"].items():
    assert len(tokens) == 2 * p and set(tokens) <= set(result["probe_ids"])
  by_period = np.array([result["scores"][f"induction_p{p}"] for p in (16, 15)])
  assert np.array_equal(np.array(result["scores"]["induction"]), by_period.min(axis=0))
  for p in (16, 15):
    assert result["baselines"][f"induction_p{p}"] == pytest.approx(
      np.mean(1 / (np.arange(p, 2 * p) + 1))
    )
  # Roles follow the scores: induction needs >= 0.5 at both periods.
  for (layer, head), role in np.ndenumerate(np.array(result["roles"], object)):
    labels = set(filter(None, role.split("+")))
    assert ("previous_token" in labels) == (previous[layer, head] >= 0.5)
    assert ("induction" in labels) == bool(np.all(by_period[:, layer, head] >= 0.5))
    assert ("positional" in labels) == bool(
      np.any(by_period[:, layer, head] >= 0.5) and not np.all(by_period[:, layer, head] >= 0.5)
    )
  assert "induction P=16" in result["text"] and "Heads by role:" in result["text"]
  assert_pngs(result, 4)
  # txf-analyze on the same run scores the same probe at every period (the
  # second period's blocks were other ones: one generator drew both).
  from txf.trained.head_analysis import analyze_run

  record = analyze_run(tmp_path / "runs" / "heads_quick", periods=[16, 15], num_batches=1)
  for p in (16, 15):
    np.testing.assert_allclose(
      record["scores"]["self"][f"induction_p{p}"], result["scores"][f"induction_p{p}"], rtol=1e-6
    )


class _Terminated(BaseException):
  """What the command's SIGTERM handler raises (txf.commands.cli.Terminated)."""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_an_experiment_trains_saves_the_run_then_stops_it(tmp_path, signum):
  """The run's guard took the signal, saved and returned its unfinished
  metrics: the experiment went on with them (KeyError 'eval_loss', a
  traceback, exit 1 instead of `terminated`, 143)."""
  from conftest import checkpoint_steps, tiny_config
  from txf.runconfig.run_config import parse
  from txf.textbook.training import train_to_end

  def command_handler(number, frame):
    raise _Terminated

  previous = signal.signal(signal.SIGTERM, command_handler)
  lines = []

  def log(line):
    lines.append(line)
    if line.startswith("step 2/"):
      os.kill(os.getpid(), signum)

  try:
    stop = _Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    with pytest.raises(stop):
      train_to_end(parse(tiny_config(steps=6)), tmp_path / "run", log=log)
  finally:
    signal.signal(signal.SIGTERM, previous)
  reason = "preempted" if signum == signal.SIGTERM else "interrupted"
  assert any(line.startswith(f"{reason}: saved step 2") for line in lines)
  assert checkpoint_steps(tmp_path / "run") == [2]
