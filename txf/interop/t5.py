"""T5-style encoder-decoders (T5 v1.0, v1.1 / flan) <-> txf EncoderDecoder.

T5 is txf's encoder-decoder with one shared embedding, a learned
relative-position bias table per stack (held by block 0 in HF, shared by its
layers), RMS norm (no mean, no bias) in Pre-LN blocks with final norms,
unscaled attention, no biases, and a ReLU (v1.0) or gated tanh-GELU (v1.1)
feed-forward. v1.0 ties the output to the embedding and scales the decoder
output by d_model^-0.5 (txf's default for tied logits); v1.1 has an untied,
unscaled `lm_head`.

Whether logits are scaled: `transformers` 4 took it from tie_word_embeddings
(as T5 was trained); `transformers` 5 writes it as scale_decoder_outputs and
always writes tie_word_embeddings=true. Both are read. Whether the output is
tied: whether the file holds an `lm_head.weight` that differs from the
embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txf.interop import hf_config
from txf.interop.hf_config import get
from txf.interop.layout import Layout
from txf.interop.rules import CheckpointError, Rule, linear, norm, same
from txf.layers.model_config import ModelConfig, derived

ARCHITECTURES = {"T5ForConditionalGeneration": "lm"}
HIDDEN_STATES = False  # txf's encoder_decoder carries its LM head only (head='none' refused)
# feed_forward_proj activation -> (txf activation ungated, gated, gelu_approximate).
_FFN_ACTIVATIONS = {
  "relu": ("relu", None, True),
  "gelu": ("gelu", "geglu", False),
  "gelu_new": ("gelu", "geglu", True),
  "gelu_pytorch_tanh": ("gelu", "geglu", True),
  "silu": (None, "swiglu", True),
}


LAYOUTS = dict.fromkeys(
  ARCHITECTURES,
  Layout(
    prefix="",
    head_roots=("lm_head",),
    tied_copies={
      "encoder.embed_tokens.weight": "shared.weight",
      "decoder.embed_tokens.weight": "shared.weight",
      "lm_head.weight": "shared.weight",
    },
    untied_output="lm_head.weight",
    # Old checkpoints hold a relative bias for the first cross-attention that
    # T5 never uses (cross-attention has no position bias).
    unused_always=(
      r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight",
    ),
  ),
)


def _ffn_fields(feed_forward_proj: str) -> dict[str, Any]:
  gated = feed_forward_proj.startswith("gated-")
  name = feed_forward_proj.removeprefix("gated-")
  if gated and name == "gelu":
    name = "gelu_new"  # transformers reads "gated-gelu" as gelu_new (T5 v1.1)
  ungated, gated_kind, approximate = _FFN_ACTIVATIONS.get(name, (None, None, True))
  activation = gated_kind if gated else ungated
  if activation is None:
    raise CheckpointError(
      f"config.json: feed_forward_proj={feed_forward_proj!r} is not "
      "supported by txf (supported: 'relu', 'gelu', 'gated-gelu', "
      "'gated-silu')"
    )
  fields: dict[str, Any] = dict(activation=activation)
  if activation in ("gelu", "geglu"):
    fields["gelu_approximate"] = approximate
  return fields


def model_config(hf: Mapping[str, Any], architecture: str, head: str, tied: bool) -> ModelConfig:
  del architecture
  scaled = hf.get("scale_decoder_outputs", hf.get("tie_word_embeddings", True))
  if scaled is None:
    scaled = True
  return ModelConfig(
    family="encoder_decoder",
    head=head,
    vocab_size=get(hf, "vocab_size"),
    d_model=get(hf, "d_model"),
    num_heads=get(hf, "num_heads"),
    head_dim=get(hf, "d_kv"),
    num_layers=get(hf, "num_layers"),
    num_decoder_layers=get(hf, "num_decoder_layers", get(hf, "num_layers")),
    d_ff=get(hf, "d_ff"),
    **_ffn_fields(get(hf, "feed_forward_proj", "relu")),
    position="t5_bias",
    options=dict(
      t5_num_buckets=get(hf, "relative_attention_num_buckets", 32),
      t5_max_distance=get(hf, "relative_attention_max_distance", 128),
    ),
    norm="rms",
    norm_eps=get(hf, "layer_norm_epsilon", 1e-6),
    norm_placement="pre",
    use_bias=False,
    scale_attention=False,
    # transformers' T5 drops its attention weights at dropout_rate too.
    dropout_rate=get(hf, "dropout_rate", 0.0),
    attention_dropout_rate=get(hf, "dropout_rate", 0.0),
    tie_embeddings=tied,
    share_embeddings=True,
    scale_logits=bool(scaled),
    pad_id=hf_config.token_id(hf, "pad_token_id") or 0,
  )


def _attention(hf: str, txf: str, cfg: ModelConfig) -> list[Rule]:
  D, H, Dh = cfg.d_model, cfg.num_heads, derived(cfg.head_dim)
  found = []
  for name, txf_name in (("q", "query"), ("k", "key"), ("v", "value")):
    found += linear(f"{hf}.{name}", f"{txf}/{txf_name}", (D,), (H, Dh), bias=False)
  return found + linear(f"{hf}.o", f"{txf}/out", (H, Dh), (D,), bias=False)


def _ffn(hf: str, txf: str, cfg: ModelConfig) -> list[Rule]:
  D, F = cfg.d_model, derived(cfg.d_ff)
  if cfg.activation in ("geglu", "swiglu"):
    # T5: act(wi_0 x) * wi_1 x; txf: act(gate x) * wi x.
    inputs = linear(f"{hf}.wi_0", f"{txf}/gate", (D,), (F,), bias=False) + linear(
      f"{hf}.wi_1", f"{txf}/wi", (D,), (F,), bias=False
    )
  else:
    inputs = linear(f"{hf}.wi", f"{txf}/wi", (D,), (F,), bias=False)
  return inputs + linear(f"{hf}.wo", f"{txf}/wo", (F,), (D,), bias=False)


def _stack(stack: str, cfg: ModelConfig, num_layers: int, decoder: bool) -> list[Rule]:
  D = cfg.d_model
  found = [
    same(
      f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
      f"{stack}/relative_position/table",
      (cfg.settings("position").t5_num_buckets, cfg.num_heads),
    )
  ]
  for i in range(num_layers):
    hf, txf = f"{stack}.block.{i}.layer", f"{stack}/block_{i}"
    found += _attention(f"{hf}.0.SelfAttention", f"{txf}/self_attention", cfg)
    found += norm(f"{hf}.0.layer_norm", f"{txf}/self_attention_norm", "rms", D)
    ffn = 1
    if decoder:
      found += _attention(f"{hf}.1.EncDecAttention", f"{txf}/cross_attention", cfg)
      found += norm(f"{hf}.1.layer_norm", f"{txf}/cross_attention_norm", "rms", D)
      ffn = 2
    found += _ffn(f"{hf}.{ffn}.DenseReluDense", f"{txf}/ffn", cfg)
    found += norm(f"{hf}.{ffn}.layer_norm", f"{txf}/ffn_norm", "rms", D)
  return found + norm(f"{stack}.final_layer_norm", f"{stack}/final_norm", "rms", D)


def rules(cfg: ModelConfig, architecture: str) -> list[Rule]:
  """The rules of every tensor, following txf's EncoderDecoder module tree."""
  del architecture
  found = [same("shared.weight", "encoder_embedder/token/embedding", (cfg.vocab_size, cfg.d_model))]
  found += _stack("encoder", cfg, cfg.num_layers, decoder=False)
  found += _stack("decoder", cfg, derived(cfg.num_decoder_layers), decoder=True)
  if not cfg.tie_embeddings:
    found += linear("lm_head", "head/logits", (cfg.d_model,), (cfg.vocab_size,), bias=False)
  return found


