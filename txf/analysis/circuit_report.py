"""Tables and figures of a decoder's circuits and of their forming over training.

Markdown tables:
  circuit_table        per head of layer l: its previous-token score, its
                       Q- and K-composition into layer l + 1 and its
                       path-patching effects (`txf.analysis.circuits`' record)
  sorted_scores_table  every head's previous-token and induction scores,
                       sorted: roles without a threshold
  phase_change_table   where each curve of the scores over training rises
                       fastest (`txf.analysis.phase_change`)

Figures (matplotlib `Figure`s; `txf.analysis.plots.save_figure` writes one):
  composition_figure, patching_figure, sorted_scores_figure, training_figure.

Every function takes runs as {label: record} (or one record), so a page can
put several seeds side by side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from txf.analysis.ablation import head_name
from txf.analysis.composition import COMPOSITIONS
from txf.analysis.patching import PATTERN_PATHS
from txf.analysis.phase_change import phase_change, steepest_fall
from txf.analysis.plots import fit_title, heatmaps_figure, legend_in_columns

_PATH_NAMES = {"q": "query path", "k": "key path", "v": "value path", "all": "every path"}
# A head's curves take its colour and its layer's line style: one style per
# layer, so layers 1 and 2 of a deeper model are not drawn alike (layers four
# apart share one).
_LAYER_LINESTYLES = ("-", "--", ":", "-.")
# (record key, what the score is) of the per-head scores a record holds.
# The patching figure's colour scale reaches at least this far either side
# of 0 (in attention weight): noise of a few thousandths stays pale, and only
# an effect this large takes the full colour.
PATCHING_COLOUR_FLOOR = 0.05
# The training figure shades the accuracy's steepest rise only with this many
# checkpoints or more: with fewer, the rise spans most of the steps drawn and
# the shading would say nothing.
MIN_SHADED_CHECKPOINTS = 4
_HEAD_SCORES = (
  ("previous_token", "previous-token score"),
  ("induction", "induction score (lowest over the probe periods)"),
)


def _patching_entry(record: Mapping[str, Any], source_layer: int) -> Mapping[str, Any]:
  """The record's patching effects of the heads of `source_layer`."""
  (entry,) = [entry for entry in record["patching"] if entry["source_layer"] == source_layer]
  return entry


def _sorted_heads(values_LxH: Any) -> list[tuple[str, float]]:
  """[(head name, score)], highest score first (ties in head order)."""
  values_LxH = np.asarray(values_LxH, np.float64)
  order = np.argsort(-values_LxH, axis=None, kind="stable")
  return [
    (head_name(*np.unravel_index(index, values_LxH.shape)), float(values_LxH.flat[index]))
    for index in order
  ]


def _row(cells: list[str]) -> str:
  return "| " + " | ".join(cells) + " |"


def circuit_table(records: Mapping[str, Mapping[str, Any]], *, source_layer: int = 0) -> str:
  """Markdown: per run and per head of `source_layer`, its previous-token
  score beside what the next layer takes from it.

  One row per head, sorted by previous-token score within each run (no
  threshold: the reader sees the gap). Columns: the head's previous-token
  score; its Q- and K-composition into the next layer (mean over that
  layer's heads; the first run's random baseline in the header); the fall
  of the next layer's induction scores when its output is patched on the
  key path, the query path and every path (mean over that layer's heads).

  Args:
    records: run label -> a record with "scores" {"previous_token": [L, H]}
      and `analyze_circuits`' fields.
  """
  if not records:
    raise ValueError("records must hold at least one run")
  baseline = next(iter(records.values()))["baseline"]
  paths = ("k", "q", "all")
  lines = [
    _row(
      [
        "run",
        "head",
        "previous-token score",
        f"Q-comp. (random {baseline['q']:.3f})",
        f"K-comp. (random {baseline['k']:.3f})",
        "key-path patch",
        "query-path patch",
        "every-path patch",
      ]
    ),
    "|---" * 8 + "|",
  ]
  for label, record in records.items():
    previous_H = np.asarray(record["scores"]["previous_token"], np.float64)[source_layer]
    composition_H = {
      kind: np.asarray(record["composition"][kind], np.float64)[source_layer].mean(axis=1)
      for kind in ("q", "k")
    }
    patching = _patching_entry(record, source_layer)
    effects_H = {path: np.asarray(patching[path], np.float64).mean(axis=1) for path in paths}
    for head in np.argsort(-previous_H, kind="stable"):
      lines.append(
        _row(
          [
            label,
            head_name(source_layer, int(head)),
            f"{previous_H[head]:.2f}",
            *(f"{composition_H[kind][head]:.3f}" for kind in ("q", "k")),
            *(f"{effects_H[path][head]:.3f}" for path in paths),
          ]
        )
      )
  return "\n".join(lines) + "\n"


