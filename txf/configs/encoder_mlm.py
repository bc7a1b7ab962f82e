"""BERT-style encoder trained with masked language modelling on the built-in corpus.

  txf-run --config=encoder_mlm

15% of byte tokens are selected (80% -> [MASK], 10% random, 10% kept) and the
loss is over the selected positions only; eval reports MLM loss, perplexity
and accuracy. Learned absolute positions, as in BERT.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.family = "encoder"
  config.model.head = "mlm"
  config.model.position = "learned"
  config.data.task = "mlm"
  config.eval.sample_tokens = 0
  return config
