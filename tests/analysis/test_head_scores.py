"""Tests for txf.analysis.head_scores (head scores, ablation, tables) and txf.analysis.plots.

Scores are checked two ways: on hand-built attention patterns whose score is
known in closed form (a copying head scores 1, uniform attention 1/(t+1)),
and on random softmax weights against per-query Python loops in float64
(rtol 1e-12: both sides sum the same float64 terms, in different orders).
Plots are checked on the Figure (title, labels, panels, legend) and on the
written file (PNG signature).
"""

import csv
import math

import jax.numpy as jnp
import numpy as np
import pytest

from txf import ops
from txf.analysis import head_scores as heads, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def random_weights(seed, B, H, T, S, causal=True):
  """Softmax rows of random logits, float64 [B, H, T, S]; causal keeps keys s <= t."""
  logits = 2.0 * np.random.default_rng(seed).normal(size=(B, H, T, S))
  if causal:
    logits = np.where(np.tril(np.ones((T, S), bool)), logits, -np.inf)
  weights = np.exp(logits - logits.max(axis=-1, keepdims=True))
  return weights / weights.sum(axis=-1, keepdims=True)


def uniform_causal(T):
  """[T, T]: row t uniform over keys 0..t."""
  return np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]


def one_hot_rows(targets, S):
  """[len(targets), S]: row t is 1 at key targets[t]."""
  return np.eye(S)[np.asarray(targets)]


def loop_reference(weights, row_value, queries, query_mask=None):
  """[H]: mean over b and the given (unmasked, nonzero) queries t of row_value(row, t)."""
  B, H = weights.shape[:2]
  result = np.zeros(H)
  for h in range(H):
    values = [
      row_value(weights[b, h, t], t)
      for b in range(B)
      for t in queries
      if (query_mask is None or query_mask[b, t]) and weights[b, h, t].sum() > 0
    ]
    result[h] = sum(values) / len(values)
  return result


def entropy_of(row, t):
  return -sum(p * math.log(p) for p in row if p > 0)


def distance_of(row, t):
  return sum(p * abs(t - s) for s, p in enumerate(row))


# ---------------------------------------------------------------- induction


def test_induction_score_hand_built_patterns():
  P, T = 5, 10
  # head 0 copies: query t >= P attends t - P + 1 (the token after the previous
  # occurrence); earlier queries look at themselves. head 1 is uniform causal,
  # head 2 uniform over all keys, head 3 a previous-token head.
  copying = one_hot_rows([t if t < P else t - P + 1 for t in range(T)], T)
  previous = one_hot_rows([max(t - 1, 0) for t in range(T)], T)
  weights = np.stack([copying, uniform_causal(T), np.full((T, T), 1 / T), previous])[None]
  scores = heads.induction_score(np.repeat(weights, 2, axis=0), P)
  expected_uniform_causal = np.mean([1 / (t + 1) for t in range(P, T)])
  np.testing.assert_allclose(scores, [1.0, expected_uniform_causal, 1 / T, 0.0], rtol=1e-12)
  assert scores[1] < 0.15


def test_induction_score_matches_loop_reference_on_random_weights():
  P, T = 3, 8  # T > 2P: a block repeated more than twice keeps the same target t - P + 1
  weights = random_weights(0, 2, 3, T, T)
  expected = loop_reference(weights, lambda row, t: row[t - P + 1], range(P, T))
  np.testing.assert_allclose(heads.induction_score(weights, P), expected, rtol=1e-12)


def test_induction_score_accepts_bfloat16_jax_weights():
  weights = random_weights(1, 1, 2, 6, 6)
  scores = heads.induction_score(jnp.asarray(weights, jnp.bfloat16), 3)
  # bfloat16 keeps 8 significant bits: each weight within 2^-8 relative.
  np.testing.assert_allclose(scores, heads.induction_score(weights, 3), rtol=2**-8)


