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
  config.seed = 0  # parameter init, dropout and (data.seed None) data order
  # Seeds as replicas: R copies of the run, seeds seed .. seed + R - 1, trained
  # in one program on the same batches (txf.train.replicas); metrics report
  # each replica ('loss/0', ...) and their mean and std.
  config.replicas = 1  # seed replicas trained side by side (see above)

  # txf.layers.model_config.ModelConfig documents every field and holds its default.
  config.model = _model_defaults()
  # txf.train.run_config fills it in.
  config.model.vocab_size = config_dict.placeholder(int)  # None: the tokenizer's vocabulary size

  # txf.data documents every field.
  config.data = ml_collections.ConfigDict(
    dict(
      name="pystdlib",  # built-in corpus: the Python standard library's sources
      task="lm",  # lm | mlm | seq2seq | classify (txf.data.spec.TASKS: per data.name)
      tokenizer="bytes",  # bytes | sentencepiece (trained in the run dir) | hf
      sp_vocab_size=1024,  # tokenizer="sentencepiece": its largest vocabulary
      tokenizer_path=config_dict.placeholder(str),  # tokenizer="hf": a tokenizer.json or its dir
      seq_len=128,  # tokens per example (seq2seq: per source and target)
      batch_size=32,  # global, across all devices and hosts
      max_corpus_bytes=4_000_000,  # pystdlib: bytes read per split
      mlm_probability=0.15,  # task="mlm": fraction of tokens masked
      min_example_len=4,  # generated tasks: shortest example (induction: span)
      max_example_len=16,  # generated tasks: longest example (induction: span)
      listops_max_depth=4,  # listops: most nested operators (root = 1)
      num_symbols=32,  # induction, mqar: content ids
      num_kv_pairs=8,  # mqar: key-value pairs per row
      # data.name="tfds:<builder>[/config]": a prepared TFDS dataset (README).
      tfds_data_dir=config_dict.placeholder(str),  # None: $TFDS_DATA_DIR or ~/tensorflow_datasets
      tfds_text_key=config_dict.placeholder(str),  # lm/mlm text feature; None: "text"
      tfds_source_key=config_dict.placeholder(str),  # seq2seq; None: from "<src>-<tgt>"
      tfds_target_key=config_dict.placeholder(str),  # seq2seq; None: from "<src>-<tgt>"
      # lm/mlm on TFDS stream the split, packed into windows (txf.data.packed):
      read_threads=DEFAULT_READ_THREADS,  # threads reading ahead (I/O)
      read_workers=config_dict.placeholder(int),  # processes tokenizing train (CPU); None: 0
      attend_across_documents=False,  # True: GPT-2's recipe, no document mask
      seed=config_dict.placeholder(int),  # the data order's; None: the run's seed
    )
  )

  config.train = ml_collections.ConfigDict(
    dict(
      steps=600,  # training steps (the schedule decays until here)
      learning_rate=3e-3,  # peak, after warmup
      warmup_steps=60,  # linear warmup from 0 to learning_rate (at most train.steps: clamped)
      decay="cosine",  # after warmup: cosine | linear | constant | rsqrt
      end_lr_fraction=0.1,  # final lr / peak (cosine, linear)
      weight_decay=0.1,  # decoupled (AdamW), on matrices only
      b1=0.9,  # Adam first-moment decay rate
      b2=0.95,  # Adam second-moment decay rate
      eps=1e-8,  # Adam denominator epsilon
      grad_clip_norm=1.0,  # global gradient norm clip (0: none)
      grad_accum_steps=1,  # micro-batches per step (batch_size must divide evenly)
      label_smoothing=0.0,  # fraction of target mass spread over the vocabulary
      z_loss=0.0,  # weight of log(Z)^2 (PaLM), keeps logits from drifting
      # The [B, T, V] logits are then never held at once (lm heads only).
      loss_chunk_len=0,  # > 0: loss fused with the LM head, this many positions at a time
      log_every=50,  # steps between progress lines and training metrics
      checkpoint_every=200,  # steps between checkpoints (and one at the end)
      max_to_keep=2,  # newest checkpoints kept
      init_from=config_dict.placeholder(str),  # a Hugging Face dir or a txf run dir to start from
      trackers="",  # experiment trackers, comma-separated: wandb (txf.train.trackers)
    )
  )

  config.eval = ml_collections.ConfigDict(
    dict(
      every=200,  # steps between evaluations (and one at the end)
      num_batches=8,  # validation batches per evaluation
      sample_tokens=96,  # LMs: tokens sampled at each eval (0: none)
      sample_prompt="def ",  # LMs: the sample's prompt
      temperature=0.8,  # LMs: the sample's temperature (0: greedy)
    )
  )

  config.parallel = ml_collections.ConfigDict(
    dict(
      data=-1,  # -1: all devices not used by the other axes
      fsdp=1,  # devices splitting the batch and the parameters / optimizer state
      tensor=1,  # devices splitting heads, MLP and vocabulary (Megatron-style)
    )
  )
  return config
