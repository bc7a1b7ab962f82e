"""Defaults for every txf run: a small byte-level decoder LM on the built-in corpus.

Every other config file starts from this one and changes only what makes it
different. Any field can be overridden on the command line:

  txf-run --config=base --workdir=/tmp/txf/base --config.train.steps=200 \
      --config.model.num_layers=4

Sized so the default run finishes on a 2-core CPU in a few minutes and shows
clear learning (see README for measured numbers).
"""

import dataclasses
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict

from txf.data.spec import DEFAULT_READ_THREADS
from txf.layers.model_config import ModelConfig


def _model_defaults() -> ml_collections.ConfigDict:
  """ModelConfig's fields and defaults; a None default becomes a typed
  placeholder, so the command line can set it (--config.model.d_ff=512)."""
  types = typing.get_type_hints(ModelConfig)
  fields = {}
  for field in dataclasses.fields(ModelConfig):
    if field.default is None:
      (kind,) = [t for t in typing.get_args(types[field.name]) if t is not type(None)]
      fields[field.name] = config_dict.placeholder(kind)
    elif field.default is dataclasses.MISSING:  # model.options: a section of its own
      factory: Any = field.default_factory
      fields[field.name] = ml_collections.ConfigDict(factory())
    else:
      fields[field.name] = field.default
  return ml_collections.ConfigDict(fields)


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  # txf.train.run_config.RunConfig documents seed and replicas.
  config.seed = 0
  config.replicas = 1

  # txf.layers.model_config.ModelConfig documents every field and holds its default.
  config.model = _model_defaults()
  # txf.train.run_config fills it in.
  config.model.vocab_size = config_dict.placeholder(int)  # None: the tokenizer's vocabulary size

  # txf.data.spec.DataSpec documents every field (txf.data, which dataset reads which).
  config.data = ml_collections.ConfigDict(
    dict(
      name="pystdlib",
      task="lm",
      tokenizer="bytes",
      sp_vocab_size=1024,
      tokenizer_path=config_dict.placeholder(str),
      seq_len=128,
      batch_size=32,
      max_corpus_bytes=4_000_000,
      mlm_probability=0.15,
      min_example_len=4,
      max_example_len=16,
      listops_max_depth=4,
      num_symbols=32,
      num_kv_pairs=8,
      tfds_data_dir=config_dict.placeholder(str),
      tfds_text_key=config_dict.placeholder(str),
      tfds_source_key=config_dict.placeholder(str),
      tfds_target_key=config_dict.placeholder(str),
      read_threads=DEFAULT_READ_THREADS,
      read_workers=config_dict.placeholder(int),
      attend_across_documents=False,
      seed=config_dict.placeholder(int),
      seed_per_replica=False,
    )
  )

  # txf.train.run_config.TrainConfig documents every field.
  config.train = ml_collections.ConfigDict(
    dict(
      steps=600,
      learning_rate=3e-3,
      warmup_steps=60,
      decay="cosine",
      end_lr_fraction=0.1,
      weight_decay=0.1,
      b1=0.9,
      b2=0.95,
      eps=1e-8,
      grad_clip_norm=1.0,
      grad_accum_steps=1,
      label_smoothing=0.0,
      z_loss=0.0,
      loss_chunk_len=0,
      log_every=50,
      checkpoint_every=200,
      max_to_keep=2,
      init_from=config_dict.placeholder(str),
      trackers="",
    )
  )

  # txf.train.run_config.EvalConfig documents every field.
  config.eval = ml_collections.ConfigDict(
    dict(
      every=200,
      num_batches=8,
      sample_tokens=96,
      sample_prompt="def ",
      temperature=0.8,
    )
  )

  # txf.train.run_config.ParallelConfig documents every field.
  config.parallel = ml_collections.ConfigDict(
    dict(
      data=-1,
      fsdp=1,
      tensor=1,
    )
  )
  return config
