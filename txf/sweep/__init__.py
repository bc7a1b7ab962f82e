"""Sweeps over run configs: grids of points, their status, results tables and
plots. Importable building blocks; the command is txf-sweep (txf.commands.sweep).
Length extrapolation of a trained point: txf.sweep.extrapolate.extrapolate_run,
and its attention analysis: txf.sweep.analyze.analyze_run (not imported here:
they load the training stack)."""

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
  plot_extrapolation,
  plot_loss_curves,
  plot_per_position,
  plot_pre_vs_post,
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
