"""configs/induction.py at toy size forms a real induction circuit (issue 23).

The toy keeps what makes the circuit form (2 layers, RoPE, a period that
varies between rows) and shrinks the rest: d_model 64, 24 tokens, blocks of
4..8 of 16 symbols, 600 steps. experiments.analyze's probe then runs at the
two longest periods the data never repeats with (12 and 11) on the run's own
ids, so a fixed-offset head cannot pass as an induction head.

Measured when this was written (seed 0 unless said; 2 shared CPU cores):
  600 steps, seed 0          L0H0, L0H3 previous-token; L1H1-L1H3 induction
                             (0.78-0.88 at both periods); eval accuracy 1.000
  600 steps, seed 1          L0H1, L0H3; L1H0, L1H2 (0.56, 0.89)
  450 steps                  L0H0; L1H2, L1H3 induction, L1H1 positional
  300 steps                  no role at all (accuracy 0.665: the plateau
                             before the phase change); the test fails
  d_model 32, 600 steps      no role at all; the test fails
  1 layer, 600 steps         no role at all; the test fails
About 45 s of CPU (user time) for the run and the analysis; seed 1 as well
(replicas=2) took 69 s, so only seed 0 runs here (trained by txf-run in a
subprocess: 31 s wall alone, against 40 s under the suite's XLA flags).
The run keeps a checkpoint every 100 steps and is trained and analysed once for this
module's tests, with circuits and checkpoints (txf.analysis.circuits,
txf.analysis.phase_change): about 60 s wall in all. Measured (seed 0,
600 steps): the key path of L0H0 (the top previous-token head) moves the
induction heads' scores by 0.40-0.44, the other previous-token head's
(L0H3) by 0.10-0.13, the control heads' by at most 0.06, every query path
by at most 0.03; L0H0's K-composition into them is 0.17 (random: 0.126),
into the non-induction L1H0 0.125; at step 100 (accuracy 0.27) every pair
composes at 0.114-0.139, and the accuracy rises fastest between steps 100
and 200 (to 0.87).
"""

import os
import pathlib
import subprocess

import numpy as np
import pytest

from conftest import REPO, cli_command, load_config
from txf.analysis.ablation import parse_heads
from txf.analysis.phase_change import phase_change
from txf.data.incontext import repeat_periods
from txf.trained.head_analysis import analyze_run

STEPS = 600


def toy_config(steps: int = STEPS, num_layers: int = 2):
  config = load_config("induction")
  config.model.update(dict(d_model=64, num_heads=4, num_layers=num_layers))
  config.data.update(dict(seq_len=24, min_example_len=4, max_example_len=8, num_symbols=16))
  config.train.update(
    dict(steps=steps, warmup_steps=steps // 10, log_every=steps, checkpoint_every=steps)
  )
  config.eval.update(dict(every=steps, num_batches=1))
  return config


CHECKPOINT_EVERY = 100


@pytest.fixture(scope="module")
def toy_analysis(tmp_path_factory):
  """(config, analyze_run's record with circuits and checkpoints) of the toy
  run, trained once with a checkpoint every 100 steps kept."""
  workdir = tmp_path_factory.mktemp("induction")
  config = toy_config()
  config.train.update(
    dict(checkpoint_every=CHECKPOINT_EVERY, max_to_keep=STEPS // CHECKPOINT_EVERY)
  )
  # Trained by txf-run in a process of its own, with XLA's CPU optimisations
  # on: the suite turns them off to compile faster (conftest), which runs the
  # 600 steps about 3 times slower.
  result = subprocess.run(
    cli_command("induction", workdir, config),
    cwd=REPO,
    env=dict(os.environ, XLA_FLAGS=""),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return config, analyze_run(workdir, circuits=True, checkpoints=True)


@pytest.mark.slow
def test_induction_config_forms_a_circuit_that_survives_a_new_period(toy_analysis):
  config, analysis = toy_analysis
  periods, roles = analysis["periods"], analysis["roles"]["self"]
  assert len(periods) == 2 and not set(periods) & set(repeat_periods(config.data))
  assert any(head.startswith("L0") for head in roles["previous_token"]), roles
  assert any(head.startswith("L1") for head in roles["induction"]), roles
  # Six checkpoints place the phase change without a warning that they are too few.
  circuits_md = next(path for path in analysis["files"] if path.endswith("circuits.md"))
  text = pathlib.Path(circuits_md).read_text()
  assert f"({STEPS // CHECKPOINT_EVERY} checkpoints, steps" in text and "too few" not in text


def layer_heads(heads: list[str], layer: int) -> list[int]:
  """The heads of `layer` among 'L<l>H<h>' names."""
  return [head for at, head in parse_heads(",".join(heads), 2, 4) if at == layer] if heads else []


@pytest.mark.slow
def test_composition_and_patching_single_out_previous_token_to_induction_pairs(toy_analysis):
  _, analysis = toy_analysis
  roles, record, training = analysis["roles"]["self"], analysis["circuits"], analysis["training"]
  previous = layer_heads(roles["previous_token"], 0)
  controls = sorted(set(range(4)) - set(previous))
  induction = layer_heads(roles["induction"], 1)
  assert previous and controls and induction, roles
  (patching,) = record["patching"]
  key_path_H = np.asarray(patching["k"])[:, induction].mean(axis=1)  # per layer-0 head
  top = int(np.argmax(np.asarray(record["scores"]["previous_token"])[0]))
  assert np.argmax(key_path_H) == top and key_path_H[top] > 0.25, key_path_H
  assert key_path_H[controls].max() < 0.1, key_path_H
  assert np.abs(patching["q"]).max() < 0.05  # the circuit is K-composition, not Q
  k_composition = np.asarray(record["composition"]["k"])[0]
  baseline = record["baseline"]["k"]
  assert k_composition[top, induction].mean() > baseline + 0.03, k_composition
  assert k_composition[controls][:, induction].max() < k_composition[top, induction].min()
  # Before the circuit (the first checkpoint) every pair composes at random
  # and no head does induction; the phase change comes between checkpoints.
  assert training["steps"][0] == CHECKPOINT_EVERY and training["steps"][-1] == STEPS
  assert np.abs(training["k_composition"][0] - baseline).max() < 0.03
  assert training["induction"][0].max() < 0.2 and training["accuracy"][0] < 0.5
  assert phase_change(training)["accuracy"]["steps"] == [100, 200]
  assert training["k_composition"][-1, 0, top, induction].min() > baseline + 0.03
  assert {"circuits.json", "training_scores.csv", "patching.png"} <= {
    path.rsplit("/", 1)[1] for path in analysis["files"]
  }
