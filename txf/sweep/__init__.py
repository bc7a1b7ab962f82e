"""Sweeps over run configs: grids of points, their status, results tables
(results.py) and figures (figures.py). Importable building blocks; the command
is txf-sweep (txf.commands.sweep). A trained point is evaluated (length
extrapolation, attention analysis) by txf.trained, as any trained run is."""

from txf.sweep.figures import (
  plot_extrapolation,
  plot_loss_curves,
  plot_per_position,
  plot_pre_vs_post,
)
from txf.sweep.grid import (
  GridError,
  Point,
  command_for,
  expand,
  make_grid,
  select,
  validate,
  zip_fields,
)
from txf.sweep.results import (
  PointSummary,
  Stat,
  mark_diverged,
  point_status,
  summarize_point,
  write_results,
)

__all__ = [
  "GridError",
  "Point",
  "PointSummary",
  "Stat",
  "command_for",
  "expand",
  "make_grid",
  "mark_diverged",
  "plot_extrapolation",
  "plot_loss_curves",
  "plot_per_position",
  "plot_pre_vs_post",
  "point_status",
  "select",
  "summarize_point",
  "validate",
  "write_results",
  "zip_fields",
]
