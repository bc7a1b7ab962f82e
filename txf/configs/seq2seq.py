"""Encoder-decoder on a synthetic sequence-to-sequence task (default: reverse).

  txf-run --config=seq2seq
  txf-run --config=seq2seq --config.data.name=addition

Tasks: copy, reverse, sort, addition; sources of data.min_example_len..data.max_example_len
symbols. The decoder is teacher-forced on BOS + target; eval reports token
loss and accuracy (teacher-forced, per token: an addition run at 0.57 got
16% of whole answers right decoding greedily; a whole answer is right when
every one of its tokens is). Shared embeddings, sinusoidal positions as in
Vaswani et al.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.family = "encoder_decoder"
  config.model.position = "sinusoidal"
  config.data.name = "reverse"
  config.data.task = "seq2seq"
  config.data.seq_len = 24
  config.data.min_example_len = 4
  config.data.max_example_len = 16
  config.eval.sample_tokens = 0
  return config
