"""Fine-tunes a Hugging Face checkpoint directory or a txf run: --config=pretrained:DIR.

  txf-run --config=pretrained:models/gpt2 --workdir=runs/gpt2_ft
  txf-run --config=pretrained:runs/rope --workdir=runs/rope_ft
  txf-run --config=pretrained:gpt2 --workdir=runs/gpt2_ft   # a Hugging Face Hub name

A Hub name is read from the Hub's cache (or downloaded; txf.interop.hub), and
the run records the snapshot's directory.

The model section is the checkpoint's (txf.interop.read_model_config), the
run starts from its weights (config.train.init_from) and reads text with its
tokenizer.json (data.tokenizer='hf'). The task follows the model: a GPT-2
decoder continues the built-in corpus (lm), a BERT encoder fills its masks
(mlm), a T5 encoder-decoder needs a translation dataset
(--config.data.name=tfds:...). A txf run directory gives its config.json's
model and data sections and its evaluations' sample (eval.sample_prompt and
sample_tokens) (its tokenizer: its sentencepiece model is copied
into the new run, not trained again; a tokenizer whose contents differ from
the one the run recorded stops the run in one line) and its latest
checkpoint's weights. Any field can still be overridden; a model field that no longer
matches the checkpoint stops the run naming it.
"""

import dataclasses

from txf.configs import base
from txf.interop import read_model_config, resolve_model
from txf.layers.model_config import DERIVED_FIELDS

TASKS = {"decoder": "lm", "encoder": "mlm", "encoder_decoder": "seq2seq"}


def get_config(directory: str = ""):
  if not directory:
    raise ValueError(
      "no checkpoint directory: use --config=pretrained:DIR (configs/pretrained.py:DIR in a "
      "checkout)"
    )
  directory = resolve_model(directory)  # a Hub name: its snapshot in the cache
  config = base.get_config()
  # Fine-tuning: a small learning rate, short warmup, light weight decay.
  fine_tuning = dict(init_from=directory, learning_rate=1e-4, warmup_steps=20, weight_decay=0.01)
  from txf.rundir.resume import is_run_directory  # noqa: PLC0415 (jax, only for this config)

  if is_run_directory(directory):
    from txf.runconfig.run_config import to_json  # noqa: PLC0415
    from txf.rundir.resume import read_held_config  # noqa: PLC0415

    saved, _ = read_held_config(directory, trained=True)
    assert saved is not None  # else read_held_config refused a run with no config
    for section, fields in to_json(saved).items():
      if section in ("model", "data"):
        config[section].update(fields)
    # Its sample, which its tokenizer reads: base's text prompt is outside a
    # generated task's symbols.
    sample = ("sample_prompt", "sample_tokens")
    config.eval.update({name: getattr(saved.eval, name) for name in sample})
    config.train.update(fine_tuning)
    return config
  model = read_model_config(directory)
  fields = {field.name: getattr(model, field.name) for field in dataclasses.fields(model)}
  # A derived field the checkpoint's other fields give anyway stays None, so
  # that an override of those (model.num_heads) is checked and named as
  # itself, not as the copied derived one (model.num_kv_heads).
  derived = model.replace(**dict.fromkeys(DERIVED_FIELDS))
  fields.update({name: None for name in DERIVED_FIELDS if getattr(derived, name) == fields[name]})
  # update: model.options keeps every setting's key (the command line sets them).
  config.model.update(fields)
  if model.position == "learned":  # the evaluations' sample fits the checkpoint's table
    config.eval.sample_tokens = min(config.eval.sample_tokens, model.max_len // 2)
  config.data.update(
    dict(
      tokenizer="hf",
      tokenizer_path=directory,
      task=TASKS[model.family],
      seq_len=min(128, model.max_len),
    )
  )
  config.train.update(fine_tuning)
  return config
