"""Writes docs/results.md's significance tables from the sweeps' per-replica raw outputs.

  python -m tools.findings_significance [--check] [--page docs/results.md]

Each line `<!-- findings_significance: data=DIR -->` of the page follows a
results table written from the sweep's raw outputs in DIR (relative to the
repository, e.g. docs/data/pe_ln; tools/results_tables.py): its leading
columns name a point, the first `m ± s` column holds the final validation
loss. `column="TITLE"` tests the column of that title instead (e.g.
"sliding @2048", "val accuracy"). Each point's per-replica values of that
column are read from DIR (its metrics.jsonl or extrapolation.json), never
from the table's rounded cells, which only name the rows (the tool checks
that the values round to the cell).

After the marker this writes, by txf.sweep.significance's rule (the paired
t-test where two points' replicas share seeds and batches, as the config.json
of every sweep committed here says they do, else Welch's; Holm-adjusted p <
0.05 over the table's comparisons, one family): for a table of (encoding,
pre/post) rows, each placement's encodings against the next in the ranking
and each encoding's Pre-LN against its Post-LN; for a table of one leading
column, each point against the next in the ranking. For a table of two
leading columns that are not (encoding, pre/post), e.g. (model, width), the
first field's points are ranked at each value of the second ("LSTM <
decoder (width 32)"): the comparison at a width is the question, not one
width against another. For a table of three or more leading columns (a grid
of three fields, e.g. LN x warmup x learning rate), every two rows that
differ in one field. `tuned="TITLE"` names a leading column that was tuned
rather than compared (the learning rate): each setting of the other columns
keeps its row of the best mean in it (the highest where the tested column
is an accuracy, the lowest loss otherwise; the first of equals), named in
the first cell ('linear attention (learning rate 0.01)'), and the rule above
applies to the rows left. The best of several settings is itself chosen on
these seeds, which flatters each side's best by about a standard error of
its mean; the page says so beside it.

`<!-- findings_significance: seeds=N -->` instead tests the table's own
rounded `m ± s` cells over N seeds by Welch's test: for a run whose raw
outputs were not kept (section 1), the only test its table allows; its rows
say so ("Welch, table").

--check writes nothing and exits 1 if a table differs from what the raw
outputs give (tests/test_docs.py checks the same).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import pathlib
import re
import sys
from collections.abc import Mapping
from typing import Any

from tools.page_tables import check_or_write, rewrite_tables
from tools.results_tables import point_cells, replica_values
from txf.rundir.resume import CONFIG_FILE
from txf.sweep import significance
from txf.sweep.results import Stat

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(
  r"^<!-- findings_significance: (?:seeds=(\d+)|data=(\S+))"
  r'(?: column="([^"]+)")?(?: tuned="([^"]+)")? -->$'
)
_STAT = re.compile(r"^(?:\*\*)?([\d.]+) ± ([\d.]+)(?:\*\*)?$")
PLACEMENTS = ("pre", "post")


@dataclasses.dataclass(frozen=True)
class Side:
  """One point as tested: its mean, and either its per-replica values (in
  replica order) with its run's config.json, or only the table's rounded
  std and the seed count (a run whose raw outputs were not kept)."""

  mean: float
  values: tuple[float, ...] | None = None
  config: Mapping[str, Any] | None = None
  std: float | None = None
  seeds: int = 0


def _test(a: Side, b: Side) -> significance.Test:
  """The rule's test of a - b: from the replicas where both sides have them
  (paired where their design pairs), else Welch's from the rounded cells."""
  if a.values is None or b.values is None:
    return significance.welch(a.mean, a.std, a.seeds, b.mean, b.std, b.seeds)
  paired = significance.paired_design(a.config or {}, b.config or {})
  return significance.compare(a.values, b.values, paired=paired)


