"""What the decoder families (gpt2.py, llama.py, gpt_neox.py) share: the
rotary settings of config.json, and logits scaled by d_model^-0.5.

Rotary position embeddings: txf rotates feature i with feature i + Dh/2
(txf.ops.positional.apply_rope), as Llama and GPT-NeoX do (`rotate_half`),
so q and k map without any permutation. `rope` with rope_scale > 1 is
transformers' 'linear' rope type (positions / factor); `rope_ntk` is plain
RoPE of the base txf computes from rope_base and rope_scale, written as that
base (it reads back as `rope`). config.json holds them as transformers 5
writes them (`rope_parameters`) and, beside them, as transformers 4 read them
(`rope_theta` / `rope_scaling`, GPT-NeoX's `rotary_emb_base` / `rotary_pct`).

Scaled logits: no Hugging Face decoder multiplies its logits by a constant,
so a txf decoder whose logits are x d_model^-0.5 (txf's default when the
output is tied) is written with its output matrix multiplied by d_model^-0.5
(in float64, rounded once to float32), untied (tie_word_embeddings false,
the output its own tensor): the same logits up to that rounding, every
hidden state the same; it reads back as an untied, unscaled txf model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from txf.interop.hf_config import get
from txf.interop.rules import CheckpointError
from txf.layers.model_config import ModelConfig, derived

ROPE_POSITIONS = ("rope", "rope_ntk")


def rope_parameters(hf: Mapping[str, Any]) -> dict[str, Any]:
  """config.json's rotary settings as one dict (rope_type, rope_theta, and
  factor / partial_rotary_factor where given): transformers 5's
  `rope_parameters`, or transformers 4's `rope_scaling` with `rope_theta`
  (GPT-NeoX: `rotary_emb_base`, `rotary_pct`) beside it; transformers 5
  reads a `rope_scaling` first, as here."""
  found = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
  if not isinstance(found, dict):
    raise CheckpointError(f"config.json: rope_parameters: expected a JSON object, got {found!r}")
  params = dict(found)
  params.setdefault("rope_type", params.get("type", "default"))
  for key, legacy in (("rope_theta", "rotary_emb_base"), ("partial_rotary_factor", "rotary_pct")):
    for name in (key, legacy):
      if key not in params and hf.get(name) is not None:
        params[key] = hf[name]
  return params


def rope_fields(hf: Mapping[str, Any], partial_default: float) -> dict[str, Any]:
  """ModelConfig fields of config.json's rotary settings (position, options);
  `partial_default`: the architecture's partial_rotary_factor when none is
  given (GPT-NeoX: 0.25). txf rotates every feature of a head, with the
  'default' or 'linear' rope type."""
  params = rope_parameters(hf)
  rope_type = params["rope_type"]
  if rope_type not in ("default", "linear"):
    raise CheckpointError(
      f"config.json: rope_type={rope_type!r} is not supported by txf (supported: 'default', "
      "'linear')"
    )
  partial = get(params, "partial_rotary_factor", float(partial_default))
  if partial != 1.0:
    raise CheckpointError(
      f"config.json: partial_rotary_factor={partial!r} is not supported by txf (supported: 1.0: "
      "txf rotates every feature of a head)"
    )
  scale = get(params, "factor", 1.0) if rope_type == "linear" else 1.0
  return dict(
    position="rope",
    options=dict(rope_base=float(get(params, "rope_theta", 10000.0)), rope_scale=float(scale)),
  )


def rope_config(cfg: ModelConfig, *, partial: bool = False) -> dict[str, Any]:
  """config.json's rotary keys of cfg (position rope or rope_ntk); `partial`:
  the architecture reads a partial_rotary_factor (GPT-NeoX), written 1.0."""
  settings = cfg.settings("position")
  base, scale = settings.rope_base, settings.rope_scale
  if cfg.position == "rope_ntk":
    # txf.ops.positional.apply_ntk_rope: plain RoPE of this base, the same
    # expression, so the same float.
    head_dim = derived(cfg.head_dim)
    base, scale = base * scale ** (head_dim / (head_dim - 2)), 1.0
  params: dict[str, Any] = {"rope_type": "default", "rope_theta": base}
  if scale != 1.0:
    params = {"rope_type": "linear", "rope_theta": base, "factor": scale}
  if partial:
    params["partial_rotary_factor"] = 1.0
  written: dict[str, Any] = {"rope_parameters": params}
  # transformers 4's keys (transformers 5 reads them the same).
  if partial:
    written.update(rotary_emb_base=base, rotary_pct=1.0)
  else:
    written["rope_theta"] = base
  if scale != 1.0:
    written["rope_scaling"] = {"type": "linear", **params}
  return written


def logit_scale(cfg: ModelConfig) -> float | None:
  """The factor of cfg's logits that the written output matrix holds
  (d_model^-0.5 for scaled logits), None when there is none."""
  return cfg.d_model**-0.5 if cfg.head == "lm" and cfg.scale_logits else None


def tie_word_embeddings(cfg: ModelConfig) -> bool:
  """config.json's tie_word_embeddings: the output is written tied only when
  it is the embedding itself (not scaled)."""
  return cfg.tie_embeddings and logit_scale(cfg) is None


def scaled_output(output_VxD: np.ndarray, cfg: ModelConfig) -> np.ndarray:
  """The output matrix times cfg's logit scale (`logit_scale`), in float64
  rounded once to float32."""
  scale = logit_scale(cfg)
  if scale is None:
    return output_VxD
  return (np.asarray(output_VxD, np.float64) * scale).astype(np.float32)


def required_decoder(head: str) -> dict[str, Any]:
  """`hf_config.require`'s keywords every decoder family has (its head
  `head`): a Pre-LN stack with a final norm, no norm on the embeddings,
  attention scaled by head_dim^-0.5, softmax weights, no window, blocks as
  separate parameters."""
  return dict(
    family="decoder",
    head=head,
    norm_placement="pre",
    embed_norm=False,
    scale_attention=True,
    window=None,
    scan_layers=False,
    attention="softmax",
  )
