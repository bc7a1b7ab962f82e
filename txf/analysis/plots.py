"""PNG plots for analysis and sweeps: attention heatmap grids and line plots.

Figures are built with matplotlib's object API (`matplotlib.figure.Figure`,
rendered by the Agg canvas), so nothing here touches pyplot's global state or
the process's backend, and plotting works on headless machines and in
threads. Each plot has a builder that returns the Figure (for tests and for
callers that add to it) and a writer that builds it, saves it with
`save_figure` and returns the path:

  attention_grid_figure / attention_grid  one heatmap per (layer, head)
  line_plot_figure / line_plot            labelled curves with optional std bands
  heatmaps_figure / heatmaps              titled panels of any 2-D arrays, one colour scale
"""

from __future__ import annotations

import io
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath
from matplotlib.figure import Figure

from txf.storage import write_file

# Tokens are written on the axes only up to this length; longer sequences get
# numeric positions, since one label per row would be unreadable.
MAX_TOKEN_TICKS = 32
# A log x axis is labelled at the data's x values when there are at most this
# many (evaluation lengths), at matplotlib's decades otherwise.
MAX_LOG_TICKS = 12
# More curves than this and the legend moves out of the axes.
LEGEND_INSIDE_MAX = 6
_PANEL_INCHES = 2.4
_DPI = 120


def _check_text(value: Any, name: str) -> str:
  """`value` if it is a non-empty string; ValueError naming `name` otherwise."""
  if not isinstance(value, str) or not value.strip():
    raise ValueError(f"{name} must be a non-empty string, got {value!r}")
  return value


