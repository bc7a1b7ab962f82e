"""Writes docs/results.md's significance tables from the page's own results tables.

  python -m tools.findings_significance [--check] [--page docs/results.md]

Each line `<!-- findings_significance: seeds=N -->` of the page follows a
results table whose rows start `| encoding | pre/post | m ± s |` (the final
validation loss, mean ± sample std over N seeds). After the marker this
writes, by txf.sweep.significance's rule (Welch's two-sided t-test, p <
0.05), each placement's encodings against the next in the ranking, and each
encoding's Pre-LN against its Post-LN. The means and stds are the table's,
rounded to 3 decimals, so p is the test's on the published numbers.

--check writes nothing and exits 1 if a table differs from what the page's
results tables give (tests/test_docs.py checks the same).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

from tools.page_tables import check_or_write, rewrite_tables
from txf.sweep.significance import welch

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^<!-- findings_significance: seeds=(\d+) -->$")
_STAT = re.compile(r"^(?:\*\*)?([\d.]+) ± ([\d.]+)(?:\*\*)?$")
HEADER = [
  "| pair | difference | t | df | p | resolved |",
  "|---|---|---|---|---|---|",
]


def _results_rows(lines: list[str]) -> dict[tuple[str, str], tuple[float, float]]:
  """{(encoding, placement): (mean, std)} of the last results table in `lines`."""
  end = len(lines)
  while end and not lines[end - 1].startswith("|"):
    end -= 1
  start = end
  while start and lines[start - 1].startswith("|"):
    start -= 1
  rows = {}
  for line in lines[start:end]:
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    stat = _STAT.match(cells[2]) if len(cells) > 2 else None
    if stat and cells[1] in ("pre", "post"):
      rows[(cells[0], cells[1])] = (float(stat[1]), float(stat[2]))
  if not rows:
    raise ValueError(f"no results table with 'm ± s' losses before line {end + 1}")
  return rows


def _line(name: str, a: tuple[float, float], b: tuple[float, float], seeds: int) -> str:
  test = welch(a[0], a[1], seeds, b[0], b[1], seeds)
  numbers = (
    f"{test.difference:+.3f} | {test.t:.2f} | {test.df:.1f} | {test.p:.3f}"
    if test.p is not None
    else f"{test.difference:+.3f} | | | "
  )
  return f"| {name} | {numbers} | {'yes' if test.resolved else 'no'} |"


def significance_table(rows: dict[tuple[str, str], tuple[float, float]], seeds: int) -> list[str]:
  """The marker's table: adjacent encodings in each placement's ranking, then
  Pre-LN against Post-LN per encoding (the lower loss first in each pair)."""
  lines = list(HEADER)
  for placement in ("pre", "post"):
    ranked = sorted((stat, encoding) for (encoding, p), stat in rows.items() if p == placement)
    for (a, first), (b, second) in zip(ranked, ranked[1:]):
      lines.append(_line(f"{first} < {second} ({placement}-LN)", a, b, seeds))
  for encoding in dict.fromkeys(encoding for encoding, _ in rows):
    if (encoding, "pre") in rows and (encoding, "post") in rows:
      pre, post = rows[(encoding, "pre")], rows[(encoding, "post")]
      first, second = ("pre", "post") if pre <= post else ("post", "pre")
      a, b = (pre, post) if first == "pre" else (post, pre)
      lines.append(_line(f"{encoding}: {first}-LN < {second}-LN", a, b, seeds))
  return lines


def rewrite(text: str) -> str:
  """The page with every marker's table written from the results table above it."""
  return rewrite_tables(
    text, MARKER, lambda found, above: significance_table(_results_rows(above), int(found[1]))
  )


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
