"""A sweep's figures, from the summaries of txf.sweep.results: loss curves,
length extrapolation, loss by position, final loss by Pre-/Post-LN, final
accuracy by model width. Each is labelled in words (`point_labels`: 'RoPE,
Pre-LN'), rendered in memory and handed as PNG bytes to a writer: by default
txf.storage.write_file (atomic); a sweep's summary collects them all
first and writes them as one set (txf.sweep.runner.summarize). The plots
themselves are txf.analysis.plots' line plots and matplotlib's object API.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from etils import epath

from txf.rundir.derived import PER_POSITION_PNG
from txf.storage import write_file
from txf.sweep.grid import Point
from txf.sweep.results import (
  CURVE_METRICS,
  FLAT_ABSOLUTE,
  FLAT_MIN_EVALUATIONS,
  FLAT_TOLERANCE,
  LOSS_UNITS,
  PointSummary,
  evaluations_in_window,
  fraction_name,
  is_flat,
  late_fall,
  late_improvement,
)

LOSS_CURVES_PNG = "loss_curves.png"
TRAIN_LOSS_CURVES_PNG = "train_loss_curves.png"
# Metric -> (PNG, what its axis and title call it) of plot_loss_curves, for
# each metric a summary keeps the curve of.
_CURVE_FIGURES = {
  "eval_loss": (LOSS_CURVES_PNG, "validation loss"),
  "loss": (TRAIN_LOSS_CURVES_PNG, "training loss"),
}
CURVES = {metric: _CURVE_FIGURES[metric] for metric in CURVE_METRICS}
PRE_VS_POST_PNG = "pre_vs_post.png"
ACCURACY_VS_WIDTH_PNG = "accuracy_vs_width.png"
WIDTH_FIELD = "model.d_model"
# A grid field tuned per point rather than compared (accuracy_vs_width_figure).
TUNED_FIELD = "train.learning_rate"
# The short name written beside each marker of a tuned field's value.
TUNED_WORDS = {TUNED_FIELD: "lr"}

# (series, *, title, xlabel, ylabel, logx, styles) -> a matplotlib Figure
# (txf.analysis.plots.line_plot_figure's arguments).
LinePlot = Callable[..., Any]
# (path, PNG bytes) -> anything: puts a figure's file down.
Write = Callable[[epath.Path, bytes], Any]

LINESTYLES = ("-", "--", ":", "-.")
# pre_vs_post's marker per value of its split field (Pre-LN round, Post-LN square).
MARKERS = ("o", "s", "^", "D")
# Axis and legend words for the grid fields sweeps vary most; other fields
# are called by their last name ('learning rate').
FIELD_WORDS = {
  "model.position": "position encoding",
  "model.norm_placement": "norm placement",
  "model.d_model": "model width",
}
# Legends' words for the values of the fields sweeps vary most; other fields
# are written '<field> <value>' ('learning rate 0.003').
VALUE_WORDS: dict[str, dict[Any, str]] = {
  "model.position": {
    "sinusoidal": "sinusoidal",
    "learned": "learned",
    "rope": "RoPE",
    "rope_ntk": "RoPE (NTK)",
    "alibi": "ALiBi",
    "t5_bias": "T5 bias",
    "none": "NoPE",
  },
  "model.norm_placement": {"pre": "Pre-LN", "post": "Post-LN"},
  "model.norm": {"layer": "LayerNorm", "rms": "RMSNorm"},
  "model.attention": {"softmax": "softmax attention", "linear": "linear attention"},
  "model.family": {
    "decoder": "Transformer decoder",
    "encoder": "Transformer encoder",
    "encoder_decoder": "encoder-decoder",
    "lstm": "LSTM",
  },
}


def _line_plot(line_plot: LinePlot | None, series: dict[str, Any], **options: Any) -> Any:
  """`line_plot(series, **options)`'s Figure (default: txf.analysis.plots.line_plot_figure)."""
  if line_plot is None:
    from txf.analysis.plots import line_plot_figure  # loads matplotlib: only when a figure is made

    line_plot = line_plot_figure
  return line_plot(series, **options)


