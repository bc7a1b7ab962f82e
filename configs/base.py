"""Defaults for every txf run: a small byte-level decoder LM on the built-in corpus.

Every other config file starts from this one and changes only what makes it
different. Any field can be overridden on the command line:

  python -m experiments.run --config=configs/base.py --workdir=/tmp/txf/base \
      --config.train.steps=200 --config.model.num_layers=4

Sized so the default run finishes on a 2-core CPU in a few minutes and shows
clear learning (see README for measured numbers).
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0

  # txf.layers.config.ModelConfig documents every field.
  config.model = ml_collections.ConfigDict(dict(
      family="decoder",
      vocab_size=None,        # None: the tokenizer's vocabulary size
      d_model=128,
      num_heads=4,
      num_kv_heads=None,      # None: = num_heads
      head_dim=None,          # None: d_model // num_heads
      num_layers=2,
      num_decoder_layers=None,
      d_ff=None,              # None: 4 * d_model (8/3 * d_model if gated)
      activation="gelu",
      position="rope",
      max_len=512,
      rope_base=10000.0,
      rope_scale=1.0,
      t5_num_buckets=32,
      t5_max_distance=128,
      norm="layer",
      norm_eps=1e-6,
      norm_placement="pre",
      use_bias=False,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      tie_embeddings=True,
      share_embeddings=True,
      window=None,
      head="lm",
      num_classes=2,
      pooling="cls",
      pad_id=0,
      dtype="float32",
      attention_impl=None,
      remat=False,
      scan_layers=False,
  ))

  # txf.data documents every field.
  config.data = ml_collections.ConfigDict(dict(
      name="pystdlib",        # built-in corpus: the Python standard library's sources
      task="lm",
      tokenizer="bytes",
      sp_vocab_size=1024,
      seq_len=128,
      batch_size=32,          # global, across all devices and hosts
      max_corpus_bytes=4_000_000,
      mlm_probability=0.15,
      min_example_len=4,
      max_example_len=16,
      listops_max_depth=4,
      # data.name="tfds:<builder>[/config]": a prepared TFDS dataset (README).
      tfds_data_dir=None,     # None: $TFDS_DATA_DIR or ~/tensorflow_datasets
      tfds_text_key=None,     # lm/mlm text feature; None: "text"
      tfds_source_key=None,   # seq2seq features; None: from a "<src>-<tgt>" config name
      tfds_target_key=None,
  ))

  config.train = ml_collections.ConfigDict(dict(
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
      grad_accum_steps=1,     # micro-batches per step (batch_size must divide evenly)
      label_smoothing=0.0,
      z_loss=0.0,
      log_every=50,
      checkpoint_every=200,
      max_to_keep=2,
  ))

  config.eval = ml_collections.ConfigDict(dict(
      every=200,
      num_batches=8,
      sample_tokens=96,       # LMs: tokens sampled at each eval (0: none)
      sample_prompt="def ",
      temperature=0.8,
  ))

  config.parallel = ml_collections.ConfigDict(dict(
      data=-1,                # -1: all devices not used by the other axes
      fsdp=1,
      tensor=1,
  ))
  return config
