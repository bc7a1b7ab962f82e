"""Lists the numbers of docs/results.md that no committed data gives.

  python -m tools.traced_numbers [--page docs/results.md]

prints each untraced measured number with its line and exits 1 if there
is one (tests/test_docs.py checks the same).

A measured number is a decimal with two or more digits after the point
(1.613, 0.093, p = 0.011), or a decimal with a sign or a percent (+1.9,
-1.6%, ± 0.4). Every other number is taken for a setting or a count and not
checked: integers (steps, seeds, widths, lengths, dates, years), decimals
with one digit after the point and no sign or percent (4.4x, 3.2M
parameters, 37.9 s: timings and scale factors are not checked), exponent
forms (1e-2). Not read at all: headings, code (fenced blocks and `spans`),
link targets, HTML comments and software versions (Python 3.12, jax 0.10.2).

A measured number is traced when one of these holds:

- it lies in a generated table (the `|` lines after a results_table,
  findings_significance or t5_dilution marker: their own tests check them
  against docs/data);
- its digits are a known value of its own `## ` section rounded to its
  printed precision, sign aside: a number in a cell of one of the section's
  generated tables; the difference of two means ("m ± s" cells) in one row
  or one column of its results tables; for each docs/data/DIR the section
  names, the p and Holm p of the sweep's own DIR/results.md and each run's
  final validation loss and accuracy, per replica, in DIR's metrics.jsonl
  files, and each replica's change of validation loss over the last fifth
  in percent (txf.sweep.results.late_improvement: the flat verdict's); or
  the rule's level, txf.sweep.significance.ALPHA;
- it lies inside a not-recomputable region: `<!-- not recomputable -->`
  ... `<!-- /not recomputable -->`, whose visible text must itself say "not
  recomputable" (or "not yet recomputable") so that the reader sees it.

It checks that each number is some committed value, not that it is the
value its sentence means: a changed digit that happens to give another
known value of its section passes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import pathlib
import re
import sys
from collections.abc import Iterator
from decimal import Decimal

from tools import findings_significance, results_tables, t5_dilution
from txf.rundir.resume import read_run_config
from txf.sweep import significance
from txf.sweep.results import late_improvement, replica_curves

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
GENERATED = (results_tables.MARKER, findings_significance.MARKER, t5_dilution.MARKER)
REGION = re.compile(r"<!-- not recomputable -->(.*?)<!-- /not recomputable -->", re.S)
SAYS_SO = re.compile(r"not (yet )?recomputable", re.I)
NUMBER = re.compile(
  r"(?<![\w.])(?P<sign>[+±−-] ?)?(?P<digits>\d+(?:,\d{3})*(?:\.\d+)?(?:e-?\d+)?)(?P<percent>%?)"
)
# Text the check does not read: fenced code, code spans, HTML comments, link targets, versions.
UNREAD = re.compile(
  r"```.*?```|`[^`\n]*`|<!--.*?-->|\]\([^)]*\)|\b(?:Python|jax|flax|optax)\s\d+(?:\.\d+)+", re.S
)
FINAL_VALUE = re.compile(r"^eval_(loss|accuracy)(/\d+)?$")


def _blank(text: str, start: int, end: int) -> str:
  """`text` with [start, end) turned to spaces, its line breaks kept."""
  return text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]


def generated_tables(lines: list[str]) -> Iterator[tuple[int, int, re.Pattern[str]]]:
  """(first, end) line indices of each table a generating tool writes, and its marker."""
  for i, line in enumerate(lines):
    for marker in GENERATED:
      if marker.match(line):
        end = i + 1
        while end < len(lines) and lines[end].startswith("|"):
          end += 1
        yield i + 1, end, marker


def regions(text: str) -> Iterator[re.Match[str]]:
  """The not-recomputable regions; a ValueError for one that does not say so."""
  for region in REGION.finditer(text):
    if not SAYS_SO.search(UNREAD.sub(" ", region.group(1))):
      line = text.count("\n", 0, region.start()) + 1
      raise ValueError(f"line {line}: a not-recomputable region that does not say so")
    yield region


def read_text(text: str) -> str:
  """The page with everything the check does not read blanked, offsets kept."""
  lines = text.split("\n")
  for first, end, _ in generated_tables(lines):
    lines[first:end] = [" " * len(line) for line in lines[first:end]]
  text = "\n".join(" " * len(line) if line.startswith("#") else line for line in lines)
  for region in regions(text):
    text = _blank(text, region.start(), region.end())
  for unread in UNREAD.finditer(text):
    text = _blank(text, unread.start(), unread.end())
  return text


def is_measured(number: re.Match[str]) -> bool:
  decimals = number["digits"].partition(".")[2]
  return (
    bool(decimals)
    and "e" not in decimals
    and (len(decimals) >= 2 or bool(number["sign"] or number["percent"]))
  )


def _value(number: re.Match[str]) -> Decimal:
  return Decimal(number["digits"].replace(",", ""))


def _numbers(text: str) -> list[Decimal]:
  return [_value(number) for number in NUMBER.finditer(text)]


def _cells(row: str) -> list[str]:
  return [cell.strip() for cell in row.split("|")[1:-1]]


def _gaps(rows: list[str]) -> Iterator[Decimal]:
  """The differences of a table's means (its "m ± s" cells) within a row and within a column."""
  means = [[_numbers(cell)[0] if "±" in cell else None for cell in _cells(row)] for row in rows]
  for line in [*means, *zip(*means)]:
    present = [value for value in line if value is not None]
    yield from (a - b for i, a in enumerate(present) for b in present[i + 1 :])


