"""Defaults for every txf run: a small byte-level decoder LM on the built-in corpus.

Every other config file starts from this one and changes only what makes it
different. Any field can be overridden on the command line:

  python -m experiments.run --config=configs/base.py --workdir=/tmp/txf/base \
      --config.train.steps=200 --config.model.num_layers=4

Sized so the default run finishes on a 2-core CPU in a few minutes and shows
clear learning (see README for measured numbers).
"""

import dataclasses
import typing

import ml_collections
from ml_collections import config_dict

from txf.data.config import DEFAULT_READ_THREADS
from txf.layers.config import ModelConfig


def _model_defaults() -> ml_collections.ConfigDict:
  """ModelConfig's fields and defaults; a None default becomes a typed
  placeholder, so the command line can set it (--config.model.d_ff=512)."""
  types = typing.get_type_hints(ModelConfig)
  fields = {}
  for field in dataclasses.fields(ModelConfig):
    if field.default is None:
      (kind,) = [t for t in typing.get_args(types[field.name]) if t is not type(None)]
      fields[field.name] = config_dict.placeholder(kind)
    else:
      fields[field.name] = field.default
  return ml_collections.ConfigDict(fields)


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0
  # Seeds as replicas: R copies of the run, seeds seed .. seed + R - 1, trained
  # in one program on the same batches (txf.train.replicas); metrics report
  # each replica ('loss/0', ...) and their mean and std.
  config.replicas = 1

  # txf.layers.config.ModelConfig documents every field and holds its default.
  config.model = _model_defaults()
  # None: the tokenizer's vocabulary size (txf.train.config fills it in).
  config.model.vocab_size = config_dict.placeholder(int)

  # txf.data documents every field.
  config.data = ml_collections.ConfigDict(
    dict(
      name="pystdlib",  # built-in corpus: the Python standard library's sources
      task="lm",
      tokenizer="bytes",
      sp_vocab_size=1024,
      tokenizer_path=config_dict.placeholder(str),  # tokenizer="hf": a tokenizer.json or its dir
      seq_len=128,
      batch_size=32,  # global, across all devices and hosts
      max_corpus_bytes=4_000_000,  # pystdlib: bytes read per split
      mlm_probability=0.15,
      min_example_len=4,
      max_example_len=16,
      listops_max_depth=4,
      num_symbols=32,  # induction, mqar: content ids
      num_kv_pairs=8,  # mqar: key-value pairs per row
      # data.name="tfds:<builder>[/config]": a prepared TFDS dataset (README).
      # None: $TFDS_DATA_DIR or ~/tensorflow_datasets
      tfds_data_dir=config_dict.placeholder(str),
      tfds_text_key=config_dict.placeholder(str),  # lm/mlm text feature; None: "text"
      # seq2seq features; None: from a "<src>-<tgt>" config name
      tfds_source_key=config_dict.placeholder(str),
      tfds_target_key=config_dict.placeholder(str),
      # lm/mlm on TFDS stream the split, packed into windows (txf.data.packed):
      read_threads=DEFAULT_READ_THREADS,  # threads reading ahead (I/O)
      # processes reading and tokenizing the training split (CPU); None: 0
      read_workers=config_dict.placeholder(int),
      attend_across_documents=False,  # True: GPT-2's recipe, no document mask
      seed=config_dict.placeholder(int),  # the data order's; None: the run's seed
    )
  )

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
      grad_accum_steps=1,  # micro-batches per step (batch_size must divide evenly)
      label_smoothing=0.0,
      z_loss=0.0,
      # The [B, T, V] logits are then never held at once (lm heads only).
      loss_chunk_len=0,  # > 0: loss fused with the LM head, this many positions at a time
      log_every=50,
      checkpoint_every=200,
      max_to_keep=2,
      init_from=config_dict.placeholder(str),  # a Hugging Face checkpoint dir to start from
      trackers="",  # experiment trackers, comma-separated: wandb (txf.train.trackers)
    )
  )

  config.eval = ml_collections.ConfigDict(
    dict(
      every=200,
      num_batches=8,
      sample_tokens=96,  # LMs: tokens sampled at each eval (0: none)
      sample_prompt="def ",
      temperature=0.8,
    )
  )

  config.parallel = ml_collections.ConfigDict(
    dict(
      data=-1,  # -1: all devices not used by the other axes
      fsdp=1,
      tensor=1,
    )
  )
  return config
