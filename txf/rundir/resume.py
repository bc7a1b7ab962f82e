"""A run's config.json -- its RunConfig serialised (txf.runconfig.run_config.to_json)
-- read back through one migration table, and the resume policy: which
changes a later run (a resumed training, an evaluation) may make to the
run it records.

  write_config(run, workdir)                 # config.json = to_json(run)
  saved = read_run_config(workdir)           # a RunConfig; None: a new work directory
  saved, source = read_held_config(workdir, trained=True)  # config.json, or lost, the record's
  check_resumable(run, saved, workdir)       # ValueError naming the field
  config_changes(run, saved)                 # what a resume changes
  run = keep_run_warmup(run, trained_to(workdir, start, saved), start)   # a finished warmup stays
  run, saved = prepare_resume(run, workdir, resume_step)   # the read, the checks, the warmup

A config.json of any format written since runs were first written reads:
`from_json` renames and adds the fields MIGRATIONS lists, then parses it as
any config (txf.runconfig.run_config.parse), so a saved run and a new one are
compared as typed RunConfigs, field by field.

None to what the checkpoint depends on, i.e. `seed`, `replicas`, the
`model` section except `FREE_MODEL_FIELDS` (how the model computes, not its
parameters: e.g. model.remat to fit a device's memory; model.max_len only
where the position encoding owns no learned table of that many rows), and
every `data` field except those in `FREE_DATA_FIELDS` (the corpus or
dataset, task, tokenizer and vocabulary, corpus size, masking and
generated-example fields define the data stream the checkpoint was trained
on and the sentencepiece model in the work directory).
`data.seq_len`, `data.batch_size`, how a TFDS stream is read and attended
(`data.read_threads`, `data.attend_across_documents`) and evaluated
(`data.tfds_eval_split`), where an hf tokenizer is read from
(`data.tokenizer_path`, its contents held by the run's record), and the `train`,
`eval` and `parallel` sections may change; a `train` change that reshapes
the optimizer state the checkpoints hold may not (`check_optimizer_state`),
and a warmup the run finished by the step it resumes from stays as it was
(`keep_run_warmup`).
Only training writes config.json (`write_config`); an evaluation leaves it
as it is.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import jax
from etils import epath

from txf.data import num_classes
from txf.layers import positions
from txf.layers.model_config import (
  COMPUTE_FIELDS,
  LANGUAGE_MODEL_HEADS,
  MOVED_TO_OPTIONS,
  ModelConfig,
)
from txf.runconfig.run_config import ConfigError, RunConfig, TrainConfig, parse, to_json
from txf.rundir.checkpoint import checkpoint_directory, saved_steps
from txf.rundir.metrics import is_eval_row, read_metrics
from txf.rundir.record import (
  RECORD_FILE,
  check_choices,
  read_record,
  recorded_config,
  recorded_tokenizer,
)
from txf.storage import is_local, read_json, write_file

CONFIG_FILE = "config.json"
# What a checkpoint depends on (see the module docstring): these sections
# must match the run's config.json, `model` except for FREE_MODEL_FIELDS and
# `data` except for FREE_DATA_FIELDS.
RESUME_SECTIONS = ("seed", "replicas", "model", "data")
FREE_MODEL_FIELDS = (*COMPUTE_FIELDS, "max_len")
# The data order (compared as the streams it draws, `_as_compared`): a run
# without checkpoints may change it, its tokenizer does not depend on it.
DATA_ORDER_FIELDS = ("seed", "seed_per_replica")
FREE_DATA_FIELDS = (
  "seq_len",
  "batch_size",
  "read_threads",
  "attend_across_documents",
  "tfds_eval_split",
)


def _model(saved: dict[str, Any]) -> dict[str, Any]:
  """A config.json's model section ({} where it has none)."""
  model = saved.get("model")
  return model if isinstance(model, dict) else {}


def _language_model_head(saved: dict[str, Any]) -> bool:
  return _model(saved).get("head", "lm") in LANGUAGE_MODEL_HEADS


def _one_embedding_table(saved: dict[str, Any]) -> bool:
  return _model(saved).get("family", "decoder") != "encoder_decoder"


