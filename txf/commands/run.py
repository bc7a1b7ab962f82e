"""Train and evaluate one config: the main job.

  txf-run --config=rope [--workdir=DIR] [--config.train.steps=200]
  txf-run --config=rope --print_config   # every field, its doc
  python -m experiments.run --config=rope [flags]   # in a checkout: the same command

The work directory defaults to workdirs/<config name>. A config txf ships is
taken by its bare name (rope; listed below); anything else is a
path (./my_config.py; configs/rope.py in a checkout), loaded only where that
file exists. The first line the run prints is the config file it loaded
(`config: /.../rope.py`), which run_record.json records too. Rerunning the
same command on the same work directory resumes from its latest checkpoint
(--resume_step=N: from step N's, the later ones moved aside), first saying
which settings it changes (`changed from the run's config.json: train.steps
30 -> 600; ...`). A train.warmup_steps above train.steps is clamped to it,
in one line, so --config.train.steps=N runs any config; such a run, extended
later, keeps the warmup it finished (one line says so).
Any field of the config can be overridden with --config.<section>.<field>=VALUE;
--print_config checks the config as the run would (an invalid one exits 2,
`config error: ...`; the mesh against the devices, and the data named
against what is there, are checked where the run starts, so a pod's config
prints on a laptop), lists every field (its value, the base config's
default where it differs, the value the run derives where the config leaves
it None, e.g. model.d_ff, and its doc) and exits 0 without training.

Its second line says the platform it trains on (`platform: cpu (1 device)`).

Exit status: 0 when training finishes, or a preempted run (SIGTERM) has saved;
130 after Ctrl-C (SIGINT): the run finishes its step (the first, during
startup), saves a checkpoint, says `interrupted: saved step N; rerun the
same command to resume` and exits (a second Ctrl-C stops at once, without
saving: one line, `interrupted`; as does a Ctrl-C while the config loads);
1 when the run diverged (its last good checkpoint is kept), a checkpoint
could not be written (`checkpoint error: ...`; the checkpoints already
written stay intact) or another output could not be (`write error: PATH:
REASON`, e.g. a full disk: metrics.jsonl, tb/, samples.txt, config.json) --
one line on stderr, and a rerun once the cause is gone resumes from the last
checkpoint; 2 when it cannot start: a config error (missing or
broken config file, unknown field, impossible combination, a change to a run
whose checkpoints do not fit it), a flag error (a value of the wrong type, an
unknown flag), a work directory that is not a writable directory or is in
use by another run, or no checkpoint in it restores. Exit 2 prints one line
on stderr, `config error: ...`, `flag error: ...`, `workdir error: ...` or
`checkpoint error: ...`, before any training step.
"""

from __future__ import annotations

import signal
from typing import Any

from absl import flags, logging
from ml_collections import config_flags

from txf.commands.cli import (
  CONFIG_DIRECTORY,
  INTERRUPTED_STATUS,
  ConfigFileParser,
  command_started,
  config_files_help,
  default_workdir,
  define_config_flag,
  exit_now,
  fail,
  loaded_config_file,
  progress,
  refuse_empty,
  require_config_kind,
  run_command,
  run_errors,
  start_jax,
)

CONFIGS = CONFIG_DIRECTORY