def test_scores_of_txf_ops_attention_weights():
  # Zero queries make txf.ops' causal softmax uniform over keys 0..t.
  P, T = 4, 8
  q = jnp.zeros((1, T, 2, 8))
  k = jnp.asarray(np.random.default_rng(9).normal(size=(1, T, 2, 8)), jnp.float32)
  weights = ops.attention_weights(q, k, is_causal=True)
  np.testing.assert_allclose(
    heads.induction_score(weights, P), [np.mean([1 / (t + 1) for t in range(P, T)])] * 2, rtol=1e-6
  )
  np.testing.assert_allclose(
    heads.attention_entropy(weights), [np.mean(np.log(np.arange(1, T + 1)))] * 2, rtol=1e-6
  )


@pytest.mark.parametrize("period", [0, 6, 7, 2.0, True])
def test_induction_score_rejects_bad_period(period):
  with pytest.raises(ValueError, match="period"):
    heads.induction_score(random_weights(0, 1, 1, 6, 6), period)


def test_repeated_random_tokens():
  tokens = heads.repeated_random_tokens(np.random.default_rng(0), 4, 7, 20, low=4)
  assert tokens.shape == (4, 14) and tokens.dtype == np.int32
  np.testing.assert_array_equal(tokens[:, :7], tokens[:, 7:])
  assert tokens.min() >= 4 and tokens.max() < 20
  assert all(len(set(row[:7])) == 7 for row in tokens)  # distinct within a block
  assert len({tuple(row) for row in tokens}) > 1  # rows differ
  again = heads.repeated_random_tokens(np.random.default_rng(0), 4, 7, 20, low=4)
  np.testing.assert_array_equal(tokens, again)


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(batch=0), "batch"),
    (dict(period=0), "period"),
    (dict(vocab_size=10), "vocab_size"),
    (dict(low=-1), "low"),
  ],
)
def test_repeated_random_tokens_rejects_bad_arguments(kwargs, field):
  arguments = dict(batch=2, period=7, vocab_size=20) | kwargs
  low = arguments.pop("low", 4)
  with pytest.raises(ValueError, match=field):
    heads.repeated_random_tokens(np.random.default_rng(0), **arguments, low=low)


# ----------------------------------------------------------- previous token


def test_previous_token_score_hand_built_patterns():
  T = 6
  shifted_identity = one_hot_rows([0, *range(T - 1)], T)
  identity = np.eye(T)
  weights = np.stack([shifted_identity, identity, uniform_causal(T)])[None]
  expected_uniform = np.mean([1 / (t + 1) for t in range(1, T)])
  np.testing.assert_allclose(
    heads.previous_token_score(weights), [1.0, 0.0, expected_uniform], rtol=1e-12
  )


def test_previous_token_score_with_query_mask_matches_loop_reference():
  weights = random_weights(2, 3, 2, 7, 7)
  query_mask = np.random.default_rng(3).random((3, 7)) < 0.6
  query_mask[:, 1] = True
  expected = loop_reference(weights, lambda row, t: row[t - 1], range(1, 7), query_mask)
  np.testing.assert_allclose(
    heads.previous_token_score(weights, query_mask=query_mask), expected, rtol=1e-12
  )


def test_previous_token_score_rejects_cross_attention_and_bad_mask():
  with pytest.raises(ValueError, match=r"T=4 queries and S=6 keys"):
    heads.previous_token_score(random_weights(0, 1, 1, 4, 6, causal=False))
  with pytest.raises(ValueError, match="query_mask"):
    heads.previous_token_score(random_weights(0, 1, 1, 4, 4), query_mask=np.ones((1, 4)))


# ------------------------------------------------------------------ entropy