# Every change to config.json since runs were first written, applied in this
# order to a run's config.json before it is parsed (`migrate`):
#   ("renamed", old, new)   a field renamed or moved (dotted names)
#   ("added", name, value)  a field added since, with the value every run
#                           written before it had (not necessarily today's
#                           default)
#   ("unread", name, (default, where))  a field refused since where its run
#                           never read it: set to its default where
#                           `where(saved)`, so such a run still reads
MIGRATIONS: tuple[tuple[str, str, Any], ...] = (
  ("renamed", "init_from", "train.init_from"),
  ("renamed", "data.min_len", "data.min_example_len"),
  ("renamed", "data.max_len", "data.max_example_len"),
  *(("renamed", f"model.{name}", f"model.options.{name}") for name in MOVED_TO_OPTIONS),
  ("added", "replicas", 1),
  ("added", "model.gelu_approximate", True),
  ("added", "model.embed_norm", False),
  ("added", "model.num_token_types", 0),
  ("added", "model.scale_attention", True),
  ("added", "model.init", "txf"),
  ("added", "model.attention", "softmax"),
  ("added", "model.options", {}),
  ("added", "train.loss_chunk_len", 0),
  ("added", "train.trackers", ""),
  ("added", "data.num_symbols", 32),
  ("added", "data.num_kv_pairs", 8),
  ("added", "data.read_threads", 4),
  ("added", "data.attend_across_documents", False),
  ("added", "data.seed_per_replica", False),
  ("added", "train.keep_every", 0),
  ("added", "train.keep_best", 0),
  ("added", "data.tfds_eval_split", "validation"),
  ("unread", "model.pooling", ("cls", _language_model_head)),
  ("unread", "model.num_classes", (2, _language_model_head)),
  ("unread", "model.share_embeddings", (True, _one_embedding_table)),
)
_ABSENT = object()
# The sections every config.json has held since the first release.
SECTIONS = ("model", "data", "train", "eval", "parallel")


def migrate(saved: dict[str, Any]) -> dict[str, Any]:
  """A config.json's object (changed in place and returned) under today's
  field names, with the fields added since at the values its run had."""
  for kind, name, change in MIGRATIONS:
    *sections, field = name.split(".")
    if kind == "renamed":
      holder = _holder(saved, sections, create=False)
      value = holder.pop(field, _ABSENT) if holder is not None else _ABSENT
      if value is not _ABSENT:
        _set_default(saved, change, value)
    elif kind == "unread":
      default, where = change
      holder = _holder(saved, sections, create=False)
      if holder is not None and field in holder and where(saved):
        holder[field] = default
    else:
      _set_default(saved, name, change)
  return saved


def _holder(tree: dict[str, Any], sections: list[str], *, create: bool) -> dict[str, Any] | None:
  """The dict at path `sections` of `tree` (made where `create`), or None."""
  for name in sections:
    if create:
      tree.setdefault(name, {})
    tree = tree.get(name)
    if not isinstance(tree, dict):
      return None
  return tree


def _set_default(tree: dict[str, Any], name: str, value: Any) -> None:
  *sections, field = name.split(".")
  holder = _holder(tree, sections, create=True)
  if holder is not None:
    holder.setdefault(field, value)


def from_json(saved: Any) -> RunConfig:
  """The RunConfig of a config.json's contents, of any format since the
  first (`migrate`, then txf.runconfig.run_config.parse).

  Raises:
    ConfigError: naming the field, for contents that are not a run's config.
  """
  if not isinstance(saved, dict):
    raise ConfigError(f"expected a JSON object, got {type(saved).__name__}")
  if "seed" not in saved:
    raise ConfigError("seed: missing (every run's config.json has it)")
  for section in SECTIONS:
    # Missing, it would parse as the defaults: a run resumed with another config.
    if section not in saved:
      raise ConfigError(f"{section}: missing (every run's config.json has this section)")
    if not isinstance(saved[section], dict):
      raise ConfigError(f"{section}: expected a JSON object, got {type(saved[section]).__name__}")
  return parse(migrate(saved))


def read_run_config(workdir: str | os.PathLike) -> RunConfig | None:
  """The RunConfig the run in `workdir` recorded (config.json), or None
  where there is none. The modules its registered choices came from are
  imported first (txf.rundir.record.check_choices), so a choice of user code
  reads as the run trained with it.

  Raises:
    ValueError: naming the file, when it cannot be read or is not UTF-8
      JSON (txf.storage.read_json); ConfigError naming the file and
      the field, when it is not a run's config; naming a registered choice
      whose module does not import.
  """
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    return None
  return _parsed(read_json(path), workdir, f"{path}")