def sorted_scores_table(records: Mapping[str, Mapping[str, Any]]) -> str:
  """Markdown: per run, every head's previous-token and induction score, sorted
  (highest first), as 'L0H0 0.87' -- roles without a threshold.

  Args:
    records: run label -> {"scores": {"previous_token": [L, H], "induction": [L, H]}}.
  """
  lines = ["| run | previous-token score, sorted | induction score, sorted |", "|---|---|---|"]
  for label, record in records.items():
    cells = [
      ", ".join(f"{head} {value:.2f}" for head, value in _sorted_heads(record["scores"][name]))
      for name, _ in _HEAD_SCORES
    ]
    lines.append(_row([label, *cells]))
  return "\n".join(lines) + "\n"


def _span(change: Mapping[str, Any], digits: int) -> str:
  """'steps 250-260: 0.52 -> 0.73' of one of `phase_change`'s entries."""
  (before, after), (start, end) = change["steps"], change["values"]
  return f"steps {before}-{after}: {start:.{digits}f} -> {end:.{digits}f}"


def phase_change_table(runs: Mapping[str, Mapping[str, Any]]) -> str:
  """Markdown: per run (scores over training, `read_training_csv`), where
  `phase_change` finds each curve's steepest rise."""
  lines = [
    "| run | validation accuracy rises fastest (loss) | induction score (last layer's mean) "
    "| previous-token score (top first-layer head) | its K-composition |",
    "|---|---|---|---|---|",
  ]
  for label, training in runs.items():
    change = phase_change(training)
    loss = change["loss"]["values"]
    cells = [
      label,
      f"{_span(change['accuracy'], 2)} ({loss[0]:.2f} -> {loss[1]:.2f} nats)",
      _span(change["induction"], 2),
      f"{change['previous_token_head']}, {_span(change['previous_token'], 2)}",
      _span(change["k_composition"], 3),
    ]
    lines.append(_row(cells))
  return "\n".join(lines) + "\n"


def _head_labels(layer: int, num_heads: int) -> list[str]:
  return [head_name(layer, head) for head in range(num_heads)]


def composition_figure(record: Mapping[str, Any], *, title: str, layer: int = 0) -> Figure:
  """Heatmaps of the Q-, K- and V-composition of layer `layer` into `layer + 1`
  (a record's "composition" and "baseline"), one panel each, values written in."""
  panels = {
    f"{kind.upper()}-composition (random: {record['baseline'][kind]:.3f})": np.asarray(
      record["composition"][kind], np.float64
    )[layer]
    for kind in COMPOSITIONS
  }
  num_heads = next(iter(panels.values())).shape[0]
  return heatmaps_figure(
    panels,
    title=title,
    xlabel=f"reading head (layer {layer + 1})",
    ylabel=f"writing head (layer {layer})",
    colorbar_label="composition score (0..1, unitless)",
    xticklabels=_head_labels(layer + 1, num_heads),
    yticklabels=_head_labels(layer, num_heads),
    annotate=True,
    value_format=".3f",
    cmap="magma",
    vmin=0.0,
  )


