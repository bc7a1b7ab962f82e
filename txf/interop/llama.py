"""Llama-style decoders <-> txf Decoder.

Llama is txf's decoder with rotary positions (rotate-half, as txf's: see
txf.interop.decoder), RMSNorm in Pre-LN blocks with a final norm, a gated
feed-forward (down(act(gate x) * up x): SwiGLU with 'silu', GeGLU with a
GELU), any number of key/value heads (GQA, MQA) and any head_dim, biases on
attention and the feed-forward together or on neither (attention_bias,
mlp_bias), and an output tied to the embedding or not. Its projections are
torch Linear ([out, in] weights).

Llama has no residual dropout: model.dropout_rate is not written (only
attention's, attention_dropout); it changes no output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from txf.interop import decoder, hf_config
from txf.interop.hf_config import get
from txf.interop.layout import Layout
from txf.interop.rules import CheckpointError, Rule, linear, norm, same
from txf.layers.model_config import ModelConfig, derived

ARCHITECTURES = {"LlamaModel": "none", "LlamaForCausalLM": "lm"}
LAYOUTS = dict.fromkeys(
  ARCHITECTURES,
  Layout(
    prefix="model.",
    head_roots=("lm_head",),
    tied_copies={"lm_head.weight": "model.embed_tokens.weight"},
    untied_output="lm_head.weight",
    head_weights=(r"lm_head\..*",),
    # The rotary frequencies older checkpoints saved with the weights.
    buffers=(r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq",),
  ),
)
# hidden_act -> (txf's gated activation, gelu_approximate).
_ACTIVATIONS = {
  "silu": ("swiglu", True),
  "swish": ("swiglu", True),
  "gelu": ("geglu", False),
  **{name: ("geglu", True) for name in hf_config.GELU_TANH},
}


def _use_bias(hf: Mapping[str, Any]) -> bool:
  attention = hf_config.expect(hf, "attention_bias", (False, True), False)
  mlp = hf_config.expect(hf, "mlp_bias", (False, True), False)
  if attention != mlp:
    raise CheckpointError(
      f"config.json: attention_bias={attention!r} with mlp_bias={mlp!r} is not supported by "
      "txf (model.use_bias puts biases on attention and the feed-forward alike)"
    )
  return attention


def model_config(hf: Mapping[str, Any], architecture: str, head: str, tied: bool) -> ModelConfig:
  del architecture
  hf_config.expect(hf, "pretraining_tp", (1,), 1)
  name = get(hf, "hidden_act", "silu")
  if name not in _ACTIVATIONS:
    raise CheckpointError(
      f"config.json: hidden_act={name!r} is not supported by txf (supported: "
      f"{', '.join(map(repr, _ACTIVATIONS))})"
    )
  activation, approximate = _ACTIVATIONS[name]
  d_model, num_heads = get(hf, "hidden_size"), get(hf, "num_attention_heads")
  vocab_size = get(hf, "vocab_size")
  pad_id = hf_config.token_id(hf, "pad_token_id") or 0
  fields: dict[str, Any] = dict(
    family="decoder",
    head=head,
    vocab_size=vocab_size,
    d_model=d_model,
    num_heads=num_heads,
    num_layers=get(hf, "num_hidden_layers"),
    d_ff=get(hf, "intermediate_size"),
    activation=activation,
    gelu_approximate=approximate,
    **decoder.rope_fields(hf, partial_default=1.0),
    max_len=get(hf, "max_position_embeddings", 2048),
    norm="rms",
    norm_eps=get(hf, "rms_norm_eps", 1e-6),
    norm_placement="pre",
    use_bias=_use_bias(hf),
    attention_dropout_rate=get(hf, "attention_dropout", 0.0),
    tie_embeddings=tied,
    scale_logits=False,
    pad_id=pad_id if 0 <= pad_id < vocab_size else 0,
  )
  # Given only where they differ from what txf derives (MHA, d_model // num_heads).
  num_kv_heads = get(hf, "num_key_value_heads", num_heads)
  head_dim = get(hf, "head_dim", d_model // num_heads)
  if num_kv_heads != num_heads:
    fields["num_kv_heads"] = num_kv_heads
  if head_dim * num_heads != d_model:
    fields["head_dim"] = head_dim
  return ModelConfig(**fields)


def rules(cfg: ModelConfig, architecture: str) -> list[Rule]:
  """The rules of every tensor, following txf's Decoder module tree."""
  p, D, H, K = LAYOUTS[architecture].prefix, cfg.d_model, cfg.num_heads, derived(cfg.num_kv_heads)
  Dh, F, bias = derived(cfg.head_dim), derived(cfg.d_ff), cfg.use_bias
  found = [same(f"{p}embed_tokens.weight", "embedder/token/embedding", (cfg.vocab_size, D))]
  for i in range(cfg.num_layers):
    hf, txf = f"{p}layers.{i}", f"stack/block_{i}"
    attention = f"{txf}/self_attention"
    found += norm(f"{hf}.input_layernorm", f"{txf}/self_attention_norm", "rms", D)
    found += linear(f"{hf}.self_attn.q_proj", f"{attention}/query", (D,), (H, Dh), bias=bias)
    found += linear(f"{hf}.self_attn.k_proj", f"{attention}/key", (D,), (K, Dh), bias=bias)
    found += linear(f"{hf}.self_attn.v_proj", f"{attention}/value", (D,), (K, Dh), bias=bias)
    found += linear(f"{hf}.self_attn.o_proj", f"{attention}/out", (H, Dh), (D,), bias=bias)
    found += norm(f"{hf}.post_attention_layernorm", f"{txf}/ffn_norm", "rms", D)
    # Llama: down(act(gate x) * up x); txf: wo(act(gate x) * wi x).
    found += linear(f"{hf}.mlp.gate_proj", f"{txf}/ffn/gate", (D,), (F,), bias=bias)
    found += linear(f"{hf}.mlp.up_proj", f"{txf}/ffn/wi", (D,), (F,), bias=bias)
    found += linear(f"{hf}.mlp.down_proj", f"{txf}/ffn/wo", (F,), (D,), bias=bias)
  found += norm(f"{p}norm", "stack/final_norm", "rms", D)
  if cfg.head == "lm" and not cfg.tie_embeddings:
    found += linear("lm_head", "head/logits", (D,), (cfg.vocab_size,), bias=False)
  return found