def _write_png(figure: Any, path: epath.Path, write: Write) -> epath.Path:
  """Renders `figure` as PNG bytes in memory and hands them to `write`; returns `path`."""
  from txf.analysis.plots import png_bytes  # as in _line_plot

  write(path, png_bytes(figure))
  return path


def field_words(path: str) -> str:
  """A grid field in words: FIELD_WORDS' ('model.position' -> 'position
  encoding'), else its last name ('model.options.t5_max_distance' -> 't5 max
  distance')."""
  return FIELD_WORDS.get(path) or path.rsplit(".", 1)[-1].replace("_", " ")


def value_words(path: str, value: Any) -> str:
  """A grid value in a legend's words: 'RoPE', 'Pre-LN', 'warmup steps 30'."""
  words = VALUE_WORDS.get(path, {})
  if isinstance(value, str | int | float) and not isinstance(value, bool) and value in words:
    return words[value]
  name = field_words(path)
  if isinstance(value, bool):
    return f"{name} {'on' if value else 'off'}"
  return f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"


def point_labels(points: Iterable[Point]) -> dict[str, str]:
  """Point name -> its legend label, its values in words joined by ', '
  ('RoPE, Pre-LN'); the point names themselves where two labels would be
  the same."""
  points = list(points)
  labels = {
    point.name: ", ".join(value_words(path, value) for path, value in point.overrides.items())
    for point in points
  }
  return labels if len(set(labels.values())) == len(labels) else {p.name: p.name for p in points}


def point_styles(points: Iterable[Point]) -> dict[str, dict[str, str]]:
  """Point name -> line style that makes a grid readable: with two or more
  grid fields, the last field's value picks the line style (e.g. Pre-LN
  solid, Post-LN dashed) and the other fields' values the colour (e.g. one
  colour per encoding); with one field (or a last field of more values than
  LINESTYLES), each point its own colour."""
  points = list(points)
  fields = list(points[0].overrides) if points else []
  last_values = (
    list(dict.fromkeys(point.overrides[fields[-1]] for point in points)) if fields else []
  )
  split = len(fields) >= 2 and len(last_values) <= len(LINESTYLES)
  colours: dict[tuple, str] = {}
  styles = {}
  for point in points:
    values = tuple(point.overrides.values())
    key = values[:-1] if split else values
    colour = colours.setdefault(key, f"C{len(colours) % 10}")
    linestyle = LINESTYLES[last_values.index(values[-1])] if split else "-"
    styles[point.name] = {"color": colour, "linestyle": linestyle}
  return styles


def flatness_mark(steps_N: np.ndarray, loss_N: np.ndarray, *, flat: bool | None = None) -> str:
  """A curve's flattening verdict for its legend (the window, the last
  fifth, is said once in the figure's title): 'not flat, -3.1%',
  'flat, -0.0019 nats' (flat by the fall in nats), 'flat: unknown, 2
  evaluations' (or 'a loss not finite'); where the replicas' verdict `flat`
  differs from the mean curve's, 'not flat: a replica falls, mean -1.8%' or
  'flat: every replica, mean -2.2%'."""
  improvement = late_improvement(steps_N, loss_N)
  if improvement is None:
    if not np.isfinite(loss_N).all():
      return "flat: unknown, a loss not finite"
    count = evaluations_in_window(steps_N)
    return f"flat: unknown, {count} evaluation{'' if count == 1 else 's'}"
  final = float(loss_N[-1])
  mean_flat = bool(is_flat(improvement, final))
  by_nats = mean_flat and improvement >= FLAT_TOLERANCE
  change = (
    f"{-late_fall(improvement, final):+.4f} nats" if by_nats else f"{-100 * improvement:+.1f}%"
  )
  if flat is None or flat == mean_flat:
    return f"{'flat' if mean_flat else 'not flat'}, {change}"
  return (
    f"flat: every replica, mean {change}" if flat else f"not flat: a replica falls, mean {change}"
  )