def patching_figure(record: Mapping[str, Any], *, title: str, source_layer: int = 0) -> Figure:
  """Heatmaps of a record's path-patching effects of `source_layer`'s heads,
  one panel per path of `PATTERN_PATHS`, values written in (a value that
  rounds to 0 unsigned). The colours diverge about 0 (red: patching lowers
  the score, blue: raises it), the scale symmetric and at least
  ±PATCHING_COLOUR_FLOOR, so an effect of a few thousandths stays pale."""
  patching = _patching_entry(record, source_layer)
  panels = {_PATH_NAMES[path]: np.asarray(patching[path], np.float64) for path in PATTERN_PATHS}
  num_heads = next(iter(panels.values())).shape[0]
  finite = np.concatenate([np.abs(values[np.isfinite(values)]) for values in panels.values()])
  reach = max(PATCHING_COLOUR_FLOOR, float(finite.max()) if finite.size else 0.0)
  return heatmaps_figure(
    panels,
    title=title,
    xlabel=f"measured head (layer {source_layer + 1})",
    ylabel=f"patched head (layer {source_layer})",
    colorbar_label="fall in induction score\n(attention weight, clean - patched)",
    xticklabels=_head_labels(source_layer + 1, num_heads),
    yticklabels=_head_labels(source_layer, num_heads),
    annotate=True,
    value_format=".3f",
    cmap="RdBu_r",
    vmin=-reach,
    vmax=reach,
  )


def training_figure(
  runs: Mapping[str, Mapping[str, Any]], *, title: str, max_step: int | None = None
) -> Figure:
  """Loss, accuracy and head scores against the training step, one column per run.

  Args:
    runs: run label -> {"steps": [N], "loss": [N] (validation loss, nats
      per token), "accuracy": [N], "previous_token": [N, L, H], "induction":
      [N, L, H]} (`read_training_csv`).
    title: the figure's title.
    max_step: the x axis ends here (None: the last step).

  Returns:
    The Figure: row 1 the loss (log scale) and the accuracy, row 2 every
    head's previous-token score, row 3 every head's induction score; a
    head's colour (one per head index) and line style (one per layer) are
    the same in rows 2 and 3; the steepest rise of the
    accuracy (`phase_change`) is shaded in each, given at least
    MIN_SHADED_CHECKPOINTS checkpoints (with fewer the title says so). The
    x axis spans the checkpoints drawn (to `max_step`); the loss axis is
    labelled in plain numbers ('2.7', not '2.7 x 10^0'). One legend, below.
  """
  if not runs:
    raise ValueError("runs must hold at least one run")
  figure = Figure(figsize=(4.2 * len(runs) + 2.2, 8.4), layout="constrained")
  grid = figure.subplots(3, len(runs), squeeze=False, sharex="col")
  handles: dict[str, Any] = {}  # legend label -> handle, each once
  for column, (label, run) in enumerate(runs.items()):
    steps_N = np.asarray(run["steps"])
    before, after, _ = steepest_fall(steps_N, -np.asarray(run["accuracy"], np.float64))
    shown_N = steps_N <= (steps_N[-1] if max_step is None else max_step)
    steps_N = steps_N[shown_N]  # the y axes autoscale to what is shown
    shade = len(steps_N) >= MIN_SHADED_CHECKPOINTS and after <= steps_N[-1]
    axes = grid[0, column]
    loss_N = np.asarray(run["loss"], np.float64)[shown_N]
    (loss_line,) = axes.plot(steps_N, loss_N, color="black", label="validation loss")
    _plain_log_axis(axes, loss_N)
    axes.set(
      # Two lines: one column's axes are narrower than the label and the steps.
      title=f"{label}:\n"
      + (
        f"accuracy rises fastest at steps {before}-{after}"
        if shade
        else f"{len(steps_N)} checkpoints: too few to place a rise"
      ),
      ylabel="validation loss (nats/token)",
    )
    right = axes.twinx()
    (accuracy_line,) = right.plot(
      steps_N,
      np.asarray(run["accuracy"])[shown_N],
      color="C2",
      linestyle=":",
      label="validation accuracy",
    )
    right.set(ylabel="validation accuracy (fraction)", ylim=(-0.02, 1.02))
    handles.setdefault(loss_line.get_label(), loss_line)
    handles.setdefault(accuracy_line.get_label(), accuracy_line)
    if shade:
      span = axes.axvspan(
        before, after, color="C3", alpha=0.25, label="the accuracy's steepest rise"
      )
      handles.setdefault(span.get_label(), span)
    for row, (name, what) in enumerate(
      (("previous_token", "previous-token score"), ("induction", "induction score")), 1
    ):
      axes = grid[row, column]
      values_NxLxH = np.asarray(run[name], np.float64)[shown_N]
      for (layer, head), _ in np.ndenumerate(values_NxLxH[0]):
        (line,) = axes.plot(
          steps_N,
          values_NxLxH[:, layer, head],
          color=f"C{head}",
          linestyle=_LAYER_LINESTYLES[layer % len(_LAYER_LINESTYLES)],
          label=f"layer {layer}, head {head}",
        )
        handles.setdefault(line.get_label(), line)
      if shade:
        axes.axvspan(before, after, color="C3", alpha=0.25)
      axes.set(ylabel=f"{what} (0..1)", ylim=(-0.02, 1.02))
      axes.grid(True, alpha=0.3)
    grid[2, column].set_xlabel("training step")
    grid[2, column].set_xlim(steps_N[0], steps_N[-1] if max_step is None else max_step)
  fit_title(figure, title)  # also gives the figure a renderer to measure the legend with
  # Below the axes, in as many columns as fit the figure's width: beside
  # them, a legend beyond the accuracy axis was cut off.
  legend_in_columns(
    figure, most_columns=4, max_width=0.98 * figure.bbox.width, handles=list(handles.values())
  )
  return figure


