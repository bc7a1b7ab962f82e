"""Attention analysis of a trained run: heatmaps, per-head scores, head ablation.

  python -m experiments.analyze --workdir=RUN [--num_batches=N] [--period=P] [--seed=S]

Writes attention_<kind>.png (per layer and head, validation sample 0),
head_scores.csv and head_scores.md into RUN/analysis/ (txf.sweep.analyze;
nothing else in RUN changes) and prints the markdown table: previous-token,
induction, entropy, attended distance and the validation-loss change when
each head's output is zeroed. An invalid argument or a directory without a
trained run exits 2 with one line naming it.
"""

from __future__ import annotations

from absl import flags, logging

from experiments.cli import fail, run_command

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of a trained run.")
_NUM_BATCHES = flags.DEFINE_integer(
    "num_batches", None, "Validation batches the ablation evaluates (default: the run's).")
_PERIOD = flags.DEFINE_integer(
    "period", None, "Repeated block length of the induction inputs (default: half the length).")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the induction inputs' random tokens.")
_REPLICA = flags.DEFINE_integer("replica", 0, "Which seed replica of the run to analyse.")
flags.mark_flag_as_required("workdir")


def main(argv) -> None:
  # After flag parsing: fast --help.
  from txf.sweep.analyze import analyze_run
  from txf.train.workdir import WorkdirError
  logging.set_verbosity(logging.WARNING)
  try:
    record = analyze_run(_WORKDIR.value, num_batches=_NUM_BATCHES.value, period=_PERIOD.value,
                         seed=_SEED.value, replica=_REPLICA.value)
  except ValueError as error:  # ConfigError too
    fail("analyze", error)
  except WorkdirError as error:
    fail("workdir", error)
  print(record["table"], end="")


if __name__ == "__main__":
  run_command(main)