def _parsed(saved: Any, workdir: str | os.PathLike, where: str) -> RunConfig:
  """A run's saved config (JSON values) as a RunConfig, the modules of its
  registered choices imported first; a ConfigError names `where`."""
  check_choices(workdir)
  try:
    return from_json(saved)
  except ConfigError as error:
    raise ConfigError(f"{where}: {error}") from error


def read_held_config(workdir: str | os.PathLike, *, trained: bool) -> tuple[RunConfig | None, str]:
  """(the config a later run in `workdir` is held to, the file it was read
  from): config.json (`read_run_config`), or where that was lost the config
  of the last start run_record.json records (the same contents, written
  with it); (None, config.json) for a new work directory.

  Raises:
    ValueError: as read_run_config, naming the file; and for a run that
      `trained` (holds checkpoints) that has neither file, whose checkpoints
      no config describes.
  """
  saved = read_run_config(workdir)
  if saved is not None:
    return saved, CONFIG_FILE
  recorded = recorded_config(workdir)
  if recorded is None:
    if trained:
      raise ValueError(
        f"workdir: {workdir} holds checkpoints but no {CONFIG_FILE} or {RECORD_FILE} saying "
        f"what config they were trained with; put the run's {CONFIG_FILE} back, or use a new "
        "--workdir"
      )
    return None, CONFIG_FILE
  return _parsed(recorded, workdir, f"{epath.Path(workdir) / RECORD_FILE}: config"), RECORD_FILE


def write_config(run: RunConfig, workdir: str | os.PathLike) -> None:
  """Records `run` as the config the run in `workdir` trains with (process
  0 writes, atomically: other processes of the run may be reading it)."""
  if jax.process_index() == 0:
    write_file(epath.Path(workdir) / CONFIG_FILE, json.dumps(to_json(run), indent=2) + "\n")


def _compared(run: RunConfig) -> dict[str, Any]:
  """A command's `run` as JSON values, for comparing with a run's
  config.json (`_as_compared`), its model fields that fit_vocabulary
  derives from the data fields (compared themselves) as derived: config.json
  records them derived, and a command line leaves them unset or at their
  default. A model.vocab_size not known yet (None: the tokenizer's) is left
  out; a classification dataset's labels are model.num_classes (ListOps'
  10, whatever the command says)."""
  fields = _as_compared(run)
  if run.model.vocab_size is None:
    del fields["model"]["vocab_size"]
  labels = num_classes(run.data)
  if labels is not None:
    fields["model"]["num_classes"] = labels
  return fields


def _recorded(saved: RunConfig) -> dict[str, Any]:
  """A run's config.json as `_as_compared`, its model.num_classes the labels
  its model was built with: a classification run written before the typed
  config recorded ModelConfig's default (2), not its dataset's labels
  (ListOps' 10, which with_vocabulary gave the model), and every reader
  refused it as changed. A dataset of 2 labels, or a recorded count that is
  not the default, compares as recorded."""
  fields = _as_compared(saved)
  labels = num_classes(saved.data)
  if labels is not None and saved.model.num_classes == _DEFAULT_NUM_CLASSES:
    fields["model"]["num_classes"] = labels
  return fields


_DEFAULT_NUM_CLASSES = next(
  field.default for field in dataclasses.fields(ModelConfig) if field.name == "num_classes"
)


def _as_compared(run: RunConfig) -> dict[str, Any]:
  """`run` as JSON values with its data order as the streams it draws:
  data.seed as the seed it resolves to (None: the run's), and
  data.seed_per_replica as whether replicas read their own batches (it
  reads nothing with one replica)."""
  fields = to_json(run)
  fields["data"].update(seed=run.data_seed, seed_per_replica=run.own_batches)
  return fields


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  """Dotted name -> value for every leaf of a JSON tree."""
  if not isinstance(tree, dict) or not tree:
    return {prefix: tree}
  leaves: dict[str, Any] = {}
  for key, value in tree.items():
    leaves.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
  return leaves


