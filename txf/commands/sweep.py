"""Run a sweep: every point of a grid of run configs, then tables and plots.

  txf-sweep --config=sweeps/pe_ln [--workdir=runs/pe_ln] [--index=N] [--dry_run] [--summarize]
  python -m experiments.sweep --config=sweeps/pe_ln [flags]   # in a checkout: the same command

Each point trains in <workdir>/<point name> as `txf-run` would; the
work directory defaults to runs/<config file stem>. The first line printed is
the sweep config file loaded (`config: /.../sweeps/pe_ln.py`), which each
point's run_record.json records too. Rerunning resumes: finished
points are skipped, an interrupted one continues from its checkpoint.
`--index=N` (or SLURM_ARRAY_TASK_ID) runs one point; `--dry_run` prints each
point's `txf-run` command; `--summarize` only rebuilds results.csv,
results.md and the plots from what is on disk (a directory where no point has
run, a mistyped --workdir, exits 2 with one line, creating nothing);
`--publish=DIR` copies every point's raw outputs, without checkpoints, into
the new directory DIR and writes results.csv and results.md there
(txf.sweep.publish: what a findings page commits). An unfinished point (one
without the extrapolation.json of its final step, too, unless the sweep does
not extrapolate), a DIR that is a file or holds anything exits 2 with one
line, copying nothing; a write that fails (a full disk) exits 1 with one
line (`write error: DIR: ...`) and leaves no DIR (it is made in a temporary
sibling and renamed into place when complete), so a rerun works. A sweep
directory that cannot be written (read-only) exits 2 with one line before
anything runs. Every point is checked before
the first trains: a bad one stops the sweep with one line naming the point and
the field (exit status 2). A diverged point is recorded and the sweep goes on.
A SIGTERM (preemption) while a point trains saves it and stops the sweep
("sweep preempted in point N ...", exit status 0, as txf-run; a Ctrl-C
the same, "sweep interrupted in point N ...", then `interrupted`, exit 130); the
rerun resumes there. A SIGTERM anywhere else stops it too, with a line
saying so and to rerun the same command (exit status 0): during a point's
length extrapolation (the rerun extrapolates the point again), between
points, or before the results are written (results.csv, results.md and the
plots are then left as they were: they are written as one set, so tables
and plots always describe the same runs). A results file, plot or
extrapolation record that cannot be written (a full disk) stops it with one
line naming the file (`write error: ...`, exit status 1); every such file is
replaced atomically, so its previous version is intact, and a summary's
files are replaced all or none.

A sweep config has sections base (the run config every point starts from),
grid (the fields swept, txf.sweep.grid) and sweep (its settings). Override a
field of the base run config with --config.base.<section>.<field>=VALUE, e.g.
--config.base.train.steps=100; a sweep config given to txf-run instead (or
a run config given here) exits 2 with one line saying so. Narrow or replace
the grid with --grid=FIELD=VALUE,VALUE,... (repeatable): the values replace
the field's list (--grid=model.position=rope,alibi runs those two encodings
with every norm placement), a field the grid does not sweep is added to it,
and --grid=FIELD= takes a field out. Narrowed points keep their names and
run directories (a field taken out leaves the names); --index counts the
points of the grid as narrowed.
"""

from __future__ import annotations

from absl import flags, logging
from ml_collections import config_flags

from txf.commands.cli import (
  CONFIG_DIRECTORY,
  config_files_help,
  default_workdir,
  define_config_flag,
  fail,
  loaded_config_file,
  refuse_empty,
  require_config_kind,
  run_command,
  run_errors,
)

# absl's --help prints the main module's docstring.
__doc__ += (
  "\nSweep configs txf ships (--config=NAME):\n"
  + config_files_help(CONFIG_DIRECTORY / "sweeps")
  + "\n"
)

_CONFIG = define_config_flag(
  "A sweep config txf ships, by name (sweeps/pe_ln; listed above), or a sweep config file's path."
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Sweep directory (default: runs/<config file stem>)."
)
_GRID = flags.DEFINE_multi_string(
  "grid",
  [],
  "FIELD=VALUE,VALUE,...: sweep these values of FIELD (a base run config field) instead of "
  "the grid's; FIELD= takes it out of the grid. Repeatable.",
)
_INDEX = flags.DEFINE_integer("index", None, "Run only this point (0-based).")
_DRY_RUN = flags.DEFINE_bool(
  "dry_run", False, "Print each point and its txf-run command; train nothing."
)
_SUMMARIZE = flags.DEFINE_bool(
  "summarize", False, "Only rebuild the results and plots from what is on disk."
)
_PUBLISH = flags.DEFINE_string(
  "publish",
  None,
  "Copy every finished point's raw outputs (no checkpoints) from --workdir into this new "
  "directory and write results.csv and results.md there; trains nothing.",
)
refuse_empty(_WORKDIR, _PUBLISH)
_EXTRAPOLATE = flags.DEFINE_bool(
  "extrapolate",
  True,
  "After training a point, evaluate it at 1x-16x its training length "
  "(txf-extrapolate's defaults, on sweep.extrapolate_tokens validation "
  "tokens); --noextrapolate skips it.",
)

# Each does one thing instead of training: at most one of them.
MODE_FLAGS = (("--dry_run", _DRY_RUN), ("--summarize", _SUMMARIZE), ("--publish", _PUBLISH))


def main(argv) -> None:
  require_config_kind("sweep")
  modes = [name for name, flag in MODE_FLAGS if flag.value not in (None, False)]
  if len(modes) > 1:
    fail("flag", f"{' and '.join(modes)}: choose one")
  if _PUBLISH.value is not None and _INDEX.value is not None:
    fail("flag", "--publish copies every point of the sweep: no --index")
  if _SUMMARIZE.value and _INDEX.value is not None:
    fail("flag", "--summarize reads every point of the sweep: no --index")
  # After flag parsing: fast --help.
  from txf.sweep.grid import GridError, PointIndexError, override_grid
  from txf.sweep.runner import run_sweep
  from txf.trained.extrapolate import extrapolate_run

  sweep_config = _CONFIG.value
  if _GRID.value:
    try:
      sweep_config.grid = override_grid(sweep_config, _GRID.value)
    except GridError as error:
      fail("flag", error)

  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  workdir = _WORKDIR.value or default_workdir(
    "runs", config_flags.get_config_filename(flags.FLAGS["config"])
  )
  print(f"config: {loaded_config_file()}", flush=True)
  with run_errors():
    try:
      run_sweep(
        sweep_config,
        workdir,
        config_file=loaded_config_file(),
        index=_INDEX.value,
        dry_run=_DRY_RUN.value,
        summarize_only=_SUMMARIZE.value,
        publish_to=_PUBLISH.value,
        extrapolate=extrapolate_run if _EXTRAPOLATE.value else None,
      )
    except PointIndexError as error:
      fail("flag", error)
    except GridError as error:
      fail("config", error)


def cli() -> None:
  """The `txf-sweep` console script (`python -m experiments.sweep` in a checkout)."""
  run_command(main)


if __name__ == "__main__":
  cli()
