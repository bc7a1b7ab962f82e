"""BERT-style encoders (BERT, MiniLM sentence encoders, RoBERTa) <-> txf Encoder.

BERT is txf's encoder with learned positions, token types, a LayerNorm on
the embedding sum, Post-LN blocks with biases, exact-erf GELU, and (MLM
head) dense + GELU + LayerNorm then the tied, unscaled output plus a bias.
RoBERTa is the same model whose position table starts at row pad_id + 1
(its positions count from there); txf keeps the rows from there on, and an
export writes the rows before them as zeros (no real token reads them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from txf.interop import hf_config
from txf.interop.hf_config import get
from txf.interop.layout import Layout
from txf.interop.rules import CheckpointError, Rule, linear, norm, same
from txf.layers.model_config import ModelConfig, derived

ARCHITECTURES = {
  "BertModel": "none",
  "BertForMaskedLM": "mlm",
  "BertForPreTraining": "mlm",
  "RobertaModel": "none",
  "RobertaForMaskedLM": "mlm",
}


def _roberta(architecture: str) -> bool:
  return architecture.startswith("Roberta")


def _rename_legacy(name: str) -> str:
  """Old TF-converted BERT checkpoints call LayerNorm's weight/bias gamma/beta."""
  if name.endswith(".gamma"):
    return name[: -len("gamma")] + "weight"
  if name.endswith(".beta"):
    return name[: -len("beta")] + "bias"
  return name


def _layout(body: str, head: str) -> Layout:
  """The tensors of an encoder under `body` ('bert') with its MLM head under
  `head` ('cls.predictions')."""
  return Layout(
    prefix=f"{body}.",
    head_roots=("cls", "lm_head"),
    tied_copies={
      f"{head}.decoder.weight": f"{body}.embeddings.word_embeddings.weight",
      f"{head}.decoder.bias": f"{head}.bias",
    },
    untied_output=f"{head}.decoder.weight",
    untied_copies={f"{head}.decoder.bias": f"{head}.bias"},
    head_weights=(r"(cls|lm_head)\..*",),
    # BERT's pooler (tanh(dense(CLS)), used by next-sentence prediction) and
    # its next-sentence head: txf has no place for them.
    unused_always=(rf"{body}\.pooler\..*", r"cls\.seq_relationship\..*"),
    buffers=(rf"{body}\.embeddings\.(position_ids|token_type_ids)",),
    rename_legacy=_rename_legacy,
  )


LAYOUTS = {
  architecture: _layout("roberta", "lm_head")
  if _roberta(architecture)
  else _layout("bert", "cls.predictions")
  for architecture in ARCHITECTURES
}


def _position_offset(architecture: str, pad_id: int) -> int:
  return pad_id + 1 if _roberta(architecture) else 0


def model_config(hf: Mapping[str, Any], architecture: str, head: str, tied: bool) -> ModelConfig:
  hf_config.expect(hf, "position_embedding_type", ("absolute",), "absolute")
  hf_config.expect(hf, "is_decoder", (False,), False)
  hf_config.expect(hf, "add_cross_attention", (False,), False)
  hidden_act = get(hf, "hidden_act", "gelu")
  activation = hf_config.activation_fields(hidden_act, "hidden_act")
  # txf's MLM head applies GELU in the blocks' form; BERT's applies hidden_act,
  # RoBERTa's always exact GELU.
  if head == "mlm" and _roberta(architecture):
    if activation.get("gelu_approximate"):
      raise CheckpointError(
        f"config.json: hidden_act={hidden_act!r} with {architecture}'s MLM "
        "head (exact GELU) is not supported by txf"
      )
    activation["gelu_approximate"] = False
  elif head == "mlm" and activation["activation"] != "gelu":
    raise CheckpointError(
      f"config.json: hidden_act={hidden_act!r} with {architecture}'s MLM "
      "head is not supported by txf (its MLM head applies GELU)"
    )
  pad_id = hf_config.token_id(hf, "pad_token_id") or 0
  offset = _position_offset(architecture, pad_id)
  return ModelConfig(
    family="encoder",
    head=head,
    vocab_size=get(hf, "vocab_size"),
    d_model=get(hf, "hidden_size"),
    num_heads=get(hf, "num_attention_heads"),
    num_layers=get(hf, "num_hidden_layers"),
    d_ff=get(hf, "intermediate_size"),
    **activation,
    position="learned",
    max_len=get(hf, "max_position_embeddings") - offset,
    num_token_types=get(hf, "type_vocab_size", 2),
    embed_norm=True,
    norm="layer",
    norm_eps=get(hf, "layer_norm_eps", 1e-12),
    norm_placement="post",
    use_bias=True,
    dropout_rate=get(hf, "hidden_dropout_prob", 0.0),
    attention_dropout_rate=get(hf, "attention_probs_dropout_prob", 0.0),
    tie_embeddings=tied,
    scale_logits=False,
    pad_id=pad_id,
  )


