"""GPT-NeoX-style decoders <-> txf Decoder.

GPT-NeoX (Pythia's architecture) with `use_parallel_residual: false` is
txf's decoder with rotary positions over the whole head
(partial_rotary_factor 1.0; rotate-half, as txf's: see txf.interop.decoder),
LayerNorm in Pre-LN blocks with a final norm, an ungated feed-forward (GELU
or ReLU), as many key/value heads as query heads, head_dim = d_model /
num_heads, and an output tied to the embedding or not. Its projections are
torch Linear ([out, in] weights); query, key and value are one fused
`query_key_value` whose rows hold, head by head, that head's query, key and
value. Attention's biases follow `attention_bias`; the feed-forward always
has biases, which a txf model without biases writes as zeros (and a
checkpoint with attention_bias false is read only when they are zeros).

The parallel residual of Pythia and GPT-NeoX-20B (x + attn(ln1 x) +
mlp(ln2 x)), and a partial rotary, are not txf's block: reading them stops
with a CheckpointError naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from txf.interop import decoder, hf_config
from txf.interop.hf_config import get
from txf.interop.layout import Layout
from txf.interop.rules import Rule, linear, norm, same, zeros
from txf.layers.model_config import ModelConfig, derived

ARCHITECTURES = {"GPTNeoXModel": "none", "GPTNeoXForCausalLM": "lm"}
# A model without attention biases: GPT-NeoX's feed-forward biases stay zeros.
_NO_BIAS = "txf's model.use_bias puts biases on attention and the feed-forward alike"


def _rename_legacy(name: str) -> str:
  """transformers 5's module name of the output (it saves it as embed_out)."""
  return "embed_out." + name.removeprefix("lm_head.") if name.startswith("lm_head.") else name


