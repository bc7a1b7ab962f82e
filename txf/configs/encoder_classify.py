"""Encoder classifier on ListOps (Nangia & Bowman 2018; the Long Range Arena task).

  txf-run --config=encoder_classify

Nested MAX/MIN/MED/SM expressions over digits, labelled 0-9. Inputs begin
with BOS, pooled as the [CLS] position. Chance accuracy is about 10%; short
expressions are learnable on a CPU, long ones (LRA uses 2000 tokens) are
the benchmark.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.family = "encoder"
  config.model.head = "classify"
  config.model.pooling = "cls"
  config.data.name = "listops"
  config.data.task = "classify"
  config.data.seq_len = 64
  config.data.min_example_len = 4
  config.data.max_example_len = 48
  config.data.listops_max_depth = 3
  config.eval.sample_tokens = 0
  return config
