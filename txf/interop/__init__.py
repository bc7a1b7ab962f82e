"""Hugging Face checkpoints in and out: BERT-style encoders, GPT-2-, Llama-
and GPT-NeoX-style decoders and T5-style encoder-decoders as txf models
(safetensors, no torch).

  pretrained = load_pretrained("models/all-MiniLM-L6-v2")   # or a Hub name: "gpt2"
  model, params = pretrained.model(), pretrained.params
  save_pretrained(cfg, params, "out/dir")
"""

from txf.interop.checkpoint import (
  Pretrained,
  load_pretrained,
  pretrained_files,
  read_model_config,
  save_pretrained,
)
from txf.interop.hub import resolve_model
from txf.interop.rules import CheckpointError

__all__ = [
  "CheckpointError",
  "Pretrained",
  "load_pretrained",
  "pretrained_files",
  "read_model_config",
  "resolve_model",
  "save_pretrained",
]