def renderer_of(figure: Figure) -> Any:
  """The Agg renderer of `figure` (giving it an Agg canvas if it has none),
  to measure text and legends with."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg

  canvas = figure.canvas
  if not isinstance(canvas, FigureCanvasAgg):
    canvas = FigureCanvasAgg(figure)
  return canvas.get_renderer()


def fit_title(figure: Figure, title: str, *, fontsize: str | float = "large") -> Any:
  """Sets `title` as the figure's title (centred over the whole figure),
  wrapped onto as many lines as it needs to fit the figure's width; returns
  the title's Text. A title as wide as the axes and legend, or wider than the
  figure, ran off both sides."""
  renderer = renderer_of(figure)  # to measure the text with
  text = " ".join(title.split())
  artist = figure.suptitle(text, fontsize=fontsize)
  available = 0.94 * figure.bbox.width
  chars = len(text)
  while chars > 16:
    width = artist.get_window_extent(renderer).width
    if width <= available:
      break
    chars = min(chars - 1, int(chars * available / width))
    artist.set_text(
      textwrap.fill(text, max(chars, 16), break_long_words=False, break_on_hyphens=False)
    )
  return artist


def png_bytes(figure: Figure) -> bytes:
  """`figure` rendered as a PNG file's bytes, in memory (for writers that
  write several files as one set: txf.storage.write_files)."""
  buffer = io.BytesIO()
  figure.savefig(buffer, format="png", dpi=_DPI)
  return buffer.getvalue()


def save_figure(figure: Figure, path: str | os.PathLike) -> epath.Path:
  """Writes `figure` as a PNG to `path` (local or `gs://`), creating parent
  directories: rendered in memory, then written atomically
  (txf.storage.write_file), so a failed write leaves no cut PNG.

  Returns:
    The path written.

  Raises:
    WriteError: naming `path` and the reason (a full disk); `path` is as it was.
  """
  return write_file(path, png_bytes(figure))


def _check_grid(weights_by_layer: Sequence[Any]) -> np.ndarray:
  """float `[L, H, T, S]` from L >= 1 equally shaped `[H, T, S]` arrays (a list or an array)."""
  if len(weights_by_layer) == 0:
    raise ValueError("weights_by_layer must be a non-empty list of [H, T, S] arrays")
  arrays = [np.asarray(weights, np.float64) for weights in weights_by_layer]
  for layer, array in enumerate(arrays):
    if array.ndim != 3 or array.shape != arrays[0].shape or 0 in array.shape:
      raise ValueError(
        f"weights_by_layer[{layer}] must be [H, T, S] like layer 0 "
        f"{arrays[0].shape}, got {array.shape}"
      )
  weights_LxHxTxS = np.stack(arrays)
  if not np.all(np.isfinite(weights_LxHxTxS)):
    raise ValueError("weights_by_layer must be finite")
  return weights_LxHxTxS


def _check_tokens(tokens: Sequence[str] | None, length: int, name: str) -> list[str] | None:
  """`tokens` as a list of `length` strings (or None); ValueError naming `name` otherwise."""
  if tokens is None:
    return None
  if isinstance(tokens, str) or len(tokens) != length:
    raise ValueError(
      f"{name} must be a list of {length} strings (one per position), got {tokens!r}"
    )
  return [str(token) for token in tokens]


def _token_ticks(
  axes: Any, query_tokens: list[str] | None, key_tokens: list[str] | None
) -> tuple[str, str]:
  """Labels the positions of a heatmap with their tokens when the sequences
  are short; returns the (x, y) axis labels that say which it shows."""
  labels = []
  for axis, tokens in (("key", key_tokens), ("query", query_tokens)):
    if tokens is None or len(tokens) > MAX_TOKEN_TICKS:
      labels.append(f"{axis} position (tokens)")
      continue
    if axis == "key":
      axes.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
    else:
      axes.set_yticks(range(len(tokens)), tokens, fontsize=6)
    labels.append(f"{axis} token")
  return labels[0], labels[1]


def attention_grid_figure(
  weights_by_layer: Sequence[Any],
  tokens: Sequence[str] | None = None,
  *,
  title: str,
  key_tokens: Sequence[str] | None = None,
) -> Figure:
  """A grid of attention heatmaps: one row per layer, one column per head.

  Each panel shows one head's weights with queries down the rows and keys
  along the columns, all panels on one colour scale from 0 to the largest
  weight (one shared colour bar), so heads can be compared by eye.

  Args:
    weights_by_layer: L arrays `[H, T, S]` of one example's attention weights
      (e.g. `weights_BxHxTxS[0]` of each layer), all the same shape, or one
      `[L, H, T, S]` array.
    tokens: optional T query token strings; they label the axes when
      T <= MAX_TOKEN_TICKS, numeric positions otherwise.
    title: figure title (non-empty).
    key_tokens: optional S key token strings; defaults to `tokens`
      (self-attention). Pass the source tokens for cross-attention.

  Returns:
    The Figure.
  """
  _check_text(title, "title")
  weights_LxHxTxS = _check_grid(weights_by_layer)
  L, H, T, S = weights_LxHxTxS.shape
  query_tokens = _check_tokens(tokens, T, "tokens")
  key_tokens = _check_tokens(tokens if key_tokens is None else key_tokens, S, "key_tokens")

  figure = Figure(figsize=(_PANEL_INCHES * H + 1.2, _PANEL_INCHES * L + 0.6), layout="constrained")
  axes_LxH = figure.subplots(L, H, squeeze=False)
  vmax = max(float(weights_LxHxTxS.max()), np.finfo(np.float32).tiny)
  for layer in range(L):
    for head in range(H):
      axes = axes_LxH[layer, head]
      image = axes.imshow(
        weights_LxHxTxS[layer, head],
        cmap="viridis",
        vmin=0.0,
        vmax=vmax,
        aspect="auto",
        interpolation="nearest",
      )
      axes.set_title(f"layer {layer}, head {head}", fontsize=9)
      xlabel, ylabel = _token_ticks(axes, query_tokens, key_tokens)
      if layer == L - 1:
        axes.set_xlabel(xlabel)
      if head == 0:
        axes.set_ylabel(ylabel)
  figure.colorbar(image, ax=axes_LxH, label="attention weight", shrink=0.8)
  fit_title(figure, title)
  return figure


def attention_grid(
  weights_by_layer: Sequence[Any],
  tokens: Sequence[str] | None,
  path: str | os.PathLike,
  title: str,
  *,
  key_tokens: Sequence[str] | None = None,
) -> epath.Path:
  """Writes `attention_grid_figure(...)` as a PNG to `path`; returns the path."""
  return save_figure(
    attention_grid_figure(weights_by_layer, tokens, title=title, key_tokens=key_tokens), path
  )


def _check_series(
  label: Any, curve: Any, logx: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """(x, y, std or None) of one series, 1-D and equally long; ValueError naming `label`."""
  _check_text(label, "series label")
  if not isinstance(curve, (tuple, list)) or len(curve) not in (2, 3):
    raise ValueError(f"series[{label!r}] must be (x, y) or (x, y, std), got {curve!r}")
  x, y = (np.asarray(values, np.float64) for values in curve[:2])
  std = None if len(curve) == 2 or curve[2] is None else np.asarray(curve[2], np.float64)
  for name, values in (("x", x), ("y", y), ("std", std)):
    if values is not None and (values.ndim != 1 or values.shape != x.shape or not x.size):
      raise ValueError(
        f"series[{label!r}] {name} must be 1-D with the length of x {x.shape}, got {values.shape}"
      )
  if std is not None and np.any(std < 0):
    raise ValueError(f"series[{label!r}] std must be >= 0")
  if logx and np.any(x <= 0):
    raise ValueError(f"series[{label!r}] x must be > 0 for logx=True")
  return x, y, std


def _label_data_ticks(axes: Any, x: np.ndarray) -> None:
  """On a log x axis, ticks at the data's few x values (1024, not 2^10 or 1.02e3)."""
  values = np.unique(x)
  if values.size <= MAX_LOG_TICKS:
    axes.set_xticks(values, [f"{value:g}" for value in values])
    axes.set_xticks([], minor=True)