def config_changes(run: RunConfig, saved: RunConfig | None) -> list[tuple[str, Any, Any]]:
  """(dotted field, the saved run's value, `run`'s value) for every field
  where `run` differs from the run's config.json as read (`saved`; [] for a
  new work directory), in config order. What a resumed run changes: the
  fields `check_resumable` allows (and, before it, those it refuses)."""
  if saved is None:
    return []
  new, old = _leaves(_compared(run)), _leaves(_recorded(saved))
  return [(name, old.get(name), value) for name, value in new.items() if old.get(name) != value]


# Where a config read from run_record.json is named in a refusal.
RECORDED = f"{RECORD_FILE}: config"


def changes_since_step(run: RunConfig, workdir: str | os.PathLike, step: int) -> list[tuple]:
  """`config_changes` of `run` from the config that first trained step
  `step` + 1, as run_record.json's entry of those steps records it ([] where
  no entry holds it, or its config does not read): what `--resume_step=step`
  retrains under another config than the steps it moves aside had, which
  config.json (the latest start's) does not say."""
  recorded = _recorded_training(workdir, lambda start, end: start <= step < end)
  try:
    trained = None if recorded is None else _parsed(recorded, workdir, RECORDED)
  except ValueError:
    return []
  return [] if trained is None else config_changes(run, trained)


def trained_to(workdir: str | os.PathLike, step: int, saved: RunConfig) -> RunConfig:
  """The config that trained the run in `workdir` to its checkpoint at
  `step`: run_record.json's entry that saved it (started before `step`,
  ended at or after it, or ended unrecorded), or `saved` (config.json as
  read) where no entry says or it does not read. config.json is the latest
  start's, written before it trained: a start that died before its first
  checkpoint left its config there, which trained none of the run's steps."""
  try:
    recorded = _recorded_training(workdir, lambda start, end: start < step <= end)
    if recorded is None or recorded == to_json(saved):  # parsed once: config.json's
      return saved
    return _parsed(recorded, workdir, RECORDED)
  except ValueError:  # a record that does not read is the run's to report (RunRecord)
    return saved


def _recorded_training(workdir: str | os.PathLike, covers) -> Any:
  """The `config` of the last run_record.json entry whose steps `covers`
  (start_step, end_step: infinity where the entry recorded no end, a start
  that died), None where none does.

  Raises:
    ValueError: the record does not read.
  """
  for entry in reversed(read_record(workdir)):
    start, end = entry.get("start_step"), entry.get("end_step")
    if isinstance(start, int) and covers(start, end if isinstance(end, int) else math.inf):
      return entry.get("config")
  return None


def check_resumable(
  run: RunConfig,
  saved: RunConfig | None,
  workdir: str | os.PathLike,
  *,
  trained: bool = True,
  source: str = CONFIG_FILE,
  advice: str = "use a new --workdir",
) -> None:
  """Refuses `run` for the run in `workdir`, whose config.json (or `source`,
  the file it was read from) read as `saved`, if it changes a field the
  run's checkpoints depend on (nothing to check in a new work directory,
  `saved` None); the message ends with `advice`. Where the run saved no
  checkpoint yet (`trained` False: it stopped before its first save, e.g. a
  model too large for the device), only its `data` fields but the data
  order's are held: the tokenizer it made in `workdir` depends on them, and
  nothing depends on the rest.

  Raises:
    ValueError: naming the first such field.
  """
  if saved is None:
    return
  held = RESUME_SECTIONS if trained else ("data",)
  for name, _, _ in config_changes(run, saved):
    section, _, field = name.partition(".")
    if section in held and not _free(section, field, saved, workdir, trained):
      raise ValueError(
        f"{name}: differs from the run already in {workdir} (see "
        f"{epath.Path(workdir) / source}); {advice}"
      )


