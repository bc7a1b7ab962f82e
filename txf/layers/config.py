"""`ModelConfig`: the validated, immutable form of a config's `model` section.

Every model option is one field here (x-transformers style: one field per
feature, conflicting options rejected). `ModelConfig.from_config` turns an
`ml_collections.ConfigDict` (or a plain dict) into this dataclass, rejecting
unknown fields and impossible combinations with a `ValueError` that names the
field, before any parameter is created.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

FAMILIES = ("decoder", "encoder", "encoder_decoder")
POSITIONS = ("sinusoidal", "learned", "rope", "alibi", "t5_bias", "none")
ACTIVATIONS = ("relu", "gelu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
NORMS = ("layer", "rms")
NORM_PLACEMENTS = ("pre", "post")
HEADS = ("lm", "mlm", "classify")
POOLINGS = ("cls", "mean", "max", "last")
DTYPES = ("float32", "bfloat16", "float16")
ATTENTION_IMPLEMENTATIONS = (None, "xla", "cudnn")

# Which heads each family can carry.
FAMILY_HEADS = {
    "decoder": ("lm", "classify"),
    "encoder": ("mlm", "classify"),
    "encoder_decoder": ("lm",),
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Hyperparameters of every txf model. Field docs are the config reference."""

  family: str = "decoder"          # decoder | encoder | encoder_decoder
  vocab_size: int = 260
  d_model: int = 128
  num_heads: int = 4
  num_kv_heads: int | None = None  # None: = num_heads (MHA); 1: MQA; else GQA
  head_dim: int | None = None      # None: d_model // num_heads
  num_layers: int = 2              # layers per stack
  num_decoder_layers: int | None = None  # encoder_decoder only; None: num_layers
  d_ff: int | None = None          # None: 4*d_model, or 8/3*d_model if gated
  activation: str = "gelu"         # relu | gelu | swiglu | geglu
  position: str = "rope"           # sinusoidal | learned | rope | alibi | t5_bias | none
  max_len: int = 256               # learned table size and longest KV cache
  rope_base: float = 10000.0
  rope_scale: float = 1.0          # > 1: linear position interpolation
  t5_num_buckets: int = 32
  t5_max_distance: int = 128
  norm: str = "layer"              # layer | rms
  norm_eps: float = 1e-6
  norm_placement: str = "pre"      # pre: x + f(norm(x)); post: norm(x + f(x))
  use_bias: bool = False           # biases on attention and FFN projections
  dropout_rate: float = 0.0        # residual and embedding dropout
  attention_dropout_rate: float = 0.0
  tie_embeddings: bool = True      # output projection = token embedding^T
  share_embeddings: bool = True    # encoder_decoder: one table for both stacks
  window: int | None = None        # sliding-window attention span
  head: str = "lm"                 # lm | mlm | classify
  num_classes: int = 2             # classify head only
  pooling: str = "cls"             # classify head: cls | mean | max | last
  pad_id: int = 0
  dtype: str = "float32"           # compute dtype; parameters stay float32
  attention_impl: str | None = None  # None (best available) | xla | cudnn
  remat: bool = False              # recompute block activations in backward
  scan_layers: bool = False        # nn.scan over layers: compile time O(1) in depth

  @classmethod
  def from_config(cls, config: Mapping[str, Any] | Any) -> "ModelConfig":
    """Builds and validates from a ConfigDict / dict; unknown fields fail."""
    items = dict(config.items()) if hasattr(config, "items") else dict(vars(config))
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(items) - known)
    if unknown:
      raise ValueError(f"model.{unknown[0]}: unknown field (known: {', '.join(sorted(known))})")
    return cls(**items)

  def __post_init__(self):
    self._check_choice("family", FAMILIES)
    self._check_choice("position", POSITIONS)
    self._check_choice("activation", ACTIVATIONS)
    self._check_choice("norm", NORMS)
    self._check_choice("norm_placement", NORM_PLACEMENTS)
    self._check_choice("head", HEADS)
    self._check_choice("pooling", POOLINGS)
    self._check_choice("dtype", DTYPES)
    self._check_choice("attention_impl", ATTENTION_IMPLEMENTATIONS)
    for name in ("vocab_size", "d_model", "num_heads", "num_layers", "max_len", "num_classes"):
      self._check_positive(name)
    for name in ("num_kv_heads", "head_dim", "d_ff", "window", "num_decoder_layers"):
      if getattr(self, name) is not None:
        self._check_positive(name)
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
          f"model.num_heads: {self.num_heads} does not divide model.d_model={self.d_model} "
          "(set model.head_dim to decouple them)")
    if self.num_heads % self.kv_heads:
      raise ValueError(
          f"model.num_kv_heads: {self.kv_heads} does not divide model.num_heads={self.num_heads}")
    if self.position == "rope" and self.per_head_dim % 2:
      raise ValueError(f"model.position: rope needs an even head dim, got {self.per_head_dim}")
    if self.position in ("sinusoidal",) and self.d_model % 2:
      raise ValueError(f"model.position: sinusoidal needs an even d_model, got {self.d_model}")
    if self.rope_scale < 1.0:
      raise ValueError(f"model.rope_scale: must be >= 1 (interpolation), got {self.rope_scale}")
    if self.position == "t5_bias" and self.t5_num_buckets < 4:
      raise ValueError(f"model.t5_num_buckets: need at least 4, got {self.t5_num_buckets}")
    if self.head not in FAMILY_HEADS[self.family]:
      raise ValueError(
          f"model.head: {self.head!r} does not fit model.family={self.family!r} "
          f"(choose from {FAMILY_HEADS[self.family]})")
    if self.family == "decoder" and self.head == "classify" and self.pooling == "cls":
      raise ValueError("model.pooling: 'cls' on a causal decoder pools a token that saw only "
                       "itself; use 'last' (or 'mean'/'max')")
    if self.num_decoder_layers is not None and self.family != "encoder_decoder":
      raise ValueError("model.num_decoder_layers: only applies to family='encoder_decoder'")
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f"model.dropout_rate: must be in [0, 1), got {self.dropout_rate}")
    if not 0.0 <= self.attention_dropout_rate < 1.0:
      raise ValueError(
          f"model.attention_dropout_rate: must be in [0, 1), got {self.attention_dropout_rate}")
    if not 0 <= self.pad_id < self.vocab_size:
      raise ValueError(f"model.pad_id: {self.pad_id} outside the vocabulary [0, {self.vocab_size})")

  def _check_choice(self, name, choices):
    value = getattr(self, name)
    if value not in choices:
      raise ValueError(f"model.{name}: {value!r} is not one of {choices}")

  def _check_positive(self, name):
    value = getattr(self, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"model.{name}: must be a positive integer, got {value!r}")

  @property
  def kv_heads(self) -> int:
    return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

  @property
  def per_head_dim(self) -> int:
    return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

  @property
  def ffn_dim(self) -> int:
    if self.d_ff is not None:
      return self.d_ff
    if self.activation in GATED_ACTIVATIONS:
      # 8/3 keeps a gated FFN's parameter count equal to an ungated 4x one
      # (Shazeer 2020); rounded up to a multiple of 8 for the matrix units.
      return -(-8 * self.d_model // 3 // 8) * 8
    return 4 * self.d_model

  @property
  def decoder_layers(self) -> int:
    return self.num_layers if self.num_decoder_layers is None else self.num_decoder_layers

  def replace(self, **changes) -> "ModelConfig":
    return dataclasses.replace(self, **changes)