def line_plot_figure(
  series: Mapping[str, Any],
  *,
  title: str,
  xlabel: str,
  ylabel: str,
  logx: bool = False,
  logy: bool = False,
  styles: Mapping[str, Mapping[str, Any]] | None = None,
  bounds: tuple[float | None, float | None] = (None, None),
  legend_below: bool = False,
) -> Figure:
  """Curves with a legend, each with an optional +-std band.

  NaN values of y (e.g. a length where a run does not apply) leave a gap.
  Short series (<= 20 points) get a marker at each point. With more than
  LEGEND_INSIDE_MAX curves the legend goes right of the axes, so it hides
  no data; `legend_below` puts it below the axes, in columns, whatever the
  number of curves. The title is wrapped to fit the figure (`fit_title`).

  Args:
    series: label -> (x, y) or (x, y, std), each a 1-D array of one length;
      std (or None) draws the band y - std .. y + std in the curve's colour.
    title, xlabel, ylabel: non-empty strings; units belong in the labels,
      e.g. 'training step', 'validation loss (nats/token)'.
    logx, logy: logarithmic axes (logx needs x > 0).
    styles: label -> matplotlib line properties (e.g. {'color': 'C2',
      'linestyle': '--'}) for some curves; the others take the colour cycle.
    bounds: (lowest, highest) value the quantity can take (None: no bound),
      e.g. (0, None) for a loss: a band is clipped to them, so where the
      replicas disagree (one solved the task, the others did not) mean -
      std does not draw a negative loss.
    legend_below: the legend below the axes, in as many columns as fit.

  Returns:
    The Figure.
  """
  for name, text in (("title", title), ("xlabel", xlabel), ("ylabel", ylabel)):
    _check_text(text, name)
  if not series:
    raise ValueError("series must hold at least one label -> (x, y[, std]) curve")
  curves = {label: _check_series(label, curve, logx) for label, curve in series.items()}

  unknown = sorted(set(styles or {}) - set(curves))
  if unknown:
    raise ValueError(f"styles[{unknown[0]!r}]: no such series")
  outside = len(curves) > LEGEND_INSIDE_MAX and not legend_below
  size = (10.0, 4.8) if outside or (legend_below and len(curves) > 3) else (6.4, 4.2)
  figure = Figure(figsize=size, layout="constrained")
  axes = figure.subplots()
  for label, (x, y, std) in curves.items():
    (line,) = axes.plot(
      x,
      y,
      label=label,
      marker="o" if x.size <= 20 else None,
      markersize=4,
      **(styles or {}).get(label, {}),
    )
    if std is not None:
      low, high = bounds
      axes.fill_between(
        x,
        y - std if low is None else np.maximum(y - std, low),
        y + std if high is None else np.minimum(y + std, high),
        color=line.get_color(),
        alpha=0.2,
        linewidth=0,
      )
  if logx:
    axes.set_xscale("log")
    _label_data_ticks(axes, np.concatenate([x for x, _, _ in curves.values()]))
  if logy:
    axes.set_yscale("log")
  axes.set(xlabel=xlabel, ylabel=ylabel)
  fit_title(figure, title)
  axes.grid(True, alpha=0.3)
  if legend_below:
    _legend_below(figure, len(curves))
  elif outside:
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
  else:
    axes.legend()
  return figure


