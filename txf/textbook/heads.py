"""Previous-token and induction heads in a trained LM (textbook item 9).

A small decoder LM is trained on the built-in corpus (configs/base.py, the
Python standard library's source, bytes) by txf.train.loop.run. Its
attention, read through the model's own layers (txf.analysis.attention_maps),
is scored per head with txf.analysis.heads:

  previous-token score  mean weight from t to t - 1, on validation text;
  induction score       mean weight from t to t - period + 1 on random
                        blocks of `period` tokens repeated twice (Olsson et
                        al. 2022): the token after the previous occurrence
                        of the current one, which is the one to predict.

The best head of each kind is shown on text and on a repeated sequence: a
previous-token head is a stripe just below the diagonal, an induction head a
stripe `period - 1` below it in the second block. Uniform causal attention
scores the mean of 1 / (t + 1) on both (given as the baseline).
`python -m experiments.analyze --workdir=<out>/runs/heads` adds entropies,
distances and head ablations for the same run.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

import jax
import ml_collections
import numpy as np

from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.heads import induction_score, previous_token_score, repeated_random_tokens
from txf.analysis.plots import attention_grid, heatmaps
from txf.textbook.report import figure_path, markdown_table
from txf.textbook.training import derive_config, train

NAME = "heads"
FULL = dict(overrides={
    "model.d_model": 128, "model.num_heads": 4, "model.num_layers": 2, "data.seq_len": 128,
    "train.steps": 1000, "train.warmup_steps": 100})
QUICK = dict(overrides={
    "model.d_model": 32, "model.num_heads": 2, "model.num_layers": 2, "data.seq_len": 32,
    "data.batch_size": 16, "data.max_corpus_bytes": 200_000, "train.steps": 150,
    "train.warmup_steps": 15})
_EVAL = {"eval.num_batches": 1, "eval.sample_tokens": 0}


def uniform_baseline(length: int, first_query: int) -> float:
  """Score of uniform causal attention on any one key at or before each
  query t >= first_query: the mean of 1 / (t + 1)."""
  return float(np.mean(1.0 / (np.arange(first_query, length) + 1)))


def _per_layer(score: Callable[[Any], np.ndarray], layers: list[Any]) -> np.ndarray:
  return np.stack([score(np.asarray(weights)) for weights in layers])


def compute(base_config: ml_collections.ConfigDict, out_dir: str | os.PathLike, *,
            overrides: dict[str, Any], run_name: str = NAME, seed: int = 0,
            log: Callable[[str], None] = print) -> dict[str, Any]:
  """Trains (or reuses) the LM and scores every head.

  The induction inputs have the shape of a validation batch (one compiled
  program serves both): as many sequences, each a random block of
  period = data.seq_len // 2 tokens repeated twice.

  Args:
    base_config: configs/base.py's config (a decoder LM).
    out_dir: the run trains in out_dir/runs/<run_name>.
    overrides: dotted config fields (model size, steps).

  Returns:
    {"eval", "steps", "period", "scores": {"previous_token", "induction"}
     ([L, H] lists), "best": {kind: [layer, head]}, "baselines": {kind:
     uniform causal attention's score}, "text_weights" [L, H, T, T] and
     "repeated_weights" [L, H, 2P, 2P] of the first sequence, "sample_text": its
     characters}.
  """
  config = derive_config(base_config, {**_EVAL, **overrides,
                                       "train.checkpoint_every": overrides["train.steps"],
                                       "eval.every": overrides["train.steps"]})
  if config.model.family != "decoder" or config.data.task != "lm":
    raise ValueError("base_config: heads needs a decoder language model (model.family="
                     f"'decoder', data.task='lm'), got {config.model.family!r}, "
                     f"{config.data.task!r}")
  trained, metrics = train(config, out_dir, run_name, log=log)
  setup, params = trained.setup, trained.params
  maps_fn = jax.jit(functools.partial(attention_maps, setup.model))
  text_BxT = next(iter(setup.eval_data))["inputs"]
  batch, length = text_BxT.shape
  period = length // 2
  # Ids from 4 up (the function's default) skip pad, bos, eos and mask.
  repeated_BxT = repeated_random_tokens(np.random.default_rng(seed), batch, period,
                                        setup.model_cfg.vocab_size)
  text_layers = maps_by_kind(maps_fn(params, text_BxT))["self"]
  repeated_layers = maps_by_kind(maps_fn(params, repeated_BxT))["self"]
  scores = {"previous_token": _per_layer(previous_token_score, text_layers),
            "induction": _per_layer(lambda w: induction_score(w, period), repeated_layers)}
  best = {kind: [int(i) for i in np.unravel_index(np.argmax(values), values.shape)]
          for kind, values in scores.items()}
  return {"eval": metrics, "steps": trained.step, "period": period,
          "scores": {kind: values.tolist() for kind, values in scores.items()}, "best": best,
          "baselines": {"previous_token": uniform_baseline(length, 1),
                        "induction": uniform_baseline(2 * period, period)},
          "text_weights": np.stack([np.asarray(w)[0] for w in text_layers]),
          "repeated_weights": np.stack([np.asarray(w)[0] for w in repeated_layers]),
          "sample_text": setup.train_data.tokenizer.decode(np.asarray(text_BxT[0]))}


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Scores per head, the two best heads' patterns, every head on a repeated
  sequence; the PNG paths."""
  scores = {kind: np.asarray(values) for kind, values in result["scores"].items()}
  L, H = scores["previous_token"].shape
  panels = {}
  for kind, title in (("previous_token", "previous-token"), ("induction", "induction")):
    layer, head = result["best"][kind]
    best = f"best {title} score: L{layer}H{head} ({scores[kind][layer, head]:.2f})"
    panels[f"{best}, text"] = result["text_weights"][layer, head]
    panels[f"{best}, repeated"] = result["repeated_weights"][layer, head]
  paths = [
      heatmaps({"previous-token score (text)": scores["previous_token"],
                "induction score (repeated random tokens)": scores["induction"]},
               figure_path(out_dir, NAME, "scores"),
               f"Head scores after {result['steps']} steps (uniform attention: "
               f"{result['baselines']['previous_token']:.3f} and "
               f"{result['baselines']['induction']:.3f})",
               xlabel="head", ylabel="layer", colorbar_label="score (mean attention weight)",
               vmin=0.0, vmax=1.0, xticklabels=[str(h) for h in range(H)],
               yticklabels=[str(layer) for layer in range(L)], annotate=True),
      heatmaps(panels, figure_path(out_dir, NAME, "patterns"),
               f"Top-scoring heads on text and on {result['period']} random tokens, repeated",
               xlabel="key position",
               ylabel="query position", colorbar_label="attention weight", columns=2,
               vmin=0.0, vmax=1.0),
      attention_grid(list(result["repeated_weights"]), None,
                     figure_path(out_dir, NAME, "repeated_all_heads"),
                     f"Every head on a random block of {result['period']} tokens repeated twice"),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  scores = {kind: np.asarray(values) for kind, values in result["scores"].items()}
  L, H = scores["previous_token"].shape
  rows = [[layer, head, scores["previous_token"][layer, head], scores["induction"][layer, head]]
          for layer in range(L) for head in range(H)]
  evaluation = ", ".join(f"{name} {value:.4f}" for name, value in result["eval"].items())
  best = ", ".join(f"{kind.replace('_', '-')}: layer {layer}, head {head} "
                   f"({scores[kind][layer, head]:.3f}, "
                   f"{scores[kind][layer, head] / result['baselines'][kind]:.1f}x uniform)"
                   for kind, (layer, head) in result["best"].items())
  return (f"Decoder LM trained {result['steps']} steps on the built-in corpus ({evaluation}). "
          f"Previous-token score on validation text; induction score on random blocks of "
          f"{result['period']} tokens repeated twice. Uniform causal attention scores "
          f"{result['baselines']['previous_token']:.3f} and "
          f"{result['baselines']['induction']:.3f}.\n\n"
          + markdown_table(["layer", "head", "previous-token", "induction"], rows)
          + f"\nBest heads: {best}.\n")


def run(out_dir: str | os.PathLike, *, quick: bool = False,
        base_config: ml_collections.ConfigDict, log: Callable[[str], None] = print
        ) -> dict[str, Any]:
  """Trains (or reuses), scores, plots and reports item 9."""
  result = compute(base_config, out_dir, **(QUICK if quick else FULL),
                   run_name=f"{NAME}_quick" if quick else NAME, log=log)
  figures = plot(result, out_dir)
  numbers = {key: value for key, value in result.items()
             if key not in ("text_weights", "repeated_weights")}
  return {**numbers, "figures": figures, "text": report(result)}