def _free(
  section: str, field: str, saved: RunConfig, workdir: str | os.PathLike, trained: bool
) -> bool:
  """Whether a resume may change `section`.`field` of the run in `workdir`
  that saved `saved` (FREE_MODEL_FIELDS, FREE_DATA_FIELDS; the data order's
  too where the run saved no checkpoint, `trained` False: its tokenizer does
  not depend on it): model.max_len only where the run's position encoding
  owns no learned table of max_len rows, which the checkpoints hold;
  data.tokenizer_path where the run has checkpoints and recorded its
  tokenizer's contents (their SHA-256, which the new path's must match: a
  run moved to a machine whose Hub cache is elsewhere)."""
  if section == "data":
    if field == "tokenizer_path":  # checked against the record where trained
      return trained and recorded_tokenizer(workdir) is not None
    return field in FREE_DATA_FIELDS or (not trained and field in DATA_ORDER_FIELDS)
  if section != "model" or field not in FREE_MODEL_FIELDS:
    return False
  return field != "max_len" or positions.encoding(saved.model.position).table != "absolute"


def prepare_resume(
  run: RunConfig, workdir: str | os.PathLike, resume_step: int | None = None
) -> tuple[RunConfig, RunConfig | None]:
  """(the run to train in `workdir`, the config it is held to as read --
  its config.json, or where that was lost its run_record.json's
  (`read_held_config`) -- or None for a new work directory), checked before
  anything is written: `run` may
  resume the run there (`check_resumable`: a run without checkpoints may
  change all but its data fields), `resume_step` (None: the
  newest) is one of its checkpoints, and a warmup it finished stays
  (`keep_run_warmup`, where it has checkpoints).

  Raises:
    ValueError: naming the field (or resume_step) refused.
  """
  steps_saved = saved_steps(workdir)
  saved, source = read_held_config(workdir, trained=bool(steps_saved))
  if saved is not None:
    _check_checkpoints_reachable(workdir)
  check_resumable(run, saved, workdir, trained=bool(steps_saved), source=source)
  if resume_step is not None and resume_step not in steps_saved:
    held = ", ".join(map(str, steps_saved)) or "none"
    raise ValueError(
      f"resume_step: no checkpoint at step {resume_step!r} in "
      f"{checkpoint_directory(workdir)} (steps: {held})"
    )
  if resume_step is not None and resume_step >= run.train.steps:
    # It would move the later checkpoints aside and train nothing from it.
    raise ValueError(
      f"resume_step: {resume_step} is not before train.steps={run.train.steps}: there is "
      "nothing to train from it (raise train.steps)"
    )
  if saved is not None and steps_saved:
    start = steps_saved[-1] if resume_step is None else resume_step
    run = keep_run_warmup(run, trained_to(workdir, start, saved), start)
    _check_end_completed_as_trained(run, saved, workdir, start)
  return run, saved


def _check_end_completed_as_trained(
  run: RunConfig, saved: RunConfig, workdir: str | os.PathLike, start: int
) -> None:
  """Refuses `run` where it changes the config of a run trained to its steps
  (to `start`) whose end's writes were lost (`end_written`): completing the
  end writes the final evaluation and config.json, which describe the run
  as it trained, not the command's changes (a finished 60-step run's lost
  config.json was written with train.steps=30 and a warmup of 30, which a
  later extension then kept).

  Raises:
    ValueError: naming the changed fields.
  """
  if start < run.train.steps or end_written(run.train.steps, workdir, start):
    return
  changed = ", ".join(name for name, _, _ in config_changes(run, saved))
  if changed:
    raise ValueError(
      f"{changed}: the run in {workdir} trained to step {start}, and what its end writes "
      f"({CONFIG_FILE}, the final evaluation) was lost: run it once as it trained, without "
      "these changes, to complete its end; then change them"
    )


def end_written(steps: int, workdir: str | os.PathLike, step: int) -> bool:
  """Whether a run trained to `step` >= train.steps has what its end writes:
  config.json (the file: a run that lost it is held to its run_record.json's,
  see prepare_resume) and, when `step` is train.steps, an eval row at `step`."""
  if not (epath.Path(workdir) / CONFIG_FILE).exists():
    return False
  return step != steps or evaluated(workdir, step)


def evaluated(workdir: str | os.PathLike, step: int) -> bool:
  """Whether metrics.jsonl holds an eval row of `step`."""
  return any(row["step"] == step and is_eval_row(row) for row in read_metrics(workdir, since=step))


