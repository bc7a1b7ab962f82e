"""Circuits beyond ablation: composition scores, path patching, phase change,
their tables and figures, and docs/induction.md against its raw outputs.

Cheap: tiny models with parameters drawn here (no training; the trained
circuit is tests/evaluate/test_induction_circuit.py's, marked slow), float64 numpy
references (tests/numpy_references.py's layers) for the numerics, and
one compiled patching program per probe shape, shared by the tests through
txf.analysis.patching's cache. Each per-layer analysis is also run at three
layers (random parameters and synthetic tables), where layer 1, the last
layer and layer l + 1 differ, so an analysis reading the wrong one fails.
"""

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import REPO
from numpy_references import f64, np_block, np_embed, np_ffn, np_norm, np_rope
from tools import induction_docs
from txf import ops
from txf.analysis import circuit_report, composition, patching, phase_change, plots
from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.circuits import analyze_circuits
from txf.analysis.head_scores import induction_score, repeated_random_tokens
from txf.analysis.plots import save_figure
from txf.layers.model_config import ModelConfig
from txf.models import build

DOCS = REPO / "docs"
TINY = dict(vocab_size=24, d_model=32, num_heads=4, num_layers=2, max_len=32)
PERIOD = 6
LENGTH = 2 * PERIOD  # the probe: a block of 6, twice
PROBE_ROWS = 16
IDS = np.arange(4, TINY["vocab_size"])


def tiny(**changes):
  """(model, params): a tiny RoPE LayerNorm decoder with parameters N(0, 0.3^2)
  drawn here (the shapes from jax.eval_shape: no compilation), norms'
  scales around 1: random weights, no circuit."""
  cfg = ModelConfig(**{**TINY, **changes})
  model = build(cfg)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, LENGTH), jnp.int32))
  rng = np.random.default_rng(1)

  def draw(path, shape):
    values = 0.3 * rng.normal(size=shape.shape)
    if path[-1].key == "scale":
      values = values + 1
    return jnp.asarray(values, jnp.float32)

  return model, jax.tree_util.tree_map_with_path(draw, nn.meta.unbox(shapes["params"]))


@pytest.fixture(scope="module")
def model_and_params():
  return tiny()


def probe(seed=0):
  """(clean, corrupt) int [PROBE_ROWS, LENGTH]: `analyze_circuits`' draws at `seed`."""
  rng = np.random.default_rng(seed)
  clean = repeated_random_tokens(rng, PROBE_ROWS, PERIOD, TINY["vocab_size"], ids=IDS)
  return clean, patching.corrupted_tokens(rng, clean, IDS)


# ---------------------------------------------------------------------------
# Composition scores.


def np_fold(norm_params, d_model):
  """C diag(scale): LayerNorm's centring and scale as a matrix."""
  return (np.eye(d_model) - 1 / d_model) @ np.diag(norm_params["scale"])


