"""Previous-token and induction heads in a trained LM (textbook item 8).

A small decoder LM is trained on the built-in corpus (configs/base.py, the
Python standard library's source, bytes) by txf.train.loop.run. Its
attention, read through the model's own layers (txf.analysis.attention_maps),
is scored per head with txf.analysis.head_scores:

  previous-token score  mean weight from t to t - 1, on validation text;
  induction score       mean weight from t to t - P + 1 on random blocks of
                        P tokens repeated twice (Olsson et al. 2022): the
                        token after the previous occurrence of the current
                        one, which is the one to predict.

The induction probe is the one txf-analyze uses: its tokens are ids
that occur in the run's validation data (in_distribution_ids; a byte the
corpus never holds says nothing about the model), and it runs at the two
longest periods P that fit the context (probe_periods). A head attending a
fixed offset scores like an induction head at the one period whose target
sits at that offset and collapses at the other, so head_roles calls a head
induction only if it scores >= 0.5 at every probe period, and positional if
it does at some and falls under 0.25 at another.

The best head of each kind is shown on text and on repeated sequences: a
previous-token head is a stripe just below the diagonal, an induction head a
stripe P - 1 below it in the second block, at both periods. Uniform causal
attention scores the mean of 1 / (t + 1) on both (given as the baseline).
`txf-analyze --workdir=<out>/runs/heads` adds entropies,
distances and head ablations for the same run.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.head_scores import (
  head_roles,
  in_distribution_ids,
  induction_probe,
  induction_score,
  previous_token_score,
  probe_periods,
)
from txf.analysis.plots import attention_grid, heatmaps
from txf.data.incontext import repeat_periods
from txf.progress import say
from txf.textbook.report import figure_path, markdown_table
from txf.textbook.training import derive_config, train

NAME = "heads"
FULL: dict[str, Any] = dict(
  overrides={
    "model.d_model": 128,
    "model.num_heads": 4,
    "model.num_layers": 2,
    "data.seq_len": 128,
    "train.steps": 1000,
    "train.warmup_steps": 100,
  }
)
QUICK: dict[str, Any] = dict(
  overrides={
    "model.d_model": 32,
    "model.num_heads": 2,
    "model.num_layers": 2,
    "data.seq_len": 32,
    "data.batch_size": 16,
    "data.max_corpus_bytes": 200_000,
    "train.steps": 150,
    "train.warmup_steps": 15,
  }
)
_EVAL = {"eval.num_batches": 1, "eval.sample_tokens": 0}
ROLES = ("previous_token", "induction", "positional")


def uniform_baseline(length: int, first_query: int) -> float:
  """Score of uniform causal attention on any one key at or before each
  query t >= first_query: the mean of 1 / (t + 1)."""
  return float(np.mean(1.0 / (np.arange(first_query, length) + 1)))


def _per_layer(score: Callable[[Any], np.ndarray], layers: list[Any]) -> np.ndarray:
  return np.stack([score(np.asarray(weights)) for weights in layers])


def _argmax(values_LxH: np.ndarray) -> list[int]:
  return [int(i) for i in np.unravel_index(np.argmax(values_LxH), values_LxH.shape)]


def _padded(weights_TxT: np.ndarray, size: int) -> np.ndarray:
  """`weights_TxT` in the top-left corner of a size x size array of NaN (left
  blank in a heatmap): panels of one figure share one shape."""
  out = np.full((size, size), np.nan)
  out[: weights_TxT.shape[0], : weights_TxT.shape[1]] = weights_TxT
  return out


def compute(
  base_config: ml_collections.ConfigDict,
  out_dir: str | os.PathLike,
  *,
  overrides: dict[str, Any],
  run_name: str = NAME,
  seed: int = 0,
  log: Callable[[str], None] = say,
) -> dict[str, Any]:
  """Trains (or reuses) the LM and scores every head.

  The induction probe (module docstring) has as many sequences as a
  validation batch; each is a random block of P distinct ids drawn from the
  ids of that batch (specials left out), repeated twice, at each of the two
  longest periods P that fit data.seq_len and the training data does not
  repeat with.

  Args:
    base_config: configs/base.py's config (a decoder LM).
    out_dir: the run trains in out_dir/runs/<run_name>.
    overrides: dotted config fields (model size, steps).

  Returns:
    {"eval", "steps", "periods" (longest first), "probe_ids" (sorted),
     "probe_tokens": {P: the first probe sequence [2P]},
     "scores": {"previous_token", "induction" (the lowest over the periods),
     "induction_p<P>" per period} ([L, H] lists), "roles": [L, H] head_roles
     labels, "best": {"previous_token" | "induction": [layer, head]},
     "baselines": {"previous_token": uniform causal attention's score,
     "induction_p<P>": its score at period P}, "text_weights" [L, H, T, T]
     and "repeated_weights" {P: [L, H, 2P, 2P]} of the first sequence,
     "sample_text": its characters}.
  """
  config = derive_config(
    base_config,
    {
      **_EVAL,
      **overrides,
      "train.checkpoint_every": overrides["train.steps"],
      "eval.every": overrides["train.steps"],
    },
  )
  if config.model.family != "decoder" or config.data.task != "lm":
    raise ValueError(
      "base_config: heads needs a decoder language model (model.family="
      f"'decoder', data.task='lm'), got {config.model.family!r}, "
      f"{config.data.task!r}"
    )
  trained, metrics = train(config, out_dir, run_name, log=log)
  setup, params = trained.setup, trained.params
  maps_fn = jax.jit(functools.partial(attention_maps, setup.model))
  text_BxT = next(iter(setup.eval_data))["inputs"]
  batch, length = text_BxT.shape
  ids = in_distribution_ids(text_BxT, setup.train_data.tokenizer.special_ids)
  periods = probe_periods(length, len(ids), repeat_periods(setup.run.data))
  text_layers = maps_by_kind(maps_fn(params, text_BxT))["self"]
  repeated_BxT = {
    period: induction_probe(seed, batch, period, setup.run.model.vocab_size, ids)
    for period in periods
  }
  repeated_layers = {
    period: maps_by_kind(maps_fn(params, tokens_BxT))["self"]
    for period, tokens_BxT in repeated_BxT.items()
  }
  induction_by_period = {
    period: _per_layer(functools.partial(induction_score, period=period), layers)
    for period, layers in repeated_layers.items()
  }
  previous_LxH = _per_layer(previous_token_score, text_layers)
  # A content match scores at every period, so a head is as much an
  # induction head as its lowest score says (as txf-analyze ranks it).
  induction_LxH = np.min(np.stack(list(induction_by_period.values())), axis=0)
  scores = {
    "previous_token": previous_LxH,
    "induction": induction_LxH,
    **{f"induction_p{period}": values for period, values in induction_by_period.items()},
  }
  return {
    "eval": metrics,
    "steps": trained.step,
    "periods": periods,
    "probe_ids": ids.tolist(),
    "probe_tokens": {period: tokens_BxT[0].tolist() for period, tokens_BxT in repeated_BxT.items()},
    "scores": {kind: values.tolist() for kind, values in scores.items()},
    "roles": head_roles(previous_LxH, induction_by_period).tolist(),
    "best": {"previous_token": _argmax(previous_LxH), "induction": _argmax(induction_LxH)},
    "baselines": {
      "previous_token": uniform_baseline(length, 1),
      **{f"induction_p{period}": uniform_baseline(2 * period, period) for period in periods},
    },
    "text_weights": np.stack([np.asarray(w)[0] for w in text_layers]),
    "repeated_weights": {
      period: np.stack([np.asarray(w)[0] for w in layers])
      for period, layers in repeated_layers.items()
    },
    "sample_text": setup.train_data.tokenizer.decode(np.asarray(text_BxT[0])),
  }


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Scores per head, the two best heads' patterns, every head on a repeated
  sequence at each probe period; the PNG paths."""
  scores = {kind: np.asarray(values) for kind, values in result["scores"].items()}
  periods = result["periods"]
  L, H = scores["previous_token"].shape
  score_panels = {
    "previous-token score (text)": scores["previous_token"],
    **{f"induction score, period {period}": scores[f"induction_p{period}"] for period in periods},
  }
  baselines = ", ".join(f"{value:.3f}" for value in result["baselines"].values())
  size = result["text_weights"].shape[-1]
  panels = {}
  layer, head = result["best"]["previous_token"]
  best = f"best previous-token: L{layer}H{head} ({scores['previous_token'][layer, head]:.2f})"
  panels[f"{best}, text"] = result["text_weights"][layer, head]
  panels[f"{best}, period {periods[0]}"] = _padded(
    result["repeated_weights"][periods[0]][layer, head], size
  )
  layer, head = result["best"]["induction"]
  for period in periods:
    score = scores[f"induction_p{period}"][layer, head]
    panels[f"best induction: L{layer}H{head}, period {period} ({score:.2f})"] = _padded(
      result["repeated_weights"][period][layer, head], size
    )
  paths = [
    heatmaps(
      score_panels,
      figure_path(out_dir, NAME, "scores"),
      f"Head scores after {result['steps']} steps (uniform attention, panel by panel: {baselines})",
      xlabel="head",
      ylabel="layer",
      colorbar_label="score (mean attention weight)",
      vmin=0.0,
      vmax=1.0,
      xticklabels=[str(h) for h in range(H)],
      yticklabels=[str(layer) for layer in range(L)],
      annotate=True,
    ),
    heatmaps(
      panels,
      figure_path(out_dir, NAME, "patterns"),
      "Top-scoring heads on text and on in-distribution random tokens, repeated",
      xlabel="key position (tokens)",
      ylabel="query position (tokens)",
      colorbar_label="attention weight",
      columns=2,
      vmin=0.0,
      vmax=1.0,
    ),
    *(
      attention_grid(
        list(result["repeated_weights"][period]),
        None,
        figure_path(out_dir, NAME, f"repeated_all_heads_p{period}"),
        f"Every head on a random block of {period} in-distribution tokens repeated twice",
      )
      for period in periods
    ),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  scores = {kind: np.asarray(values) for kind, values in result["scores"].items()}
  periods, roles = result["periods"], np.asarray(result["roles"], object)
  L, H = scores["previous_token"].shape
  columns = ["previous_token", *(f"induction_p{period}" for period in periods)]
  rows = [
    [layer, head, *(scores[column][layer, head] for column in columns), roles[layer, head] or "-"]
    for layer in range(L)
    for head in range(H)
  ]
  evaluation = ", ".join(f"{name} {value:.4f}" for name, value in result["eval"].items())
  baselines = ", ".join(f"{name} {value:.3f}" for name, value in result["baselines"].items())
  by_role = "; ".join(
    f"{role.replace('_', '-')}: "
    + (
      ", ".join(
        f"L{layer}H{head}"
        for (layer, head), labels in np.ndenumerate(roles)
        if role in labels.split("+")
      )
      or "none"
    )
    for role in ROLES
  )
  return (
    f"Decoder LM trained {result['steps']} steps on the built-in corpus ({evaluation}). "
    f"Previous-token score on validation text; induction score on random blocks of "
    f"P tokens repeated twice, P = {', '.join(map(str, periods))}, the tokens drawn from "
    f"the {len(result['probe_ids'])} ids in the validation batch. Uniform causal "
    f"attention scores {baselines}. A role needs a score >= 0.5 (induction: at every "
    "period; positional: at some, and under half that at another).\n\n"
    + markdown_table(
      ["layer", "head", "previous-token", *(f"induction P={period}" for period in periods), "role"],
      rows,
    )
    + f"\nHeads by role: {by_role}.\n"
  )


def run(
  out_dir: str | os.PathLike,
  *,
  quick: bool = False,
  base_config: ml_collections.ConfigDict,
  log: Callable[[str], None] = say,
) -> dict[str, Any]:
  """Trains (or reuses), scores, plots and reports item 8."""
  result = compute(
    base_config,
    out_dir,
    **(QUICK if quick else FULL),
    run_name=f"{NAME}_quick" if quick else NAME,
    log=log,
  )
  figures = plot(result, out_dir)
  numbers = {
    key: value for key, value in result.items() if key not in ("text_weights", "repeated_weights")
  }
  return {**numbers, "figures": figures, "text": report(result)}