def _cells(line: str) -> list[str]:
  return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _results_rows(
  lines: list[str], column: str | None = None
) -> tuple[list[str], str, dict[tuple[str, ...], tuple[float, float]]]:
  """The titles of the leading columns (those that name a point), the tested
  column's title and {the point's leading cells: (mean, std)} of the last
  results table in `lines`, from its first `m ± s` column or the one titled
  `column`."""
  end = len(lines)
  while end and not lines[end - 1].startswith("|"):
    end -= 1
  start = end
  while start and lines[start - 1].startswith("|"):
    start -= 1
  if end - start < 3:
    raise ValueError(f"no results table before line {end + 1}")
  titles, body = _cells(lines[start]), [_cells(line) for line in lines[start + 2 : end]]
  stat_columns = [i for i in range(len(titles)) if all(_STAT.match(row[i]) for row in body)]
  if not stat_columns:
    raise ValueError(f"no column of 'm ± s' losses in the table before line {end + 1}")
  if column is not None and column not in titles:
    raise ValueError(f"column={column!r} is not a title of the table before line {end + 1}")
  at = titles.index(column) if column is not None else stat_columns[0]
  rows = {}
  for row in body:
    stat = _STAT.match(row[at])
    if stat is None:
      raise ValueError(f"{row[at]!r} in column {titles[at]!r} is not 'm ± s'")
    rows[tuple(row[: stat_columns[0]])] = (float(stat[1]), float(stat[2]))
  return titles[: stat_columns[0]], titles[at], rows


def table_sides(
  rows: dict[tuple[str, ...], tuple[float, float]], seeds: int
) -> dict[tuple[str, ...], Side]:
  """The table's rows as Sides of their rounded mean and std over `seeds`."""
  return {key: Side(mean, std=std, seeds=seeds) for key, (mean, std) in rows.items()}


def data_sides(
  rows: dict[tuple[str, ...], tuple[float, float]], data: pathlib.Path, title: str
) -> dict[tuple[str, ...], Side]:
  """The table's rows as Sides of their points' per-replica values in
  column `title`, read from the sweep's raw outputs in `data`.

  Raises:
    ValueError: a row names no point of `data`, or its values do not round
      to its cell (the table is not this data's).
  """
  points = point_cells(data)
  sides = {}
  for key, cell in rows.items():
    if key not in points:
      raise ValueError(f"row {key} names no point of {data}")
    point = data / points[key]
    values = replica_values(point, title)
    stat = Stat.of(values)
    if (round(stat.mean, 3), round(stat.std or 0.0, 3)) != cell:
      raise ValueError(f"{point}: {title} {stat} does not round to the table's {cell}")
    config = json.loads((point / CONFIG_FILE).read_text())
    sides[key] = Side(stat.mean, tuple(values), config)
  return sides


