"""Fine-tunes a Hugging Face checkpoint directory: --config=pretrained:DIR.

  txf-run --config=pretrained:models/gpt2 --workdir=runs/gpt2_ft

The model section is the checkpoint's (txf.interop.read_model_config), the
run starts from its weights (config.train.init_from) and reads text with its
tokenizer.json (data.tokenizer='hf'). The task follows the model: a GPT-2
decoder continues the built-in corpus (lm), a BERT encoder fills its masks
(mlm), a T5 encoder-decoder needs a translation dataset
(--config.data.name=tfds:...). Any field can still be overridden; a model
field that no longer matches the checkpoint stops the run naming it.
"""

import dataclasses

from txf.configs import base
from txf.interop import read_model_config

TASKS = {"decoder": "lm", "encoder": "mlm", "encoder_decoder": "seq2seq"}


def get_config(directory: str = ""):
  if not directory:
    raise ValueError(
      "no checkpoint directory: use --config=pretrained:DIR (configs/pretrained.py:DIR in a "
      "checkout)"
    )
  config = base.get_config()
  model = read_model_config(directory)
  for field in dataclasses.fields(model):
    config.model[field.name] = getattr(model, field.name)
  config.data.update(
    dict(
      tokenizer="hf",
      tokenizer_path=directory,
      task=TASKS[model.family],
      seq_len=min(128, model.max_len),
    )
  )
  # Fine-tuning: a small learning rate, short warmup, light weight decay.
  config.train.update(
    dict(init_from=directory, learning_rate=1e-4, warmup_steps=20, weight_decay=0.01)
  )
  return config
