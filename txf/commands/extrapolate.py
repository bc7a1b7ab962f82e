"""Length extrapolation of a trained run (Press et al. 2022, "Train Short, Test Long").

  txf-extrapolate --workdir=RUN [--factors=1,2,4,8,16] [--stride=N] [--num_tokens=N]
  python -m experiments.extrapolate --workdir=RUN [flags]   # in a checkout: the same command

Scores the run's validation split at each factor x its training length with
non-overlapping and sliding windows (txf.analysis.extrapolation), prints a
table and writes extrapolation.json, extrapolation.png and
per_position_loss.png into RUN (nothing else there changes but its .lock,
held meanwhile); a progress line per length goes to stderr as it is done. A
length longer than a learned position table is reported as n/a. An invalid
argument, a directory without a trained run, one that cannot be written (a
read-only file system) or one held by another process (a run still training
there, another extrapolation) exits 2 with one line naming it, before
anything is computed; a file that cannot be written (a full disk) exits 1
with one line naming it (`write error: ...`), the previous files intact
(the figures and extrapolation.json are written as one set).
"""

from __future__ import annotations

import contextlib

from absl import flags, logging

from txf.commands.cli import fail, progress, refuse_empty, run_command, run_errors

_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory of a trained decoder LM.", required=True
)
refuse_empty(_WORKDIR)
_FACTORS = flags.DEFINE_list(
  "factors", ["1", "2", "4", "8", "16"], "Evaluation lengths as multiples of the training length."
)
_STRIDE = flags.DEFINE_integer(
  "stride", None, "Tokens a sliding window advances (default: half the length)."
)
_NUM_TOKENS = flags.DEFINE_integer(
  "num_tokens", None, "Validation tokens to score (default: those of the run's evaluator)."
)


def main(argv) -> None:
  # After flag parsing: fast --help.
  from txf.progress import timestamped
  from txf.train.run_setup import adding_to_run
  from txf.trained.extrapolate import check_extrapolation, extrapolate, format_table

  logging.set_verbosity(logging.WARNING)
  try:
    factors = [int(factor) for factor in _FACTORS.value]
  except ValueError:
    fail("flag", f"factors: not a list of integers: {','.join(_FACTORS.value)}")
  with run_errors(), contextlib.ExitStack() as held:
    try:
      workdir = held.enter_context(adding_to_run(_WORKDIR.value))
      request = check_extrapolation(
        workdir, factors, stride=_STRIDE.value, num_tokens=_NUM_TOKENS.value
      )
    except ValueError as error:  # ConfigError too; after the checks a ValueError is a fault
      fail("extrapolate", error)
    # Stamped here, not in txf.trained.extrapolate: a sweep's log stamps its own.
    record = extrapolate(request, log=lambda line: progress(timestamped(line)))
  print(format_table(record))


def cli() -> None:
  """The `txf-extrapolate` console script and `python -m experiments.extrapolate`."""
  run_command(main)


if __name__ == "__main__":
  cli()
