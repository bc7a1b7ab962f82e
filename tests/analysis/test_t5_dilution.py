"""The T5 bias's count correction (tools/t5_dilution.py): the attention mass
beyond a distance and the corrected bias against numpy, the recorded file
against the sweep's committed outputs and itself, and the page's table
written from it."""

import copy
import json

import jax
import numpy as np
import pytest

from conftest import REPO
from tools import t5_dilution
from txf.analysis.attention import mass_beyond
from txf.layers import positions
from txf.models import ModelConfig, build
from txf.ops import last_bucket_start

SWEEP = REPO / "docs" / "data" / "t5_distance"
RECORDED = json.loads(t5_dilution.DATA.read_text())


@pytest.mark.parametrize("distance", [0, 1, 4, 5])
def test_mass_beyond_sums_each_querys_weights_at_least_that_far_back(distance):
  weights = np.random.default_rng(0).random((2, 3, 5, 5))
  expected = np.zeros((2, 3, 5))
  for t in range(5):
    for s in range(5):
      if t - s >= distance:
        expected[:, :, t] += weights[:, :, t, s]
  np.testing.assert_allclose(mass_beyond(weights, distance), expected, rtol=1e-12)
  if distance == 5:  # past the first query's reach
    assert not mass_beyond(weights, distance).any()
  with pytest.raises(ValueError, match=r"^weights must be a self-attention map \[B, H, T, T\]"):
    mass_beyond(weights[..., :4], distance)


def test_the_count_corrected_bias_lowers_each_last_bucket_key_by_log_n_over_n_train():
  """Numpy: a key at distance >= s (the last bucket's start) of a query with
  n such keys gets -log(n / n_train) added once n > n_train; nothing else
  moves. So at the training length the model is the T5 model itself."""
  cfg = ModelConfig(
    vocab_size=16, d_model=8, num_heads=2, num_layers=1, position="t5_bias",
    options=dict(t5_num_buckets=8, t5_max_distance=10), max_len=64,
  )  # fmt: skip
  start = last_bucket_start(num_buckets=8, max_distance=10)
  train_length, length = start + 3, 24  # n_train = 3
  with positions.ENCODINGS.scoped():
    t5_dilution._register_corrected_encoding()
    corrected_cfg = cfg.replace(
      position=t5_dilution.CORRECTED, options={"train_length": train_length}
    )
    assert corrected_cfg.options == {**cfg.options, "train_length": train_length}
    table = np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32)
    at = np.arange(length)[None]
    bias = {
      name: np.asarray(positions.encoding(c.position).bias(c, at, at, table, bidirectional=False))
      for name, c in (("plain", cfg), ("corrected", corrected_cfg))
    }
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]
    n_far = np.maximum(np.arange(length) - start + 1, 0)[:, None]
    expected = np.where(distance >= start, -np.log(np.maximum(n_far / 3, 1.0)), 0.0)
    shift = bias["corrected"] - bias["plain"]
    np.testing.assert_allclose(shift, np.broadcast_to(expected, shift.shape), atol=1e-6)
    assert expected[train_length - 1].min() == 0 > expected[train_length].min()

    tokens = np.random.default_rng(2).integers(0, 16, size=(2, train_length))
    params = build(cfg).init(jax.random.key(0), tokens)
    same = [np.asarray(build(c).apply(params, tokens)) for c in (cfg, corrected_cfg)]
    np.testing.assert_array_equal(*same)


@pytest.mark.parametrize("point", RECORDED["points"], ids=lambda p: str(p["t5_max_distance"]))
def test_the_recorded_losses_as_trained_are_the_sweeps_committed_extrapolation(point):
  """The file's 'as trained' losses recomputed what the sweep's
  extrapolation.json holds, replica by replica, on the same tokens."""
  max_distance = point["t5_max_distance"]
  point_dir = SWEEP / f"t5_max_distance={max_distance}"
  record = json.loads((point_dir / "extrapolation.json").read_text())
  assert point["tokens"] == record["num_tokens"] and point["train_length"] == record["train_length"]
  assert point["last_bucket_start"] == last_bucket_start(max_distance=max_distance)
  for length, losses in point["versions"]["as trained"]["sliding"].items():
    at = record["lengths"].index(int(length))
    np.testing.assert_allclose(losses, record["replica_loss"]["sliding"][at], rtol=1e-6)


@pytest.mark.parametrize("point", RECORDED["points"], ids=lambda p: str(p["t5_max_distance"]))
def test_within_the_training_length_the_three_versions_are_one_function(point):
  """Binned by position: every version's loss and last-bucket mass agree over
  the training length (no query there has more than n_train last-bucket
  keys, nor more keys than the window), and bins wholly before the last
  bucket's start hold no mass."""
  bins = RECORDED["length"] // RECORDED["bin"]
  inside = point["train_length"] // RECORDED["bin"]
  for field in ("loss_by_position", "last_bucket_mass_by_position"):
    by_version = np.array([point["versions"][name][field] for name in t5_dilution.VERSIONS])
    assert by_version.shape == (3, bins)
    inside_3xI = by_version[:, :inside]
    first_3xI = np.broadcast_to(inside_3xI[0], inside_3xI.shape)
    np.testing.assert_allclose(inside_3xI, first_3xI, rtol=1e-5)
  mass = np.array(point["versions"]["as trained"]["last_bucket_mass_by_position"])
  before = point["last_bucket_start"] // RECORDED["bin"]
  assert not mass[:before].any() and (mass[before:] > 0).all()


def test_the_pages_table_is_the_recorded_file():
  page = (REPO / "docs" / "results.md").read_text()
  assert page.count("<!-- t5_dilution -->") == 1
  assert t5_dilution.rewrite(page, RECORDED) == page
  changed = copy.deepcopy(RECORDED)
  changed["points"][0]["versions"]["corrected"]["sliding"]["2048"][0] += 0.05
  assert t5_dilution.rewrite(page, changed) != page


def test_runs_without_a_point_are_refused_in_one_line(tmp_path, capsys):
  (tmp_path / "t5_max_distance=32").mkdir()
  assert t5_dilution.main(["--runs", str(tmp_path)]) == 2
  assert capsys.readouterr().err == f"--runs: {tmp_path} has no point t5_max_distance=64\n"


def test_the_figures_legend_names_each_colour_and_style_once(tmp_path, monkeypatch):
  """Before, a shared legend of 'max distance M, version' listed 'window 128'
  three times, though only the right panel draws it, and the loss panel's
  title said 'mean over spans of 128' for the mean over 128 positions."""
  from txf.analysis import plots

  drawn = []
  monkeypatch.setattr(plots, "save_figure", lambda figure, path: drawn.append(figure))
  t5_dilution.figure(json.loads(t5_dilution.DATA.read_text()), tmp_path / "dilution.png")
  (figure,) = drawn
  (legend,) = figure.legends
  labels = [text.get_text() for text in legend.texts]
  assert labels == [
    *(f"max distance {m}" for m in t5_dilution.MAX_DISTANCES),
    "as trained",
    "corrected",
    "window 128 (right panel only)",
  ]
  assert figure.axes[1].get_title() == "Loss by position (each point: the mean over 128 positions)"
