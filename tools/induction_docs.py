"""Writes docs/induction.md's tables and circuit figures from the committed raw outputs.

  python -m tools.induction_docs [--check] [--data docs/data/induction] [--page docs/induction.md]
      [--figures docs/figures]

docs/data/induction/seed<N>/ holds what `txf-analyze --circuits
--checkpoints` and `--ablate=...` wrote into each seed's run:
circuits.json, training_scores.csv, head_scores.csv, and group_ablation.txt
(the group-ablation sections of head_scores.md, one per --ablate run). Each
table of the page follows a marker line `<!-- induction_docs: NAME -->`;
this rewrites the table after each marker (NAME one of `TABLES`) and writes
the page's figures:

  induction_training.png        loss, accuracy and head scores over training, per seed
  induction_sorted_scores.png   every head's scores, sorted, per seed
  induction_composition_seed0.png, induction_patching_seed0.png

--check writes nothing and exits 1 if the page's tables differ from the
data (tests/analysis/test_circuits.py checks the same).
"""

from __future__ import annotations

import argparse
import csv
import json
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from tools.page_tables import check_or_write, rewrite_tables
from txf.analysis import circuit_report
from txf.analysis.ablation import head_name
from txf.analysis.head_scores import head_roles
from txf.analysis.phase_change import read_training_csv
from txf.analysis.plots import save_figure

ROOT = pathlib.Path(__file__).resolve().parent.parent
TABLES = ("roles", "group_ablation", "circuits", "sorted_scores", "phase_change")
MARKER = "<!-- induction_docs: {} -->"
_MARKER_LINE = re.compile(r"^<!-- induction_docs: (\w+) -->$")


def seed_dirs(data: pathlib.Path) -> dict[str, pathlib.Path]:
  """'seed N' -> data/seedN/, by seed."""
  paths = sorted(data.glob("seed*"), key=lambda path: int(path.name.removeprefix("seed")))
  if not paths:
    raise SystemExit(f"induction_docs: no seed<N>/ directories in {data}")
  return {f"seed {path.name.removeprefix('seed')}": path for path in paths}


def read_head_scores(path: pathlib.Path) -> dict[str, np.ndarray]:
  """head_scores.csv's causal self-attention columns as {name: float64 [L, H]}."""
  with path.open() as file:
    rows = [row for row in csv.DictReader(file) if row["attention"] == "self"]
  shape = (1 + max(int(row["layer"]) for row in rows), 1 + max(int(row["head"]) for row in rows))
  names = [name for name in rows[0] if name not in ("attention", "layer", "head")]
  scores = {name: np.full(shape, np.nan) for name in names}
  for row in rows:
    for name in names:
      scores[name][int(row["layer"]), int(row["head"])] = float(row[name])
  return scores


def probe_periods(scores: Mapping[str, np.ndarray]) -> list[int]:
  """The probe periods of head_scores.csv's induction_p<period> columns, in its order."""
  return [
    int(name.removeprefix("induction_p")) for name in scores if name.startswith("induction_p")
  ]


def roles(scores: Mapping[str, np.ndarray]) -> dict[str, list[tuple[int, int]]]:
  """{'previous_token' | 'induction': [(layer, head)]} by `head_roles`' 0.5 convention."""
  roles_LxH = head_roles(
    scores["previous_token"],
    {period: scores[f"induction_p{period}"] for period in probe_periods(scores)},
  )
  return {
    role: [index for index, labels in np.ndenumerate(roles_LxH) if role in labels.split("+")]
    for role in ("previous_token", "induction")
  }


def read_group_ablations(path: pathlib.Path) -> dict[str, Any]:
  """group_ablation.txt: {"baseline": (loss, accuracy) with every head on,
  "ablations": [(heads ['L1H0', ...], loss, accuracy)]}, in the file's order."""
  sections = re.findall(
    r"## Group ablation of (.+)\n\n.*?\n.*?\n"
    r"\| every head \| (\S+) \| (\S+) \|\n\| heads zeroed \| (\S+) \| (\S+) \|",
    path.read_text(),
  )
  if not sections:
    raise ValueError(f"{path}: no '## Group ablation of' section")
  baselines = {(float(loss), float(accuracy)) for _, loss, accuracy, _, _ in sections}
  if len(baselines) != 1:
    raise ValueError(f"{path}: the sections' 'every head' rows differ: {sorted(baselines)}")
  return {
    "baseline": baselines.pop(),
    "ablations": [
      (heads.split(", "), float(loss), float(accuracy)) for heads, _, _, loss, accuracy in sections
    ],
  }


def roles_table(data: pathlib.Path) -> str:
  """Per seed: the previous-token and induction heads by the 0.5 convention,
  with their scores, and the validation accuracy at the last checkpoint."""
  lines = []
  for label, path in seed_dirs(data).items():
    scores = read_head_scores(path / "head_scores.csv")
    periods = probe_periods(scores)
    if not lines:
      lines = [
        "| seed | previous-token heads (score) | induction heads (score at periods "
        f"{' / '.join(map(str, periods))}) | final eval accuracy |",
        "|---|---|---|---|",
      ]
    found = roles(scores)
    previous = ", ".join(
      f"{head_name(*index)} ({scores['previous_token'][index]:.2f})"
      for index in found["previous_token"]
    )
    induction = ", ".join(
      f"{head_name(*index)} ("
      + "/".join(f"{scores[f'induction_p{period}'][index]:.2f}" for period in periods)
      + ")"
      for index in found["induction"]
    )
    accuracy = read_training_csv(path / "training_scores.csv")["accuracy"][-1]
    lines.append(f"| {label.removeprefix('seed ')} | {previous} | {induction} | {accuracy:.4f} |")
  return "\n".join(lines) + "\n"


