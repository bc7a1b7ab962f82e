"""A run's config.json, read once under today's field names, and the resume
policy: which changes a later run (a resumed training, an evaluation) may
make to the run it records.

  saved = read_run_config(workdir)           # None: a new work directory
  check_resumable(config, saved, workdir)    # ValueError naming the field
  config_changes(config, saved)              # what a resume changes

None to what the checkpoint depends on, i.e. `seed`, `replicas`, the
`model` section, and every `data` field except those in `FREE_DATA_FIELDS`
(the corpus or dataset, task, tokenizer and vocabulary, corpus size, masking
and generated-example fields define the data stream the checkpoint was
trained on and the sentencepiece model in the work directory).
`data.seq_len`, `data.batch_size`, how a TFDS stream is read and attended
(`data.read_threads`, `data.attend_across_documents`), and the `train`,
`eval` and `parallel` sections may change; a `train` change that reshapes
the optimizer state the checkpoints hold may not (`check_optimizer_state`).
Only training writes config.json (`write_config`); an evaluation leaves it
as it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import ml_collections
from etils import epath

from txf.layers.model_config import MOVED_TO_OPTIONS
from txf.train.optim import make_optimizer
from txf.train.record import check_choices
from txf.train.workdir import read_json, replace_text

CONFIG_FILE = "config.json"
# What a checkpoint depends on (see the module docstring): these sections
# must match the run's config.json, `data` except for FREE_DATA_FIELDS.
RESUME_SECTIONS = ("seed", "replicas", "model", "data")
FREE_DATA_FIELDS = ("seq_len", "batch_size", "read_threads", "attend_across_documents")


# Fields renamed since runs were first written: (section, old name, new name).
# A run's config.json is read under today's names, so older runs resume.
RENAMED_FIELDS = (("data", "min_len", "min_example_len"), ("data", "max_len", "max_example_len"))
# Fields added since (dotted for a section's): the value every run written
# before had. Fields added with a None default need no entry (absent reads as None).
ADDED_FIELDS = {
  "replicas": 1,
  "model.gelu_approximate": True,
  "model.embed_norm": False,
  "model.num_token_types": 0,
  "model.scale_attention": True,
  "model.init": "txf",
  "model.attention": "softmax",
  "model.options": {},
  "train.loss_chunk_len": 0,
  "train.trackers": "",
  "data.num_symbols": 32,
  "data.num_kv_pairs": 8,
  "data.seed_per_replica": False,
}


def read_run_config(workdir: str | os.PathLike) -> dict[str, Any] | None:
  """The run's config.json as a dict under today's field names, or None.

  Raises:
    ValueError: naming the file, when it is not UTF-8 JSON or cannot be read
      (txf.train.workdir.read_json), not an object, or one of its sections is
      not an object.
  """
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    return None
  saved = read_json(path)
  if not isinstance(saved, dict):
    raise ValueError(f"{path}: expected a JSON object, got {type(saved).__name__}")
  for section in ("model", "data", "train", "eval", "parallel"):
    if section in saved and not isinstance(saved[section], dict):
      raise ValueError(
        f"{path}: {section}: expected a JSON object, got {type(saved[section]).__name__}"
      )
  for name, value in ADDED_FIELDS.items():
    section, _, field = name.rpartition(".")
    fields = saved.get(section) if section else saved
    if isinstance(fields, dict):
      fields.setdefault(field, value)
  for section, old, new in RENAMED_FIELDS:
    fields = saved.get(section)
    if isinstance(fields, dict) and old in fields and new not in fields:
      fields[new] = fields.pop(old)
  model = saved.get("model")
  if isinstance(model, dict):  # model.rope_base -> model.options.rope_base, ...
    for name in MOVED_TO_OPTIONS:
      if name in model:
        model["options"].setdefault(name, model.pop(name))
  return saved


def _first_difference(old: Any, new: Any, name: str) -> str | None:
  """Dotted name of the first field that differs between two JSON trees."""
  if isinstance(old, dict) and isinstance(new, dict):
    for key in sorted(set(old) | set(new)):
      found = _first_difference(old.get(key), new.get(key), f"{name}.{key}")
      if found:
        return found
    return None
  return None if old == new else name


def _checkpoint_fields(config_json: Mapping[str, Any]) -> dict[str, Any]:
  """The part of a config (as JSON) that its checkpoints depend on."""
  fields = {section: config_json.get(section) for section in RESUME_SECTIONS}
  if isinstance(fields["data"], dict):
    fields["data"] = {
      key: value for key, value in fields["data"].items() if key not in FREE_DATA_FIELDS
    }
  return fields


def changed_fields(
  config: Any, saved: Mapping[str, Any] | None, sections: tuple[str, ...]
) -> list[str]:
  """Dotted names of the fields in `sections` where `config` differs from the
  run's config.json as read (`saved`; [] when there is none)."""
  if saved is None:
    return []
  current = json.loads(config.to_json_best_effort())
  changed = []
  for section in sections:
    old, new = saved.get(section) or {}, current.get(section) or {}
    changed += [
      f"{section}.{key}"
      for key in sorted(set(old) | set(new))
      if _first_difference(old.get(key), new.get(key), key)
    ]
  return changed


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
  """Dotted name -> value for every leaf of a JSON tree."""
  if not isinstance(tree, dict):
    return {prefix: tree}
  leaves: dict[str, Any] = {}
  for key, value in tree.items():
    leaves.update(_leaves(value, f"{prefix}.{key}" if prefix else key))
  return leaves