_CONFIG = define_config_flag(
  "A config txf ships, by name (rope; listed above), or a config file's path; "
  "NAME:arg passes arg to its get_config()."
)
_WORKDIR = flags.DEFINE_string(
  "workdir", None, "Run directory (default: workdirs/<config file stem>)."
)
refuse_empty(_WORKDIR)
_RESUME_STEP = flags.DEFINE_integer(
  "resume_step",
  None,
  "Resume from the checkpoint at this step instead of the newest; the later steps are "
  "moved to checkpoints/<step>.dropped (kept), their metrics rows to metrics.dropped.jsonl.",
)
_PRINT_CONFIG = flags.DEFINE_bool(
  "print_config",
  False,
  "Print every field of the resolved config (one per line, with its doc) and exit 0.",
)
_COORDINATOR = flags.DEFINE_string(
  "coordinator_address",
  None,
  "host:port of process 0, for multi-process runs outside SLURM/MPI/Cloud TPU "
  "(which are detected automatically).",
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes in the run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index.")


def configs_help() -> str:
  """The list of run config files for --help."""
  return "Configs txf ships (--config=NAME):\n" + config_files_help(CONFIGS) + "\n"


# absl's --help prints the main module's docstring.
__doc__ += "\n" + configs_help()


def field_docs() -> dict[str, str]:
  """`section.field` -> doc: each field's own (txf.fields), as its section's
  dataclass declares it, a model.options setting's as its entry's settings
  do; a field with a set of values (a registry: model.*, data.name,
  data.task, data.tokenizer, train.decay, train.trackers) lists txf's own
  where its doc does not, and then those user code registered, labelled so."""
  # Here, not at the top: importing txf loads jax, which --help need not wait for.
  from txf.choices import Registry
  from txf.data.spec import GENERATED, TASKS, TEXT, TOKENIZERS, DataSpec
  from txf.fields import docs
  from txf.layers import model_config
  from txf.runconfig import run_config
  from txf.runconfig.optim import DECAYS
  from txf.runconfig.tracker_kinds import TRACKERS

  sections = {
    "model": model_config.ModelConfig,
    "data": DataSpec,
    "train": run_config.TrainConfig,
    "eval": run_config.EvalConfig,
    "parallel": run_config.ParallelConfig,
  }
  found = docs(run_config.RunConfig)  # seed, replicas
  for section, cls in sections.items():
    found.update({f"{section}.{name}": doc for name, doc in docs(cls).items()})
  found.update({f"model.options.{name}": doc for name, doc in model_config.setting_docs().items()})

  # The fields whose choices grow as user code registers entries (txf.register):
  # {field: [(choice, whether it is txf's own)]}.
  def own(values: Any) -> list[tuple[str, bool]]:
    if not isinstance(values, Registry):
      return [(str(value), True) for value in values]
    return [(name, values.provenance(name)["builtin"]) for name in values.names()]

  choices = {f"model.{name}": own(values) for name, values in model_config.CHOICES.items()}
  # A text source that takes an argument is listed by its form ('files:PATH_OR_GLOB').
  choices["data.name"] = own(GENERATED) + [
    (
      name if entry.argument is None else f"{name}:{entry.argument}",
      TEXT.provenance(name)["builtin"],
    )
    for name, entry in TEXT.items()
  ]
  registries = {"data.task": TASKS, "data.tokenizer": TOKENIZERS, "train.decay": DECAYS}
  choices.update({field: own(registry) for field, registry in registries.items()})
  choices["train.trackers"] = own(TRACKERS)
  for field, found_choices in choices.items():
    doc = found.get(field, "")
    txfs = [name for name, builtin in found_choices if builtin]
    registered = [name for name, builtin in found_choices if not builtin]
    if any(name not in doc for name in txfs):  # a doc not listing txf's own: them before it
      doc = f"{' | '.join(txfs)}: {doc}" if doc else " | ".join(txfs)
    if registered:
      doc = f"{doc} (registered: {' | '.join(registered)})"
    found[field] = doc
  return found


def leaves(tree, prefix=""):
  """(`section.field`, value) for every leaf of a nested ConfigDict."""
  for key, value in tree.items():
    if hasattr(value, "items"):
      yield from leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def resolved_run(config):
  """The checked RunConfig the run of `config` would train with (model.vocab_size
  from the tokenizer, head_dim, d_ff, ... derived, a train.warmup_steps above
  train.steps clamped), after checking the whole config as the run does
  (txf.runconfig.run_config.parse, txf.train.run_setup.fit_vocabulary). The
  mesh is not checked against this machine's devices: a pod's config
  (decoder_1b) is read on a laptop; the run checks it where it starts.

  Raises:
    ValueError: naming the field, for a config the run would reject.
  """
  # Here, not at the top: importing txf loads jax, which --help need not wait for.
  import tempfile

  from txf.runconfig.run_config import parse
  from txf.train.run_setup import fit_vocabulary

  # A sentencepiece tokenizer is trained into the run's directory: here, a throwaway one.
  with tempfile.TemporaryDirectory() as workdir:
    return fit_vocabulary(parse(config), workdir)[0]


def print_config(config, base, run=None) -> None:
  """One `section.field = value` line per field, with the default from
  configs/base.py where the value differs, the value the run uses where it
  differs from the config's (a model field None that `run`, the resolved
  RunConfig, derives, or a train field it fits: `(resolved: 512)`), and the
  field's doc; a model.options setting (its doc names the entries declaring
  it) that no chosen entry reads says so."""
  docs = field_docs()
  defaults = dict(leaves(base))
  for name, value in leaves(config):
    line = f"{name} = {value!r}"
    if name in defaults and defaults[name] != value:
      line += f"  (base: {defaults[name]!r})"
    section, _, field = name.partition(".")
    resolved = getattr(run, section, None) if section in ("model", "train") else None
    if resolved is not None and hasattr(resolved, field):
      used = getattr(resolved, field)
      # A train field the check only typed (trackers 'a,b' -> ('a', 'b')) is not news.
      if used != value and (section == "model" or isinstance(used, type(value))):
        line += f"  (resolved: {used!r})"
    setting = name.removeprefix("model.options.")
    if run is not None and setting != name and setting not in run.model.options:
      line += "  (not read: no chosen entry declares it)"
    if name in docs:
      line += f"  # {docs[name]}"
    print(line)


def main(argv) -> None:
  require_config_kind("run")
  config_file = loaded_config_file()
  if _PRINT_CONFIG.value:
    command_started()  # its tokenizer is trained in a temporary directory, removed on Ctrl-C
    try:
      run = resolved_run(_CONFIG.value)
    except ValueError as error:  # ConfigError too
      fail("config", error)
    progress(f"config: {config_file}")  # stdout holds only the fields
    for note in run.notes:
      progress(note)
    print_config(_CONFIG.value, ConfigFileParser().parse(str(CONFIGS / "base.py")), run)
    return
  # Imported after flag parsing: --help need not wait for jax.
  from txf.runconfig.run_config import parse
  from txf.rundir.checkpoint import PreemptionGuard
  from txf.train import distributed
  from txf.train.loop import run

  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  workdir = _WORKDIR.value or default_workdir(
    "workdirs", config_flags.get_config_filename(flags.FLAGS["config"])
  )
  try:
    across_processes = distributed.initialize(
      _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value
    )
  except ValueError as error:
    fail("flag", error)
  print(f"config: {config_file}", flush=True)
  print(start_jax(), flush=True)  # after jax.distributed, which must start first
  # Until here a signal ends the run at once; now the guard takes them, but
  # SIGTERM across processes, which jax.distributed's preemption service
  # owns (every process then saves at one step: PreemptionGuard).
  command_started(kept=(signal.SIGTERM,) if across_processes else ())
  with run_errors(), PreemptionGuard() as guard:
    run(
      parse(_CONFIG.value),
      workdir,
      config_file=config_file,
      preemption=guard,
      resume_step=_RESUME_STEP.value,
    )
  if guard.interrupted:
    # Saved and closed by now; not through the interpreter's exit, whose
    # hooks (jax's backend clean-up) a second Ctrl-C interrupted with a traceback.
    exit_now(INTERRUPTED_STATUS, None)


def cli() -> None:
  """The `txf-run` console script (`python -m experiments.run` in a checkout)."""
  run_command(main, starts_jax=False)


if __name__ == "__main__":
  cli()