def np_composition(params, writer, reader, num_kv_heads=None, fold=None):
  """{'q', 'k', 'v': float64 [H, H]}: the paper's three norm ratios of every
  head of layer `writer` into every head of layer `reader`, from the kernels
  of a tiny() model folded with `fold(norm_params, d_model)` (np_fold's
  LayerNorm by default)."""
  fold = fold or np_fold
  p = f64(params)["stack"]
  H, norm = TINY["num_heads"], np.linalg.norm
  group = H // (num_kv_heads or H)
  first, second = (p[f"block_{layer}"]["self_attention"] for layer in (writer, reader))
  fold1, fold2 = (
    fold(p[f"block_{layer}"]["self_attention_norm"], TINY["d_model"]) for layer in (writer, reader)
  )
  scores = {kind: np.empty((H, H)) for kind in composition.COMPOSITIONS}
  for h1 in range(H):
    ov1 = fold1 @ first["value"]["kernel"][:, h1 // group] @ first["out"]["kernel"][h1]
    for h2 in range(H):
      q2 = fold2 @ second["query"]["kernel"][:, h2]
      k2 = fold2 @ second["key"]["kernel"][:, h2 // group]
      v2 = fold2 @ second["value"]["kernel"][:, h2 // group]
      qk2, ov2 = q2 @ k2.T, v2 @ second["out"]["kernel"][h2]
      scores["q"][h1, h2] = norm(ov1 @ qk2) / (norm(ov1) * norm(qk2))
      scores["k"][h1, h2] = norm(qk2 @ ov1.T) / (norm(ov1) * norm(qk2))
      scores["v"][h1, h2] = norm(ov1 @ ov2) / (norm(ov1) * norm(ov2))
  return scores


@pytest.mark.parametrize("num_kv_heads", [None, 2])
def test_composition_scores_match_a_float64_reference(num_kv_heads):
  """Per pair, the paper's three norms ratios from the folded kernels
  (rtol 1e-9: the same float64 products in another order)."""
  _, params = tiny(num_kv_heads=num_kv_heads)
  scores = composition.composition_scores(params)
  for kind, values in np_composition(params, 0, 1, num_kv_heads).items():
    np.testing.assert_allclose(scores[kind][0], values, rtol=1e-9, err_msg=kind)
  # No circuit: every pair composes like random matrices, near the baseline.
  baseline = composition.random_composition_baseline(32, 8)
  for kind in composition.COMPOSITIONS:
    assert abs(baseline[kind] - 1 / np.sqrt(32)) < 0.02
    assert np.all(np.abs(scores[kind] - baseline[kind]) < 0.08), (kind, scores[kind])


@pytest.mark.parametrize(
  "norm, fold_norm, fold",
  [
    ("rms", True, lambda norm_params, d: np.diag(norm_params["scale"])),  # no centring
    ("layer", False, lambda norm_params, d: np.eye(d)),  # a Post-LN run's: nothing folded
  ],
)
def test_composition_scores_fold_each_norm_as_it_acts(norm, fold_norm, fold):
  # tiny() is LayerNorm and every call folded it: RMSNorm centred, or
  # fold_norm=False ignored, passed.
  _, params = tiny(norm=norm)
  scores = composition.composition_scores(params, fold_norm=fold_norm)
  for kind, values in np_composition(params, 0, 1, fold=fold).items():
    np.testing.assert_allclose(scores[kind][0], values, rtol=1e-9, err_msg=kind)
  assert not np.allclose(scores["q"][0], np_composition(params, 0, 1)["q"], rtol=1e-6)


def test_composition_over_rope_distances_is_the_mean_of_each_distances():
  _, params = tiny()
  at = {d: composition.composition_scores(params, rope_distances=(d,)) for d in (0, 3)}
  both = composition.composition_scores(params, rope_distances=(0, 3))
  for kind in composition.COMPOSITIONS:
    np.testing.assert_allclose(both[kind], (at[0][kind] + at[3][kind]) / 2, rtol=1e-12)
  assert not np.allclose(at[0]["k"], at[3]["k"])  # the distance reaches W_QK
  np.testing.assert_allclose(at[0]["v"], at[3]["v"], rtol=1e-12)  # V reads no W_QK


def unscanned(params, num_layers):
  """Scanned parameters (the stack's `blocks`, a leading layer axis) as
  `block_0` .. `block_{num_layers - 1}`."""
  blocks = params["stack"]["blocks"]
  return {
    **params,
    "stack": {
      **{name: value for name, value in params["stack"].items() if name != "blocks"},
      **{
        f"block_{layer}": jax.tree.map(lambda x, at=layer: x[at], blocks)
        for layer in range(num_layers)
      },
    },
  }


def test_scanned_layers_compose_like_unscanned_ones():
  """Three layers: the scanned blocks' layer axis is read layer by layer."""
  _, scanned = tiny(scan_layers=True, num_layers=3)
  by_layer = unscanned(scanned, 3)
  for kind, values in composition.composition_scores(scanned).items():
    np.testing.assert_allclose(values, composition.composition_scores(by_layer)[kind], rtol=1e-12)
  one_layer = {"stack": {"block_0": by_layer["stack"]["block_0"]}}
  assert composition.composition_scores(one_layer)["k"].shape == (0, 4, 4)


def planted_params(seed=0, d_model=32, num_heads=4, head_dim=4):
  """Two layers of Gaussian projections, one circuit planted: head 1 of
  layer 0 writes only into features 0..3; head 2 of layer 1 reads its keys
  only from there and its queries only from elsewhere; head 3 of layer 1
  reads its values only from there."""
  rng = np.random.default_rng(seed)
  D, H, E = d_model, num_heads, head_dim
  shapes = {"query": (D, H, E), "key": (D, H, E), "value": (D, H, E), "out": (H, E, D)}
  blocks = [
    {"self_attention": {name: {"kernel": rng.normal(size=shape)} for name, shape in shapes.items()}}
    for _ in range(2)
  ]
  written = np.arange(D) < 4
  blocks[0]["self_attention"]["out"]["kernel"][1][:, ~written] = 0
  blocks[1]["self_attention"]["key"]["kernel"][~written, 2] = 0
  blocks[1]["self_attention"]["query"]["kernel"][written, 2] = 0
  blocks[1]["self_attention"]["value"]["kernel"][~written, 3] = 0
  return {"stack": {"block_0": blocks[0], "block_1": blocks[1]}}


def test_a_planted_circuit_is_found_on_its_path_and_pair_only():
  scores = composition.composition_scores(planted_params())
  k_HxH, q_HxH, v_HxH = (scores[kind][0] for kind in "kqv")
  others = lambda scores_HxH, pair: np.delete(scores_HxH.ravel(), pair[0] * 4 + pair[1])
  assert np.unravel_index(np.argmax(k_HxH), k_HxH.shape) == (1, 2)
  assert k_HxH[1, 2] > 2 * others(k_HxH, (1, 2)).max()
  assert q_HxH[1, 2] < 1e-12  # it writes where head 2's queries do not read
  assert np.unravel_index(np.argmax(v_HxH), v_HxH.shape) == (1, 3)
  assert v_HxH[1, 3] > 1.5 * others(v_HxH, (1, 3)).max()
  # the rest compose like random matrices of these shapes
  baseline = composition.random_composition_baseline(32, 4)
  assert abs(others(k_HxH, (1, 2)).mean() - baseline["k"]) < 0.05


def test_rope_rotation_is_the_query_key_distance_of_apply_rope():
  rng = np.random.default_rng(0)
  q_1xTx1xE, k_1xTx1xE = rng.normal(size=(2, 1, 10, 1, 8)).astype(np.float32)
  positions = np.arange(10)
  q_rot = np.asarray(ops.apply_rope(q_1xTx1xE, positions, base=100.0, scale=2.0), np.float64)
  k_rot = np.asarray(ops.apply_rope(k_1xTx1xE, positions, base=100.0, scale=2.0), np.float64)
  q_TxE, k_TxE = q_1xTx1xE[0, :, 0].astype(np.float64), k_1xTx1xE[0, :, 0].astype(np.float64)
  for t, s in ((7, 2), (3, 3), (9, 0)):
    rotation = composition.rope_rotation(t - s, 8, base=100.0, scale=2.0)
    np.testing.assert_allclose(
      q_rot[0, t, 0] @ k_rot[0, s, 0], q_TxE[t] @ rotation @ k_TxE[s], rtol=1e-5
    )
    # np_rope, the layer references' float64 RoPE, agrees
    reference = np_rope(q_1xTx1xE.astype(np.float64), positions, 100.0, 2.0)[0, t, 0]
    np.testing.assert_allclose(
      reference, q_TxE[t] @ composition.rope_rotation(t, 8, base=100.0, scale=2.0)
    )


def test_a_folded_circuit_is_the_logit_of_normalised_rows_up_to_their_scales(model_and_params):
  """W_QK with LayerNorm folded in gives the model's attention logit up to the
  per-token 1/std (and the norm's bias, set to 0 here): what the scores ignore."""
  _, params = model_and_params
  p = f64(params)["stack"]["block_1"]
  norm = {**p["self_attention_norm"], "bias": np.zeros(32)}
  attention = p["self_attention"]
  x_q, x_k = np.random.default_rng(2).normal(size=(2, 32)) * 3 + 1
  qk_LxHxDxD, _ = composition.head_circuits(params, rope_distance=5)
  stds = [np.sqrt(np.var(x) + 1e-6) for x in (x_q, x_k)]
  for head in range(4):
    query = np_norm(norm, x_q, "layer", 1e-6) @ attention["query"]["kernel"][:, head]
    key = np_norm(norm, x_k, "layer", 1e-6) @ attention["key"]["kernel"][:, head]
    logit = query @ composition.rope_rotation(5, 8) @ key
    np.testing.assert_allclose(
      logit * stds[0] * stds[1], x_q @ qk_LxHxDxD[1, head] @ x_k, rtol=1e-9
    )


# ---------------------------------------------------------------------------
# Path patching.


def np_weights(p_attention, h_query_BxTxD, h_key_BxTxD, rope_base):
  """float64 causal RoPE attention weights [B, H, T, T], queries and keys
  projected from their own normalised rows."""
  positions = np.arange(h_query_BxTxD.shape[1])
  project = lambda h, name: np_rope(
    np.tensordot(h, p_attention[name]["kernel"], 1), positions, rope_base, 1.0
  )
  q_BxTxHxE, k_BxTxHxE = project(h_query_BxTxD, "query"), project(h_key_BxTxD, "key")
  scores = np.einsum("bthe,bshe->bhts", q_BxTxHxE, k_BxTxHxE) / np.sqrt(q_BxTxHxE.shape[-1])
  scores = np.where(np.tril(np.ones(scores.shape[-2:], bool)), scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


def np_head_output(p_attention, h_BxTxD, head, rope_base):
  """float64 [B, T, D]: one head's share of the attention output (its z W_O)."""
  weights_BxTxT = np_weights(p_attention, h_BxTxD, h_BxTxD, rope_base)[:, head]
  values_BxTxE = np.tensordot(h_BxTxD, p_attention["value"]["kernel"][:, head], 1)
  z_BxTxE = np.einsum("bts,bse->bte", weights_BxTxT, values_BxTxE)
  return z_BxTxE @ p_attention["out"]["kernel"][head]


def np_residual_streams(params, cfg, tokens_BxT, num_layers):
  """float64 [B, T, D]: the residual stream entering block `num_layers` of
  a tiny() decoder (the embedding, then that many blocks)."""
  p = f64(params)
  x = np_embed(p["embedder"], tokens_BxT, np.arange(tokens_BxT.shape[1]), "rope")
  valid = np.ones(np.shape(tokens_BxT), bool)
  for layer in range(num_layers):
    x = np_block(p["stack"][f"block_{layer}"], x, cfg, causal=True, self_valid=valid)
  return x


def np_patched_weights(params, cfg, clean, corrupt, head, path, source_layer=0):
  """Layer source_layer + 1's attention weights on `clean`, head `head` (an
  int, or a sequence of heads patched together) of `source_layer` patched
  from `corrupt` on `path` ('q' / 'k': the queries' / keys' input only;
  'all': everywhere): the module docstring of txf.analysis.patching,
  written out in float64."""
  p = f64(params)["stack"]
  source, target = f"block_{source_layer}", f"block_{source_layer + 1}"
  norm = lambda block, name, x: np_norm(p[block][f"{name}_norm"], x, "layer", cfg.norm_eps)
  attention0, attention1 = (p[block]["self_attention"] for block in (source, target))
  entering = [np_residual_streams(params, cfg, tokens, source_layer) for tokens in (clean, corrupt)]
  normed0 = [norm(source, "self_attention", x) for x in entering]
  clean_out = sum(
    np_head_output(attention0, normed0[0], other, cfg.option("rope_base")) for other in range(4)
  )
  delta = sum(
    np_head_output(attention0, normed0[1], one, cfg.option("rope_base"))
    - np_head_output(attention0, normed0[0], one, cfg.option("rope_base"))
    for one in ([head] if isinstance(head, int) else head)
  )
  mid = entering[0] + clean_out + (delta if path == "all" else 0)
  x1 = mid + np_ffn(p[source]["ffn"], norm(source, "ffn", mid), cfg.activation)
  h_clean, h_patched = (norm(target, "self_attention", x) for x in (x1, x1 + delta))
  h_query = h_patched if path == "q" else h_clean
  h_key = h_patched if path == "k" else h_clean
  return np_weights(attention1, h_query, h_key, cfg.option("rope_base"))


@pytest.fixture(scope="module")
def patched_fn(model_and_params):
  model, _ = model_and_params
  return jax.jit(patching.patched_attention_fn(model))


@pytest.mark.parametrize("path", ["q", "k", "all"])
def test_path_patching_matches_a_float64_reference(model_and_params, patched_fn, path):
  """float32 model against float64 numpy: atol 2e-5 on attention weights
  (two layers of float32 roundings)."""
  model, params = model_and_params
  clean, corrupt = probe()
  selector = patching.path_selector(path)
  patched = patched_fn(params, clean, corrupt, np.eye(4, dtype=np.float32)[2], selector)
  expected = np_patched_weights(params, model.cfg, clean, corrupt, 2, path)
  np.testing.assert_allclose(patched, expected, atol=2e-5)
  unpatched = np_patched_weights(params, model.cfg, clean, clean, 2, path)
  assert np.abs(expected - unpatched).max() > 1e-3  # the patch changes something
  # Patching no head, or from a corrupted prompt equal to the clean one: the model's own weights.
  for corrupt_BxT, heads_H in ((clean, np.eye(4)[2]), (corrupt, np.zeros(4))):
    same = patched_fn(params, clean, corrupt_BxT, heads_H.astype(np.float32), selector)
    np.testing.assert_allclose(same, unpatched, atol=2e-5)


def test_patching_a_random_model_moves_nothing(model_and_params):
  """No circuit (random weights): no head of layer 0 moves layer 1's
  induction scores on any path; the value path never moves attention."""
  model, params = model_and_params
  clean, corrupt = probe()
  effects = patching.path_patching(model, params, clean, corrupt, PERIOD)
  assert effects["clean"].shape == (4,) and effects["k"].shape == (4, 4)
  assert np.all(effects["v"] == 0)
  for path in ("q", "k", "all"):
    assert np.abs(effects[path]).max() < 0.05, (path, effects[path])
  assert np.abs(effects["clean"] - effects["corrupted_source"]).max() < 0.1


def test_analyze_circuits_of_a_random_model_is_a_json_record_at_the_baseline(model_and_params):
  """The record of a model without a circuit: composition at the random
  level, patching effects near 0, averaged over the (here one) period."""
  model, params = model_and_params
  record = json.loads(json.dumps(analyze_circuits(model, params, IDS, [PERIOD], batch=PROBE_ROWS)))
  assert record["periods"] == [PERIOD] and record["baseline"]["k"] == pytest.approx(
    1 / np.sqrt(32), abs=0.02
  )
  assert np.array(record["composition"]["k"]).shape == (1, 4, 4)
  assert np.array(record["composition_rope"]["k"]).shape == (1, 4, 4)
  assert np.all(np.abs(np.array(record["composition"]["k"]) - record["baseline"]["k"]) < 0.08)
  (entry,) = record["patching"]
  assert set(entry) == {"source_layer", "clean", "corrupted_source", *patching.PATTERN_PATHS}
  assert record["patching_by_period"] == {str(PERIOD): [entry]}  # one period: its own mean
  # The same draws as probe(0): the same effects as path_patching's.
  clean, corrupt = probe()
  direct = patching.path_patching(model, params, clean, corrupt, PERIOD, paths=("k",))
  np.testing.assert_allclose(entry["k"], direct["k"], rtol=0, atol=1e-12)


@pytest.mark.parametrize(
  "changes, match",
  [
    (dict(norm_placement="post"), "Pre-LN"),
    (dict(scan_layers=True), "scan_layers"),
    (dict(num_layers=1), "no next layer"),
  ],
)
def test_path_patching_refuses_what_it_cannot_patch(changes, match):
  model = build(ModelConfig(**{**TINY, **changes}))
  with pytest.raises(ValueError, match=match):
    patching.patched_attention_fn(model, 0)


def test_corrupted_tokens_have_no_repeated_block():
  clean, corrupt = probe()
  assert corrupt.shape == clean.shape and corrupt.dtype == np.int32
  half = LENGTH // 2
  assert not np.any(np.all(corrupt[:, :half] == corrupt[:, half:], axis=1))
  assert all(len(set(row[:half])) == half for row in corrupt)  # distinct within a block
  with pytest.raises(ValueError, match="even"):
    patching.corrupted_tokens(np.random.default_rng(0), clean[:, :-1], IDS)
  with pytest.raises(ValueError, match="path"):
    patching.path_selector("o")
  # A block takes distinct ids: a pool of exactly its length fills each
  # block with the pool itself; one id fewer cannot.
  pool = IDS[:half]
  exact = patching.corrupted_tokens(np.random.default_rng(0), clean, pool)
  for block in (exact[:, :half], exact[:, half:]):
    assert all(sorted(row) == pool.tolist() for row in block)
  with pytest.raises(
    ValueError, match=f"^ids: {half - 1} distinct ids cannot fill a block of {half}$"
  ):
    patching.corrupted_tokens(np.random.default_rng(0), clean, pool[:-1])


def test_path_patching_refuses_paths_that_are_not_some_of_PATHS(model_and_params):
  """Before anything runs: no path at all (which returned the clean and
  corrupted scores alone), or one that is not a path."""
  model, params = model_and_params
  clean, corrupt = probe()
  for paths, named in (((), r"\[\]"), (("k", "o"), r"\['o'\]")):
    with pytest.raises(
      ValueError, match=rf"^paths: {named} are not some of \['q', 'k', 'v', 'all'\]$"
    ):
      patching.path_patching(model, params, clean, corrupt, PERIOD, paths=paths)


# ---------------------------------------------------------------------------
# Scores over training.


def test_steepest_fall():
  assert phase_change.steepest_fall([0, 10, 20, 40], [5.0, 4.0, 1.0, 0.0]) == (10, 20, 0.3)
  # per step: the drop 4 -> 0 over 40 steps is slower than 0 -> -1 over 2
  assert phase_change.steepest_fall([0, 40, 42], [4.0, 0.0, -1.0])[:2] == (40, 42)
  assert phase_change.steepest_fall([0, 1, 2], [2.0, 1.0, 0.0]) == (0, 1, 1.0)  # ties: earliest
  for steps, values in (([0], [1.0]), ([0, 0], [1.0, 2.0]), ([0, 1], [1.0])):
    with pytest.raises(ValueError):
      phase_change.steepest_fall(steps, values)


def synthetic_training(num_steps=12, jump=5):
  """Scores over training with a phase change between steps jump and jump + 1;
  the loss also falls (more slowly) before it."""
  steps = np.arange(1, num_steps + 1) * 10
  rising = (np.arange(num_steps) > jump).astype(np.float64)
  previous = np.full((num_steps, 2, 3), 0.05)
  previous[:, 0, 1] = 0.1 + 0.8 * rising
  induction = np.full((num_steps, 2, 3), 0.02)
  induction[:, 1] = 0.05 + 0.9 * rising[:, None] * np.array([1.0, 0.9, 0.8])
  k_composition = np.full((num_steps, 1, 3, 3), 0.12)
  k_composition[:, 0, 1] += 0.1 * rising[:, None]
  return {
    "steps": steps,
    "loss": 3.0 - 2.9 * rising - 0.01 * np.arange(num_steps),
    "accuracy": 0.1 + 0.85 * rising,
    "previous_token": previous,
    "induction": induction,
    "k_composition": k_composition,
  }


def test_phase_change_and_the_training_csv_round_trip(tmp_path):
  training = synthetic_training()
  change = phase_change.phase_change(training)
  assert change["previous_token_head"] == "L0H1"
  for name in ("accuracy", "loss", "induction", "previous_token", "k_composition"):
    assert change[name]["steps"] == [60, 70], name
  assert change["loss"]["values"] == pytest.approx([3.0 - 0.05, 0.1 - 0.06])
  assert change["k_composition"]["values"] == pytest.approx([0.12, 0.22])
  path = phase_change.write_training_csv(training, tmp_path / "scores.csv")
  read = phase_change.read_training_csv(path)
  for name, values in training.items():
    np.testing.assert_array_equal(read[name], values, err_msg=name)  # full precision
  assert circuit_report.phase_change_table({"run one": read}).splitlines()[2] == (
    "| run one | steps 60-70: 0.10 -> 0.95 (2.95 -> 0.04 nats) | steps 60-70: 0.05 -> 0.86 "
    "| L0H1, steps 60-70: 0.10 -> 0.90 | steps 60-70: 0.120 -> 0.220 |"
  )
  path.write_text(path.read_text().replace("eval_loss", "loss", 1))
  with pytest.raises(ValueError, match="not a training scores file"):
    phase_change.read_training_csv(path)


# ---------------------------------------------------------------------------
# Three layers: layer 1, the last layer (-1) and layer l + 1 are no longer
# the same layer, so an analysis that reads the wrong one gives another answer.


@pytest.fixture(scope="module")
def three_layers():
  return tiny(num_layers=3)


def test_composition_of_three_layers_pairs_each_layer_with_the_next(three_layers):
  """Entry l is layer l into layer l + 1 (rtol 1e-9 against np_composition),
  and the pairings a wrong index would make score otherwise."""
  _, params = three_layers
  scores = composition.composition_scores(params)
  assert scores["k"].shape == (2, 4, 4)
  reference = {pair: np_composition(params, *pair) for pair in ((0, 1), (1, 2), (0, 2))}
  for layer in (0, 1):
    for kind, values in reference[layer, layer + 1].items():
      np.testing.assert_allclose(scores[kind][layer], values, rtol=1e-9, err_msg=(layer, kind))
  for wrong, right in (((0, 2), (0, 1)), ((0, 2), (1, 2)), ((0, 1), (1, 2))):
    assert np.abs(reference[wrong]["k"] - reference[right]["k"]).max() > 1e-3


def test_attention_maps_of_three_layers_are_each_layers_own(three_layers):
  """maps_by_kind's l-th map is block l's weights, scanned or not (atol 2e-5
  against float64: three layers of float32 roundings)."""
  model, params = three_layers
  clean, _ = probe()
  p = f64(params)["stack"]
  expected = []
  for layer in range(3):
    x = np_residual_streams(params, model.cfg, clean, layer)
    normed = np_norm(p[f"block_{layer}"]["self_attention_norm"], x, "layer", model.cfg.norm_eps)
    expected.append(
      np_weights(
        p[f"block_{layer}"]["self_attention"], normed, normed, model.cfg.option("rope_base")
      )
    )
  assert np.abs(expected[1] - expected[2]).max() > 1e-2  # the layers attend differently
  scanned = build(ModelConfig(**{**TINY, "num_layers": 3, "scan_layers": True}))
  restacked = {
    **params,
    "stack": {
      "blocks": jax.tree.map(
        lambda *layers: jnp.stack(layers), *(params["stack"][f"block_{i}"] for i in range(3))
      ),
      "final_norm": params["stack"]["final_norm"],
    },
  }
  for name, (kind_model, kind_params) in {
    "unscanned": (model, params),
    "scanned": (scanned, restacked),
  }.items():
    layers = maps_by_kind(attention_maps(kind_model, kind_params, clean))["self"]
    assert len(layers) == 3, name
    for layer, weights_BxHxTxT in enumerate(layers):
      np.testing.assert_allclose(weights_BxHxTxT, expected[layer], atol=2e-5, err_msg=name)


@pytest.mark.parametrize("source_layer", [0, 1])
def test_path_patching_of_three_layers_measures_the_next_layer(three_layers, source_layer):
  """The heads of source_layer + 1 are measured, on the key path and every
  path, against the float64 patched weights (atol 2e-5 on scores that
  average attention weights); the clean scores of layers 1 and 2 differ.
  corrupted_source is every head of source_layer patched on every path
  (which differs from patching them on the key path alone by over 1e-3)."""
  model, params = three_layers
  clean, corrupt = probe()
  effects = patching.path_patching(
    model, params, clean, corrupt, PERIOD, source_layer=source_layer, paths=("k", "all")
  )
  score = lambda weights: induction_score(weights, PERIOD)
  clean_by_target = {
    target: score(np_patched_weights(params, model.cfg, clean, clean, 0, "all", target - 1))
    for target in (1, 2)
  }
  assert np.abs(clean_by_target[1] - clean_by_target[2]).max() > 1e-3
  np.testing.assert_allclose(effects["clean"], clean_by_target[source_layer + 1], atol=2e-5)
  for path in ("k", "all"):
    expected_HxH = np.stack(
      [
        clean_by_target[source_layer + 1]
        - score(np_patched_weights(params, model.cfg, clean, corrupt, head, path, source_layer))
        for head in range(4)
      ]
    )
    np.testing.assert_allclose(effects[path], expected_HxH, atol=2e-5, err_msg=path)
  every_head = {
    path: score(np_patched_weights(params, model.cfg, clean, corrupt, range(4), path, source_layer))
    for path in ("k", "all")
  }
  assert np.abs(every_head["k"] - every_head["all"]).max() > 1e-3
  np.testing.assert_allclose(effects["corrupted_source"], every_head["all"], atol=2e-5)


def test_analyze_circuits_of_three_layers_records_every_source_layer(three_layers):
  """One patching entry per layer that has a next one, each path_patching's
  of that layer; composition [L - 1, H, H]."""
  model, params = three_layers
  record = analyze_circuits(model, params, IDS, [PERIOD], batch=PROBE_ROWS)
  np.testing.assert_array_equal(
    record["composition"]["k"], composition.composition_scores(params)["k"]
  )
  assert [entry["source_layer"] for entry in record["patching"]] == [0, 1]
  clean, corrupt = probe()  # analyze_circuits' draws
  for entry in record["patching"]:
    direct = patching.path_patching(
      model, params, clean, corrupt, PERIOD, source_layer=entry["source_layer"], paths=("k",)
    )
    for name in ("clean", "k"):
      np.testing.assert_allclose(entry[name], direct[name], rtol=0, atol=1e-12)


def test_analyze_circuits_averages_the_periods_and_composes_over_their_rope_distances():
  """Two periods (4 and 6): each patching entry is the mean of its two
  per-period entries, which differ. composition_rope is composition_scores
  (a direct call) over the distances 0 .. 2 * 6 - 1 under the model's own
  rope_scale (2 here), each of which moves the scores. No period at all
  is refused."""
  model, params = tiny(options=dict(rope_scale=2.0))
  with pytest.raises(ValueError, match="^periods: at least one"):
    analyze_circuits(model, params, IDS, [], batch=PROBE_ROWS)
  record = analyze_circuits(model, params, IDS, [4, PERIOD], batch=PROBE_ROWS)
  (entry,) = record["patching"]
  by_period = [record["patching_by_period"][period][0] for period in ("4", str(PERIOD))]
  for name in ("clean", "corrupted_source", *patching.PATTERN_PATHS):
    np.testing.assert_allclose(
      entry[name], np.mean([one[name] for one in by_period], axis=0), rtol=1e-12, err_msg=name
    )
    for one in by_period:
      assert np.abs(np.subtract(entry[name], one[name])).max() > 1e-4, name
  rope = lambda distances, scale: composition.composition_scores(
    params, rope_distances=distances, rope_scale=scale
  )["k"]
  expected = rope(range(2 * PERIOD), 2.0)
  np.testing.assert_allclose(record["composition_rope"]["k"], expected, rtol=1e-12)
  for other in (rope(range(PERIOD), 2.0), rope(range(2 * PERIOD), 1.0)):
    assert np.abs(expected - other).max() > 1e-3


@pytest.fixture
def seen(monkeypatch):
  """[(period, clean_BxT, corrupt_BxT)] of each path_patching call
  analyze_circuits makes, recorded as it passes them on."""
  from txf.analysis import circuits

  calls = []
  real = circuits.path_patching

  def recording(model, params, clean_BxT, corrupt_BxT, period, **kwargs):
    calls.append((period, np.asarray(clean_BxT), np.asarray(corrupt_BxT)))
    return real(model, params, clean_BxT, corrupt_BxT, period, **kwargs)

  monkeypatch.setattr(circuits, "path_patching", recording)
  return calls


def test_each_periods_patching_prompts_are_the_head_scores_probe_in_any_order(seen):
  """Each period's clean prompts are induction_probe's at that period (what
  head_scores.csv's induction_p<P> scores), so the record does not depend on
  the order of the periods: one generator for all drew the second period's
  prompts after the first's."""
  from txf.analysis.head_scores import induction_probe

  model, params = tiny()
  forward = analyze_circuits(model, params, IDS, [4, PERIOD], batch=PROBE_ROWS, seed=3)
  backward = analyze_circuits(model, params, IDS, [PERIOD, 4], batch=PROBE_ROWS, seed=3)
  for period in ("4", str(PERIOD)):
    assert forward["patching_by_period"][period] == backward["patching_by_period"][period]
  vocab_size = model.cfg.vocab_size
  for period, clean, corrupt in seen:
    np.testing.assert_array_equal(clean, induction_probe(3, PROBE_ROWS, period, vocab_size, IDS))
    assert not np.array_equal(corrupt[:, :period], corrupt[:, period:])


def test_each_periods_corrupted_prompts_share_no_block_with_its_clean_ones(seen):
  """The corrupted source of each period is drawn after its clean prompts by
  the same generator: one seeded alike afresh drew the clean prompts' blocks
  again (row 0's first block, row 1's as row 0's second), so the "corrupted"
  run held the very block the induction head copies from."""
  model, params = tiny()
  analyze_circuits(model, params, IDS, [4, PERIOD], batch=PROBE_ROWS, seed=3)
  assert sorted({period for period, *_ in seen}) == [4, PERIOD]
  for period, clean, corrupt in seen:
    clean_blocks = {tuple(row[:period]) for row in clean}
    corrupt_blocks = {tuple(block) for row in corrupt for block in (row[:period], row[period:])}
    assert not clean_blocks & corrupt_blocks, period


def rising(num_steps, after):
  """float64 [num_steps]: 0 up to index `after`, 1 from index after + 1."""
  return (np.arange(num_steps) > after).astype(np.float64)


def three_layer_training(num_steps=12):
  """Scores over training of 3 layers x 3 heads (steps 10, 20, ...) whose
  curves rise at different checkpoints in each layer: the accuracy after
  index 6; the induction scores of layer 1 after 3, of the last layer
  (2) after 7; the previous-token score of layer 0's top head (H1) after
  5, of layer 1's (H2) after 2, of layer 2's (H0) after 8; the K-composition
  of L0H1 into layer 1 after 4, of L1H1 into layer 2 after 9."""
  steps = np.arange(1, num_steps + 1) * 10
  rise = lambda after: rising(num_steps, after)
  previous = np.full((num_steps, 3, 3), 0.05)
  previous[:, 0, 1] = 0.1 + 0.8 * rise(5)
  previous[:, 1, 2] = 0.2 + 0.75 * rise(2)
  previous[:, 2, 0] = 0.3 + 0.65 * rise(8)
  induction = np.full((num_steps, 3, 3), 0.02)
  induction[:, 1] = 0.1 + 0.6 * rise(3)[:, None]
  induction[:, 2] = 0.05 + 0.9 * rise(7)[:, None] * np.array([1.0, 0.9, 0.8])
  k_composition = np.full((num_steps, 2, 3, 3), 0.12)
  k_composition[:, 0, 1] += 0.1 * rise(4)[:, None]
  k_composition[:, 1, 1] += 0.3 * rise(9)[:, None]
  return {
    "steps": steps,
    "loss": 3.0 - 2.9 * rise(6) - 0.01 * np.arange(num_steps),
    "accuracy": 0.1 + 0.85 * rise(6),
    "previous_token": previous,
    "induction": induction,
    "k_composition": k_composition,
  }


def test_phase_change_of_three_layers_reads_the_first_and_last_layers(tmp_path):
  """phase_change times the last layer's induction (not layer 1's), the
  first layer's top previous-token head (not layer 1's or the last's) and
  its K-composition into layer 1 (not layer 1's into layer 2), also after
  a round trip through the CSV file."""
  training = three_layer_training()
  steps, induction = training["steps"], training["induction"]
  span = lambda after: [int(steps[after]), int(steps[after + 1])]
  path = phase_change.write_training_csv(training, tmp_path / "scores.csv")
  read = phase_change.read_training_csv(path)
  assert read["k_composition"].shape == (12, 2, 3, 3)
  for name, values in training.items():
    np.testing.assert_array_equal(read[name], values, err_msg=name)
  change = phase_change.phase_change(read)
  assert change["previous_token_head"] == "L0H1"
  expected = {
    "accuracy": span(6),
    "induction": span(7),
    "previous_token": span(5),
    "k_composition": span(4),
  }
  assert {name: change[name]["steps"] for name in expected} == expected
  assert change["induction"]["values"] == pytest.approx(induction[[7, 8], 2].mean(axis=1))
  assert change["k_composition"]["values"] == pytest.approx([0.12, 0.22])


def test_training_figure_tells_every_layers_heads_apart():
  """Each (layer, head) curve has a style (colour, line style) of its own,
  in the previous-token and induction rows, at three layers."""
  figure = circuit_report.training_figure({"a": three_layer_training()}, title="Training")
  head_rows = [
    lines
    for axes in figure.axes
    if (lines := [line for line in axes.get_lines() if line.get_label().startswith("layer ")])
  ]
  assert len(head_rows) == 2
  for lines in head_rows:
    assert len(lines) == 9
    styles = {(line.get_color(), line.get_linestyle()) for line in lines}
    assert len(styles) == 9, sorted(styles)


def three_layer_record():
  """A circuits record of 3 layers x 3 heads: random scores and
  compositions, a patching entry per source layer whose effects differ."""
  rng = np.random.default_rng(3)
  return {
    "scores": {"previous_token": rng.random((3, 3)).tolist()},
    "composition": {kind: rng.random((2, 3, 3)).tolist() for kind in "qkv"},
    "baseline": {kind: 0.125 for kind in "qkv"},
    "patching": [
      {"source_layer": layer, **{path: rng.random((3, 3)).tolist() for path in ("k", "q", "all")}}
      for layer in (0, 1)
    ],
  }


def test_circuit_table_and_figures_of_a_layer_read_that_layer():
  """Layer 1 of three in the table: its own scores, its composition into
  layer 2 and its patching entry (each row against the record's values in
  numpy); layers 0 and 1 in the figures (values to 3 decimals)."""
  record = three_layer_record()
  lines = circuit_report.circuit_table({"r": record}, source_layer=1).splitlines()[2:]
  previous_H = np.asarray(record["scores"]["previous_token"])[1]
  assert [line.split(" | ")[1] for line in lines] == [
    f"L1H{head}" for head in np.argsort(-previous_H, kind="stable")
  ]
  for line in lines:
    head = int(line.split(" | ")[1][-1])
    composition_H = [np.asarray(record["composition"][kind])[1, head].mean() for kind in "qk"]
    effects_H = [np.asarray(record["patching"][1][path])[head].mean() for path in ("k", "q", "all")]
    assert line == (
      f"| r | L1H{head} | {previous_H[head]:.2f} | "
      + " | ".join(f"{value:.3f}" for value in [*composition_H, *effects_H])
      + " |"
    )
  for layer in (0, 1):  # the figures of either layer: layer -1 is only one of them
    figures = {
      "composition": circuit_report.composition_figure(record, title="C", layer=layer),
      "patching": circuit_report.patching_figure(record, title="P", source_layer=layer),
    }
    for name, expected in (
      ("composition", record["composition"]["q"][layer]),
      ("patching", record["patching"][layer]["k"]),
    ):
      axes = figures[name].axes[0]
      assert f"layer {layer + 1}" in axes.get_xlabel(), name
      assert f"layer {layer}" in axes.get_ylabel(), name
      assert [label.get_text() for label in axes.get_yticklabels()] == [
        f"L{layer}H{head}" for head in range(3)
      ]
      shown = sorted(float(text.get_text()) for text in axes.texts)
      assert shown == pytest.approx(sorted(np.ravel(expected)), abs=5e-4), (name, layer)


# ---------------------------------------------------------------------------
# Tables and figures.


def synthetic_record():
  rng = np.random.default_rng(0)
  return {
    "step": 100,
    "scores": {
      "previous_token": [[0.3, 0.9, 0.6], [0.1, 0.0, 0.2]],
      "induction": rng.random((2, 3)).tolist(),
    },
    "composition": {kind: rng.random((1, 3, 3)).tolist() for kind in "qkv"},
    "baseline": {kind: 0.125 for kind in "qkv"},
    "periods": [5, 4],
    "patching": [
      {
        "source_layer": 0,
        **{
          path: (np.arange(9).reshape(3, 3) / 10 * scale).tolist()
          for path, scale in (("k", 1), ("q", -0.1), ("all", 2))
        },
      }
    ],
  }


def test_tables_sort_heads_by_score():
  record = synthetic_record()
  lines = circuit_report.circuit_table({"r": record}).splitlines()
  assert lines[0].startswith("| run | head | previous-token score | Q-comp. (random 0.125) |")
  assert [line.split(" | ")[1] for line in lines[2:]] == ["L0H1", "L0H2", "L0H0"]
  q_HxH, k_HxH = (np.asarray(record["composition"][kind])[0] for kind in "qk")
  # L0H1's row of the patching effects is 0.3, 0.4, 0.5: mean 0.4
  assert lines[2] == (
    f"| r | L0H1 | 0.90 | {q_HxH[1].mean():.3f} | {k_HxH[1].mean():.3f} | 0.400 | -0.040 | 0.800 |"
  )
  sorted_line = circuit_report.sorted_scores_table({"r": record}).splitlines()[2]
  assert sorted_line.startswith(
    "| r | L0H1 0.90, L0H2 0.60, L0H0 0.30, L1H2 0.20, L1H0 0.10, L1H1 0.00 |"
  )


def test_figures_have_titles_labels_and_legends(tmp_path):
  record, training = synthetic_record(), synthetic_training()
  figures = {
    "composition": circuit_report.composition_figure(record, title="Composition"),
    "patching": circuit_report.patching_figure(record, title="Patching"),
    "training": circuit_report.training_figure(
      {"a": training, "b": training}, title="Training", max_step=80
    ),
    "sorted": circuit_report.sorted_scores_figure({"a": record["scores"]}, title="Sorted"),
  }
  for name, figure in figures.items():
    assert figure.get_suptitle(), name
    assert any(axes.get_xlabel() and axes.get_ylabel() for axes in figure.axes), name
  # heatmaps: a colour bar says what the colours measure; values to 3 decimals
  for name in ("composition", "patching"):
    colorbar = figures[name].axes[-1]
    assert colorbar.get_ylabel(), name
    texts = [text.get_text() for text in figures[name].axes[0].texts]
    assert all(len(text.split(".")[1]) == 3 for text in texts), texts
  assert figures["training"].axes[0].get_xlim()[1] == 80
  labels = {text.get_text() for legend in figures["training"].legends for text in legend.texts}
  assert {"validation loss", "layer 0, head 1", "layer 1, head 2"} <= labels
  legend_texts = [text.get_text() for legend in figures["sorted"].legends for text in legend.texts]
  assert "previous-token score" in legend_texts
  path = save_figure(figures["sorted"], tmp_path / "sorted.png")
  assert path.read_bytes()[:4] == b"\x89PNG"


# ---------------------------------------------------------------------------
# docs/induction.md against its raw outputs.


def test_docs_induction_tables_are_the_ones_its_data_give():
  """Every table of the page, as tools/induction_docs.py writes it from
  docs/data/induction (run it to update the page)."""
  data = DOCS / "data" / "induction"
  tables = induction_docs.tables(data)
  assert set(tables) == set(induction_docs.TABLES)
  page = (DOCS / "induction.md").read_text()
  assert induction_docs.update_page(page, tables) == page, (
    "docs/induction.md's tables differ from docs/data/induction: python -m tools.induction_docs"
  )
  # The raw files are one analysis per seed: circuits.json's scores are
  # head_scores.csv's and the last checkpoint's of training_scores.csv.
  training = induction_docs.training_scores(data)
  for label, record in induction_docs.circuit_records(data).items():
    head_scores = induction_docs.read_head_scores(data / label.replace(" ", "") / "head_scores.csv")
    assert training[label]["steps"][-1] == record["step"]
    for name in ("previous_token", "induction"):
      np.testing.assert_array_equal(record["scores"][name], head_scores[name], err_msg=label)
      np.testing.assert_array_equal(record["scores"][name], training[label][name][-1])
    np.testing.assert_array_equal(record["composition"]["k"], training[label]["k_composition"][-1])


def test_update_page_replaces_the_table_after_each_marker():
  marker = induction_docs.MARKER.format("roles")
  page = f"text\n{marker}\n| old |\n|---|\n\nafter\n"
  assert induction_docs.update_page(page, {"roles": "| new |\n"}) == (
    f"text\n{marker}\n| new |\n\nafter\n"
  )
  with pytest.raises(ValueError, match="phase_change"):
    induction_docs.update_page(page, {"phase_change": "| new |\n"})


def test_patching_colours_diverge_about_zero_and_noise_stays_pale():
  """Before, the scale ran from the smallest to the largest effect: noise of
  ±0.0008 took the full colour range, and cells read '-0.000'."""
  record = synthetic_record()
  noise = np.array([[0.0008, -0.0004, 0.0], [-0.0008, 0.0003, -0.0001], [0.0, 0.0002, 0.0005]])
  record["patching"][0].update({path: noise.tolist() for path in ("k", "q", "all")})
  figure = circuit_report.patching_figure(record, title="Patching")
  image = figure.axes[0].images[0]
  low, high = image.get_clim()
  assert low == -high and high >= circuit_report.PATCHING_COLOUR_FLOOR
  texts = [text.get_text() for axes in figure.axes for text in axes.texts]
  assert texts and not any(text.startswith("-0.000") for text in texts), texts
  # A large effect sets the scale, still symmetric.
  record = synthetic_record()
  low, high = circuit_report.patching_figure(record, title="P").axes[0].images[0].get_clim()
  assert low == -high == -1.6


def test_value_text_drops_the_sign_of_a_rounded_zero():
  assert plots.value_text(-0.0004, ".3f") == "0.000"
  assert plots.value_text(-0.0006, ".3f") == "-0.001"
  assert plots.value_text(0.25, ".3g") == "0.25"


def test_training_figure_with_few_checkpoints_shades_nothing_and_spans_its_steps():
  """Before, with the two checkpoints a run keeps by default (steps 150,
  200) the 'steepest rise' shading covered all the data, the x axis started
  at 0, and the log loss axis read '2.74 x 10^0'."""
  few = {
    "steps": np.array([150, 200]),
    "loss": np.array([2.74, 2.63]),
    "accuracy": np.array([0.15, 0.17]),
    "previous_token": np.full((2, 2, 3), 0.05),
    "induction": np.full((2, 2, 3), 0.02),
  }
  figure = circuit_report.training_figure({"a": few}, title="Training")
  labels = {text.get_text() for legend in figure.legends for text in legend.texts}
  assert "validation loss" in labels and "the accuracy's steepest rise" not in labels
  assert not [patch for axes in figure.axes for patch in axes.patches]
  assert "too few" in figure.axes[0].get_title()
  assert figure.axes[-1].get_xlim() == (150, 200)
  figure.canvas.draw()
  ticks = [label.get_text() for label in figure.axes[0].get_yticklabels(which="both")]
  assert any(ticks) and not any("10^" in tick or "times" in tick for tick in ticks), ticks
  # Enough checkpoints: the rise is shaded, a strict part of the steps.
  figure = circuit_report.training_figure({"a": synthetic_training()}, title="Training")
  labels = {text.get_text() for legend in figure.legends for text in legend.texts}
  assert "the accuracy's steepest rise" in labels
  renderer = figure.canvas.get_renderer()
  (legend,) = figure.legends
  assert legend.get_window_extent(renderer).x1 <= figure.bbox.x1  # not cut off
