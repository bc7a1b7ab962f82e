"""Writes docs/results.md's sweep results tables from the sweeps' committed raw outputs.

  python -m tools.results_tables [--check] [--page docs/results.md]

A line `<!-- results_table: DIR -->` (DIR relative to the repository, e.g.
docs/data/pe_ln) precedes a table this writes from DIR: the sweep's
results.csv (written over DIR by `txf-sweep --config=sweeps/NAME
--workdir=DIR --summarize` from the points' metrics.jsonl and
extrapolation.json committed there) for the final validation loss and its
flatness, and each point's extrapolation.json for the extrapolated losses,
mean ± sample std over the seed replicas. One row per point, in the
sweep's order: the fields the grid varies (encoding, LN, T5 max distance,
...), val @128, last fifth, flat, sliding @128, sliding @256, sliding @2048,
non-overlapping @2048, Δ (sliding @2048 minus sliding @128; empty where 2048
does not apply). A sweep without extrapolation (no extrapolation.json, e.g.
sweeps/mqar_scale) gets the recall table instead: the grid's fields, val
loss, val accuracy, last fifth, flat.

--check writes nothing and exits 1 if a table differs from its data
(tests/test_docs.py checks the same).
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import re
import sys

from tools.page_tables import check_or_write, rewrite_tables
from txf.rundir.metrics import METRICS_FILE
from txf.rundir.resume import CONFIG_FILE
from txf.sweep.figures import VALUE_WORDS
from txf.sweep.results import EXTRAPOLATION_FILE, RESULTS_CSV, Stat
from txf.train.replicas import metric_names

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- results_table: (\S+) -->$")
ENCODINGS = {
  "sinusoidal": "sinusoidal",
  "learned": "learned",
  "rope": "RoPE",
  "alibi": "ALiBi",
  "t5_bias": "T5 bias",
  "none": "none (NoPE)",
}
# (protocol, evaluation length) of each extrapolation column, in order.
COLUMNS = (("sliding", 128), ("sliding", 256), ("sliding", 2048), ("non_overlapping", 2048))
# The column titles of the grid's fields; their values as the cells show them.
GRID_COLUMNS = {
  "model.position": ("encoding", ENCODINGS.__getitem__),
  "model.norm_placement": ("LN", str),
  "model.options.t5_max_distance": ("T5 max distance", str),
  "model.family": ("model", VALUE_WORDS["model.family"].__getitem__),  # the figures' words
  "model.attention": ("attention", VALUE_WORDS["model.attention"].__getitem__),
  "model.d_model": ("width", str),
  "train.warmup_steps": ("warmup steps", str),
  "train.learning_rate": ("peak lr", str),
}
RESULT_COLUMNS = (
  "val @128",
  "last fifth",
  "flat",
  "sliding @128",
  "sliding @256",
  "sliding @2048",
  "non-overlapping @2048",
  "Δ",
)
RECALL_COLUMNS = ("val loss", "val accuracy", "last fifth", "flat")


def _header(fields: list[str], results: tuple[str, ...]) -> list[str]:
  titles = [GRID_COLUMNS[field][0] if field in GRID_COLUMNS else field for field in fields]
  titles += results
  return ["| " + " | ".join(titles) + " |", "|" + "---|" * len(titles)]


def _stat_text(stat: Stat) -> str:
  return f"{stat.mean:.3f} ± {stat.std:.3f}"


def _extrapolated(record: dict, protocol: str, length: int) -> Stat | None:
  """The replicas' loss at (protocol, length) as a Stat; None where the
  length does not apply (a learned table shorter than it)."""
  at = record["lengths"].index(length)
  if not record["applicable"][at]:
    return None
  return Stat.of(record["replica_loss"][protocol][at])


def _csv_stat(row: dict[str, str], name: str) -> str:
  """results.csv's `name` and `name`_std as the table shows them."""
  return _stat_text(Stat(float(row[name]), float(row[f"{name}_std"])))