def _check_checkpoints_reachable(workdir: str | os.PathLike) -> None:
  """Refuses a run whose checkpoints directory is a link to nothing (an
  unmounted disk): the run started afresh from step 0 there, moving its
  metrics aside and creating the link's target.

  Raises:
    ValueError: naming the link and its target.
  """
  directory = checkpoint_directory(workdir)
  if is_local(directory) and os.path.islink(directory) and not directory.exists():
    raise ValueError(
      f"{directory}: a link to {os.readlink(directory)}, which does not exist: the run's "
      "checkpoints are not reachable (mount or restore them; remove the link to train afresh)"
    )


def keep_run_warmup(run: RunConfig, saved: RunConfig, start: int) -> RunConfig:
  """`run`, resuming from step `start` a run that `saved` trained to it
  (`trained_to`), with that config's warmup where the run had finished it by
  `start` and `run` asks for a longer one: the warmup is part of the schedule the
  checkpoints were trained on, and lengthening it would drop the learning
  rate at the resumed step (a 30-step smoke run, its warmup of 60 clamped to
  30, resumed for 600 steps: to half its peak). The kept warmup is what
  config.json then records, so a later resume of the extended run (after a
  preemption, or to extend it again) keeps it too. The note in the returned
  run's `notes` says so; any other `run` is returned as it is."""
  old, new = saved.train, run.train
  if not (old.warmup_steps <= start and old.warmup_steps < new.warmup_steps):
    return run
  kept = dataclasses.replace(new, warmup_steps=old.warmup_steps)
  if start >= new.steps:  # nothing left to train: kept for the record, no rate moves
    return dataclasses.replace(run, train=kept)
  kept_rate, asked_rate = float(kept.schedule(start)), float(new.schedule(start))
  note = (
    f"train.warmup_steps: {new.warmup_steps} -> {old.warmup_steps}, the warmup this run "
    f"finished by step {old.warmup_steps} (a longer one would "
    f"{'lower' if asked_rate < kept_rate else 'raise'} the learning rate at step {start + 1} "
    f"from {kept_rate:.3e} to {asked_rate:.3e}); to warm up again, train in a new "
    "--workdir with train.init_from=<this run>"
  )
  return dataclasses.replace(run, train=kept, notes=(*run.notes, note))


def check_optimizer_state(
  run: RunConfig, saved: RunConfig | None, workdir: str | os.PathLike, abstract_params: Any
) -> None:
  """Refuses a `train` change that reshapes the optimizer state the run's
  checkpoints hold (e.g. train.grad_clip_norm=0 drops the clipping's state),
  naming the field, instead of a restore failing on a tree mismatch.
  `saved` is the run's config.json as read (None: a new work directory).

  Raises:
    ValueError: naming the first changed train field that changes the state's
      structure on its own.
  """
  if saved is None:
    return

  def structure(train: TrainConfig) -> jax.tree_util.PyTreeDef:
    return jax.tree.structure(jax.eval_shape(train.optimizer.init, abstract_params))

  current = structure(run.train)
  for field in dataclasses.fields(TrainConfig):
    old, new = getattr(saved.train, field.name), getattr(run.train, field.name)
    if old == new:
      continue
    try:
      reverted = dataclasses.replace(run.train, **{field.name: old})
    except ValueError:  # the saved value does not go with the others: not this field's doing
      continue
    if structure(reverted) != current:
      raise ValueError(
        f"train.{field.name}: {old!r} -> {new!r} changes the optimizer "
        f"state that the checkpoints in {workdir} hold; keep the run's value or use a new "
        "--workdir"
      )


def saved_config(path: epath.Path) -> dict[str, Any] | None:
  """The JSON object in `path`/config.json; None when there is none or it is
  broken (the reader it is given to says so)."""
  try:
    saved = json.loads((path / CONFIG_FILE).read_text())
  except (ValueError, OSError):
    return None
  return saved if isinstance(saved, dict) else None


def is_run_directory(path: str | os.PathLike) -> bool:
  """Whether `path` holds a txf run rather than a Hugging Face model
  directory (whose config.json has no `model` and `train` sections): a
  config.json with both, or, where that was lost or damaged, the run's other
  files (its run_record.json, its checkpoints: not an empty checkpoints/ of a
  run stopped before its first save), which its readers then name
  (`read_held_config`)."""
  path = epath.Path(path)
  saved = saved_config(path) or {}
  if all(isinstance(saved.get(section), dict) for section in ("model", "train")):
    return True
  return (path / RECORD_FILE).exists() or bool(saved_steps(path))
