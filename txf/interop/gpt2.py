"""GPT-2-style decoders <-> txf Decoder.

GPT-2 is txf's decoder with learned positions, Pre-LN LayerNorm blocks with
biases and a final norm, GELU in its tanh form (gelu_new), and tied,
unscaled logits (scaled ones are written untied: txf.interop.decoder). Its
projections are Conv1D ([in, out] weights, no transpose) and its attention's
query, key and value are one fused `c_attn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from txf.interop import decoder, hf_config
from txf.interop.hf_config import get
from txf.interop.layout import Layout
from txf.interop.rules import Rule, linear, norm, same
from txf.layers.model_config import ModelConfig, derived

ARCHITECTURES = {"GPT2Model": "none", "GPT2LMHeadModel": "lm"}
LAYOUTS = dict.fromkeys(
  ARCHITECTURES,
  Layout(
    prefix="transformer.",
    head_roots=("lm_head",),
    tied_copies={"lm_head.weight": "transformer.wte.weight"},
    untied_output="lm_head.weight",
    head_weights=(r"lm_head\..*",),
    # The causal-mask buffers older checkpoints saved with the weights.
    buffers=(r"transformer\.h\.\d+\.attn\.(bias|masked_bias)",),
  ),
)


def model_config(hf: Mapping[str, Any], architecture: str, head: str, tied: bool) -> ModelConfig:
  del architecture
  hf_config.expect(hf, "scale_attn_weights", (True,), True)
  hf_config.expect(hf, "scale_attn_by_inverse_layer_idx", (False,), False)
  hf_config.expect(hf, "add_cross_attention", (False,), False)
  d_model, vocab_size = get(hf, "n_embd"), get(hf, "vocab_size")
  # GPT-2 has no padding token; its <|endoftext|> pads by convention.
  pad_id = hf_config.token_id(hf, "pad_token_id")
  if pad_id is None:
    pad_id = hf_config.token_id(hf, "eos_token_id") or 0
  return ModelConfig(
    family="decoder",
    head=head,
    vocab_size=vocab_size,
    d_model=d_model,
    num_heads=get(hf, "n_head"),
    num_layers=get(hf, "n_layer"),
    d_ff=get(hf, "n_inner", 4 * d_model),
    **hf_config.activation_fields(
      get(hf, "activation_function", "gelu_new"), "activation_function"
    ),
    position="learned",
    max_len=get(hf, "n_positions"),
    norm="layer",
    norm_eps=get(hf, "layer_norm_epsilon", 1e-5),
    norm_placement="pre",
    use_bias=True,
    dropout_rate=get(hf, "resid_pdrop", 0.0),
    attention_dropout_rate=get(hf, "attn_pdrop", 0.0),
    tie_embeddings=tied,
    scale_logits=False,
    pad_id=pad_id if 0 <= pad_id < vocab_size else 0,
  )


def _fused_qkv(hf: str, txf: str, d_model: int, num_heads: int, head_dim: int) -> Rule:
  """`c_attn` ([D, 3D] weight, [3D] bias, q|k|v along the output) <-> the
  query, key and value projections ([D, H, Dh] kernels, [H, Dh] biases)."""
  D, H, Dh = d_model, num_heads, head_dim
  names = [
    f"{txf}/{part}/{kind}" for kind in ("kernel", "bias") for part in ("query", "key", "value")
  ]

  def to_txf(weight, bias):
    kernels = [w.reshape(D, H, Dh) for w in np.split(weight, 3, axis=1)]
    return (*kernels, *(b.reshape(H, Dh) for b in np.split(bias, 3)))

  def to_hf(*arrays):
    kernels, biases = arrays[:3], arrays[3:]
    return (
      np.concatenate([k.reshape(D, H * Dh) for k in kernels], axis=1),
      np.concatenate([b.reshape(H * Dh) for b in biases]),
    )

  return Rule(
    (f"{hf}.weight", f"{hf}.bias"),
    ((D, 3 * H * Dh), (3 * H * Dh,)),
    tuple(names),
    ((D, H, Dh),) * 3 + ((H, Dh),) * 3,
    to_txf,
    to_hf,
  )


def rules(cfg: ModelConfig, architecture: str) -> list[Rule]:
  """The rules of every tensor, following txf's Decoder module tree."""
  p, D, H = LAYOUTS[architecture].prefix, cfg.d_model, cfg.num_heads
  Dh, F = derived(cfg.head_dim), derived(cfg.d_ff)
  found = [
    same(f"{p}wte.weight", "embedder/token/embedding", (cfg.vocab_size, D)),
    same(f"{p}wpe.weight", "embedder/position_table", (cfg.max_len, D)),
  ]
  for i in range(cfg.num_layers):
    hf, txf = f"{p}h.{i}", f"stack/block_{i}"
    found += norm(f"{hf}.ln_1", f"{txf}/self_attention_norm", "layer", D)
    found.append(_fused_qkv(f"{hf}.attn.c_attn", f"{txf}/self_attention", D, H, Dh))
    found += linear(
      f"{hf}.attn.c_proj", f"{txf}/self_attention/out", (H, Dh), (D,), bias=True, transposed=False
    )
    found += norm(f"{hf}.ln_2", f"{txf}/ffn_norm", "layer", D)
    found += linear(f"{hf}.mlp.c_fc", f"{txf}/ffn/wi", (D,), (F,), bias=True, transposed=False)
    found += linear(f"{hf}.mlp.c_proj", f"{txf}/ffn/wo", (F,), (D,), bias=True, transposed=False)
  found += norm(f"{p}ln_f", "stack/final_norm", "layer", D)
  if cfg.head == "lm" and not cfg.tie_embeddings:
    found += linear("lm_head", "head/logits", (D,), (cfg.vocab_size,), bias=False)
  return found


def default_architecture(cfg: ModelConfig) -> str:
  return "GPT2LMHeadModel" if cfg.head == "lm" else "GPT2Model"


def hf_config_of(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json of cfg as `architecture`; refuses fields it cannot hold."""
  required = dict(
    family="decoder",
    head=ARCHITECTURES[architecture],
    position="learned",
    norm="layer",
    norm_placement="pre",
    embed_norm=False,
    use_bias=True,
    scale_attention=True,
    activation=("gelu", "relu"),
    **hf_config.plain_attention(cfg),
  )
  if cfg.num_heads * derived(cfg.head_dim) != cfg.d_model:
    required.update(head_dim=cfg.d_model // cfg.num_heads)
  hf_config.require(cfg, architecture, **required)
  return {
    "architectures": [architecture],
    "model_type": "gpt2",
    "vocab_size": cfg.vocab_size,
    "n_embd": cfg.d_model,
    "n_layer": cfg.num_layers,
    "n_head": cfg.num_heads,
    "n_inner": cfg.d_ff,
    "n_positions": cfg.max_len,
    "activation_function": hf_config.hf_activation(cfg),
    "layer_norm_epsilon": cfg.norm_eps,
    "resid_pdrop": cfg.dropout_rate,
    "embd_pdrop": cfg.dropout_rate,
    "attn_pdrop": cfg.attention_dropout_rate,
    "tie_word_embeddings": decoder.tie_word_embeddings(cfg),
    "scale_attn_weights": True,
    # Unset, GPT2Config's own 50256 (GPT-2's <|endoftext|>), an id outside a
    # smaller vocabulary, where generate() would stop: None unless the run's
    # ids are given (save_pretrained's token_ids).
    "bos_token_id": None,
    "eos_token_id": None,
    "initializer_range": 0.02,
  }