def config_changes(config: Any, saved: Mapping[str, Any] | None) -> list[tuple[str, Any, Any]]:
  """(dotted field, the run's config.json value, `config`'s value) for every
  field of `config` that differs from the run's config.json as read
  (`saved`), in config order ([] for a new work directory, `saved` None; a
  field config.json lacks: None). What a resumed run changes: the fields
  `check_resumable` allows (and, before it, those it refuses)."""
  if saved is None:
    return []
  old, new = _leaves(saved), _leaves(json.loads(config.to_json_best_effort()))
  return [
    (name, old.get(name), value)
    for name, value in new.items()
    if name not in old or old[name] != value
  ]


def check_resumable(
  config: Any, saved: Mapping[str, Any] | None, workdir: str | os.PathLike
) -> None:
  """Refuses `config` for the run in `workdir`, whose config.json read as
  `saved`, if it changes a field the run's checkpoints depend on (nothing to
  check in a new work directory, `saved` None), or if a registered choice
  (model.position, ...) would be another function than the one the run
  trained with: the module its record names is imported first
  (txf.train.record.check_choices).

  Raises:
    ValueError: naming the first such field.
  """
  if saved is None:
    return
  saved = _checkpoint_fields(saved)
  path = epath.Path(workdir) / CONFIG_FILE
  current = _checkpoint_fields(json.loads(config.to_json_best_effort()))
  for section in RESUME_SECTIONS:
    field = _first_difference(saved[section], current[section], section)
    if field:
      raise ValueError(
        f"{field}: differs from the run already in {workdir} (see {path}); use a new --workdir"
      )
  check_choices(config, workdir)


def check_optimizer_state(
  config: Any, saved: Mapping[str, Any] | None, workdir: str | os.PathLike, abstract_params: Any
) -> None:
  """Refuses a `train` change that reshapes the optimizer state the run's
  checkpoints hold (e.g. train.grad_clip_norm=0 drops the clipping's state),
  naming the field, instead of a restore failing on a tree mismatch.
  `saved` is the run's config.json as read (None: a new work directory).

  Raises:
    ValueError: naming the first changed train field that changes the state's
      structure on its own.
  """
  if saved is None or not isinstance(saved.get("train"), dict):
    return

  def structure(train: Any) -> jax.tree_util.PyTreeDef:
    return jax.tree.structure(jax.eval_shape(make_optimizer(train).init, abstract_params))

  current = structure(config.train)
  for name in changed_fields(config, saved, sections=("train",)):
    field = name.partition(".")[2]
    if field not in saved["train"]:
      continue
    reverted = ml_collections.ConfigDict(config.train.to_dict())
    old_value = saved["train"][field]
    try:
      reverted[field] = old_value
    except TypeError:  # ml_collections keeps each field's type
      raise ValueError(
        f"{epath.Path(workdir) / CONFIG_FILE}: {name}: {old_value!r} is not of "
        f"type {type(config.train[field]).__name__}"
      ) from None
    try:
      changes_structure = structure(reverted) != current
    except ValueError:  # the saved value no longer validates: not this field's doing
      continue
    if changes_structure:
      raise ValueError(
        f"{name}: {old_value!r} -> {config.train[field]!r} changes the optimizer "
        f"state that the checkpoints in {workdir} hold; keep the run's value or use a new "
        "--workdir"
      )


def write_config(config: Any, workdir: str | os.PathLike) -> None:
  """Records `config` as the one the run in `workdir` trains with (process 0
  writes, atomically: other processes of the run may be reading it)."""
  if jax.process_index() == 0:
    replace_text(
      epath.Path(workdir) / CONFIG_FILE,
      json.dumps(json.loads(config.to_json_best_effort()), indent=2) + "\n",
    )