LAYOUTS = dict.fromkeys(
  ARCHITECTURES,
  Layout(
    prefix="gpt_neox.",
    head_roots=("embed_out",),
    tied_copies={"embed_out.weight": "gpt_neox.embed_in.weight"},
    untied_output="embed_out.weight",
    head_weights=(r"embed_out\..*",),
    # The causal-mask and rotary buffers older checkpoints saved with the weights.
    buffers=(r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",),
    rename_legacy=_rename_legacy,
  ),
)


def model_config(hf: Mapping[str, Any], architecture: str, head: str, tied: bool) -> ModelConfig:
  del architecture
  hf_config.expect(hf, "use_parallel_residual", (False,), True)
  vocab_size = get(hf, "vocab_size")
  pad_id = hf_config.token_id(hf, "pad_token_id") or 0
  dropout = get(hf, "hidden_dropout", 0.0)
  return ModelConfig(
    family="decoder",
    head=head,
    vocab_size=vocab_size,
    d_model=get(hf, "hidden_size"),
    num_heads=get(hf, "num_attention_heads"),
    num_layers=get(hf, "num_hidden_layers"),
    d_ff=get(hf, "intermediate_size"),
    **hf_config.activation_fields(get(hf, "hidden_act", "gelu"), "hidden_act"),
    # transformers (4 and 5) rotates a quarter of each head unless told otherwise.
    **decoder.rope_fields(hf, partial_default=0.25),
    max_len=get(hf, "max_position_embeddings", 2048),
    norm="layer",
    norm_eps=get(hf, "layer_norm_eps", 1e-5),
    norm_placement="pre",
    use_bias=hf_config.expect(hf, "attention_bias", (True, False), True),
    dropout_rate=dropout,
    attention_dropout_rate=get(hf, "attention_dropout", 0.0),
    tie_embeddings=tied,
    scale_logits=False,
    pad_id=pad_id if 0 <= pad_id < vocab_size else 0,
  )


def _fused_qkv(hf: str, txf: str, d_model: int, num_heads: int, head_dim: int, bias: bool) -> Rule:
  """`query_key_value` ([3 H Dh, D] weight, [3 H Dh] bias; rows head by head,
  each head's query, key, value) <-> the query, key and value projections
  ([D, H, Dh] kernels, [H, Dh] biases)."""
  D, H, Dh = d_model, num_heads, head_dim
  parts = ("query", "key", "value")
  names = [f"{txf}/{part}/kernel" for part in parts]
  if bias:
    names += [f"{txf}/{part}/bias" for part in parts]

  def to_txf(weight, *biases):
    by_head = weight.reshape(H, 3, Dh, D)
    kernels = [by_head[:, p].transpose(2, 0, 1) for p in range(3)]
    if not biases:
      return tuple(kernels)
    bias_by_head = biases[0].reshape(H, 3, Dh)
    return (*kernels, *(bias_by_head[:, p] for p in range(3)))

  def to_hf(*arrays):
    kernels, biases = arrays[:3], arrays[3:]
    weight = np.stack([k.transpose(1, 2, 0) for k in kernels], axis=1).reshape(3 * H * Dh, D)
    return (weight, np.stack(biases, axis=1).reshape(3 * H * Dh)) if biases else (weight,)

  return Rule(
    (f"{hf}.weight", f"{hf}.bias") if bias else (f"{hf}.weight",),
    ((3 * H * Dh, D), (3 * H * Dh,)) if bias else ((3 * H * Dh, D),),
    tuple(names),
    ((D, H, Dh),) * 3 + (((H, Dh),) * 3 if bias else ()),
    to_txf,
    to_hf,
  )


def _ffn_projection(hf: str, txf: str, in_dim: int, out_dim: int, bias: bool) -> list[Rule]:
  found = linear(hf, txf, (in_dim,), (out_dim,), bias=bias)
  return found if bias else [*found, zeros(f"{hf}.bias", (out_dim,), _NO_BIAS)]


def rules(cfg: ModelConfig, architecture: str) -> list[Rule]:
  """The rules of every tensor, following txf's Decoder module tree."""
  p, D, H = LAYOUTS[architecture].prefix, cfg.d_model, cfg.num_heads
  Dh, F, bias = derived(cfg.head_dim), derived(cfg.d_ff), cfg.use_bias
  found = [same(f"{p}embed_in.weight", "embedder/token/embedding", (cfg.vocab_size, D))]
  for i in range(cfg.num_layers):
    hf, txf = f"{p}layers.{i}", f"stack/block_{i}"
    found += norm(f"{hf}.input_layernorm", f"{txf}/self_attention_norm", "layer", D)
    found.append(
      _fused_qkv(f"{hf}.attention.query_key_value", f"{txf}/self_attention", D, H, Dh, bias)
    )
    found += linear(f"{hf}.attention.dense", f"{txf}/self_attention/out", (H, Dh), (D,), bias=bias)
    found += norm(f"{hf}.post_attention_layernorm", f"{txf}/ffn_norm", "layer", D)
    found += _ffn_projection(f"{hf}.mlp.dense_h_to_4h", f"{txf}/ffn/wi", D, F, bias)
    found += _ffn_projection(f"{hf}.mlp.dense_4h_to_h", f"{txf}/ffn/wo", F, D, bias)
  found += norm(f"{p}final_layer_norm", "stack/final_norm", "layer", D)
  if cfg.head == "lm" and not cfg.tie_embeddings:
    found += linear("embed_out", "head/logits", (D,), (cfg.vocab_size,), bias=False)
  return found


def default_architecture(cfg: ModelConfig) -> str:
  return "GPTNeoXForCausalLM" if cfg.head == "lm" else "GPTNeoXModel"


def hf_config_of(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json of cfg as `architecture`; refuses fields it cannot hold."""
  required = dict(
    position=decoder.ROPE_POSITIONS,
    norm="layer",
    activation=("gelu", "relu"),
    num_kv_heads=cfg.num_heads,
    **decoder.required_decoder(ARCHITECTURES[architecture]),
  )
  if cfg.num_heads * derived(cfg.head_dim) != cfg.d_model:
    required.update(head_dim=cfg.d_model // cfg.num_heads)
  hf_config.require(cfg, architecture, **required)
  return {
    "architectures": [architecture],
    "model_type": "gpt_neox",
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "intermediate_size": cfg.d_ff,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "hidden_act": hf_config.hf_activation(cfg),
    "max_position_embeddings": cfg.max_len,
    **decoder.rope_config(cfg, partial=True),
    "layer_norm_eps": cfg.norm_eps,
    "use_parallel_residual": False,
    "attention_bias": cfg.use_bias,
    "hidden_dropout": cfg.dropout_rate,
    "attention_dropout": cfg.attention_dropout_rate,
    "tie_word_embeddings": decoder.tie_word_embeddings(cfg),
    "bos_token_id": None,
    "eos_token_id": None,
    "initializer_range": 0.02,
  }
