"""Multi-query associative recall (Arora et al. 2023, "Zoology") with a 2-layer decoder.

  txf-run --config=mqar --workdir=/tmp/txf/mqar

Each row holds 8 key-value pairs over 64 symbols, then every key queried once
at power-law gaps, followed by its value (txf.data.incontext); loss and
accuracy count the values after queried keys only (chance: 1/32).

Expected on 2 CPU cores (shared with other jobs): about 7 minutes; eval_accuracy
0.13 / 0.76 / 0.998 / 0.9995 at steps 250 / 500 / 750 / 1000 (seed 0).
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.d_model = 64
  config.data.name = "mqar"
  config.data.seq_len = 64
  config.data.num_symbols = 64
  config.data.num_kv_pairs = 8
  config.train.steps = 1000
  config.train.warmup_steps = 100
  config.eval.every = 250
  config.eval.sample_tokens = 0
  config.train.checkpoint_every = 500
  return config