def plot_loss_curves(
  rows: Iterable[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  metric: str = "eval_loss",
  line_plot: LinePlot | None = None,
  write: Write = write_file,
) -> epath.Path:
  """Validation ('eval_loss', loss_curves.png) or training ('loss',
  train_loss_curves.png) loss vs training step, one line per point (its
  summary's curve) with a ±1 std band over its replicas, clipped at 0 (a
  loss is never negative; where one replica solved the task and the others
  did not, mean - std is); points with no such row yet are left out, and so
  are diverged ones (their blown-up losses would squash every other curve),
  which the title names.
  Curves are labelled in words (`point_labels`: 'RoPE, Pre-LN'), validation
  curves with the flattening criterion's verdict too, short
  (`flatness_mark`: 'RoPE, Pre-LN (not flat, -3.1%)'), the criterion once
  in the title. The legend is below the axes, in columns, over no curve.
  Returns the PNG.

  `line_plot` builds the Figure (default txf.analysis.plots.line_plot_figure);
  `write` puts its PNG down (default: atomically, txf.storage.write_file).
  """
  if metric not in CURVES:
    raise ValueError(f"metric: {metric!r} is not one of {tuple(CURVES)}")
  png, what = CURVES[metric]
  rows = list(rows)
  directory = epath.Path(sweep_workdir)
  series, styles, replica_counts = {}, {}, set()
  all_styles = point_styles(row.point for row in rows)
  labels = point_labels(row.point for row in rows)
  diverged = []
  for row in rows:
    steps_N, mean_N, std_N = row.curves[metric]
    if row.diverged:  # its blow-up would set the axis (to 1e11): the table blanks it too
      diverged.append(labels[row.point.name])
    elif len(steps_N):
      label = labels[row.point.name]
      if metric == "eval_loss":
        label += f" ({flatness_mark(steps_N, mean_N, flat=row.flat)})"
      series[label] = (steps_N, mean_N, std_N)
      styles[label] = all_styles[row.point.name]
      replica_counts.add(row.replicas)
  path = directory / png
  (replicas,) = replica_counts if len(replica_counts) == 1 else (None,)
  criterion = (
    f"; in brackets, the mean's change over the last {fraction_name()} of training; "
    f"flat: every replica < {FLAT_TOLERANCE:.0%} or {FLAT_ABSOLUTE} nats better there "
    f"(unknown with < {FLAT_MIN_EVALUATIONS} evaluations there)"
    if metric == "eval_loss"
    else ""
  )
  figure = _line_plot(
    line_plot,
    series,
    title=f"{what.capitalize()} per point"
    + (f" (mean ± std over {replicas} replicas, clipped at 0)" if replicas and replicas > 1 else "")
    + (f"; diverged, not drawn: {'; '.join(diverged)}" if diverged else "")
    + criterion,
    xlabel="training step",
    ylabel=f"{what} ({LOSS_UNITS})",
    styles=styles,
    bounds=(0.0, None),
    legend_below=True,
  )
  return _write_png(figure, path, write)


def plot_extrapolation(
  rows: Iterable[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  protocol: str,
  line_plot: LinePlot | None = None,
  write: Write = write_file,
) -> epath.Path:
  """Validation loss vs evaluation length (log x), one line per point that has
  extrapolation results for `protocol`, applicable lengths only. Returns the
  PNG, extrapolation_<protocol>.png."""
  rows = list(rows)
  series, styles, all_styles = {}, {}, point_styles(row.point for row in rows)
  labels = point_labels(row.point for row in rows)
  for row in rows:
    found = row.extrapolation
    if found is None or protocol not in found.loss:
      continue
    label = labels[row.point.name]
    styles[label] = all_styles[row.point.name]
    kept = [at for at, applicable in enumerate(found.applicable) if applicable]
    series[label] = (
      np.array([found.lengths[at] for at in kept]),
      np.array([found.loss[protocol][at] for at in kept]),
      None,
    )
  path = epath.Path(sweep_workdir) / f"extrapolation_{protocol}.png"
  figure = _line_plot(
    line_plot,
    series,
    title=f"Length extrapolation ({protocol.replace('_', '-')} windows)",
    xlabel="evaluation length (tokens)",
    ylabel=f"validation loss ({LOSS_UNITS})",
    logx=True,
    styles=styles,
    legend_below=True,
  )
  return _write_png(figure, path, write)


def plot_per_position(
  rows: Iterable[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  bins: int = 16,
  line_plot: LinePlot | None = None,
  write: Write = write_file,
) -> epath.Path:
  """Validation loss vs token position in the non-overlapping windows of each
  point's longest applicable evaluation length, one line per point that has
  them (where an encoding breaks shows as a rise past the training length).
  Returns the PNG, per_position_loss.png.

  Each position's loss averages only a few windows, so the curve is the mean
  over `bins` equal spans of positions (x: the span's centre): the trend past
  the training length is what the plot is for, not per-token noise. The
  title says how many positions each point averages. The legend is below
  the axes, over no curve.
  """
  rows = list(rows)
  series, styles, all_styles = {}, {}, point_styles(row.point for row in rows)
  labels = point_labels(row.point for row in rows)
  span_sizes: set[int] = set()
  for row in rows:
    found = row.extrapolation
    if found is None or found.per_position_loss is None:
      continue
    loss = np.array(found.per_position_loss, np.float64)
    spans = np.array_split(np.arange(len(loss)), min(bins, len(loss)))
    span_sizes.update(span.size for span in spans)
    scored = [loss[span][~np.isnan(loss[span])] for span in spans]
    label = f"{labels[row.point.name]} ({found.per_position_length} tokens)"
    styles[label] = all_styles[row.point.name]
    series[label] = (
      np.array([span.mean() for span in spans]),
      np.array([values.mean() if values.size else np.nan for values in scored]),
      None,
    )
  path = epath.Path(sweep_workdir) / PER_POSITION_PNG
  figure = _line_plot(
    line_plot,
    series,
    title="Loss by position at the longest length ("
    + (
      f"each point: the mean over {next(iter(span_sizes))} positions"
      if len(span_sizes) == 1
      else f"each point: the mean over 1/{bins} of the positions"
    )
    + ")",
    xlabel="position in the window (tokens from its start)",
    ylabel=f"validation loss ({LOSS_UNITS})",
    styles=styles,
    legend_below=True,
  )
  return _write_png(figure, path, write)


def pre_vs_post_figure(
  rows: Sequence[PointSummary],
  *,
  group_field: str = "model.position",
  split_field: str = "model.norm_placement",
):
  """plot_pre_vs_post's matplotlib Figure, unwritten.

  Raises:
    ValueError: a field that is not one of the points' grid fields.
  """
  # Only matplotlib's object API: no pyplot global state, safe in threads.
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  from txf.analysis.plots import fit_title  # loads matplotlib: only when a figure is made

  for field in (group_field, split_field):
    if not any(field in row.point.overrides for row in rows):
      raise ValueError(f"{field}: not a grid field of these points")
  groups = list(dict.fromkeys(row.point.overrides.get(group_field) for row in rows))
  splits = list(dict.fromkeys(row.point.overrides.get(split_field) for row in rows))
  # The other grid fields' settings (e.g. a learning-rate axis): each gets
  # its own marker beside the others, or one of them would hide the rest.
  others = lambda row: tuple(
    (k, v) for k, v in row.point.overrides.items() if k not in (group_field, split_field)
  )
  settings = list(dict.fromkeys(others(row) for row in rows))
  series = [(split, setting) for split in splits for setting in settings]
  width = 0.6 / len(series)
  figure = Figure(
    # Room for each column's markers, and for the longer legend of settings.
    figsize=(max(6.4, 0.6 * len(groups) * max(2, len(series))) + 2.4 * (len(settings) > 1), 4.8),
    layout="constrained",
  )
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  for offset, (split, setting) in enumerate(series):
    positions = np.arange(len(groups)) + (offset - (len(series) - 1) / 2) * width
    # At most one point per column: the points differ in some grid field.
    held = {
      row.point.overrides.get(group_field): row
      for row in rows
      if row.point.overrides.get(split_field) == split and others(row) == setting
    }
    found = [held.get(group) for group in groups]
    stats = [None if row is None else row.eval_loss for row in found]
    label = ", ".join(
      [value_words(split_field, split)]
      + ([value_words(k, v) for k, v in setting] if len(settings) > 1 else [])
    )
    # Markers, not bars: the axis then spans the losses rather than starting
    # at 0, where gaps of a few hundredths of a nat would not show.
    means = [math.nan if stat is None else stat.mean for stat in stats]
    axes.errorbar(
      positions,
      means,
      yerr=_bounded_errors(means, stats, 0.0, math.inf),
      fmt=MARKERS[splits.index(split) % len(MARKERS)],
      markersize=7,
      capsize=4,
      label=label,
    )
    for position, row in zip(positions, found):
      if row is not None and row.diverged:  # no marker: say why, at the axis' foot
        axes.text(
          position,
          0.02,
          "diverged",
          rotation=90,
          ha="center",
          va="bottom",
          transform=axes.get_xaxis_transform(),
        )
  axes.set_xticks(np.arange(len(groups)), [value_words(group_field, group) for group in groups])
  axes.set_xlim(-0.5, len(groups) - 0.5)  # each column its full share, its edge markers too
  axes.set_xlabel(field_words(group_field))
  axes.set_ylabel(f"final validation loss ({LOSS_UNITS})")
  fit_title(
    figure, f"Final validation loss by {field_words(group_field)} and {field_words(split_field)}"
  )
  axes.grid(axis="y", alpha=0.3)
  # Beside the axes, never over a marker.
  legend_title = ", ".join(
    field_words(field)
    for field in (
      [split_field, *(k for k, _ in settings[0])] if len(settings) > 1 else [split_field]
    )
  )
  axes.legend(title=legend_title, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  return figure


def plot_pre_vs_post(
  rows: Sequence[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  group_field: str = "model.position",
  split_field: str = "model.norm_placement",
  write: Write = write_file,
) -> epath.Path:
  """Final validation loss, one column per value of `group_field` (the
  encodings) holding one marker per value of `split_field` (Pre- and
  Post-LN), error bars ±1 std over replicas (clipped at 0); where the grid varies other
  fields too (a learning rate), one marker per their setting, each labelled
  with it. A point without a final eval loss has no marker (a diverged one
  is labelled so). Returns the PNG."""
  figure = pre_vs_post_figure(rows, group_field=group_field, split_field=split_field)
  return _write_png(figure, epath.Path(sweep_workdir) / PRE_VS_POST_PNG, write)


def _bounded_errors(
  means: Sequence[float], stats: Sequence[Any], low: float, high: float
) -> np.ndarray:
  """Error bars' [2, N] (below, above) lengths: ±std, clipped so a bar ends
  inside the quantity's range `low`..`high` (a loss >= 0, an accuracy in
  0..1): where one replica solved the task and the others did not, mean ±
  std passes it. 0 where a point has no mean or no std."""
  errors = np.zeros((2, len(means)))
  for at, (mean, stat) in enumerate(zip(means, stats, strict=True)):
    if stat is not None and stat.std is not None and not math.isnan(mean):
      errors[:, at] = (min(stat.std, mean - low), min(stat.std, high - mean))
  return np.maximum(errors, 0.0)


def _mean_accuracy(row: PointSummary) -> float:
  return -math.inf if row.eval_accuracy is None else row.eval_accuracy.mean


def accuracy_vs_width_figure(
  rows: Sequence[PointSummary],
  *,
  width_field: str = WIDTH_FIELD,
  tuned_field: str = TUNED_FIELD,
):
  """plot_accuracy_vs_width's matplotlib Figure, unwritten.

  Raises:
    ValueError: `width_field` is not a grid field of these points.
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure

  from txf.analysis.plots import fit_title

  if not any(width_field in row.point.overrides for row in rows):
    raise ValueError(f"{width_field}: not a grid field of these points")
  tuned = any(tuned_field in row.point.overrides for row in rows)
  # One line per setting of the other grid fields (e.g. per model family);
  # with a tuned field, each width's marker is its best setting (Zoology's
  # practice: an architecture at a width is judged at its best learning rate).
  lines: dict[tuple, dict[Any, PointSummary]] = {}
  for row in rows:
    overrides = row.point.overrides
    others = tuple((k, v) for k, v in overrides.items() if k not in (width_field, tuned_field))
    at_width = lines.setdefault(others, {})
    held = at_width.get(overrides[width_field])
    if held is None or _mean_accuracy(row) > _mean_accuracy(held):
      at_width[overrides[width_field]] = row
  figure = Figure(figsize=(8.4, 4.8), layout="constrained")
  FigureCanvasAgg(figure)
  axes = figure.add_subplot()
  for others, at_width in lines.items():
    members = [at_width[width] for width in sorted(at_width)]
    stats = [row.eval_accuracy for row in members]
    means = [math.nan if stat is None else stat.mean for stat in stats]
    bars = axes.errorbar(
      [row.point.overrides[width_field] for row in members],
      means,
      yerr=_bounded_errors(means, stats, 0.0, 1.0),
      fmt="o-",
      capsize=4,
      label=", ".join(value_words(k, v) for k, v in others) or "all points",
    )
    if tuned:
      last = len(members) - 1
      for at, (row, mean) in enumerate(zip(members, means, strict=True)):
        if not math.isnan(mean):
          # Inside the axes: left of the last width's marker, below a marker
          # near the top; on a white box, over any error bar it crosses.
          axes.annotate(
            f"{TUNED_WORDS.get(tuned_field, field_words(tuned_field))} "
            f"{row.point.overrides[tuned_field]:g}",
            (row.point.overrides[width_field], mean),
            textcoords="offset points",
            xytext=(-8 if at == last else 8, -14 if mean > 0.85 else 6),
            ha="right" if at == last else "left",
            fontsize="small",
            color=bars.lines[0].get_color(),
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
          )
  axes.set_xscale("log", base=2)
  widths = sorted({row.point.overrides[width_field] for row in rows})
  axes.set_xticks(widths, [str(width) for width in widths])
  axes.set_ylim(-0.02, 1.02)
  axes.set_xlabel(f"{field_words(width_field)} (units per layer)")
  axes.set_ylabel("final validation accuracy (fraction of predictions)")
  title = "Final validation accuracy by model width"
  replica_counts = {row.replicas for row in rows}
  if len(replica_counts) == 1 and next(iter(replica_counts)) > 1:
    title += f" (mean ± std over {next(iter(replica_counts))} replicas, clipped to 0..1)"
  if tuned:
    short = TUNED_WORDS.get(tuned_field, field_words(tuned_field))
    title += f", each at its best {field_words(tuned_field)} (beside each marker: {short} <value>)"
  fit_title(figure, title)
  axes.grid(alpha=0.3)
  # Beside the axes, never over a marker.
  axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
  return figure


def plot_accuracy_vs_width(
  rows: Sequence[PointSummary],
  sweep_workdir: str | epath.PathLike,
  *,
  width_field: str = WIDTH_FIELD,
  tuned_field: str = TUNED_FIELD,
  write: Write = write_file,
) -> epath.Path:
  """Final validation accuracy against the model width (`width_field`, log2
  x), one line per setting of the other grid fields (e.g. per model family,
  as Zoology's MQAR figures), error bars ±1 std over replicas, clipped to
  0..1 (an accuracy's range: where one replica solved the task and the
  others did not, mean ± std passes it); a point
  without a final accuracy is left out of its line. Where the grid varies
  `tuned_field` (the learning rate), each width shows its setting of the
  highest mean accuracy, that value written beside the marker ('lr 0.001'), as Zoology
  reports each architecture at its best learning rate. Returns the PNG."""
  figure = accuracy_vs_width_figure(rows, width_field=width_field, tuned_field=tuned_field)
  return _write_png(figure, epath.Path(sweep_workdir) / ACCURACY_VS_WIDTH_PNG, write)
