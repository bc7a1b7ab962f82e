"""Masks and cross-attention (textbook item 2).

Masks: the attention weights of a 10-token sequence (random q, k) under
txf.ops' causal mask, a key-padding mask (the last tokens are padding) and
both: a masked key gets weight exactly 0, and every row still sums to 1.

Cross-attention: a tiny encoder-decoder trained on the copy or reverse task
(configs/seq2seq.py, trained by txf.train.loop.run) attends, from each of 5
decoder positions (BOS and the first 4 target tokens: each predicts the next
target token), over a 7-token source. The token it must predict sits at one
source position (i for copy, 6 - i for reverse), and the trained heads'
weights (the model's own, txf.analysis.attention_maps) line up with it: the
learned alignment. Scored per head as the mean weight on that position
(1: perfect alignment, 1/7: uniform).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from txf import decode, ops
from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.plots import attention_grid, heatmaps
from txf.progress import say, stage
from txf.textbook.report import figure_path, markdown_table
from txf.textbook.training import derive_config, train

NAME = "masks"
TASKS = {"copy": lambda word: word, "reverse": lambda word: word[::-1]}
FULL: dict[str, Any] = dict(
  length=10,
  valid_length=7,
  task="reverse",
  source="gadbfce",
  num_queries=5,
  greedy=True,
  overrides={
    "model.d_model": 64,
    "model.num_heads": 4,
    "model.num_layers": 2,
    "train.steps": 1500,
    "train.warmup_steps": 150,
  },
)
QUICK: dict[str, Any] = dict(
  length=10,
  valid_length=7,
  task="reverse",
  source="gadbfce",
  num_queries=5,
  greedy=False,
  overrides={
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.num_layers": 1,
    "train.steps": 150,
    "train.warmup_steps": 15,
  },
)
# Shared by both sizes: sources of 4-8 symbols (the example's 7 among them).
_DATA = {
  "data.seq_len": 10,
  "data.min_example_len": 4,
  "data.max_example_len": 8,
  "data.batch_size": 32,
  "eval.num_batches": 1,
}


def mask_weights(length: int, valid_length: int, seed: int = 0) -> dict[str, dict[str, Any]]:
  """Weights [T, T] of random q, k under each mask, with the mask and checks.

  Returns:
    {"causal" | "padding" | "causal + padding": {"mask": bool [T, T]
     (True = may attend), "weights": float32 [T, T],
     "max_masked_weight": the largest weight on a masked key (0.0),
     "max_row_sum_error": largest |row sum - 1|}}.
  """
  rng = np.random.default_rng(seed)
  q, k = (jnp.asarray(rng.standard_normal((1, length, 1, 16)), jnp.float32) for _ in range(2))
  lengths = jnp.asarray([valid_length])
  causal = np.asarray(ops.causal_mask(length))[0, 0]
  padding = np.broadcast_to(
    np.asarray(ops.padding_mask(lengths=lengths, k_len=length))[0, 0], (length, length)
  )
  cases: dict[str, tuple[np.ndarray, dict[str, Any]]] = {
    "causal": (causal, dict(is_causal=True)),
    "padding": (padding, dict(kv_lengths=lengths)),
    "causal + padding": (causal & padding, dict(is_causal=True, kv_lengths=lengths)),
  }
  result = {}
  for name, (mask, kwargs) in cases.items():
    weights = np.asarray(ops.attention_weights(q, k, **kwargs))[0, 0]
    result[name] = {
      "mask": mask,
      "weights": weights,
      "max_masked_weight": float(np.max(weights[~mask])),
      "max_row_sum_error": float(np.max(np.abs(weights.sum(-1) - 1))),
    }
  return result


def expected_source_positions(task: str, source_length: int, num_queries: int) -> list[int]:
  """Where decoder query i's next target token sits in the source."""
  positions = list(range(source_length))
  return TASKS[task](positions)[:num_queries]