def test_attention_entropy_uniform_one_hot_and_masked_keys():
  T, n = 5, 3
  uniform_over_n = np.zeros((T, T))
  uniform_over_n[:, :n] = 1 / n  # the other keys masked: exact zeros
  weights = np.stack([uniform_over_n, np.eye(T), uniform_causal(T)])[None]
  with np.errstate(all="raise"):  # a 0 * log 0 would raise here
    entropy = heads.attention_entropy(weights)
  assert np.all(np.isfinite(entropy))
  expected_causal = np.mean([math.log(t + 1) for t in range(T)])
  np.testing.assert_allclose(entropy, [math.log(n), 0.0, expected_causal], rtol=1e-12, atol=0)


def test_attention_entropy_skips_rows_without_keys_and_masked_queries():
  weights = random_weights(4, 2, 3, 6, 9, causal=False)
  weights[0, :, 2] = 0.0  # a query with no allowed key
  query_mask = np.ones((2, 6), bool)
  query_mask[1, 4:] = False
  expected = loop_reference(weights, entropy_of, range(6), query_mask)
  np.testing.assert_allclose(
    heads.attention_entropy(weights, query_mask=query_mask), expected, rtol=1e-12
  )


# ----------------------------------------------------------------- distance


def test_mean_attended_distance_hand_built_patterns():
  T = 8
  to_first = one_hot_rows([0] * T, T)  # query t attends key 0: distance t
  three_back = one_hot_rows([max(t - 3, 0) for t in range(T)], T)
  weights = np.stack([to_first, np.eye(T), three_back])[None]
  expected_three_back = np.mean([min(t, 3) for t in range(T)])
  np.testing.assert_allclose(
    heads.mean_attended_distance(weights), [(T - 1) / 2, 0.0, expected_three_back], rtol=1e-12
  )


def test_mean_attended_distance_with_query_mask_matches_loop_reference():
  # head_analysis passes the padding as a mask; no test did: one ignoring it passed.
  weights = random_weights(4, 3, 2, 7, 7)
  query_mask = np.random.default_rng(5).random((3, 7)) < 0.5
  query_mask[:, 0] = True
  expected = loop_reference(weights, distance_of, range(7), query_mask)
  got = heads.mean_attended_distance(weights, query_mask=query_mask)
  np.testing.assert_allclose(got, expected, rtol=1e-12)
  assert not np.allclose(got, heads.mean_attended_distance(weights))


def test_mean_attended_distance_cross_attention_matches_loop_reference():
  weights = random_weights(5, 2, 2, 4, 7, causal=False)  # T=4 target, S=7 source
  expected = loop_reference(weights, distance_of, range(4))
  np.testing.assert_allclose(heads.mean_attended_distance(weights), expected, rtol=1e-12)


@pytest.mark.parametrize(
  "weights, message",
  [
    (np.full((2, 4, 4), 0.25), r"\[B, H, T, S\]"),
    (np.ones((1, 1, 3, 3), np.int32), "float"),
    (np.log(random_weights(0, 1, 1, 3, 3, causal=False)), "logits"),
    (2 * random_weights(0, 1, 1, 3, 3), "sum to 1"),
  ],
)
def test_scores_reject_arrays_that_are_not_attention_weights(weights, message):
  with pytest.raises(ValueError, match=message):
    heads.mean_attended_distance(weights)


def test_scores_reject_all_queries_masked():
  with pytest.raises(ValueError, match="no valid query"):
    heads.attention_entropy(random_weights(0, 1, 1, 3, 3), query_mask=np.zeros((1, 3), bool))


# ----------------------------------------------------------------- ablation