def default_architecture(cfg: ModelConfig) -> str:
  return "LlamaForCausalLM" if cfg.head == "lm" else "LlamaModel"


def _hidden_act(cfg: ModelConfig) -> str:
  if cfg.activation == "swiglu":
    return "silu"
  return "gelu_new" if cfg.gelu_approximate else "gelu"


def hf_config_of(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json of cfg as `architecture`; refuses fields it cannot hold."""
  hf_config.require(
    cfg,
    architecture,
    position=decoder.ROPE_POSITIONS,
    norm="rms",
    activation=("swiglu", "geglu"),
    **decoder.required_decoder(ARCHITECTURES[architecture]),
  )
  return {
    "architectures": [architecture],
    "model_type": "llama",
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "intermediate_size": cfg.d_ff,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "num_key_value_heads": cfg.num_kv_heads,
    "head_dim": cfg.head_dim,
    "hidden_act": _hidden_act(cfg),
    "max_position_embeddings": cfg.max_len,
    **decoder.rope_config(cfg),
    "rms_norm_eps": cfg.norm_eps,
    "attention_bias": cfg.use_bias,
    "mlp_bias": cfg.use_bias,
    "attention_dropout": cfg.attention_dropout_rate,
    "tie_word_embeddings": decoder.tie_word_embeddings(cfg),
    "bos_token_id": None,
    "eos_token_id": None,
    "pretraining_tp": 1,
    "initializer_range": 0.02,
  }