def _extrapolation_cells(record: dict) -> list[str]:
  """sliding @128 ... non-overlapping @2048, then Δ, of a point's extrapolation.json."""
  stats = [_extrapolated(record, protocol, length) for protocol, length in COLUMNS]
  sliding_128, sliding_2048 = stats[0], stats[2]
  delta = f"{sliding_2048.mean - sliding_128.mean:+.3f}" if sliding_128 and sliding_2048 else ""
  return [*(_stat_text(stat) if stat else "n/a" for stat in stats), delta]


def _results_csv(data: pathlib.Path) -> tuple[list[str], list[dict[str, str]]]:
  """The grid's fields and the rows of the sweep's results.csv in `data`."""
  with open(data / RESULTS_CSV, newline="") as file:
    reader = csv.DictReader(file)
    columns = list(reader.fieldnames or [])
    rows = list(reader)
  return columns[columns.index("point") + 1 : columns.index("status")], rows


def _grid_cells(fields: list[str], row: dict[str, str]) -> list[str]:
  return [GRID_COLUMNS.get(field, ("", str))[1](row[field]) for field in fields]


def point_cells(data: pathlib.Path) -> dict[tuple[str, ...], str]:
  """{a row's grid cells, as the table shows them: its point's name} of the
  sweep whose raw outputs are in `data`."""
  fields, rows = _results_csv(data)
  return {tuple(_grid_cells(fields, row)): row["point"] for row in rows}


def _final_evaluation(point: pathlib.Path, name: str, replicas: int) -> list[float]:
  """Each replica's `name` (eval_loss, eval_accuracy) in the last metrics.jsonl
  row that logs it."""
  keys = metric_names(name, replicas)  # a single run logs `name` alone
  lines = (point / METRICS_FILE).read_text().splitlines()
  last = [row for row in map(json.loads, lines) if keys[0] in row][-1]
  return [float(last[key]) for key in keys]


def replica_values(point: pathlib.Path, title: str) -> list[float]:
  """Each replica's value, in replica order, of the point whose raw outputs
  are in `point`, in the table's column titled `title` (a loss or accuracy
  column: val @128, val loss, val accuracy, sliding @2048, ...)."""
  replicas = json.loads((point / CONFIG_FILE).read_text())["replicas"]
  if title in ("val @128", "val loss", "val accuracy"):
    name = "eval_accuracy" if title == "val accuracy" else "eval_loss"
    return _final_evaluation(point, name, replicas)
  columns = {f"{protocol.replace('_', '-')} @{n}": (protocol, n) for protocol, n in COLUMNS}
  if title not in columns:
    raise ValueError(f"column {title!r} holds no per-replica values")
  protocol, length = columns[title]
  record = json.loads((point / EXTRAPOLATION_FILE).read_text())
  return [float(v) for v in record["replica_loss"][protocol][record["lengths"].index(length)]]


def table(data: pathlib.Path) -> list[str]:
  """The results table of the sweep whose raw outputs are in `data`."""
  fields, rows = _results_csv(data)
  extrapolated = (data / rows[0]["point"] / EXTRAPOLATION_FILE).exists()
  lines = _header(fields, RESULT_COLUMNS if extrapolated else RECALL_COLUMNS)
  for row in rows:
    cells = _grid_cells(fields, row)
    cells.append(_csv_stat(row, "eval_loss"))
    if not extrapolated:
      cells.append(_csv_stat(row, "eval_accuracy"))
    cells += [f"{-100 * float(row['late_improvement']):.1f}%", row["flat"]]
    if extrapolated:
      record = json.loads((data / row["point"] / EXTRAPOLATION_FILE).read_text())
      cells += _extrapolation_cells(record)
    lines.append("| " + " | ".join(cells) + " |")
  return lines


def rewrite(text: str, root: pathlib.Path = ROOT) -> str:
  """The page with the table after every marker written from its data."""
  return rewrite_tables(text, MARKER, lambda found, above: table(root / found[1]))


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs" / "results.md")
  parser.add_argument("--check", action="store_true", help="compare, write nothing")
  args = parser.parse_args()
  return check_or_write(args.page, rewrite, args.check, "results tables and their data")


if __name__ == "__main__":
  sys.exit(main())