def _table_values(rows: list[str], marker: re.Pattern[str]) -> Iterator[Decimal]:
  """A generated table's numbers; a results table's gaps too (a significance table's
  columns are tests, whose differences mean nothing)."""
  yield from _numbers("\n".join(rows[2:]))
  if marker is not findings_significance.MARKER:
    yield from _gaps(rows[2:])


def _summary_ps(summary: pathlib.Path) -> Iterator[Decimal]:
  """The p and Holm p of a sweep's own results.md, its pair table's columns."""
  titles: list[str] = []
  for row in summary.read_text().splitlines():
    cells = _cells(row)
    if "Holm p" in cells:
      titles = cells
    elif titles and len(cells) == len(titles) and not row.startswith("|---"):
      yield from _numbers(cells[titles.index("p")] + " " + cells[titles.index("Holm p")])


def _final_values(metrics: pathlib.Path) -> Iterator[Decimal]:
  """Each replica's final validation loss and accuracy in a metrics.jsonl."""
  rows = [json.loads(line) for line in metrics.read_text().splitlines()]
  last = [row for row in rows if "eval_loss" in row or "eval_loss/0" in row][-1]
  yield from (Decimal(repr(v)) for k, v in last.items() if FINAL_VALUE.match(k))


def _late_changes(metrics: pathlib.Path) -> Iterator[Decimal]:
  """Each replica's change of validation loss over the last fifth of
  training, and the mean's, in percent (what the flat verdict judges, read
  as a summary reads the curves), where it is known."""
  run = metrics.parent
  saved = read_run_config(run)
  steps_N, loss_NxR = replica_curves(run, replicas=1 if saved is None else saved.replicas)
  for loss_N in (*loss_NxR.T, loss_NxR.mean(axis=1)):
    change = late_improvement(steps_N, loss_N)
    if change is not None:
      yield Decimal(repr(100 * change))


def known_values(section: str, data: pathlib.Path = DATA) -> list[Decimal]:
  """Every value a measured number of `section` may round from, sorted, sign
  aside: from the section's generated tables and the docs/data directories it names."""
  lines = section.split("\n")
  values = [
    v
    for first, end, marker in generated_tables(lines)
    for v in _table_values(lines[first:end], marker)
  ]
  for name in sorted(set(re.findall(r"docs/data/(\w+)", section))):
    if (data / name / "results.md").exists():
      values += _summary_ps(data / name / "results.md")
    for metrics in sorted((data / name).glob("**/metrics.jsonl")):
      values += [*_final_values(metrics), *_late_changes(metrics)]
  return sorted(abs(value) for value in [*values, Decimal(str(significance.ALPHA))])


def traced(number: re.Match[str], values: list[Decimal]) -> bool:
  """Whether a known value rounds to `number` at its printed precision."""
  value = _value(number)
  half = Decimal(5).scaleb(value.as_tuple().exponent - 1)
  i = bisect.bisect_left(values, value - half)
  return i < len(values) and values[i] <= value + half


def sections(text: str) -> Iterator[tuple[int, str]]:
  """(first line, text) of the page's opening and of each `## ` section."""
  lines = text.split("\n")
  starts = [0, *(i for i, line in enumerate(lines) if line.startswith("## ")), len(lines)]
  for start, end in zip(starts, starts[1:]):
    yield start, "\n".join(lines[start:end])


def untraced(text: str, data: pathlib.Path = DATA) -> list[tuple[int, str]]:
  """(line, number) of each measured number of `text` that is not traced."""
  found = []
  for start, section in sections(text):
    values = known_values(section, data)
    read = read_text(section)
    found += [
      (start + read.count("\n", 0, number.start()) + 1, number.group().strip())
      for number in NUMBER.finditer(read)
      if is_measured(number) and not traced(number, values)
    ]
  return found


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs" / "results.md")
  args = parser.parse_args(argv)
  found = untraced(args.page.read_text())
  for line, number in found:
    print(f"{args.page}:{line}: {number} is not traced to docs/data", file=sys.stderr)
  return 1 if found else 0


if __name__ == "__main__":
  sys.exit(main())
