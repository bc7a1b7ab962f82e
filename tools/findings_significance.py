"""Writes docs/results.md's significance tables from the sweeps' per-replica raw outputs.

  python -m tools.findings_significance [--check] [--page docs/results.md]

Each line `<!-- findings_significance: data=DIR -->` of the page comes after
the results table written from the sweep's raw outputs in DIR (relative to
the repository, e.g. docs/data/pe_ln; tools/results_tables.py), which its
`<!-- results_table: DIR -->` line heads: its leading
columns name a point, the first `m ± s` column holds the final validation
loss. `column="TITLE"` tests the column of that title instead (e.g.
"sliding @2048", "val accuracy"). Each point's per-replica values of that
column are read from DIR (its metrics.jsonl or extrapolation.json), never
from the table's rounded cells, which only name the rows (the tool checks
that the values round to the cell).

After the marker this writes, by txf.sweep.significance's rule (the paired
t-test where two points' replicas share seeds and batches, as the config.json
of every sweep committed here says they do, else Welch's; Holm-adjusted p <
0.05 over the table's comparisons, one family), each comparison's
difference, its 95% confidence interval (paired: the t interval of the mean
paired difference, df R - 1; Welch: Welch-Satterthwaite's), t, df, p and
Holm p. Which pairs:

- one leading column whose cells all parse as numbers (an ordered setting:
  a distance, a width, a length): each setting against its neighbour in the
  setting's order (32-64, 64-128, 128-512), the lower mean named first. The
  family follows from the setting alone, before any result is seen.
- one leading column of unordered categories: each point against the next
  in the ranking of the observed means. This family is chosen *after*
  seeing the ranking: which pairs are tested depends on the data, and a
  pair that is not adjacent in the observed ranking is never tested. Holm's
  bound on the chance of any false pass holds for a family fixed in
  advance; for this one it is not proven (the bound that holds for sure is
  Holm over every pair, k(k-1)/2 of them for k points, which this does not
  apply), so read its passes as weaker than the stated 0.05. What it buys:
  k - 1 comparisons instead of k(k-1)/2, so a smaller Holm factor.
- (encoding, pre/post) rows: each placement's encodings against the next in
  the ranking (chosen after seeing it, as above) and each encoding's Pre-LN
  against its Post-LN.
- two leading columns that are not (encoding, pre/post), e.g. (model,
  width): the first field's points are ranked at each value of the second
  ("LSTM < decoder (width 32)"), adjacent in the ranking (with two points at
  a value, their one pair, chosen by nothing); the comparison at a width is
  the question, not one width against another.
- three or more leading columns (a grid of three fields, e.g. LN x warmup
  x learning rate): every two rows that differ in one field.

`tuned="TITLE"` names a leading column that was tuned rather than compared
(the learning rate): each setting of the other columns keeps its row of the
best mean in it (the highest where the tested column is an accuracy, the
lowest loss otherwise; the first of equals), named in the first cell
('linear attention (learning rate 0.01)'), and the rule above applies to the
rows left. The best of several settings is itself chosen on these seeds,
which flatters each side's best by about a standard error of its mean; the
page says so beside it.

`where="TITLE=CELL; TITLE=CELL"` keeps the rows whose leading cell under
each TITLE is CELL and drops those columns, before the pairs are chosen:
`where="model=LSTM"` on (model, width) rows leaves the LSTM's widths, an
ordered setting, so each width is tested against its neighbour (the growth
of one model with width, which the (model, width) table does not test).

`data=DIR+DIR2` tests the rows of both sweeps' results tables (DIR's, then
DIR2's; as many leading columns, named by DIR's titles), as one family:
points of two sweeps that share seeds and batches (e.g. the LSTM of one
sweep against the decoders of another) are paired like points of one.

`step=N` tests each point's per-replica values at the evaluation of step N
(a validation loss or accuracy column) instead of the final ones: the same
family at an earlier evaluation, to show whether a resolved ordering holds
before the last one. The final values must still round to the table's cells.
A data= marker's results table is the one that its DIR's
`<!-- results_table: DIR -->` line above it heads (so a marker may follow
another marker's table, or another sweep's); a seeds= marker's is the last
table above it that this tool did not write.

`<!-- findings_significance: seeds=N -->` instead tests the table's own
rounded `m ± s` cells over N seeds by Welch's test: for a run whose raw
outputs were not kept (section 1), the only test its table allows; its rows
say so ("Welch, table").

`<!-- findings_significance: noise=DIR,DIR2,... -->` writes no pair table
but the sweeps' seed noise: for the points every one of them holds, the
within-point SD of the final validation loss pooled over those points (df
the sum of R - 1), and the two-sided F test of each two sweeps' pooled
variances, with the ratio's 95% interval, Holm over the table's tests.

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
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tools.page_tables import check_or_write, rewrite_tables
from tools.results_tables import point_cells, replica_values
from txf.rundir.metrics import METRICS_FILE
from txf.rundir.resume import CONFIG_FILE
from txf.sweep import significance
from txf.sweep.results import Stat
from txf.train.replicas import metric_names

ROOT = pathlib.Path(__file__).resolve().parent.parent
MARKER = re.compile(
  r"^<!-- findings_significance: (?:seeds=(?P<seeds>\d+)|data=(?P<data>\S+)|noise=(?P<noise>\S+))"
  r'(?: column="(?P<column>[^"]+)")?(?: tuned="(?P<tuned>[^"]+)")?'
  r'(?: where="(?P<where>[^"]+)")?(?: step=(?P<step>\d+))? -->$'
)
TABLE_MARKER = "<!-- results_table: {} -->"
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


def _results_blocks(lines: list[str]) -> Iterator[tuple[int, int]]:
  """(start, end) line indices of the tables in `lines`, the last first,
  leaving out the tables this tool writes (those after a marker)."""
  end = len(lines)
  while True:
    while end and not lines[end - 1].startswith("|"):
      end -= 1
    if not end:
      return
    start = end
    while start and lines[start - 1].startswith("|"):
      start -= 1
    if not (start and MARKER.match(lines[start - 1])):
      yield start, end
    end = start


Rows = dict[tuple[str, ...], tuple[float, float]]


def _data_block(lines: list[str], data: str) -> tuple[int, int]:
  """(start, end) line indices of the results table that the last
  `<!-- results_table: DATA -->` line of `lines` heads.

  Raises:
    ValueError: no such line.
  """
  heads = [i for i, line in enumerate(lines) if line == TABLE_MARKER.format(data)]
  if not heads:
    raise ValueError(f"no results table of {data} before line {len(lines) + 1}")
  start = end = heads[-1] + 1
  while end < len(lines) and lines[end].startswith("|"):
    end += 1
  return start, end


def _results_rows(
  lines: list[str], column: str | None = None, data: list[str] | None = None
) -> tuple[list[str], str, list[Rows]]:
  """The titles of the leading columns (those that name a point), the tested
  column's title and, for each results table (in `data`'s order: the table
  each DIR's `results_table` line heads; without `data`, the last table in
  `lines`), {the point's leading cells: (mean, std)}, from its first
  `m ± s` column or the one titled `column`. The tables must have as many
  leading columns and the same tested title; the titles are the first
  one's."""
  if data:
    blocks = [_data_block(lines, name) for name in data]
  else:
    last = next(_results_blocks(lines), None)
    blocks = [last] if last else []
  if not blocks or any(end - start < 3 for start, end in blocks):
    raise ValueError(f"no results table before line {len(lines) + 1}")
  found = []
  for start, end in blocks:
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
    found.append((titles[: stat_columns[0]], titles[at], rows))
  if len({(len(leading), title) for leading, title, _ in found}) != 1:
    raise ValueError(f"the tables before line {len(lines) + 1} differ in their columns")
  return found[0][0], found[0][1], [rows for *_, rows in found]


def table_sides(rows: Rows, seeds: int) -> dict[tuple[str, ...], Side]:
  """The table's rows as Sides of their rounded mean and std over `seeds`."""
  return {key: Side(mean, std=std, seeds=seeds) for key, (mean, std) in rows.items()}


def values_at(point: pathlib.Path, title: str, step: int) -> list[float]:
  """Each replica's value in column `title` (a validation loss or accuracy)
  at the evaluation of step `step`, from the point's metrics.jsonl (the last
  row of that step that logs it, as a resumed run may log one twice).

  Raises:
    ValueError: the column is not a validation loss or accuracy, or no
      evaluation was logged at `step`.
  """
  if title not in ("val @128", "val loss", "val accuracy"):
    raise ValueError(f"step= tests a validation loss or accuracy column, not {title!r}")
  name = "eval_accuracy" if title == "val accuracy" else "eval_loss"
  keys = metric_names(name, json.loads((point / CONFIG_FILE).read_text())["replicas"])
  rows = map(json.loads, (point / METRICS_FILE).read_text().splitlines())
  at = [row for row in rows if row.get("step") == step and keys[0] in row]
  if not at:
    raise ValueError(f"{point}: no evaluation at step {step}")
  return [float(at[-1][key]) for key in keys]


def data_sides(
  tables: list[Rows], data: list[pathlib.Path], title: str, step: int | None = None
) -> dict[tuple[str, ...], Side]:
  """The rows of `tables` as Sides of their points' per-replica values in
  column `title`, read from the sweep's raw outputs in the directory of
  `data` at the table's place: the final ones, or with `step` those of the
  evaluation at that step (the final ones must still round to the cells).

  Raises:
    ValueError: a row names no point of its directory, or its final values
      do not round to its cell (the table is not this data's).
  """
  if len(tables) != len(data):
    raise ValueError(f"{len(data)} directories for {len(tables)} results tables")
  sides = {}
  for rows, directory in zip(tables, data):
    points = point_cells(directory)
    for key, cell in rows.items():
      if key not in points:
        raise ValueError(f"row {key} names no point of {directory}")
      if key in sides:
        raise ValueError(f"row {key} is in two of the tables")
      point = directory / points[key]
      values = replica_values(point, title)
      stat = Stat.of(values)
      if (round(stat.mean, 3), round(stat.std or 0.0, 3)) != cell:
        raise ValueError(f"{point}: {title} {stat} does not round to the table's {cell}")
      if step is not None:
        values = values_at(point, title, step)
      config = json.loads((point / CONFIG_FILE).read_text())
      sides[key] = Side(float(np.mean(values)), tuple(values), config)
  return sides


def _p_text(p: float | None) -> str:
  """p to 3 decimals; below 0.001 to 2 significant digits (not a bare 0.000)."""
  if p is None:
    return ""
  return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _ci_text(test: significance.Test) -> str:
  """The difference's 95% interval, '[low, high]' to 3 decimals."""
  return "" if test.ci is None else f"[{test.ci[0]:+.3f}, {test.ci[1]:+.3f}]"


def lines_of(pairs: list[tuple[str, Side, Side]]) -> list[str]:
  """The table of `pairs` (name, lower side, higher side): each test, the
  95% interval of its difference, its raw p and its p Holm-adjusted over
  `pairs`, one family."""
  tests = [_test(a, b) for _, a, b in pairs]
  adjusted = significance.holm([test.p for test in tests])
  level = f"{100 * significance.CONFIDENCE:.0f}%"
  lines = [
    f"| pair | difference | {level} CI | test | t | df | p | Holm p (of {len(pairs)}) | resolved |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  for (name, a, _), test, holm_p in zip(pairs, tests, adjusted):
    kind = "paired" if test.paired else ("Welch" if a.values is not None else "Welch, table")
    numbers = (
      f"{test.t:.2f} | {test.df:.1f} | {_p_text(test.p)} | {_p_text(holm_p)}"
      if test.p is not None
      else " | | | "
    )
    resolved = "yes" if significance.passes(holm_p) else "no"
    lines.append(
      f"| {name} | {test.difference:+.3f} | {_ci_text(test)} | {kind} | {numbers} | {resolved} |"
    )
  return lines


Pair = tuple[str, Side, Side]


def _ranked_pairs(rows: dict[str, Side], note: str) -> list[Pair]:
  """Each point of `rows` against the next in the ranking (lower mean first):
  a family chosen after seeing the ranking (module docstring)."""
  ranked = sorted(rows, key=lambda name: rows[name].mean)
  return [
    (f"{first} < {second}{note}", rows[first], rows[second])
    for first, second in zip(ranked, ranked[1:])
  ]


def _number(cell: str) -> float | None:
  try:
    return float(cell)
  except ValueError:
    return None


def _neighbour_pairs(rows: dict[str, Side]) -> list[Pair]:
  """Each setting of `rows` (cells that parse as numbers) against the next
  in the setting's own order, the lower mean named first: a family fixed
  before the results."""
  ordered = sorted(rows, key=lambda name: float(name))
  pairs = []
  for a, b in zip(ordered, ordered[1:]):
    first, second = sorted([a, b], key=lambda name: rows[name].mean)
    pairs.append((f"{first} < {second}", rows[first], rows[second]))
  return pairs


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


def only_where(
  titles: list[str], rows: dict[tuple[str, ...], Side], where: str
) -> tuple[list[str], dict[tuple[str, ...], Side]]:
  """`titles` and `rows` restricted by `where` ("TITLE=CELL; TITLE=CELL"):
  the rows whose leading cell under each TITLE is CELL, without those
  columns ('attention=linear attention' leaves linear attention's widths;
  the pairs' names then end in '(attention linear attention)').

  Raises:
    ValueError: a TITLE is not a leading column, a condition is not
      TITLE=CELL, or fewer than two rows are left.
  """
  fixed = {}
  for condition in where.split(";"):
    title, equals, cell = (part.strip() for part in condition.partition("="))
    if not equals or not cell:
      raise ValueError(f"where={where!r}: {condition.strip()!r} is not TITLE=CELL")
    if title not in titles:
      raise ValueError(f"where={where!r}: {title!r} is not a leading column of {titles}")
    fixed[titles.index(title)] = cell
  kept = [i for i in range(len(titles)) if i not in fixed]
  left = {
    tuple(key[i] for i in kept): side
    for key, side in rows.items()
    if all(key[i] == cell for i, cell in fixed.items())
  }
  if len(left) < 2:
    raise ValueError(f"where={where!r} leaves {len(left)} row(s): nothing to compare")
  return [titles[i] for i in kept], left


def significance_pairs(titles: list[str], rows: dict[tuple[str, ...], Side]) -> list[Pair]:
  """The marker's pairs (module docstring) of `rows` under leading columns
  `titles`: for (encoding, placement) rows adjacent encodings in each
  placement's ranking, then Pre-LN against Post-LN per encoding; for other
  two-cell rows, adjacent first cells at each second cell; for rows of one
  leading cell, neighbouring settings where every cell is a number, else
  adjacent points in the ranking; for rows of three or more, every two rows
  that differ in one cell."""
  if all(len(key) == 1 for key in rows):
    single = {key[0]: side for key, side in rows.items()}
    if all(_number(name) is not None for name in single):
      return _neighbour_pairs(single)
    return _ranked_pairs(single, "")
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


def noise_lines(data: list[pathlib.Path]) -> list[str]:
  """The table of a noise=DIR,DIR,... marker: the within-point variance of
  the final validation loss pooled over the points every sweep of `data`
  holds, and the F test of each two sweeps' variances, Holm-adjusted over
  the table's tests."""
  names = [set(point_cells(directory).values()) for directory in data]
  common = sorted(set.intersection(*names))
  if not common:
    raise ValueError(f"no point is in every one of {[str(d) for d in data]}")
  pooled = [
    significance.pooled_variance([replica_values(directory / name, "val loss") for name in common])
    for directory in data
  ]
  tests = [
    (a, b, significance.variance_ratio(*pooled[a], *pooled[b]))
    for a, b in itertools.combinations(range(len(data)), 2)
  ]
  adjusted = significance.holm([test.p for *_, test in tests])
  level = f"{100 * significance.CONFIDENCE:.0f}%"
  lines = [
    f"| sweeps (a / b), {len(common)} points | pooled SD a (df) | pooled SD b (df) "
    f"| variance ratio a / b | {level} CI | F p | Holm p (of {len(tests)}) | resolved |",
    "|---|---|---|---|---|---|---|---|",
  ]
  for (a, b, test), holm_p in zip(tests, adjusted):
    sd = lambda i: f"{pooled[i][0] ** 0.5:.4f} ({pooled[i][1]})"
    resolved = "yes" if significance.passes(holm_p) else "no"
    lines.append(
      f"| {data[a].name} / {data[b].name} | {sd(a)} | {sd(b)} | {test.ratio:.2f} "
      f"| [{test.ci[0]:.2f}, {test.ci[1]:.2f}] | {_p_text(test.p)} | {_p_text(holm_p)} "
      f"| {resolved} |"
    )
  return lines


def rewrite(text: str, root: pathlib.Path = ROOT) -> str:
  """The page with every marker's table written from its data (or from the
  results table above it, for a seeds=N marker)."""

  def table_for(found: re.Match[str], above: list[str]) -> list[str]:
    if found["noise"]:
      return noise_lines([root / name for name in found["noise"].split(",")])
    names = found["data"].split("+") if found["data"] else []
    titles, title, tables = _results_rows(above, found["column"], names)
    step = int(found["step"]) if found["step"] else None
    if names:
      rows = data_sides(tables, [root / name for name in names], title, step)
    elif step is not None:
      raise ValueError("step= needs the raw outputs (data=), not seeds=")
    else:
      rows = table_sides(tables[0], int(found["seeds"]))
    note = ""
    if found["where"] is not None:
      titles, rows = only_where(titles, rows, found["where"])
      note = (
        " ("
        + ", ".join(part.strip().replace("=", " ", 1) for part in found["where"].split(";"))
        + ")"
      )
    if found["tuned"] is not None:
      titles, rows = at_best(titles, rows, found["tuned"], "accuracy" in title)
    return lines_of([(name + note, a, b) for name, a, b in significance_pairs(titles, rows)])

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
