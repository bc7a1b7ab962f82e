"""Parameter counts by component against their closed forms (textbook item 6).

Each architecture is a txf ModelConfig; its parameters come from the real
`model.init` traced abstractly (jax.eval_shape: shapes, no arrays) and are
attributed to components by txf.analysis.counts.count_params. The closed
forms are written out below per architecture, in the textbook's variables
(d = d_model, d_ff, L layers, V vocabulary, n_ctx learned positions), and
must agree exactly. With biases, one attention layer holds 4 d^2 + 4 d
(q, k, v, out), a feed-forward layer 2 d d_ff + d_ff + d, a LayerNorm 2 d.

  base       Vaswani et al. (2017) base model: encoder-decoder, d 512, 8 heads,
             d_ff 2048, 6 + 6 layers, Post-LN, biases, sinusoidal positions,
             one 37,000-token table shared by both stacks and the output
  stack32k   a 6-layer decoder stack of the base model's width (d 512, 8
             heads, d_ff 2048, Post-LN, biases) with a tied 32,000-token table
  gpt2       GPT-2 small: d 768, 12 heads, d_ff 3072, 12 layers, Pre-LN with a
             final LayerNorm, biases, 1024 learned positions, tied 50,257 vocab
  bert       BERT-base's shape: encoder, d 768, 12 heads, d_ff 3072, 12
             layers, Post-LN, biases, 512 learned positions, 30,522 vocab,
             tied MLM head (dense d x d, LayerNorm, output bias)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

from txf import models
from txf.analysis.counts import COMPONENTS, count_params
from txf.analysis.plots import save_figure
from txf.layers.model_config import ModelConfig
from txf.textbook.report import figure_path, markdown_table

NAME = "param_counts"


def _attention(d: int) -> int:
  return 4 * d * d + 4 * d


def _ffn(d: int, d_ff: int) -> int:
  return 2 * d * d_ff + d_ff + d


def _layer_norm(d: int) -> int:
  return 2 * d


def base_closed_form(d=512, d_ff=2048, layers=6, vocab=37000) -> dict[str, int]:
  """Encoder-decoder, Post-LN: encoder layers hold self-attention, FFN and 2
  norms; decoder layers add cross-attention and a third norm; no final norm."""
  return dict(
    embedding=vocab * d,
    attention=2 * layers * _attention(d),
    cross_attention=layers * _attention(d),
    ffn=2 * layers * _ffn(d, d_ff),
    norm=(2 + 3) * layers * _layer_norm(d),
    head=0,
  )


def stack32k_closed_form(d=512, d_ff=2048, layers=6, vocab=32000) -> dict[str, int]:
  """Decoder stack, Post-LN (no final norm), tied output."""
  return dict(
    embedding=vocab * d,
    attention=layers * _attention(d),
    ffn=layers * _ffn(d, d_ff),
    norm=2 * layers * _layer_norm(d),
    head=0,
  )


def gpt2_closed_form(d=768, layers=12, vocab=50257, n_ctx=1024) -> dict[str, int]:
  """Pre-LN decoder: L (12 d^2 + 13 d) + V d + n_ctx d + 2 d (final norm)."""
  return dict(
    embedding=vocab * d + n_ctx * d,
    attention=layers * _attention(d),
    ffn=layers * _ffn(d, 4 * d),
    norm=(2 * layers + 1) * _layer_norm(d),
    head=0,
  )


def bert_closed_form(d=768, layers=12, vocab=30522, n_ctx=512) -> dict[str, int]:
  """Post-LN encoder with a tied MLM head: transform d^2 + d, its norm, output bias V."""
  return dict(
    embedding=vocab * d + n_ctx * d,
    attention=layers * _attention(d),
    ffn=layers * _ffn(d, 4 * d),
    norm=2 * layers * _layer_norm(d),
    head=d * d + d + _layer_norm(d) + vocab,
  )


# scan_layers: the stacks are traced as one scanned block (fast); count_params
# gives the same counts for either layout (tests/analysis/test_counts.py).
_SCANNED: dict[str, Any] = dict(scan_layers=True)
_COMMON: dict[str, Any] = dict(use_bias=True, norm="layer", activation="relu", **_SCANNED)
ARCHITECTURES: dict[str, tuple[str, ModelConfig, Callable[[], dict[str, int]]]] = {
  "base": (
    "Transformer base (6 + 6 layers, V 37,000)",
    ModelConfig(
      family="encoder_decoder",
      vocab_size=37000,
      d_model=512,
      num_heads=8,
      d_ff=2048,
      num_layers=6,
      position="sinusoidal",
      norm_placement="post",
      share_embeddings=True,
      tie_embeddings=True,
      **_COMMON,
    ),
    base_closed_form,
  ),
  "stack32k": (
    "6-layer stack (tied V 32,000)",
    ModelConfig(
      family="decoder",
      vocab_size=32000,
      d_model=512,
      num_heads=8,
      d_ff=2048,
      num_layers=6,
      position="sinusoidal",
      norm_placement="post",
      tie_embeddings=True,
      **_COMMON,
    ),
    stack32k_closed_form,
  ),
  "gpt2": (
    "GPT-2 small",
    ModelConfig(
      family="decoder",
      vocab_size=50257,
      d_model=768,
      num_heads=12,
      num_layers=12,
      max_len=1024,
      position="learned",
      use_bias=True,
      norm="layer",
      activation="gelu",
      tie_embeddings=True,
      **_SCANNED,
    ),
    gpt2_closed_form,
  ),
  "bert": (
    "BERT-base shape (MLM head)",
    ModelConfig(
      family="encoder",
      head="mlm",
      vocab_size=30522,
      d_model=768,
      num_heads=12,
      num_layers=12,
      max_len=512,
      position="learned",
      use_bias=True,
      norm="layer",
      norm_placement="post",
      activation="gelu",
      tie_embeddings=True,
      **_SCANNED,
    ),
    bert_closed_form,
  ),
}
# Published totals, for the record (not asserted): what they count that txf's
# model does not, or the other way round.
PUBLISHED = {
  "base": (
    "65M (Vaswani et al. 2017, Table 3)",
    "the paper gives no breakdown; its "
    "shared vocabulary of about 37,000 BPE tokens gives 63.1M here",
  ),
  "gpt2": ("124,439,808 (Hugging Face GPT2Model)", "the same architecture and count"),
  "bert": (
    "109,482,240 (Hugging Face BertModel)",
    "BertModel has no MLM head (-622,650) "
    "but token-type embeddings (+2 d = 1,536), an embedding LayerNorm (+1,536) and "
    "a pooler (+d^2 + d = 590,592): 109,511,226 - 622,650 + 593,664 = 109,482,240",
  ),
}


def model_counts(cfg: ModelConfig) -> dict[str, int]:
  """count_params of the model's abstract `init` (shapes only, no arrays)."""
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  params = jax.eval_shape(models.build(cfg).init, jax.random.key(0), *inputs)
  return count_params(params, cfg)