def test_head_ablation_zeroes_one_head_per_call_and_returns_deltas():
  L, H = 3, 2
  importance = np.random.default_rng(6).normal(size=(L, H))
  # Interaction term: a loss that is not additive in the heads must still give
  # loss(one head off) - loss(all on).
  interaction = 0.5
  masks = []

  def loss_fn(head_mask):
    masks.append(np.array(head_mask))
    off = 1.0 - np.asarray(head_mask, np.float64)
    return 2.0 + float((importance * off).sum()) + interaction * float(off.sum()) ** 2

  reported = []
  deltas = heads.head_ablation(
    loss_fn, L, H, progress=lambda *args: reported.append((*args, len(masks)))
  )
  assert len(masks) == 1 + L * H
  # Progress: each head once it is done (its loss_fn call made), in order.
  assert [(layer, head, calls) for layer, head, _, calls in reported] == [
    (layer, head, 2 + layer * H + head) for layer in range(L) for head in range(H)
  ]
  assert [delta for *_, delta, _ in reported] == list(deltas.ravel())
  np.testing.assert_array_equal(masks[0], np.ones((L, H)))
  zeroed = []
  for mask in masks[1:]:
    assert mask.shape == (L, H) and set(np.unique(mask)) <= {0.0, 1.0}
    assert (mask == 0).sum() == 1
    zeroed.append(tuple(np.argwhere(mask == 0)[0]))
  assert sorted(zeroed) == [(layer, h) for layer in range(L) for h in range(H)]
  np.testing.assert_allclose(deltas, importance + interaction, rtol=1e-12)


def test_head_ablation_rejects_bad_sizes():
  with pytest.raises(ValueError, match="num_heads"):
    heads.head_ablation(lambda mask: 0.0, 2, 0)


# ------------------------------------------------------------------- tables


def test_head_scores_table_and_csv(tmp_path):
  L, H = 2, 3
  scores = {
    "induction": np.arange(L * H).reshape(L, H) / 7,
    "loss_delta": -np.arange(L * H).reshape(L, H) * 1e-3,
  }
  table = heads.head_scores_table(scores)
  lines = table.splitlines()
  assert len(lines) == 2 + L * H
  assert lines[0] == "| layer | head | induction | loss_delta |"
  assert lines[1] == "|---|---|---|---|"
  cells = [cell.strip() for cell in lines[2 + 1 * H + 2].strip("|").split("|")]
  assert cells == ["1", "2", f"{5 / 7:.4g}", f"{-5e-3:.4g}"]

  path = heads.write_head_scores_csv(scores, tmp_path / "sub" / "heads.csv")
  with path.open() as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["layer", "head", "induction", "loss_delta"]
  assert len(rows) == 1 + L * H
  for layer, head, induction, loss_delta in rows[1:]:
    layer, head = int(layer), int(head)
    assert float(induction) == scores["induction"][layer, head]  # full precision
    assert float(loss_delta) == scores["loss_delta"][layer, head]


def test_head_scores_table_rejects_mismatched_shapes():
  with pytest.raises(ValueError, match="scores\\['entropy'\\]"):
    heads.head_scores_table({"induction": np.zeros((2, 3)), "entropy": np.zeros((3, 2))})
  with pytest.raises(ValueError, match="at least one"):
    heads.head_scores_table({})


# -------------------------------------------------------------------- plots


def test_attention_grid_figure_and_png(tmp_path):
  L, H, T = 2, 3, 5
  weights = random_weights(7, L, H, T, T)
  tokens = ["a", "b", "c", "d", "e"]
  figure = plots.attention_grid_figure(list(weights), tokens, title="layer x head")
  assert figure.get_suptitle() == "layer x head"
  panels = [axes for axes in figure.axes if axes.get_title()]
  assert [axes.get_title() for axes in panels] == [
    f"layer {layer}, head {h}" for layer in range(L) for h in range(H)
  ]
  # The axes tick the tokens, and say so.
  assert [axes.get_xlabel() for axes in panels[-H:]] == ["key token"] * H
  assert [panels[layer * H].get_ylabel() for layer in range(L)] == ["query token"] * L
  assert [label.get_text() for label in panels[0].get_xticklabels()] == tokens
  np.testing.assert_array_equal(panels[4].images[0].get_array(), weights[1, 1])
  assert len(figure.axes) == L * H + 1  # one shared colour bar
  assert figure.axes[-1].get_ylabel() == "attention weight"

  path = plots.attention_grid(list(weights), tokens, tmp_path / "grid.png", "attention")
  assert path.read_bytes()[:8] == PNG_MAGIC


