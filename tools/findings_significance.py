"""Writes docs/results.md's significance tables from the page's own results tables.

  python -m tools.findings_significance [--check] [--page docs/results.md]

Each line `<!-- findings_significance: seeds=N -->` of the page follows a
results table: its leading columns name a point (encoding and placement, or
another grid field), the first `m ± s` column holds the final validation
loss, mean ± sample std over N seeds. `seeds=N column="TITLE"` tests the
column of that title instead (e.g. "sliding @2048"). After the marker this
writes, by txf.sweep.significance's rule (Welch's two-sided t-test, p <
0.05): for a table of (encoding, pre/post) rows, each placement's encodings
against the next in the ranking and each encoding's Pre-LN against its
Post-LN; for a table of one leading column, each point against the next in
the ranking. The means and stds are the table's, rounded to 3 decimals, so
p is the test's on the published numbers. For a table of two leading columns
that are not (encoding, pre/post), e.g. (model, width), the first field's
points are ranked at each value of the second ("LSTM < decoder (width
32)"): the comparison at a width is the question, not one width against
another. For a table of three or more leading columns (a grid of three
fields, e.g. LN x warmup x learning rate), every two rows that differ in one
field. `tuned="TITLE"` names a leading column that was tuned rather than
compared (the learning rate): each setting of the other columns keeps its
row of the best mean in it (the highest where the tested column is an
accuracy, the lowest loss otherwise; the first of equals), named in the first
cell ('linear attention (learning rate 0.01)'), and the rule above applies
to the rows left. The best of several settings is itself chosen on these
seeds, which flatters each side's best by about a standard error of its
mean; the page says so beside it.

--check writes nothing and exits 1 if a table differs from what the page's
results tables give (tests/test_docs.py checks the same).
"""

from __future__ import annotations

import argparse
import itertools
import pathlib
import re
import sys

from tools.page_tables import check_or_write, rewrite_tables
from txf.sweep.significance import welch

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(
  r'^<!-- findings_significance: seeds=(\d+)(?: column="([^"]+)")?(?: tuned="([^"]+)")? -->$'
)
_STAT = re.compile(r"^(?:\*\*)?([\d.]+) ± ([\d.]+)(?:\*\*)?$")
HEADER = [
  "| pair | difference | t | df | p | resolved |",
  "|---|---|---|---|---|---|",
]
PLACEMENTS = ("pre", "post")


def _cells(line: str) -> list[str]:
  return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _results_rows(
  lines: list[str], column: str | None = None
) -> tuple[list[str], dict[tuple[str, ...], tuple[float, float]]]:
  """The titles of the leading columns (those that name a point) and {the
  point's leading cells: (mean, std)} of the last results table in `lines`,
  from its first `m ± s` column or the one titled `column`."""
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
  return titles[: stat_columns[0]], rows


def _line(name: str, a: tuple[float, float], b: tuple[float, float], seeds: int) -> str:
  test = welch(a[0], a[1], seeds, b[0], b[1], seeds)
  numbers = (
    f"{test.difference:+.3f} | {test.t:.2f} | {test.df:.1f} | {test.p:.3f}"
    if test.p is not None
    else f"{test.difference:+.3f} | | | "
  )
  return f"| {name} | {numbers} | {'yes' if test.resolved else 'no'} |"


def _ranked_pairs(rows: dict[str, tuple[float, float]], seeds: int, note: str) -> list[str]:
  """Each point of `rows` against the next in the ranking (lower loss first)."""
  ranked = sorted((stat, name) for name, stat in rows.items())
  return [
    _line(f"{first} < {second}{note}", a, b, seeds)
    for (a, first), (b, second) in zip(ranked, ranked[1:])
  ]


