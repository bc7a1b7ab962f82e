"""Models: `build(config.model)` returns the linen module for the config's
family, a `model.family` choice (txf.layers.model_config.FAMILIES; user
code adds its own with txf.register.family)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn

from txf.layers.model_config import FAMILIES, ModelConfig, ModelFamily
from txf.models.lstm import LSTMLanguageModel, LSTMLayer
from txf.models.output_heads import ClassificationHead, LMHead, MaskedLMHead, pool
from txf.models.transformer import Decoder, Encoder, EncoderDecoder

FAMILIES.register("decoder", ModelFamily(Decoder, ("lm", "classify"), generative=True))
FAMILIES.register("encoder", ModelFamily(Encoder, ("mlm", "classify")))
FAMILIES.register("encoder_decoder", ModelFamily(EncoderDecoder, ("seq2seq",), generative=True))
FAMILIES.register("lstm", ModelFamily(LSTMLanguageModel, ("lm",), generative=True))


def build(model_config: Mapping[str, Any] | ModelConfig) -> nn.Module:
  """Validates a `model` config section and returns the model for its family.

  Raises:
    TypeError: if `model_config` is not a mapping (a ConfigDict, a dict) or a
      `ModelConfig`.
    ValueError: naming the field, for unknown fields or impossible combinations.
  """
  if not (isinstance(model_config, ModelConfig) or hasattr(model_config, "items")):
    raise TypeError(
      f"model config: expected the config's `model` section (a ConfigDict, dict "
      f"or ModelConfig), got {type(model_config).__name__}"
    )
  cfg = (
    model_config if isinstance(model_config, ModelConfig) else ModelConfig.from_config(model_config)
  )
  return FAMILIES[cfg.family].module(cfg)


__all__ = [
  "build",
  "ModelConfig",
  "Decoder",
  "Encoder",
  "EncoderDecoder",
  "LMHead",
  "MaskedLMHead",
  "ClassificationHead",
  "pool",
  "LSTMLanguageModel",
  "LSTMLayer",
]
