"""Attention analysis of a trained run: heatmaps, per-head scores, head ablation.

  record = analyze_run("runs/pe_ln/rope_pre")
  print(record["table"])

The run is restored once through txf.train.setup.load_run. Its attention is
read through the model's own layers (txf.analysis.attention_maps) and its
heads are ablated through the model's own 'head_mask' collection
(txf.analysis.ablation), evaluated with the run's eval step. Each attention
kind (txf.analysis.attention.attention_kind: 'self' for a decoder or an
encoder; 'encoder_self', 'decoder_self' and 'cross' for an encoder-decoder)
gets, in <workdir>/analysis/:

  attention_<kind>.png  heatmaps per layer and head of validation sample 0
  head_scores.csv       one row per (kind, layer, head), full precision
  head_scores.md        the same as markdown tables, one per kind

Scores per head (txf.analysis.heads): previous-token score and mean entropy
and distance on the first validation batch; induction score on repeated
random token sequences, for causal self-attention only (n/a elsewhere: a
bidirectional encoder sees the answer, cross-attention keys are the source);
and the validation-loss change when the head's output is zeroed, over the
run's evaluator's batches. Nothing else in the run directory changes.
"""

from __future__ import annotations

import csv
import functools
import io
import os
from typing import Any, Callable

import jax
import numpy as np
from etils import epath

from txf.analysis.ablation import ablation_loss_fns, attention_shapes
from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.heads import (attention_entropy, head_ablation, head_score_rows,
                                head_scores_table, induction_score, mean_attended_distance,
                                previous_token_score, repeated_random_tokens)
from txf.analysis.plots import attention_grid
from txf.checks import int_at_least
from txf.train.setup import RunSetup, load_run
from txf.train.step import make_eval_step, model_inputs
from txf.train.workdir import run_path

ANALYSIS_DIR = "analysis"
SCORES_CSV = "head_scores.csv"
SCORES_MD = "head_scores.md"
# The lowest id `repeated_random_tokens` draws: skips pad, bos, eos and mask.
_LOWEST_RANDOM_ID = 4


def attention_png(kind: str) -> str:
  """The heatmap file of one attention kind."""
  return f"attention_{kind}.png"


def _query_tokens(batch: dict[str, np.ndarray], kind: str) -> np.ndarray:
  """int [B, T]: the tokens whose positions are `kind`'s queries."""
  if kind == "encoder_self":
    return batch["encoder_inputs"]
  if kind in ("decoder_self", "cross"):
    return batch["decoder_inputs"]
  return batch["inputs"]


def _key_tokens(batch: dict[str, np.ndarray], kind: str) -> np.ndarray:
  """int [B, S]: the tokens whose positions are `kind`'s keys."""
  return batch["encoder_inputs"] if kind == "cross" else _query_tokens(batch, kind)


def _is_causal(setup: RunSetup, kind: str) -> bool:
  return kind == "decoder_self" or (kind == "self" and setup.task == "lm")


def _unpadded_length(tokens_T: np.ndarray, pad_id: int) -> int:
  """Positions up to the last token that is not padding (all, if every one is)."""
  kept = np.nonzero(tokens_T != pad_id)[0]
  return int(kept[-1]) + 1 if kept.size else len(tokens_T)


def _labels(setup: RunSetup, tokens_T: np.ndarray) -> list[str]:
  """One readable label per token id: its text, quoted if blank, else <id>."""
  labels = []
  for token in tokens_T:
    text = setup.train_data.tokenizer.decode([int(token)])
    labels.append(text if text.strip() and text.isprintable()
                  else repr(text) if text else f"<{int(token)}>")
  return labels


def _plot_sample(setup: RunSetup, kind: str, layers: list[Any], batch: dict[str, np.ndarray],
                 path: epath.Path, step: int) -> None:
  """Heatmaps of validation sample 0 for one kind, padding cut off."""
  pad_id = setup.model_cfg.pad_id
  queries_T, keys_S = _query_tokens(batch, kind)[0], _key_tokens(batch, kind)[0]
  T, S = _unpadded_length(queries_T, pad_id), _unpadded_length(keys_S, pad_id)
  attention_grid([np.asarray(weights_BxHxTxS[0, :, :T, :S]) for weights_BxHxTxS in layers],
                 _labels(setup, queries_T[:T]), path,
                 f"{kind} attention, validation sample 0 (step {step})",
                 key_tokens=_labels(setup, keys_S[:S]))