def default_architecture(cfg: ModelConfig) -> str:
  del cfg
  return "T5ForConditionalGeneration"


def hf_config_of(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json of cfg as `architecture`; refuses fields it cannot hold.

  tie_word_embeddings is written as transformers 4 reads it (it decides the
  logits' scaling there); a tied, unscaled output is written untied, its
  lm_head a copy of the embedding (the `lm_head.weight` save_pretrained adds).
  """
  required = dict(
    family="encoder_decoder",
    position="t5_bias",
    norm="rms",
    norm_placement="pre",
    embed_norm=False,
    use_bias=False,
    scale_attention=False,
    share_embeddings=True,
    activation=("relu", "gelu", "geglu", "swiglu"),
    **hf_config.plain_attention(cfg),
  )
  if not cfg.tie_embeddings:
    required.update(scale_logits=False)
  refused = []
  if cfg.activation == "geglu" and not cfg.gelu_approximate:
    refused.append(
      (
        "model.gelu_approximate: False",
        "(needs True with model.activation='geglu': its gated GELU is the tanh form)",
      )
    )
  hf_config.require(cfg, architecture, *refused, **required)
  gated = cfg.activation in ("geglu", "swiglu")
  name = {"relu": "relu", "swiglu": "silu"}.get(
    cfg.activation, "gelu_new" if cfg.gelu_approximate else "gelu"
  )
  if gated and name == "gelu_new":
    name = "gelu"  # "gated-gelu" means gelu_new to transformers
  return {
    "architectures": [architecture],
    "model_type": "t5",
    "vocab_size": cfg.vocab_size,
    "d_model": cfg.d_model,
    "d_kv": cfg.head_dim,
    "d_ff": cfg.d_ff,
    "num_layers": cfg.num_layers,
    "num_decoder_layers": cfg.num_decoder_layers,
    "num_heads": cfg.num_heads,
    "relative_attention_num_buckets": cfg.settings("position").t5_num_buckets,
    "relative_attention_max_distance": cfg.settings("position").t5_max_distance,
    "feed_forward_proj": f"gated-{name}" if gated else name,
    "layer_norm_epsilon": cfg.norm_eps,
    "dropout_rate": cfg.dropout_rate,
    "tie_word_embeddings": bool(cfg.scale_logits),
    "is_encoder_decoder": True,
    "decoder_start_token_id": cfg.pad_id,
    "initializer_factor": 1.0,
  }