def _position_rule(hf: str, txf: str, max_len: int, offset: int, d_model: int) -> Rule:
  """The position table without (import) or with (export, zeros) its first
  `offset` rows."""
  return Rule(
    (hf,),
    ((max_len + offset, d_model),),
    (txf,),
    ((max_len, d_model),),
    lambda table: (table[offset:],),
    lambda table: (np.concatenate([np.zeros((offset, d_model), table.dtype), table]),),
  )


def rules(cfg: ModelConfig, architecture: str) -> list[Rule]:
  """The rules of every tensor, following txf's Encoder module tree."""
  p, D, H = LAYOUTS[architecture].prefix, cfg.d_model, cfg.num_heads
  Dh, F = derived(cfg.head_dim), derived(cfg.d_ff)
  offset = _position_offset(architecture, cfg.pad_id)
  found = [
    same(f"{p}embeddings.word_embeddings.weight", "embedder/token/embedding", (cfg.vocab_size, D)),
    _position_rule(
      f"{p}embeddings.position_embeddings.weight", "embedder/position_table", cfg.max_len, offset, D
    ),
    same(
      f"{p}embeddings.token_type_embeddings.weight",
      "embedder/token_type_table",
      (cfg.num_token_types, D),
    ),
    *norm(f"{p}embeddings.LayerNorm", "embedder/embed_norm", "layer", D),
  ]
  for i in range(cfg.num_layers):
    hf, txf = f"{p}encoder.layer.{i}", f"stack/block_{i}"
    for name, txf_name in (("query", "query"), ("key", "key"), ("value", "value")):
      found += linear(
        f"{hf}.attention.self.{name}", f"{txf}/self_attention/{txf_name}", (D,), (H, Dh), bias=True
      )
    found += linear(
      f"{hf}.attention.output.dense", f"{txf}/self_attention/out", (H, Dh), (D,), bias=True
    )
    found += norm(f"{hf}.attention.output.LayerNorm", f"{txf}/self_attention_norm", "layer", D)
    found += linear(f"{hf}.intermediate.dense", f"{txf}/ffn/wi", (D,), (F,), bias=True)
    found += linear(f"{hf}.output.dense", f"{txf}/ffn/wo", (F,), (D,), bias=True)
    found += norm(f"{hf}.output.LayerNorm", f"{txf}/ffn_norm", "layer", D)
  if cfg.head == "mlm":
    head = "lm_head" if _roberta(architecture) else "cls.predictions"
    transform = "lm_head" if _roberta(architecture) else "cls.predictions.transform"
    found += linear(f"{transform}.dense", "head/transform", (D,), (D,), bias=True)
    found += norm(
      f"{transform}.{'layer_norm' if _roberta(architecture) else 'LayerNorm'}",
      "head/norm",
      "layer",
      D,
    )
    found.append(same(f"{head}.bias", "head/bias", (cfg.vocab_size,)))
    if not cfg.tie_embeddings:
      found += linear(
        f"{head}.decoder", "head/projection/logits", (D,), (cfg.vocab_size,), bias=False
      )
  return found


def default_architecture(cfg: ModelConfig) -> str:
  return "BertForMaskedLM" if cfg.head == "mlm" else "BertModel"


def hf_config_of(cfg: ModelConfig, architecture: str) -> dict[str, Any]:
  """The config.json of cfg as `architecture`; refuses fields it cannot hold."""
  required = dict(
    family="encoder",
    head=ARCHITECTURES[architecture],
    position="learned",
    norm="layer",
    norm_placement="post",
    embed_norm=True,
    use_bias=True,
    scale_attention=True,
    activation=("gelu", "relu"),
    **hf_config.plain_attention(cfg),
  )
  if cfg.head == "mlm":
    required.update(scale_logits=False, activation="gelu")
  if _roberta(architecture) and (cfg.activation == "gelu" or cfg.head == "mlm"):
    required.update(gelu_approximate=False)
  refused = []
  if cfg.num_token_types < 1:
    refused.append(
      (
        f"model.num_token_types: {cfg.num_token_types}",
        "(needs 1 or more: its embedding always adds token type 0)",
      )
    )
  if cfg.num_heads * derived(cfg.head_dim) != cfg.d_model:
    refused.append(
      (
        f"model.head_dim: {cfg.head_dim}",
        f"(needs head_dim x {cfg.num_heads} heads = model.d_model={cfg.d_model})",
      )
    )
  hf_config.require(cfg, architecture, *refused, **required)
  return {
    "architectures": [architecture],
    "model_type": "roberta" if _roberta(architecture) else "bert",
    "vocab_size": cfg.vocab_size,
    "hidden_size": cfg.d_model,
    "num_hidden_layers": cfg.num_layers,
    "num_attention_heads": cfg.num_heads,
    "intermediate_size": cfg.d_ff,
    "hidden_act": hf_config.hf_activation(cfg),
    "max_position_embeddings": cfg.max_len + _position_offset(architecture, cfg.pad_id),
    "type_vocab_size": cfg.num_token_types,
    "layer_norm_eps": cfg.norm_eps,
    "hidden_dropout_prob": cfg.dropout_rate,
    "attention_probs_dropout_prob": cfg.attention_dropout_rate,
    "position_embedding_type": "absolute",
    "tie_word_embeddings": cfg.tie_embeddings,
    "initializer_range": 0.02,
  }