def cross_attention(
  trained, task: str, source: str, num_queries: int, greedy: bool
) -> dict[str, Any]:
  """The trained model's cross-attention from `num_queries` decoder positions
  over `source`, its alignment per head, and (`greedy`) its greedy output."""
  setup, params = trained.setup, trained.params
  tokenizer = setup.train_data.tokenizer
  target = TASKS[task](source)
  encoder_1xS = jnp.asarray(tokenizer.encode(source)[None], jnp.int32)
  decoder_1xQ = jnp.asarray(
    [[tokenizer.bos_id, *tokenizer.encode(target[: num_queries - 1])]], jnp.int32
  )
  maps_fn = jax.jit(functools.partial(attention_maps, setup.model))
  layers = maps_by_kind(maps_fn(params, encoder_1xS, decoder_1xQ))["cross"]
  weights_LxHxQxS = np.stack([np.asarray(weights)[0] for weights in layers])
  expected = expected_source_positions(task, len(source), num_queries)
  alignment_LxH = weights_LxHxQxS[:, :, np.arange(num_queries), expected].mean(-1)
  best = np.unravel_index(np.argmax(alignment_LxH), alignment_LxH.shape)
  greedy_output = None
  if greedy:
    generated_1xN = decode.generate(
      setup.model,
      params,
      encoder_tokens_BxS=encoder_1xS,
      max_new_tokens=len(source) + 1,
      eos_id=tokenizer.eos_id,
    )
    greedy_output = tokenizer.decode(np.asarray(generated_1xN[0, 1:]))  # after the bos prompt
  return {
    "source": source,
    "target": target,
    "expected_positions": expected,
    "query_tokens": ["<bos>", *target[: num_queries - 1]],
    "key_tokens": list(source),
    "weights": weights_LxHxQxS,
    "alignment": alignment_LxH.tolist(),
    "best_head": [int(best[0]), int(best[1])],
    "best_alignment": float(alignment_LxH[best]),
    "uniform_alignment": 1.0 / len(source),
    "greedy_output": greedy_output,
  }


