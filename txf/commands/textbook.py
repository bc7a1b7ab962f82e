"""Textbook experiments: the numbers and figures a Transformer course claims.

  txf-textbook NAME [NAME ...] [--out_dir=workdirs/textbook] [--quick]
  txf-textbook all
  txf-textbook --list
  python -m experiments.textbook NAME [flags]   # in a checkout: the same command

Runs each experiment of txf.textbook, prints its numbers (markdown) and
writes into --out_dir its figures (textbook_<name>_<what>.png), its numbers
(<name>.json) and its report (<name>.md). Experiments that train start from
a config txf ships (named by --list) and keep their runs in
<out_dir>/runs/; running again reuses a finished run. --quick runs the toy
sizes the tests use. An unknown NAME or a bad argument (an --out_dir that is
not a writable directory among them) exits 2 with one line, before any
experiment runs; a file that cannot be written (a full disk) exits 1 with
one line naming it (`write error: ...`), as a training error does (the
training commands' one-line errors).
docs/textbook.md collects the results.
"""

from __future__ import annotations

import importlib
import json
import time

import numpy as np
from absl import flags, logging
from etils import epath

from txf.commands.cli import fail, refuse_empty, run_command, run_errors
from txf.rundir.workdir import WorkdirError, check_writable
from txf.storage import write_error, write_file

_OUT_DIR = flags.DEFINE_string(
  "out_dir", "workdirs/textbook", "Directory for the figures, numbers and training runs."
)
refuse_empty(_OUT_DIR)
_QUICK = flags.DEFINE_bool("quick", False, "Toy sizes (seconds; what the tests run).")
_LIST = flags.DEFINE_bool("list", False, "List the experiments and exit.")


def _json_default(value):
  """numpy scalars and arrays in the results, as JSON."""
  if isinstance(value, np.ndarray):
    return value.tolist()
  if isinstance(value, np.generic):
    return value.item()
  raise TypeError(f"not JSON serializable: {type(value).__name__}")


def main(argv) -> None:
  from txf import textbook  # after flag parsing: fast --help

  logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
  if _LIST.value:
    if argv[1:]:  # it listed every experiment, the names ignored
      fail("flag", f"--list lists every experiment; it takes no names (got {' '.join(argv[1:])})")
    width = max(map(len, textbook.EXPERIMENTS)) + 2
    for experiment in textbook.EXPERIMENTS.values():
      trains = f" (trains the {experiment.config} config)" if experiment.config else ""
      print(f"{experiment.name:<{width}} item {experiment.item}: {experiment.title}{trains}")
    return
  names = argv[1:]
  if not names:
    fail("flag", "name an experiment (or 'all'); --list shows them")
  try:  # every name, 'all' beside them too: a typo ran everything
    # Each once, in the order first named (`scaling scaling` ran it twice).
    experiments = [textbook.get(name) for name in dict.fromkeys(names) if name != "all"]
  except ValueError as error:
    fail("flag", error)
  if "all" in names:
    experiments = list(textbook.EXPERIMENTS.values())
  try:
    check_writable(_OUT_DIR.value)
  except WorkdirError as error:
    fail("flag", f"out_dir: {error}")
  out_dir = epath.Path(_OUT_DIR.value)
  with run_errors():
    for experiment in experiments:
      try:
        _run(experiment, out_dir)
      except OSError as error:  # a figure that cannot be written (a full disk)
        raise write_error(error.filename or out_dir, error) from error


def _run(experiment, out_dir: epath.Path) -> None:
  """Runs one experiment: prints its report and writes its numbers and
  report (atomically: WriteError naming a file that cannot be written)."""
  kwargs = {}
  if experiment.config:
    config_module = importlib.import_module(f"txf.configs.{experiment.config}")
    kwargs["base_config"] = config_module.get_config()
  print(f"## {experiment.name} (item {experiment.item}): {experiment.title}\n", flush=True)
  start = time.perf_counter()
  result = experiment.run(out_dir, quick=_QUICK.value, **kwargs)
  seconds = time.perf_counter() - start
  for path in _stale_figures(out_dir, experiment.name, result.get("figures", [])):
    path.unlink()
    print(f"removed {path} (an earlier run's, not drawn by this one)", flush=True)
  result = {**result, "seconds": seconds, "quick": _QUICK.value}
  numbers = json.dumps(result, indent=1, default=_json_default)
  write_file(out_dir / f"{experiment.name}.json", numbers + "\n")
  # Every experiment here reports markdown; one without prints its numbers.
  text = result.get("text", numbers)
  write_file(out_dir / f"{experiment.name}.md", text)
  print(text)
  print(
    "figures:\n"
    + "\n".join(f"  {path}" for path in result.get("figures", []))
    + f"\n({seconds:.0f} s)\n",
    flush=True,
  )


def _stale_figures(out_dir: epath.Path, name: str, figures: list[str]) -> list[epath.Path]:
  """The experiment's figures in `out_dir` (textbook_<name>_*.png) that this
  run did not draw: an earlier run's of other settings (the heads
  experiment names a grid by its probe period), which name.json, one run's,
  no longer describes."""
  from txf import textbook  # noqa: PLC0415 (as main's: after flag parsing)

  drawn = {epath.Path(path).name for path in figures}
  # Another experiment whose name begins with this one's (heads_x) owns its own.
  others = [f"textbook_{other}_" for other in textbook.EXPERIMENTS if other.startswith(f"{name}_")]
  return sorted(
    path
    for path in out_dir.glob(f"textbook_{name}_*.png")
    if path.name not in drawn and not path.name.startswith(tuple(others))
  )


def cli() -> None:
  """The `txf-textbook` console script and `python -m experiments.textbook`."""
  run_command(main, arguments="experiment names", required=False)


if __name__ == "__main__":
  cli()