# The widest a figure grows to give its legend below the axes two or more columns.
_LEGEND_BELOW_MAX_INCHES = 12.0


def legend_in_columns(
  figure: Figure, *, most_columns: int, max_width: float, handles: list | None = None
) -> tuple[Any, int]:
  """(the figure's legend below its axes, its columns): the most columns,
  from `most_columns` down, whose legend is at most `max_width` pixels wide
  (one column, whatever its width). `handles`: the entries (default: the
  labelled artists)."""
  renderer = renderer_of(figure)
  entries = {} if handles is None else {"handles": handles}
  for columns in range(most_columns, 0, -1):
    legend = figure.legend(**entries, loc="outside lower center", ncols=columns, fontsize="small")
    if columns == 1 or legend.get_window_extent(renderer).width <= max_width:
      break
    legend.remove()
  return legend, columns


def _legend_below(figure: Figure, entries: int) -> None:
  """The figure's legend below its axes: in the most columns (up to 4;
  one for 3 entries or fewer) that fit _LEGEND_BELOW_MAX_INCHES, the figure
  widened to them if need be, and taller by the legend's rows."""
  width, height = figure.get_size_inches()
  legend, columns = legend_in_columns(
    figure,
    most_columns=min(4, entries) if entries > 3 else 1,
    max_width=(_LEGEND_BELOW_MAX_INCHES - 0.3) * figure.dpi,
  )
  needed = legend.get_window_extent(renderer_of(figure)).width / figure.dpi + 0.3
  rows = -(-entries // columns)
  figure.set_size_inches(max(width, needed), height + 0.2 * rows)


def line_plot(
  series: Mapping[str, Any],
  path: str | os.PathLike,
  title: str,
  xlabel: str,
  ylabel: str,
  logx: bool = False,
  logy: bool = False,
  styles: Mapping[str, Mapping[str, Any]] | None = None,
  bounds: tuple[float | None, float | None] = (None, None),
  legend_below: bool = False,
) -> epath.Path:
  """Writes `line_plot_figure(...)` as a PNG to `path`; returns the path."""
  return save_figure(
    line_plot_figure(
      series,
      title=title,
      xlabel=xlabel,
      ylabel=ylabel,
      logx=logx,
      logy=logy,
      styles=styles,
      bounds=bounds,
      legend_below=legend_below,
    ),
    path,
  )


def value_text(value: float, value_format: str = ".3g") -> str:
  """`value` formatted by `value_format`, without the minus sign of a value
  that rounds to zero: '0.000', not '-0.000' (noise of -0.0004)."""
  text = f"{value:{value_format}}"
  stripped = text.lstrip("-")
  return stripped if text != stripped and float(stripped.rstrip("%")) == 0 else text


def heatmaps_figure(
  panels: Mapping[str, Any],
  *,
  title: str,
  xlabel: str,
  ylabel: str,
  colorbar_label: str,
  columns: int | None = None,
  cmap: str = "viridis",
  vmin: float | None = None,
  vmax: float | None = None,
  xticklabels: Sequence[str] | None = None,
  yticklabels: Sequence[str] | None = None,
  annotate: bool = False,
  value_format: str = ".3g",
) -> Figure:
  """Heatmaps of 2-D arrays (masks, encodings, biases, similarities), one per panel.

  All panels share one colour scale (`vmin`..`vmax`, default the arrays'
  finite range) and one colour bar; a NaN or inf entry is left blank (e.g.
  a masked position). Rows run down the y axis, columns along x.

  Args:
    panels: panel title -> 2-D array [rows, columns] (all the same shape).
    title: figure title; xlabel, ylabel: axis labels (with units) of every
      panel; colorbar_label: what the colours measure (with units).
    columns: panels per row of the grid; default all in one row.
    cmap: matplotlib colour map.
    vmin, vmax: the colour scale's ends.
    xticklabels, yticklabels: optional labels of the columns / rows (when
      at most MAX_TOKEN_TICKS of them).
    annotate: write each finite value in its cell, for small grids such as
      per-head scores; a value that rounds to zero is written without a
      sign ('0.000', not '-0.000'), in black or white as reads best on its
      cell's colour.
    value_format: the format spec of the values written (default 3
      significant digits; '.3f': 3 decimals, one width for every cell).

  Returns:
    The Figure.
  """
  for name, text in (
    ("title", title),
    ("xlabel", xlabel),
    ("ylabel", ylabel),
    ("colorbar_label", colorbar_label),
  ):
    _check_text(text, name)
  if not panels:
    raise ValueError("panels must hold at least one title -> 2-D array")
  arrays = {
    _check_text(name, "panel title"): np.asarray(values, np.float64)
    for name, values in panels.items()
  }
  shape = next(iter(arrays.values())).shape
  for name, array in arrays.items():
    if array.ndim != 2 or array.shape != shape or 0 in shape:
      raise ValueError(
        f"panels[{name!r}] must be a non-empty 2-D array like the first "
        f"{shape}, got shape {array.shape}"
      )
  finite = np.concatenate([array[np.isfinite(array)] for array in arrays.values()])
  if not finite.size:
    raise ValueError("panels hold no finite value to colour")
  vmin = float(finite.min()) if vmin is None else vmin
  vmax = float(finite.max()) if vmax is None else vmax
  row_labels = _check_tokens(yticklabels, shape[0], "yticklabels")
  column_labels = _check_tokens(xticklabels, shape[1], "xticklabels")
  columns = len(arrays) if columns is None else int(columns)
  rows = -(-len(arrays) // columns)
  figure = Figure(
    figsize=(_PANEL_INCHES * 1.3 * columns + 1.2, _PANEL_INCHES * 1.3 * rows + 0.6),
    layout="constrained",
  )
  axes_grid = figure.subplots(rows, columns, squeeze=False)
  for index, axes in enumerate(axes_grid.flat):
    if index >= len(arrays):
      axes.set_axis_off()
      continue
    name, array = list(arrays.items())[index]
    image = axes.imshow(
      np.ma.masked_invalid(array),
      cmap=cmap,
      vmin=vmin,
      vmax=vmax,
      aspect="auto",
      interpolation="nearest",
    )
    axes.set_title(name, fontsize=9)
    axes.set(xlabel=xlabel, ylabel=ylabel)
    _token_ticks(axes, row_labels, column_labels)
    if annotate:
      for (row, column), value in np.ndenumerate(array):
        if np.isfinite(value):
          red, green, blue, _ = image.cmap(image.norm(value))
          axes.text(
            column,
            row,
            value_text(value, value_format),
            ha="center",
            va="center",
            fontsize=8,
            color="white" if 0.299 * red + 0.587 * green + 0.114 * blue < 0.5 else "black",
          )
  figure.colorbar(image, ax=axes_grid, label=colorbar_label, shrink=0.8)
  fit_title(figure, title)
  return figure


def heatmaps(
  panels: Mapping[str, Any],
  path: str | os.PathLike,
  title: str,
  *,
  xlabel: str,
  ylabel: str,
  colorbar_label: str,
  **kwargs: Any,
) -> epath.Path:
  """Writes `heatmaps_figure(...)` as a PNG to `path`; returns the path."""
  return save_figure(
    heatmaps_figure(
      panels, title=title, xlabel=xlabel, ylabel=ylabel, colorbar_label=colorbar_label, **kwargs
    ),
    path,
  )