def compute(
  base_config: ml_collections.ConfigDict,
  out_dir: str | os.PathLike,
  *,
  length: int,
  valid_length: int,
  task: str,
  source: str,
  num_queries: int,
  greedy: bool,
  overrides: dict[str, Any],
  run_name: str = NAME,
  log: Callable[[str], None] = say,
) -> dict[str, Any]:
  """Mask weights, and the cross-attention of an encoder-decoder trained on `task`.

  Args:
    base_config: configs/seq2seq.py's config (or any encoder-decoder one).
    out_dir: the run trains in out_dir/runs/<run_name>.
    length, valid_length: the masked sequence and its unpadded length.
    task: 'copy' or 'reverse'.
    source: the source whose alignment is shown (symbols of the task's
      alphabet, 4-8 of them).
    num_queries: decoder positions shown (BOS + num_queries - 1 targets).
    greedy: also decode `source` greedily (txf.decode.generate).
    overrides: dotted config fields (model size, steps).
  """
  if task not in TASKS:
    raise ValueError(f"task must be one of {sorted(TASKS)}, got {task!r}")
  if not 1 <= num_queries <= len(source):
    raise ValueError(f"num_queries must be in [1, len(source)={len(source)}], got {num_queries}")
  config = derive_config(
    base_config,
    {
      "data.name": task,
      **_DATA,
      **overrides,
      "train.checkpoint_every": overrides["train.steps"],
      "eval.every": overrides["train.steps"],
    },
  )
  trained, metrics = train(config, out_dir, run_name, log=log)
  with stage("masks: cross-attention maps" + (" and greedy decoding" if greedy else "")):
    cross = cross_attention(trained, task, source, num_queries, greedy)
  return {
    "masks": mask_weights(length, valid_length),
    "valid_length": valid_length,
    "task": task,
    "eval": metrics,
    "steps": trained.step,
    "cross": cross,
  }


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Mask heatmaps, every cross-attention head, and the best head's alignment."""
  masks, cross = result["masks"], result["cross"]
  length = next(iter(masks.values()))["weights"].shape[0]
  positions = [str(i) for i in range(length)]
  layer, head = cross["best_head"]
  expected = np.zeros_like(cross["weights"][0, 0])
  expected[np.arange(len(cross["expected_positions"])), cross["expected_positions"]] = 1.0
  labels = dict(xticklabels=cross["key_tokens"], yticklabels=cross["query_tokens"])
  paths = [
    heatmaps(
      {name: case["weights"] for name, case in masks.items()},
      figure_path(out_dir, NAME, "masks"),
      f"Attention weights under masks (keys {result['valid_length']}-{length - 1} are "
      "padding); masked weights are exactly 0",
      xlabel="key position (tokens)",
      ylabel="query position (tokens)",
      colorbar_label="attention weight",
      xticklabels=positions,
      yticklabels=positions,
    ),
    attention_grid(
      list(cross["weights"]),
      cross["query_tokens"],
      figure_path(out_dir, NAME, "cross_attention"),
      f"Cross-attention of an encoder-decoder trained on {result['task']} "
      f"({result['steps']} steps)",
      key_tokens=cross["key_tokens"],
    ),
    heatmaps(
      {
        f"best head (layer {layer}, head {head})": cross["weights"][layer, head],
        f"mean of layer {layer}'s heads": cross["weights"][layer].mean(0),
        f"{result['task']}: the token to predict": expected,
      },
      figure_path(out_dir, NAME, "alignment"),
      f"Learned alignment: {cross['source']!r} -> {cross['target']!r}",
      xlabel="source token (encoder)",
      ylabel="decoder input",
      vmin=0.0,
      vmax=1.0,
      colorbar_label="attention weight",
      **labels,
    ),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  masks, cross = result["masks"], result["cross"]
  mask_rows = [
    [name, case["max_masked_weight"], case["max_row_sum_error"]] for name, case in masks.items()
  ]
  alignment = np.asarray(cross["alignment"])
  head_rows = [
    [layer, head, alignment[layer, head]]
    for layer in range(alignment.shape[0])
    for head in range(alignment.shape[1])
  ]
  evaluation = ", ".join(f"{name} {value:.4f}" for name, value in result["eval"].items())
  greedy = (
    ""
    if cross["greedy_output"] is None
    else f" Greedy output for {cross['source']!r}: {cross['greedy_output']!r} (expected "
    f"{cross['target']!r})."
  )
  return (
    "Masks on a 10-token sequence (random q, k):\n\n"
    + markdown_table(
      ["mask", "largest weight on a masked key", "largest abs(row sum - 1)"], mask_rows
    )
    + f"\nEncoder-decoder trained on {result['task']} for {result['steps']} steps "
    f"({evaluation}).{greedy} Cross-attention from "
    f"{len(cross['query_tokens'])} decoder positions over the {len(cross['source'])}-token "
    "source; mean weight on the source token each position must predict (uniform: "
    f"{cross['uniform_alignment']:.3f}):\n\n"
    + markdown_table(["layer", "head", "alignment"], head_rows)
  )


def run(
  out_dir: str | os.PathLike,
  *,
  quick: bool = False,
  base_config: ml_collections.ConfigDict,
  log: Callable[[str], None] = say,
) -> dict[str, Any]:
  """Trains (or reuses), measures, plots and reports item 2."""
  result = compute(
    base_config,
    out_dir,
    **(QUICK if quick else FULL),
    run_name=f"{NAME}_quick" if quick else NAME,
    log=log,
  )
  figures = plot(result, out_dir)
  numbers = {
    "masks": {
      name: {key: value for key, value in case.items() if key.startswith("max_")}
      for name, case in result["masks"].items()
    },
    **{key: result[key] for key in ("valid_length", "task", "eval", "steps")},
    "cross": {key: value for key, value in result["cross"].items() if key != "weights"},
  }
  return {**numbers, "figures": figures, "text": report(result)}
