"""Defaults for every txf run: a small byte-level decoder LM on the built-in corpus.

Every other config file starts from this one and changes only what makes it
different. Any field can be overridden on the command line:

  txf-run --config=base --workdir=/tmp/txf/base --config.train.steps=200 \
      --config.model.num_layers=4

Sized so the default run finishes on a 2-core CPU in a few minutes and shows
clear learning (see README for measured numbers).

The fields, their defaults and docs are the run config's dataclasses'
(txf.runconfig.run_config.RunConfig and its sections: ModelConfig, DataSpec,
TrainConfig, EvalConfig, ParallelConfig); this file only lays them out as a
ConfigDict the command line can set (`config_section`).
"""

import dataclasses
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from txf.runconfig.run_config import RunConfig


def config_section(cls: type) -> ml_collections.ConfigDict:
  """The dataclass `cls`'s documented fields at their defaults, as a
  ConfigDict the command line can set: a field of a dataclass type is a
  section of its own, a mapping default (model.options) a section, a None
  default a typed placeholder (--config.model.d_ff=512), a tuple of names a
  comma-separated string (--config.train.trackers=wandb,jsonl)."""
  types = typing.get_type_hints(cls)
  section = ml_collections.ConfigDict()
  for field in dataclasses.fields(cls):
    if "doc" not in field.metadata:  # not a setting (RunConfig.notes)
      continue
    kind = types[field.name]
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
      section[field.name] = config_section(kind)
      continue
    factory: Any = field.default_factory
    default = field.default if factory is dataclasses.MISSING else factory()
    if default is None:
      (kind,) = [t for t in typing.get_args(kind) if t is not type(None)]
      section[field.name] = config_dict.placeholder(kind)
    elif isinstance(default, dict):
      section[field.name] = ml_collections.ConfigDict(default)
    elif isinstance(default, tuple):
      section[field.name] = ",".join(default)
    else:
      section[field.name] = default
  return section


def get_config() -> ml_collections.ConfigDict:
  config = config_section(RunConfig)
  # The one field where a run differs from its dataclass's default (260, the
  # byte tokenizer's ids): the vocabulary is the run's tokenizer's, filled in
  # by txf.train.run_setup (RunConfig.with_vocabulary).
  config.model.vocab_size = config_dict.placeholder(int)
  return config