def _induction_period(setup: RunSetup, kinds: list[str], batch: dict[str, np.ndarray],
                      period: int | None) -> int | None:
  """The induction inputs' block length: `period`, checked, or half the causal
  kind's query length (at most the vocabulary allows); None without a causal kind."""
  causal = [kind for kind in kinds if _is_causal(setup, kind)]
  if not causal:
    return None
  T = _query_tokens(batch, causal[0]).shape[1]
  limit = min(T // 2, setup.model_cfg.vocab_size - _LOWEST_RANDOM_ID)
  if period is None:
    return limit
  if period > limit:
    raise ValueError(f"period must be at most {limit} (two blocks of distinct tokens fit the "
                     f"run's {T} query positions and vocabulary), got {period}")
  return period


def _induction(setup: RunSetup, maps_fn: Callable[..., dict[str, Any]], params: Any,
               batch: dict[str, np.ndarray], kind: str, period: int, seed: int) -> np.ndarray:
  """[L, H] induction scores of `kind` on repeated random tokens (an
  encoder-decoder's source: the batch's encoder inputs), attention from
  `maps_fn(params, *inputs)`."""
  B = _query_tokens(batch, kind).shape[0]
  tokens_BxT = repeated_random_tokens(np.random.default_rng(seed), B, period,
                                      setup.model_cfg.vocab_size, low=_LOWEST_RANDOM_ID)
  inputs = ((batch["encoder_inputs"], tokens_BxT) if setup.task == "seq2seq"
            else (tokens_BxT,))
  layers = maps_by_kind(maps_fn(params, *inputs))[kind]
  return np.stack([induction_score(weights, period) for weights in layers])


def _attention_scores(setup: RunSetup, kind: str, layers: list[Any],
                      batch: dict[str, np.ndarray], induction_LxH: np.ndarray
                      ) -> dict[str, np.ndarray]:
  """The [L, H] scores of one kind in table order: previous-token
  (self-attention only; NaN for cross), `induction_LxH`, entropy and
  distance on the batch, padded queries left out."""
  query_mask_BxT = _query_tokens(batch, kind) != setup.model_cfg.pad_id
  per_layer = lambda score: np.stack([score(weights, query_mask=query_mask_BxT)
                                      for weights in layers])
  entropy_LxH = per_layer(attention_entropy)
  previous_LxH = (np.full_like(entropy_LxH, np.nan) if kind == "cross"
                  else per_layer(previous_token_score))
  return {"previous_token": previous_LxH, "induction": induction_LxH, "entropy_nats": entropy_LxH,
          "distance_tokens": per_layer(mean_attended_distance)}


def _eval_loss_sums(task: str):
  """(model, params, batch) -> (loss_sum, count) with the run's eval step."""
  def loss_sums(model, params, batch):
    sums = make_eval_step(model, task)(params, batch)
    return sums["loss_sum"], sums["count"]
  return loss_sums


def analyze_run(workdir: str | os.PathLike, *, num_batches: int | None = None,
                period: int | None = None, seed: int = 0, replica: int = 0) -> dict[str, Any]:
  """Writes the attention analysis of the run in `workdir` into
  <workdir>/analysis/ (see the module docstring) and returns it.

  Args:
    workdir: a trained run (config.json and a checkpoint): decoder, encoder
      or encoder-decoder (not an LSTM).
    num_batches: validation batches the ablation evaluates (None: the run's
      eval.num_batches); the scores use the first.
    period: the repeated block length of the induction inputs (None: half
      the run's query length, at most the vocabulary allows).
    seed: seed of the induction inputs' random tokens.
    replica: which seed replica of a run of several to analyse (0: the
      first, whose seed is the run's `seed`).

  Returns:
    {"step": checkpoint step, "baseline_loss": validation loss with every
     head, "period": induction period (None without a causal kind),
     "scores": {kind: {score name: [L, H] list}}, "files": [paths written],
     "table": the markdown of head_scores.md}.

  Raises:
    ConfigError: `workdir` holds no run or checkpoint.
    WorkdirError: `workdir` on a file system that is not installed (a gs://
      one needs the `gcs` extra).
    ValueError: naming the argument, before the model runs.
  """
  if num_batches is not None:
    int_at_least(num_batches, "num_batches", 1)
  if period is not None:
    int_at_least(period, "period", 1)
  int_at_least(seed, "seed", 0)
  if jax.process_count() > 1:
    raise ValueError(f"analyze_run: runs in one process, got {jax.process_count()}")
  workdir = run_path(workdir)
  run = load_run(workdir, {} if num_batches is None else {"eval.num_batches": num_batches})
  setup = run.setup
  if setup.model_cfg.family == "lstm":
    raise ValueError(f"model.family: the run in {workdir} is an LSTM; it has no attention "
                     "to analyse")
  try:
    params = setup.replica_params(run.params, replica)
  except ValueError as error:
    raise ValueError(f"{error} (in {workdir})") from None
  batches = list(setup.eval_data)
  first = batches[0]
  shapes = attention_shapes(params)
  period = _induction_period(setup, list(shapes), first, period)
  out = workdir / ANALYSIS_DIR
  scores: dict[str, dict[str, np.ndarray]] = {}
  files = []
  with setup.activation_sharding():
    # Compiled once: the default induction inputs have the batch's shapes.
    maps_fn = jax.jit(functools.partial(attention_maps, setup.model))
    layers_by_kind = maps_by_kind(maps_fn(params, *model_inputs(first, setup.task)))
    loss_fns = ablation_loss_fns(setup.model, params,
                                 [setup.to_device(batch) for batch in batches],
                                 _eval_loss_sums(setup.task))
    any_kind, any_shape = next(iter(shapes.items()))
    baseline = loss_fns[any_kind](np.ones(any_shape, np.float32))  # every head on
    for kind, (num_layers, num_heads) in shapes.items():
      layers = layers_by_kind[kind]
      path = out / attention_png(kind)
      _plot_sample(setup, kind, layers, first, path, run.step)
      files.append(path)
      induction_LxH = (_induction(setup, maps_fn, params, first, kind, period, seed)
                       if _is_causal(setup, kind) else np.full((num_layers, num_heads), np.nan))
      scores[kind] = {**_attention_scores(setup, kind, layers, first, induction_LxH),
                      "ablation_delta_loss": head_ablation(loss_fns[kind], num_layers,
                                                           num_heads)}
  table = _markdown(scores, run.step, baseline, period, len(batches))
  files += [_write(out / SCORES_MD, table), _write(out / SCORES_CSV, _csv(scores))]
  return {"step": run.step, "baseline_loss": baseline, "period": period,
          "scores": {kind: {name: values.tolist() for name, values in kind_scores.items()}
                     for kind, kind_scores in scores.items()},
          "files": [str(path) for path in files], "table": table}


def _write(path: epath.Path, text: str) -> epath.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  return path


def _markdown(scores: dict[str, dict[str, np.ndarray]], step: int, baseline: float,
              period: int | None, num_batches: int) -> str:
  """head_scores.md: a header saying what the columns mean, one table per kind."""
  induction = (f"attention to the token after the previous occurrence, on random blocks of "
               f"{period} tokens repeated twice; causal self-attention only" if period
               else "n/a (the model has no causal self-attention)")
  parts = [f"# Attention heads at step {step}\n\n"
           f"- previous_token: mean attention from t to t - 1 (self-attention only)\n"
           f"- entropy_nats: mean entropy of a query's attention, nats\n"
           f"- distance_tokens: mean expected |query - key| position distance, tokens\n"
           f"- induction: {induction}\n"
           f"- ablation_delta_loss: the run's validation loss (nats; {num_batches} "
           f"batch{'es' if num_batches > 1 else ''}, baseline {baseline:.4f}) with the head's "
           f"output zeroed, minus the baseline\n"]
  parts += [f"\n## {kind} attention\n\n{head_scores_table(kind_scores)}"
            for kind, kind_scores in scores.items()]
  return "".join(parts)


def _csv(scores: dict[str, dict[str, np.ndarray]]) -> str:
  """head_scores.csv: an 'attention' (kind) column, then head_score_rows'."""
  text = io.StringIO()
  writer = csv.writer(text, lineterminator="\n")
  for at, (kind, kind_scores) in enumerate(scores.items()):
    header, rows = head_score_rows(kind_scores)
    if at == 0:
      writer.writerow(["attention", *header])
    writer.writerows([kind, *(repr(value) for value in row)] for row in rows)
  return text.getvalue()