def compute() -> dict[str, Any]:
  """{architecture: {"title", "counts": count_params by component (+ total),
  "closed_form": the same components from the formulas (+ total), "match"}}."""
  result = {}
  for name, (title, cfg, closed_form) in ARCHITECTURES.items():
    counts = model_counts(cfg)
    formula = {component: 0 for component in COMPONENTS} | closed_form()
    formula["total"] = sum(formula.values())
    result[name] = {
      "title": title,
      "counts": counts,
      "closed_form": formula,
      "match": counts == formula,
    }
  return result


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Stacked bars: each architecture's parameters by component; the PNG path."""
  figure = Figure(figsize=(8.0, 4.6), layout="constrained")
  axes = figure.subplots()
  names = list(result)
  bottom = np.zeros(len(names))
  for component in COMPONENTS:
    millions = np.array([result[name]["counts"][component] / 1e6 for name in names])
    if millions.any():
      axes.bar(
        [result[name]["title"].replace(" (", "\n(") for name in names],
        millions,
        bottom=bottom,
        label=component,
      )
      bottom += millions
  for x, total in enumerate(bottom):
    axes.text(x, total, f"{total:.1f}M", ha="center", va="bottom", fontsize=9)
  axes.set(
    title="Parameters by component (count_params of model.init)",
    ylabel="parameters (millions)",
    xlabel="architecture",
  )
  axes.set_ylim(top=1.12 * bottom.max())
  axes.tick_params(axis="x", labelsize=8)
  axes.legend(fontsize="small")
  return [str(save_figure(figure, figure_path(out_dir, NAME, "components")))]


def report(result: dict[str, Any]) -> str:
  parts = []
  for name, entry in result.items():
    rows = [
      [
        component,
        entry["counts"][component],
        entry["closed_form"][component],
        "yes" if entry["counts"][component] == entry["closed_form"][component] else "NO",
      ]
      for component in (*COMPONENTS, "total")
      if entry["counts"][component] or entry["closed_form"][component]
    ]
    published = PUBLISHED.get(name)
    note = f"\nPublished: {published[0]}; {published[1]}.\n" if published else ""
    parts.append(
      f"### {entry['title']}\n\n"
      + markdown_table(["component", "count_params", "closed form", "equal"], rows)
      + note
    )
  return "\n".join(parts)


def run(out_dir: str | os.PathLike, *, quick: bool = False) -> dict[str, Any]:
  """Counts, plots and reports item 6 (`quick` changes nothing: it is all shapes)."""
  del quick  # abstract shapes only: the full size is already fast
  result = compute()
  return {**result, "figures": plot(result, out_dir), "text": report(result)}