def _p_text(p: float | None) -> str:
  """p to 3 decimals; below 0.001 to 2 significant digits (not a bare 0.000)."""
  if p is None:
    return ""
  return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def lines_of(pairs: list[tuple[str, Side, Side]]) -> list[str]:
  """The table of `pairs` (name, lower side, higher side): each test, its raw
  p and its p Holm-adjusted over `pairs`, one family."""
  tests = [_test(a, b) for _, a, b in pairs]
  adjusted = significance.holm([test.p for test in tests])
  lines = [
    f"| pair | difference | test | t | df | p | Holm p (of {len(pairs)}) | resolved |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for (name, a, _), test, holm_p in zip(pairs, tests, adjusted):
    kind = "paired" if test.paired else ("Welch" if a.values is not None else "Welch, table")
    numbers = (
      f"{test.t:.2f} | {test.df:.1f} | {_p_text(test.p)} | {_p_text(holm_p)}"
      if test.p is not None
      else " | | | "
    )
    resolved = "yes" if significance.passes(holm_p) else "no"
    lines.append(f"| {name} | {test.difference:+.3f} | {kind} | {numbers} | {resolved} |")
  return lines


Pair = tuple[str, Side, Side]


def _ranked_pairs(rows: dict[str, Side], note: str) -> list[Pair]:
  """Each point of `rows` against the next in the ranking (lower mean first)."""
  ranked = sorted(rows, key=lambda name: rows[name].mean)
  return [
    (f"{first} < {second}{note}", rows[first], rows[second])
    for first, second in zip(ranked, ranked[1:])
  ]


def _one_cell_pairs(titles: list[str], rows: dict[tuple[str, ...], Side]) -> list[Pair]:
  """Every two rows that differ in one leading cell, the lower mean first,
  column by column ('warmup steps 60 < 0 (LN post, peak lr 0.003)')."""
  pairs = []
  for column, title in enumerate(titles):
    for key_a, key_b in itertools.combinations(rows, 2):
      if [i for i, (a, b) in enumerate(zip(key_a, key_b)) if a != b] != [column]:
        continue
      first, second = sorted([key_a, key_b], key=lambda key: rows[key].mean)
      rest = ", ".join(f"{titles[i]} {first[i]}" for i in range(len(titles)) if i != column)
      name = f"{title} {first[column]} < {second[column]} ({rest})"
      pairs.append((name, rows[first], rows[second]))
  return pairs


def at_best(
  titles: list[str], rows: dict[tuple[str, ...], Side], tuned: str, higher_is_better: bool
) -> tuple[list[str], dict[tuple[str, ...], Side]]:
  """`titles` and `rows` without the leading column `tuned`: each setting of
  the others keeps its row of the best mean, the tuned value named in its
  first cell ('softmax attention (learning rate 0.003)').

  Raises:
    ValueError: `tuned` is not a leading column, or is the only one.
  """
  if tuned not in titles:
    raise ValueError(f"tuned={tuned!r} is not a leading column of {titles}")
  if len(titles) < 2:
    raise ValueError(f"tuned={tuned!r} is the only leading column: nothing left to compare")
  at = titles.index(tuned)
  best: dict[tuple[str, ...], tuple[str, Side]] = {}
  for key, side in rows.items():
    rest = key[:at] + key[at + 1 :]
    held = best.get(rest)
    if held is None or (side.mean > held[1].mean if higher_is_better else side.mean < held[1].mean):
      best[rest] = (key[at], side)
  kept = {(f"{rest[0]} ({tuned} {value})", *rest[1:]): side for rest, (value, side) in best.items()}
  return titles[:at] + titles[at + 1 :], kept


def significance_pairs(titles: list[str], rows: dict[tuple[str, ...], Side]) -> list[Pair]:
  """The marker's pairs (module docstring) of `rows` under leading columns
  `titles`: for (encoding, placement) rows adjacent encodings in each
  placement's ranking, then Pre-LN against Post-LN per encoding; for other
  two-cell rows, adjacent first cells at each second cell; for rows of one
  leading cell, adjacent points; for rows of three or more, every two rows
  that differ in one cell."""
  if all(len(key) == 1 for key in rows):
    return _ranked_pairs({key[0]: side for key, side in rows.items()}, "")
  if all(len(key) >= 3 for key in rows):
    return _one_cell_pairs(titles, rows)
  if not all(len(key) == 2 for key in rows):
    raise ValueError(f"rows must be of one, two or more leading cells, got {list(rows)}")
  pairs = []
  if not all(key[1] in PLACEMENTS for key in rows):
    for second in dict.fromkeys(key[1] for key in rows):
      at = {first: side for (first, other), side in rows.items() if other == second}
      pairs += _ranked_pairs(at, f" ({titles[1]} {second})")
    return pairs
  for placement in PLACEMENTS:
    by_encoding = {encoding: side for (encoding, p), side in rows.items() if p == placement}
    pairs += _ranked_pairs(by_encoding, f" ({placement}-LN)")
  for encoding in dict.fromkeys(encoding for encoding, _ in rows):
    if (encoding, "pre") in rows and (encoding, "post") in rows:
      first, second = sorted(PLACEMENTS, key=lambda p: rows[(encoding, p)].mean)
      name = f"{encoding}: {first}-LN < {second}-LN"
      pairs.append((name, rows[(encoding, first)], rows[(encoding, second)]))
  return pairs


def rewrite(text: str, root: pathlib.Path = ROOT) -> str:
  """The page with every marker's table written from its data (or from the
  results table above it, for a seeds=N marker)."""

  def table_for(found: re.Match[str], above: list[str]) -> list[str]:
    seeds, data, column, tuned = found[1], found[2], found[3], found[4]
    titles, title, stats = _results_rows(above, column)
    rows = data_sides(stats, root / data, title) if data else table_sides(stats, int(seeds))
    if tuned is not None:
      titles, rows = at_best(titles, rows, tuned, "accuracy" in title)
    return lines_of(significance_pairs(titles, rows))

  return rewrite_tables(text, MARKER, table_for)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs" / "results.md")
  parser.add_argument("--check", action="store_true", help="compare, write nothing")
  args = parser.parse_args()
  return check_or_write(
    args.page, rewrite, args.check, "significance tables and the raw outputs they test"
  )


if __name__ == "__main__":
  sys.exit(main())