def _what_they_are(heads: list[str], scores: Mapping[str, np.ndarray]) -> str:
  """The group's role: induction heads, previous-token heads, or the control
  (layer 0's heads with no role)."""
  found = {role: [head_name(*index) for index in heads] for role, heads in roles(scores).items()}
  num_heads = scores["previous_token"].shape[1]
  no_role = [
    head_name(0, head)
    for head in range(num_heads)
    if head_name(0, head) not in found["previous_token"]
  ]
  if heads == found["induction"]:
    return "induction heads"
  if heads == found["previous_token"]:
    return "previous-token heads"
  if heads == no_role:
    return f"control: the other layer-0 head{'s' if len(heads) > 1 else ''}"
  raise ValueError(f"group {heads}: not the induction, previous-token or control heads {found}")


def group_ablation_table(data: pathlib.Path) -> str:
  """Per seed: loss and accuracy with every head on, then with each group zeroed."""
  loss_text = lambda loss: f"{loss:.2f}" if loss >= 1 else f"{loss:.3f}"
  lines = ["| seed | zeroed | what they are | loss (nats) | accuracy |", "|---|---|---|---|---|"]
  for label, path in seed_dirs(data).items():
    scores = read_head_scores(path / "head_scores.csv")
    ablations = read_group_ablations(path / "group_ablation.txt")
    seed = label.removeprefix("seed ")
    loss, accuracy = ablations["baseline"]
    lines.append(f"| {seed} | none | every head on | {loss_text(loss)} | {accuracy:.3f} |")
    for heads, loss, accuracy in ablations["ablations"]:
      lines.append(
        f"| {seed} | {', '.join(heads)} | {_what_they_are(heads, scores)} "
        f"| {loss_text(loss)} | {accuracy:.3f} |"
      )
  return "\n".join(lines) + "\n"


def circuit_records(data: pathlib.Path) -> dict[str, dict[str, Any]]:
  """'seed N' -> its circuits.json record."""
  return {
    label: json.loads((path / "circuits.json").read_text())
    for label, path in seed_dirs(data).items()
  }


def training_scores(data: pathlib.Path) -> dict[str, dict[str, np.ndarray]]:
  """'seed N' -> its scores over training (`read_training_csv`)."""
  return {
    label: read_training_csv(path / "training_scores.csv")
    for label, path in seed_dirs(data).items()
  }


def tables(data: pathlib.Path) -> dict[str, str]:
  """{name in TABLES: the markdown table} from the raw outputs in `data`."""
  records = circuit_records(data)
  return {
    "roles": roles_table(data),
    "group_ablation": group_ablation_table(data),
    "circuits": circuit_report.circuit_table(records),
    "sorted_scores": circuit_report.sorted_scores_table(records),
    "phase_change": circuit_report.phase_change_table(training_scores(data)),
  }


def update_page(page: str, new_tables: Mapping[str, str]) -> str:
  """`page` with the table after each `MARKER` line replaced by `new_tables`'
  (a marker followed by no table gets one); ValueError if a marker of
  `new_tables` is not on the page once, or one on the page is not of them."""
  lines = page.splitlines()
  for name in new_tables:
    if lines.count(MARKER.format(name)) != 1:
      raise ValueError(f"the page must hold the line {MARKER.format(name)!r} once")
  for line in lines:
    found = _MARKER_LINE.match(line)
    if found and found[1] not in new_tables:
      raise ValueError(f"{line!r}: no table of that name (tables: {', '.join(new_tables)})")
  return rewrite_tables(page, _MARKER_LINE, lambda found, above: new_tables[found[1]].splitlines())


def write_figures(data: pathlib.Path, figures: pathlib.Path) -> list[pathlib.Path]:
  """The page's figures, from the raw outputs in `data`."""
  records = circuit_records(data)
  first_label, first = next(iter(records.items()))
  step, periods = first["step"], ", ".join(str(period) for period in first["periods"])
  by_name = {
    "induction_training.png": circuit_report.training_figure(
      training_scores(data),
      title="Validation loss, accuracy and head scores at every checkpoint (first 1000 steps)",
      max_step=1000,
    ),
    "induction_sorted_scores.png": circuit_report.sorted_scores_figure(
      {label: record["scores"] for label, record in records.items()},
      title=f"Every head's scores at step {step}, sorted",
    ),
    "induction_composition_seed0.png": circuit_report.composition_figure(
      first, title=f"Composition of layer-0 into layer-1 heads ({first_label}, step {step})"
    ),
    "induction_patching_seed0.png": circuit_report.patching_figure(
      first, title=f"Path patching into layer 1 ({first_label}, step {step}, periods {periods})"
    ),
  }
  return [pathlib.Path(save_figure(figure, figures / name)) for name, figure in by_name.items()]


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
  parser.add_argument("--data", type=pathlib.Path, default=ROOT / "docs/data/induction")
  parser.add_argument("--page", type=pathlib.Path, default=ROOT / "docs/induction.md")
  parser.add_argument("--figures", type=pathlib.Path, default=ROOT / "docs/figures")
  parser.add_argument("--check", action="store_true", help="write nothing; 1 if the page differs")
  args = parser.parse_args(argv)
  new_tables = tables(args.data)
  status = check_or_write(
    args.page, lambda page: update_page(page, new_tables), args.check, f"tables and {args.data}"
  )
  if args.check:
    return status
  print(args.page)
  for path in write_figures(args.data, args.figures):
    print(path)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
