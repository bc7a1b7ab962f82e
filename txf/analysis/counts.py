"""Parameter counts by component and training FLOPs per token.

`count_params` attributes every parameter of a txf model to the component of
the layer that owns it, found by tracing the model's module tree (which layer
class sits at which path; no names of parameters or modules are listed here).
`flops_per_token` needs only the config: it counts the matmuls one token goes
through, in closed form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import layers, models
from txf.layers.model_config import HEADS, ModelConfig, derived

COMPONENTS = ("embedding", "position", "attention", "cross_attention", "ffn", "norm", "head")
# The LSTM family's components: its layers are 'recurrent'.
LSTM_COMPONENTS = ("embedding", "recurrent", "norm", "head")

# Layer class -> component. A parameter belongs to the component of the
# outermost classified module on its path, so a norm inside the MLM head
# counts as 'head', one in a block as 'norm'. MultiHeadAttention is
# 'attention' or 'cross_attention' by how it is called, and every
# registered head's module is 'head' (`_component`).
_CLASS_COMPONENTS = {
  layers.Embedder: "embedding",  # token table and learned position table
  layers.RelativePositionTable: "position",
  layers.FeedForward: "ffn",
  layers.Norm: "norm",
  models.LSTMLayer: "recurrent",
}


def _component(module: nn.Module, args: tuple) -> str | None:
  """The component of a module called with positional `args`, or None."""
  if isinstance(module, layers.MultiHeadAttention):
    # Cross-attention is the attention called with a key/value input.
    return "cross_attention" if len(args) > 1 and args[1] is not None else "attention"
  if any(head.module is not None and isinstance(module, head.module) for _, head in HEADS.items()):
    return "head"
  return next(
    (component for cls, component in _CLASS_COMPONENTS.items() if isinstance(module, cls)), None
  )


def module_components(cfg: ModelConfig | Mapping[str, Any]) -> dict[tuple[str, ...], str]:
  """{module path: component} for the classified modules of the model of `cfg`.

  Found by an abstract `model.init` (no arrays) that records each module's
  class as it is called.
  """
  cfg = _as_model_config(cfg)
  components: dict[tuple[str, ...], str] = {}

  def record(next_fun, args, kwargs, context):
    if context.method_name == "__call__":
      component = _component(context.module, args)
      if component is not None:
        components.setdefault(tuple(context.module.path), component)
    return next_fun(*args, **kwargs)

  tokens_1x1 = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  inputs = (tokens_1x1,) * (2 if cfg.family == "encoder_decoder" else 1)
  with nn.intercept_methods(record):
    jax.eval_shape(models.build(cfg).init, jax.random.key(0), *inputs)
  return components


def _key_name(key: Any) -> str:
  """The module/parameter name of one `jax.tree_util` path entry."""
  for attribute in ("key", "name", "idx"):
    if hasattr(key, attribute):
      return str(getattr(key, attribute))
  return str(key)


def count_params(params: Mapping[str, Any], cfg: ModelConfig | Mapping[str, Any]) -> dict[str, int]:
  """Exact parameter counts of a txf model, by component.

  Args:
    params: the `params` collection of `model.init(...)`, or the whole
      variables dict (`{'params': ...}`); leaves may be arrays, shape structs
      or `nn.Partitioned` boxes.
    cfg: the model's config (a `ModelConfig` or a config's `model` section);
      its `scan_layers` must match the layout of `params` (scanned stacks,
      `blocks` with a leading layer axis, and unscanned ones, `block_{i}`,
      give the same counts).

  Returns:
    For the Transformer families {'embedding': token tables + learned position tables,
     'position': T5 relative-bias tables,
     'attention': self-attention projections (kernels and biases),
     'cross_attention': encoder-decoder attention projections,
     'ffn': feed-forward layers,
     'norm': every norm in the stacks, final norms included,
     'head': parameters of the output head that are not the tied embedding
       (untied logits kernel; MLM transform, norm and bias; classifier),
     'total': all of the above};
    for family='lstm' {'embedding', 'recurrent': the LSTM layers' kernels and
    biases, 'norm': the final norm, 'head', 'total'} (LSTM_COMPONENTS).

  Raises:
    ValueError: naming a parameter that no classified module of the model
      owns (a new layer class must be given a component rather than its
      parameters silently dropped).
  """
  if "params" in params:
    params = params["params"]
  components = module_components(cfg)
  cfg = _as_model_config(cfg)
  counts = dict.fromkeys(LSTM_COMPONENTS if cfg.family == "lstm" else COMPONENTS, 0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(params))[0]:
    names = tuple(_key_name(key) for key in path)
    component = next(
      (components[names[:i]] for i in range(1, len(names)) if names[:i] in components), None
    )
    if component is None:
      raise ValueError(f"count_params: no component for parameter {'/'.join(names)}")
    counts[component] += math.prod(leaf.shape)
  counts["total"] = sum(counts.values())
  return counts


def _as_model_config(cfg: ModelConfig | Mapping[str, Any]) -> ModelConfig:
  return cfg if isinstance(cfg, ModelConfig) else ModelConfig.from_config(cfg)


def _attention_matmul_params(cfg: ModelConfig) -> int:
  """Weights of q, k, v and out: D*H*Dh + 2*D*K*Dh + H*Dh*D."""
  return cfg.d_model * derived(cfg.head_dim) * (2 * cfg.num_heads + 2 * derived(cfg.num_kv_heads))


def _lstm_matmul_params(cfg: ModelConfig) -> int:
  """Input and recurrent kernels of the four gates: 4 * (D * D + D * D)."""
  return 8 * cfg.d_model * cfg.d_model


def _ffn_matmul_params(cfg: ModelConfig) -> int:
  """Weights of wi (and gate) and wo: (2 or 3) * D * F."""
  gated = cfg.activation in ("swiglu", "geglu")
  return (3 if gated else 2) * cfg.d_model * derived(cfg.d_ff)


def matmul_params(cfg: ModelConfig | Mapping[str, Any]) -> int:
  """N: the matmul weights every token is multiplied by in a forward pass.

  Non-embedding in the sense of Kaplan et al. (2020): no embedding lookups,
  no biases, norms or position tables, but the output projection onto the
  vocabulary counts (tied or not: the matmul is done either way, as in
  Chowdhery et al. 2022, appendix B). For an encoder-decoder both stacks
  count: one source and one target token go through them together. The
  classification head acts once per sequence, not per token, and is left out
  (`flops_per_token` adds it per sequence).
  """
  cfg = _as_model_config(cfg)
  if cfg.family == "lstm":
    return cfg.num_layers * _lstm_matmul_params(cfg) + cfg.d_model * cfg.vocab_size
  layer = _attention_matmul_params(cfg) + _ffn_matmul_params(cfg)
  stacks = cfg.num_layers * layer
  if cfg.family == "encoder_decoder":
    stacks += derived(cfg.num_decoder_layers) * (layer + _attention_matmul_params(cfg))
  return stacks + _head_matmul_params(cfg)


def _head_matmul_params(cfg: ModelConfig) -> int:
  """The head's part of `matmul_params`, as its entry declares it
  (txf.register.head's matmul_params)."""
  count = HEADS[cfg.head].matmul_params
  assert count is not None  # a ModelConfig refuses a head without it (_check_head)
  return count(cfg)


def flops_per_token(cfg: ModelConfig | Mapping[str, Any], seq_len: int) -> float:
  """Training (forward + backward) FLOPs per token, without rematerialisation.

      flops = 6 * N  +  12 * L_a * H * Dh * T

  the convention of PaLM's model FLOPs utilisation (Chowdhery et al. 2022,
  appendix B: 6N + 12LHQT), which nanoGPT and most published MFU figures use.
  N is `matmul_params(cfg)`: each weight costs 2 FLOPs (multiply-add) per
  token forward and 4 backward (Kaplan et al. 2020, sec. 2.1; Hoffmann et al.
  2022, appendix F). Per attention layer and token, the q.k scores and the
  weighted sum of values each take 2 * H * Dh * T FLOPs forward, 12 * H * Dh
  * T forward + backward; L_a counts every attention sub-layer (self and
  cross; an encoder-decoder's cross-attention attends to all T = seq_len
  encoder positions). As in PaLM, causal attention is counted whole: a causal
  kernel that skips the masked half does less work than this counts, and
  sliding windows are not credited either, so MFU figures compare across
  codebases that use the convention.

  An LSTM (family='lstm') has no attention term: 6 * N, its gates' matmuls
  and the vocabulary projection (the gates' elementwise work is not counted).

  For an encoder-decoder the source and target both have length seq_len and
  "a token" is one source plus one target token. A classification head adds
  6 * D * num_classes per sequence, i.e. divided by seq_len.

  Args:
    cfg: model config (a `ModelConfig` or a config's `model` section).
    seq_len: T, tokens per sequence.

  Returns:
    FLOPs per token (float).
  """
  cfg = _as_model_config(cfg)
  if cfg.family == "lstm":
    return 6.0 * matmul_params(cfg)
  attention_width = cfg.num_heads * derived(cfg.head_dim)
  attention_layers = cfg.num_layers
  if cfg.family == "encoder_decoder":  # the only family with num_decoder_layers
    attention_layers += 2 * derived(cfg.num_decoder_layers)  # self- and cross-attention
  flops = 6.0 * matmul_params(cfg) + 12.0 * attention_layers * attention_width * seq_len
  if cfg.head == "classify":
    flops += 6.0 * cfg.d_model * cfg.num_classes / seq_len
  return flops


def summarize(
  params: Mapping[str, Any], cfg: ModelConfig | Mapping[str, Any], seq_len: int | None = None
) -> str:
  """A table of parameter counts by component and the FLOPs per token.

  Args:
    params: as for `count_params`.
    cfg: the model's config.
    seq_len: sequence length for the FLOP count; default `cfg.max_len`.

  Returns:
    Multi-line text, e.g.::

      component            params       %
      embedding              8,192    9.6
      ...
      total                 85,376  100.0
      training FLOPs/token (T=256): 4.58e+05
  """
  cfg = _as_model_config(cfg)
  seq_len = cfg.max_len if seq_len is None else seq_len
  counts = count_params(params, cfg)
  total = max(counts["total"], 1)
  rows = [f"{'component':<16}{'params':>14}{'%':>8}"]
  rows += [
    f"{name:<16}{count:>14,}{100.0 * count / total:>8.1f}"
    for name, count in counts.items()
    if count or name == "total"
  ]
  rows.append(f"training FLOPs/token (T={seq_len}): {flops_per_token(cfg, seq_len):.3g}")
  return "\n".join(rows)
