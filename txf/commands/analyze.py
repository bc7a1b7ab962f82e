"""Attention analysis of a trained run: heatmaps, per-head scores, head ablation.

  txf-analyze --workdir=RUN [--num_batches=N] [--periods=P1,P2] [--seed=S] [--ablate=L1H0,L1H2]
      [--replica=R] [--circuits] [--checkpoints]
  python -m experiments.analyze --workdir=RUN [flags]   # in a checkout: the same command

Writes attention_<kind>.png (per layer and head, validation sample 0),
head_scores.csv and head_scores.md into RUN/analysis/ (txf.trained.head_analysis;
nothing else in RUN changes but its .lock, held meanwhile) and prints the
markdown table: previous-token, induction (at two or more probe periods the
training data does not repeat with, on tokens from the run's validation
data; a head that scores at one period and collapses at another, under half
the threshold, is reported as positional),
entropy, attended distance and the validation-loss change when each head's
output is zeroed. --ablate zeroes a set of heads together and reports the
validation loss and accuracy with and without them (single-head ablation
misses heads that back each other up). --circuits adds composition scores
between consecutive layers' heads and path patching of each head's output
into the next layer's queries or keys, or all its paths (circuits.json, circuits.md,
composition.png, patching.png, head_scores_sorted.png); --checkpoints adds
the validation loss, head scores and K-composition at every checkpoint the
run kept (training_scores.csv, training_scores.png): when the circuit forms.
Both need a decoder LM of two or more layers (--circuits: Pre-LN, unscanned).
Progress lines go to stderr: the first compiles, then each head's
ablation as it is done. An
invalid argument, a directory without a trained run, one that cannot be
written (a read-only file system) or one held by another process (a run
still training there) exits 2 with one line naming it, before anything is
computed. Nothing is written until everything is computed, and then the
files are written as one set: a failure, or a file that cannot be written
(a full disk: exit 1, one line `write error: PATH: ...`), leaves the
previous analysis as it was.
"""

from __future__ import annotations

import contextlib

from absl import flags, logging

from txf.commands.cli import fail, progress, refuse_empty, run_command, run_errors

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of a trained run.", required=True)
refuse_empty(_WORKDIR)
_NUM_BATCHES = flags.DEFINE_integer(
  "num_batches",
  None,
  "Validation batches the ablation evaluates (default: the run's; more than "
  "the split holds is refused).",
)
_PERIODS = flags.DEFINE_list(
  "periods",
  None,
  "Two or more block lengths of the induction probe (default: the two "
  "longest that fit and that the training data does not repeat with).",
)
_ABLATE = flags.DEFINE_string(
  "ablate", None, "Causal self-attention heads to zero together, e.g. L1H0,L1H2."
)
_CIRCUITS = flags.DEFINE_bool(
  "circuits",
  False,
  "Also composition scores between consecutive layers' heads and path patching of "
  "each head's output into the next layer (circuits.json, circuits.md, PNGs).",
)
_CHECKPOINTS = flags.DEFINE_bool(
  "checkpoints",
  False,
  "Also validation loss, head scores and K-composition at every kept checkpoint "
  "(training_scores.csv, training_scores.png): when the circuit forms.",
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the induction inputs' random tokens.")
_REPLICA = flags.DEFINE_integer("replica", 0, "Which seed replica of the run to analyse.")


def _periods(values: list[str] | None) -> list[int] | None:
  """--periods as ints; a value that is not one exits 2 naming it."""
  if values is None:
    return None
  try:
    return [int(value) for value in values]
  except ValueError:
    fail("flag", f"--periods must be integers, got {','.join(values)!r}")


def main(argv) -> None:
  # After flag parsing: fast --help.
  from txf.train.run_setup import adding_to_run
  from txf.trained.head_analysis import analyze, check_analysis

  logging.set_verbosity(logging.WARNING)
  periods = _periods(_PERIODS.value)  # a flag error before the run is read
  with run_errors(), contextlib.ExitStack() as held:
    try:
      workdir = held.enter_context(adding_to_run(_WORKDIR.value))
      request = check_analysis(
        workdir,
        num_batches=_NUM_BATCHES.value,
        periods=periods,
        seed=_SEED.value,
        replica=_REPLICA.value,
        ablate=_ABLATE.value,
        circuits=_CIRCUITS.value,
        checkpoints=_CHECKPOINTS.value,
      )
    except ValueError as error:  # ConfigError too; after the checks a ValueError is a fault
      fail("analyze", error)
    record = analyze(request, log=progress)
  print(record["table"], end="")


def cli() -> None:
  """The `txf-analyze` console script and `python -m experiments.analyze`."""
  run_command(main)


if __name__ == "__main__":
  cli()