def _plain_log_axis(axes: Any, values: np.ndarray) -> None:
  """A log y axis labelled in plain numbers ('2.7', '0.1'): matplotlib
  labels a range within one decade '2.74 x 10^0'. There, 4 ticks spread
  over the values' range."""
  from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

  axes.set_yscale("log")
  positive = values[np.isfinite(values) & (values > 0)]
  if positive.size and positive.max() < 10 * positive.min():
    spread = np.geomspace(positive.min(), positive.max(), 4)
    ticks = sorted({float(f"{tick:.3g}") for tick in spread})
    axes.yaxis.set_major_locator(FixedLocator(ticks))
    axes.yaxis.set_minor_locator(NullLocator())
  axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
  axes.yaxis.set_minor_formatter(NullFormatter())


def sorted_scores_figure(
  runs: Mapping[str, Mapping[str, Any]], *, title: str, threshold: float | None = 0.5
) -> Figure:
  """Every head's previous-token and induction score as bars, sorted, one row per run.

  No threshold decides anything here: the reader sees the gap (or its
  absence) between the heads that do a thing and those that do not.

  Args:
    runs: run label -> {"previous_token": [L, H], "induction": [L, H]}.
    title: the figure's title.
    threshold: drawn as a dashed line for reference (the convention of
      `txf.analysis.head_scores.head_roles`); None: no line.
  """
  if not runs:
    raise ValueError("runs must hold at least one run")
  figure = Figure(figsize=(9.0, 1.0 + 2.3 * len(runs)), layout="constrained")
  grid = figure.subplots(len(runs), 2, squeeze=False, sharey=True)
  for row, (label, run) in enumerate(runs.items()):
    for column, (name, what) in enumerate(_HEAD_SCORES):
      axes = grid[row, column]
      heads, values = zip(*_sorted_heads(run[name]))
      bars = axes.bar(range(len(heads)), values, color=f"C{column}", label=what)
      axes.bar_label(bars, fmt="%.2f", fontsize=7)
      axes.set_xticks(range(len(heads)), heads, fontsize=8)
      if threshold is not None:
        axes.axhline(
          threshold,
          color="grey",
          linestyle="--",
          linewidth=1,
          label=f"{threshold} (the role table's convention)",
        )
      axes.set(ylim=(0, 1.12), ylabel="score (0..1)", title=f"{label}: {what}")
      axes.title.set_fontsize(9)
      if row == len(runs) - 1:
        axes.set_xlabel("head (L<layer>H<head>), highest score first")
  legend: dict[str, Any] = {}  # label -> handle, each label once
  for axes in grid[0]:
    for handle, text in zip(*axes.get_legend_handles_labels()):
      legend.setdefault(text, handle)
  figure.legend(
    handles=list(legend.values()), loc="outside lower center", ncols=3, fontsize="small"
  )
  fit_title(figure, title)
  return figure
