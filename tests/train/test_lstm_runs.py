"""End-to-end: the LSTM family through the runner, and the textbook comparison
of a Transformer LM with an LSTM LM (txf.textbook.lstm_vs_transformer).

One quick comparison (both models at test size, 30 steps) runs once for the
module; its LSTM run is also the uninterrupted reference of the exact-resume
test, whose interrupted copy compiles nothing new (JAX's persistent cache,
as in test_train_loop.py).
"""

import math

import numpy as np
import pytest

from conftest import (
  assert_same_states,
  load_config,
  restore_state,
  sigterm_at,
  without_timings,
)
from txf.layers.model_config import ModelConfig
from txf.runconfig.run_config import parse
from txf.rundir.metrics import read_metrics
from txf.textbook import lstm_vs_transformer as comparison
from txf.train import loop


@pytest.fixture(scope="module")
def quick(tmp_path_factory, compilation_cache_dir):
  out_dir = tmp_path_factory.mktemp("lstm_vs_transformer")
  lines = []
  result = comparison.run(out_dir, base_config=load_config("base"), quick=True, log=lines.append)
  return out_dir, result, lines


@pytest.mark.slow
def test_lstm_learns(quick):
  """Train loss over the first 3 steps vs the last 3 (logged every step):
  drops of 1.3-1.6 nats over seeds 0-3; the margin is about half the least."""
  _, result, _ = quick
  losses = result["lstm"]["curves"]["train"][1]
  assert len(losses) == 30 and all(np.isfinite(losses))
  assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.6, losses


@pytest.mark.slow
def test_lstm_resumes_exactly_with_samples(quick, tmp_path, sigterm_is_caught):
  """The comparison's LSTM run, again, preempted at step 10 and resumed: the
  same final state bit for bit, the same metrics and the same samples."""
  out_dir, result, _ = quick
  config = comparison.comparison_configs(load_config("base"), quick=True)["lstm"]
  config.model.d_model = result["lstm"]["d_model"]
  interrupted = tmp_path / "interrupted"
  lines = []
  loop.run(parse(config), interrupted, log=sigterm_at(10, lines))
  assert any(line.startswith("preempted: saved step 10") for line in lines), lines
  assert sigterm_is_caught == []
  lines = []
  loop.run(parse(config), interrupted, log=lines.append)
  assert any("resumed from step 10" in line for line in lines)

  straight = out_dir / "runs" / f"{comparison.NAME}_quick" / "lstm"
  assert without_timings(read_metrics(interrupted)) == without_timings(read_metrics(straight))
  assert (interrupted / "samples.txt").read_text() == (straight / "samples.txt").read_text()
  assert_same_states(restore_state(straight, 30), restore_state(interrupted, 30))


@pytest.mark.slow
def test_quick_runs_train_apart_from_the_full_ones(quick):
  """Before, the quick runs took runs/lstm_vs_transformer, and the full
  comparison in the same out_dir then refused its Transformer: 'model.d_model:
  differs from the run already in ...' (as masks and heads, '_quick')."""
  out_dir, result, _ = quick
  runs_dir = out_dir / "runs" / f"{comparison.NAME}_quick"
  assert [path.name for path in (out_dir / "runs").iterdir()] == [runs_dir.name]
  for name in comparison.RUNS:
    assert result[name]["workdir"] == str(runs_dir / name)


@pytest.mark.slow
def test_comparison_numbers_are_consistent(quick):
  out_dir, result, _ = quick
  transformer, lstm = result["transformer"], result["lstm"]
  # Sizes: the LSTM's width is the one whose count is nearest the Transformer's.
  assert abs(result["param_ratio"] - 1) <= comparison.PARAM_TOLERANCE
  assert result["param_ratio"] == lstm["params"] / transformer["params"]
  width = lstm["d_model"]
  lstm_cfg = ModelConfig(
    family="lstm", vocab_size=260, d_model=width, num_layers=comparison.LSTM_LAYERS
  )
  assert comparison.num_params(lstm_cfg) == lstm["params"]
  for neighbour in (width - 1, width + 1):
    assert abs(
      comparison.num_params(lstm_cfg.replace(d_model=neighbour)) - transformer["params"]
    ) >= abs(lstm["params"] - transformer["params"])
  for run in (transformer, lstm):
    assert run["steps"] == 30
    assert math.isclose(run["eval_perplexity"], math.exp(run["eval_loss"]), rel_tol=1e-6)
    # The numbers are the run's own: its last validation row and metrics.
    rows = read_metrics(run["workdir"])
    assert run["eval_loss"] == [r["eval_loss"] for r in rows if "eval_loss" in r][-1]
    assert run["curves"]["validation"] == ([30], [run["eval_loss"]])
    speeds = [r["tokens_per_sec"] for r in rows if "tokens_per_sec" in r]
    assert run["tokens_per_sec"] == pytest.approx(np.mean(speeds)) and run["tokens_per_sec"] > 0
    assert run["wall_time_s"] > 0
    assert run["sample"].startswith("def ") and len(run["sample"]) > len("def ")
  table = result["text"]  # txf-textbook's lstm_vs_transformer.md; no other file holds it
  assert not list(out_dir.glob("*.md"))
  for run in (transformer, lstm):
    assert f"{run['params']:,}" in table and f"{run['eval_perplexity']:.3f}" in table
    assert run["sample"] in table
  assert result["figures"] == [str(out_dir / "textbook_lstm_vs_transformer_loss.png")]
  png = (out_dir / "textbook_lstm_vs_transformer_loss.png").read_bytes()
  assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_lstm_config_matches_the_comparison():
  """configs/lstm.py is the comparison's LSTM at the default size."""
  configs = comparison.comparison_configs(load_config("base"))
  transformer_cfg = ModelConfig.from_config({**configs["transformer"].model, "vocab_size": 260})
  lstm_cfg = ModelConfig.from_config({**configs["lstm"].model, "vocab_size": 260})
  width = comparison.matched_lstm_width(comparison.num_params(transformer_cfg), lstm_cfg)
  config = load_config("lstm")
  assert (config.model.d_model, config.model.num_layers) == (width, comparison.LSTM_LAYERS)
  assert comparison.num_params(transformer_cfg) == 822_016  # configs/lstm.py's docstring
  assert comparison.num_params(lstm_cfg.replace(d_model=width)) == 819_244


def test_comparison_refuses_a_base_config_that_is_not_an_lm():
  with pytest.raises(ValueError, match=r"^data\.task"):
    comparison.comparison_configs(load_config("encoder_mlm"))
