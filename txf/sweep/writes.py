"""Atomic writes of the files a sweep owns: results tables, plots and a
point's extrapolation record and plots.

Each file is replaced whole (txf.train.workdir.replace_bytes: a temporary in
the same directory renamed over it; one upload on object storage), so a crash
or a full disk never leaves a cut file that a rerun or `--summarize` would
choke on: the previous version stays until the new one is complete. A write
that fails raises txf.train.workdir.WriteError (as every run output does),
whose message is one line naming the path and the reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from etils import epath

from txf.train.workdir import is_local, replace_bytes, write_error


def write_file(path: str | os.PathLike, data: str | bytes) -> epath.Path:
  """Replaces `path` with `data` (a str is written as UTF-8) atomically,
  creating its local parent directories; returns the path.

  Raises:
    WriteError: the write failed (`path` is as it was).
  """
  path = epath.Path(path)
  data = data.encode("utf-8") if isinstance(data, str) else data
  try:
    if is_local(path):  # object stores have no directories to create
      path.parent.mkdir(parents=True, exist_ok=True)
    replace_bytes(path, data)
  # Remote file systems raise their own types (gcsfs's HttpError, ...).
  except Exception as error:
    raise write_error(path, error) from error
  return path


def write_figure(figure: Any, path: str | os.PathLike) -> epath.Path:
  """Writes a matplotlib Figure as a PNG (txf.analysis.plots' resolution)
  with `write_file`; returns the path."""
  from txf.analysis.plots import png_bytes  # loads matplotlib: only when a figure is written

  return write_file(path, png_bytes(figure))


def write_line_plot(
  series: Mapping[str, Any], path: str | os.PathLike, **options: Any
) -> epath.Path:
  """txf.analysis.plots.line_plot (same arguments), written with `write_figure`."""
  from txf.analysis.plots import line_plot_figure  # as in write_figure

  return write_figure(line_plot_figure(series, **options), path)