def test_a_long_title_over_few_panels_wraps_inside_the_figure():
  """A two-head grid's title ran off both sides of its figure (the textbook's
  'Every head on a random block of 16 in-distribution tokens repeated twice')."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg

  title = "Every head on a random block of 16 in-distribution tokens repeated twice"
  grid = plots.attention_grid_figure([random_weights(7, 1, 2, 5, 5)[0]], title=title)
  heatmaps = plots.heatmaps_figure(
    {"one": np.eye(3)},
    title=title,
    xlabel="x (tokens)",
    ylabel="y (tokens)",
    colorbar_label="weight",
    columns=1,
  )
  for figure in (grid, heatmaps):
    canvas = FigureCanvasAgg(figure)  # what save_figure renders with
    canvas.draw()
    box = figure._suptitle.get_window_extent(canvas.get_renderer())
    assert figure.bbox.x0 <= box.x0 and box.x1 <= figure.bbox.x1
    assert " ".join(figure.get_suptitle().split()) == title


def test_attention_grid_cross_attention_and_long_sequences():
  weights = random_weights(8, 1, 2, 3, 4, causal=False)[0]
  figure = plots.attention_grid_figure(
    [weights], ["x", "y", "z"], title="cross", key_tokens=["p", "q", "r", "s"]
  )
  assert [t.get_text() for t in figure.axes[0].get_xticklabels()] == ["p", "q", "r", "s"]
  assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == ["x", "y", "z"]
  T = plots.MAX_TOKEN_TICKS + 1
  figure = plots.attention_grid_figure(
    [uniform_causal(T)[None]], [str(i) for i in range(T)], title="long"
  )
  assert len(figure.axes[0].get_xticks()) < T  # numeric positions, not tokens
  assert (figure.axes[0].get_xlabel(), figure.axes[0].get_ylabel()) == (
    "key position (tokens)",
    "query position (tokens)",
  )
  figure = plots.attention_grid_figure([uniform_causal(3)[None]], title="no tokens")
  assert (figure.axes[0].get_xlabel(), figure.axes[0].get_ylabel()) == (
    "key position (tokens)",
    "query position (tokens)",
  )


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(title=""), "title"),
    (dict(tokens=["a", "b"]), "tokens"),
    (dict(weights_by_layer=[np.eye(3)]), r"weights_by_layer\[0\]"),
    (dict(weights_by_layer=[]), "weights_by_layer"),
  ],
)
def test_attention_grid_rejects_bad_input(kwargs, field):
  arguments = dict(weights_by_layer=[np.eye(3)[None]], tokens=["a", "b", "c"], title="t") | kwargs
  with pytest.raises(ValueError, match=field):
    plots.attention_grid_figure(arguments.pop("weights_by_layer"), **arguments)


def test_line_plot_figure_and_png(tmp_path):
  x = np.array([128, 256, 512, 1024])
  series = {
    "rope": (x, np.array([3.0, 2.9, 3.4, 4.0]), np.full(4, 0.1)),
    "alibi": (x, np.array([3.1, 3.0, 2.95, 2.9])),
  }
  figure = plots.line_plot_figure(
    series,
    title="loss vs length",
    xlabel="evaluation length (tokens)",
    ylabel="loss (nats/token)",
    logx=True,
  )
  (axes,) = figure.axes
  assert (figure.get_suptitle(), axes.get_xlabel(), axes.get_ylabel()) == (
    "loss vs length",
    "evaluation length (tokens)",
    "loss (nats/token)",
  )
  assert axes.get_xscale() == "log"
  assert [text.get_text() for text in axes.get_legend().get_texts()] == ["rope", "alibi"]
  assert len(axes.collections) == 1  # one std band
  band = axes.collections[0].get_paths()[0].vertices
  np.testing.assert_allclose([band[:, 1].min(), band[:, 1].max()], [2.8, 4.1], rtol=1e-12)
  assert [text.get_text() for text in axes.get_xticklabels()] == ["128", "256", "512", "1024"]

  path = plots.line_plot(series, tmp_path / "loss.png", "loss", "step", "loss (nats/token)")
  assert path.read_bytes()[:8] == PNG_MAGIC


def test_line_plot_styles_and_a_legend_outside_for_many_curves():
  x = np.arange(3.0)
  many = {f"run {i}": (x, x + i) for i in range(plots.LEGEND_INSIDE_MAX + 1)}
  figure = plots.line_plot_figure(
    many,
    title="t",
    xlabel="x (steps)",
    ylabel="y (nats)",
    styles={"run 0": {"color": "C3", "linestyle": "--"}},
  )
  (axes,) = figure.axes
  first = axes.get_lines()[0]
  assert (first.get_color(), first.get_linestyle()) == ("C3", "--")
  figure.canvas.draw()  # the legend's place is known once drawn
  legend_box = axes.get_legend().get_window_extent()
  assert legend_box.x0 >= axes.get_window_extent().x1  # right of the axes: hides no curve
  few = plots.line_plot_figure(
    dict(list(many.items())[:2]), title="t", xlabel="x (steps)", ylabel="y (nats)"
  )
  few.canvas.draw()
  assert few.axes[0].get_legend().get_window_extent().x0 < few.axes[0].get_window_extent().x1
  with pytest.raises(ValueError, match=r"styles\['nope'\]: no such series"):
    plots.line_plot_figure(many, title="t", xlabel="x", ylabel="y", styles={"nope": {}})


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(xlabel=""), "xlabel"),
    (dict(ylabel=" "), "ylabel"),
    (dict(title=None), "title"),
    (dict(series={}), "series"),
    (dict(series={"a": ([1, 2], [1, 2, 3])}), r"series\['a'\] y"),
    (dict(series={"a": ([1, 2], [1, 2], [0.1])}), r"series\['a'\] std"),
    (dict(series={"a": ([0, 1], [1, 2])}, logx=True), "logx"),
  ],
)
def test_line_plot_rejects_bad_input(kwargs, field):
  arguments = dict(series={"a": ([1, 2], [3, 4])}, title="t", xlabel="x", ylabel="y") | kwargs
  with pytest.raises(ValueError, match=field):
    plots.line_plot_figure(arguments.pop("series"), **arguments)


# ------------------------------------------------ probe periods, roles, groups


def offset_weights(batch, heads_offsets, T):
  """[B, H, T, T]: head h puts all weight on key t - offset_h (t itself if before 0)."""
  weights = np.zeros((batch, len(heads_offsets), T, T))
  for h, offset in enumerate(heads_offsets):
    for t in range(T):
      weights[:, h, t, max(t - offset, 0)] = 1.0
  return weights


def test_a_fixed_offset_head_is_positional_and_a_content_head_induction():
  T = 24
  scores = {}
  for P in (8, 11):
    # Head 0 attends a fixed offset (7: the induction target at period 8
    # only); head 1 the token after the previous occurrence at this P.
    scores[P] = heads.induction_score(offset_weights(2, (7, P - 1), T), P)[None]
  assert scores[8][0, 0] == pytest.approx(1.0) and scores[11][0, 0] == pytest.approx(0.0)
  roles = heads.head_roles(np.zeros((1, 2)), scores)
  assert list(roles[0]) == ["positional", "induction"]
  # Probed only at periods other than the fixed offset's: neither.
  assert heads.head_roles(np.zeros((1, 2)), {11: scores[11], 12: scores[11]})[0, 0] == ""
  with pytest.raises(ValueError, match="two or more probe periods"):
    heads.head_roles(np.zeros((1, 2)), {8: scores[8]})
  # A content-following head that straddles the threshold (0.53 at one
  # period, 0.49 at the other: an induction run's L1H3 at its phase change)
  # is no fixed-offset head: it was reported positional; it is neither.
  straddling = {23: np.array([[0.4868]]), 19: np.array([[0.5298]])}
  assert heads.head_roles(np.zeros((1, 1)), straddling)[0, 0] == ""
  collapsing = {23: np.array([[0.2499]]), 19: np.array([[0.5298]])}
  assert heads.head_roles(np.zeros((1, 1)), collapsing)[0, 0] == "positional"


def test_probe_periods_avoid_the_training_periods_and_fit():
  assert heads.probe_periods(48, 32, range(4, 17)) == [24, 23]
  assert heads.probe_periods(48, 20, range(4, 17)) == [20, 19]  # distinct ids limit
  assert heads.probe_periods(48, 32, range(4, 25)) == [3, 2]
  with pytest.raises(ValueError, match="only 1 induction-probe periods"):
    heads.probe_periods(8, 32, (2, 3))


def test_the_probe_draws_only_in_distribution_ids():
  tokens = np.array([[0, 0, 7, 9, 1, 40], [9, 12, 7, 0, 0, 0]])
  ids = heads.in_distribution_ids(tokens, {0, 1, 2})
  np.testing.assert_array_equal(ids, [7, 9, 12, 40])
  probe = heads.repeated_random_tokens(np.random.default_rng(0), 50, 4, 260, ids=ids)
  assert set(np.unique(probe)) == {7, 9, 12, 40}  # all drawn, nothing else
  with pytest.raises(ValueError, match=r"len\(ids\) = 4 must be >= period=5"):
    heads.repeated_random_tokens(np.random.default_rng(0), 1, 5, 260, ids=ids)
  with pytest.raises(ValueError, match=r"ids must lie in \[0, vocab_size=20\)"):
    heads.repeated_random_tokens(np.random.default_rng(0), 1, 2, 20, ids=ids)


def test_group_mask_zeroes_exactly_the_named_heads():
  mask = heads.group_mask([(1, 0), (0, 2)], 2, 3)
  reference = np.ones((2, 3), np.float32)
  reference[1, 0] = reference[0, 2] = 0
  np.testing.assert_array_equal(mask, reference)
  with pytest.raises(ValueError, match="head L2H0 is not in"):
    heads.group_mask([(2, 0)], 2, 3)


def test_head_roles_of_three_layers_are_each_heads_own():
  """Roles of a 3-layer x 2-head table whose layers differ (no two layers
  alike, read forwards or backwards), against a per-head loop over the
  thresholds: layer 0 holds a previous-token head, layer 1 an induction
  head, the last layer a positional and a previous-token + induction one."""
  previous_LxH = np.array([[0.9, 0.1], [0.2, 0.3], [0.4, 0.6]])
  induction_by_period = {
    8: np.array([[0.1, 0.0], [0.2, 0.8], [0.7, 0.6]]),
    11: np.array([[0.0, 0.1], [0.1, 0.9], [0.2, 0.7]]),
  }
  roles = heads.head_roles(previous_LxH, induction_by_period)
  for layer, head in np.ndindex(3, 2):
    induction = [scores[layer, head] >= 0.5 for scores in induction_by_period.values()]
    collapsed = [scores[layer, head] < 0.25 for scores in induction_by_period.values()]
    expected = [
      name
      for name, is_role in (
        ("previous_token", previous_LxH[layer, head] >= 0.5),
        ("induction", all(induction)),
        ("positional", any(induction) and any(collapsed)),
      )
      if is_role
    ]
    assert roles[layer, head] == "+".join(expected), (layer, head)
  assert roles[1, 1] == "induction" and roles[2, 0] == "positional"
  assert roles[0, 0] == "previous_token" and roles[2, 1] == "previous_token+induction"
