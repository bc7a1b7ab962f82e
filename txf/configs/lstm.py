"""LSTM language model: the recurrent baseline (model.family='lstm').

  txf-run --config=lstm

Two layers (base.py's) of flax's LSTM cell, 218 units wide, with the Pre-LN
Transformer's tied embedding, final norm and LM head: 819,244 parameters, as
near as a width gets to the 822,016 of base.py at model.num_layers=4
(d_model 128, 4 heads), the Transformer it is compared with in
txf.textbook.lstm_vs_transformer. Same data, optimizer and schedule as
base.py. An LSTM reads only the model fields in
txf.layers.model_config.LSTM_FIELDS; the others (positions, attention heads, FFN,
...) must keep their defaults.
"""

from txf.configs import base


def get_config():
  config = base.get_config()
  config.model.family = "lstm"
  config.model.d_model = 218
  return config