def _one_cell_pairs(
  titles: list[str], rows: dict[tuple[str, ...], tuple[float, float]], seeds: int
) -> list[str]:
  """Every two rows that differ in one leading cell, the lower loss first,
  column by column ('warmup steps 60 < 0 (LN post, peak lr 0.003)')."""
  lines = []
  for column, title in enumerate(titles):
    for key_a, key_b in itertools.combinations(rows, 2):
      if [i for i, (a, b) in enumerate(zip(key_a, key_b)) if a != b] != [column]:
        continue
      (a, first), (b, second) = sorted([(rows[key_a], key_a), (rows[key_b], key_b)])
      rest = ", ".join(f"{titles[i]} {first[i]}" for i in range(len(titles)) if i != column)
      lines.append(_line(f"{title} {first[column]} < {second[column]} ({rest})", a, b, seeds))
  return lines


def at_best(
  titles: list[str],
  rows: dict[tuple[str, ...], tuple[float, float]],
  tuned: str,
  higher_is_better: bool,
) -> tuple[list[str], dict[tuple[str, ...], tuple[float, float]]]:
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
  best: dict[tuple[str, ...], tuple[str, tuple[float, float]]] = {}
  for key, stat in rows.items():
    rest = key[:at] + key[at + 1 :]
    held = best.get(rest)
    if held is None or (stat[0] > held[1][0] if higher_is_better else stat[0] < held[1][0]):
      best[rest] = (key[at], stat)
  kept = {(f"{rest[0]} ({tuned} {value})", *rest[1:]): stat for rest, (value, stat) in best.items()}
  return titles[:at] + titles[at + 1 :], kept


def significance_table(
  titles: list[str], rows: dict[tuple[str, ...], tuple[float, float]], seeds: int
) -> list[str]:
  """The marker's table (module docstring) of `rows` under leading columns
  `titles`: for (encoding, placement) rows adjacent encodings in each
  placement's ranking, then Pre-LN against Post-LN per encoding; for other
  two-cell rows, adjacent first cells at each second cell; for rows of one
  leading cell, adjacent points; for rows of three or more, every two rows
  that differ in one cell."""
  lines = list(HEADER)
  if all(len(key) == 1 for key in rows):
    return lines + _ranked_pairs({key[0]: stat for key, stat in rows.items()}, seeds, "")
  if all(len(key) >= 3 for key in rows):
    return lines + _one_cell_pairs(titles, rows, seeds)
  if not all(len(key) == 2 for key in rows):
    raise ValueError(f"rows must be of one, two or more leading cells, got {list(rows)}")
  if not all(key[1] in PLACEMENTS for key in rows):
    for second in dict.fromkeys(key[1] for key in rows):
      at = {first: stat for (first, other), stat in rows.items() if other == second}
      lines += _ranked_pairs(at, seeds, f" ({titles[1]} {second})")
    return lines
  for placement in PLACEMENTS:
    by_encoding = {encoding: stat for (encoding, p), stat in rows.items() if p == placement}
    lines += _ranked_pairs(by_encoding, seeds, f" ({placement}-LN)")
  for encoding in dict.fromkeys(encoding for encoding, _ in rows):
    if (encoding, "pre") in rows and (encoding, "post") in rows:
      pre, post = rows[(encoding, "pre")], rows[(encoding, "post")]
      first, second = ("pre", "post") if pre <= post else ("post", "pre")
      a, b = (pre, post) if first == "pre" else (post, pre)
      lines.append(_line(f"{encoding}: {first}-LN < {second}-LN", a, b, seeds))
  return lines


def rewrite(text: str) -> str:
  """The page with every marker's table written from the results table above it."""

  def table_for(found: re.Match[str], above: list[str]) -> list[str]:
    seeds, column, tuned = int(found[1]), found[2], found[3]
    titles, rows = _results_rows(above, column)
    if tuned is not None:
      titles, rows = at_best(titles, rows, tuned, "accuracy" in (column or ""))
    return significance_table(titles, rows, seeds)

  return rewrite_tables(text, MARKER, table_for)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs" / "results.md")
  parser.add_argument("--check", action="store_true", help="compare, write nothing")
  args = parser.parse_args()
  return check_or_write(
    args.page, rewrite, args.check, "significance tables and its results tables"
  )


if __name__ == "__main__":
  sys.exit(main())
