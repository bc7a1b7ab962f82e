"""A decoder's circuits on the induction probe, as one record: `analyze_circuits`.

Ablation says a head matters; it does not say which head reads which. The
record holds both measures of that, for the self-attention stack of a txf
decoder:

  txf.analysis.composition   Q-, K- and V-composition between every head of
                             layer l and every head of layer l + 1, from
                             the weights alone (Elhage et al. 2021), beside
                             the score of random weights
  txf.analysis.patching      the fall of layer l + 1's induction scores when
                             one layer-l head's output is taken from a
                             corrupted prompt on one path (queries, keys or
                             everywhere)

`txf.analysis.phase_change` times the circuit's forming over a run's
checkpoints, and `txf.analysis.circuit_report` turns the record and the
scores over training into tables and figures. `txf.trained.head_analysis.analyze_run`
runs them on a trained run (`txf-analyze --circuits --checkpoints`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import numpy as np

from txf.analysis.composition import composition_scores, random_composition_baseline
from txf.analysis.head_scores import repeated_random_tokens
from txf.analysis.patching import PATTERN_PATHS, corrupted_tokens, path_patching
from txf.layers.model_config import derived


def analyze_circuits(
  model: nn.Module,
  params: Any,
  ids: Any,
  periods: Sequence[int],
  *,
  batch: int = 32,
  seed: int = 0,
) -> dict[str, Any]:
  """Composition scores and path patching of a decoder, as one JSON-able record.

  Args:
    model: a txf decoder, Pre-LN and unscanned (`path_patching`).
    params: its parameters (one replica's).
    ids: the token ids the probe draws blocks from (the run's own, e.g.
      `txf.analysis.head_scores.in_distribution_ids`).
    periods: the probe periods (block lengths); the patching effects are
      averaged over them.
    batch: probe rows per period.
    seed: of the probe's tokens: each period's clean prompts are
      `induction_probe(seed, batch, period, ...)`'s, its corrupted ones drawn
      after them by the same generator.

  Returns:
    {"composition": {'q', 'k', 'v': nested lists [L - 1, H, H]}, "composition_rope":
     {'q', 'k'} averaged over the query-key distances 0 .. 2 max(periods) - 1
     (RoPE models only, else None), "baseline": {'q', 'k', 'v': float} (the
     score of random weights, `random_composition_baseline`), "periods",
     "patching": [one per source layer l: {"source_layer": l, "clean",
     "corrupted_source": [H], and per path of `PATTERN_PATHS` [H, H]}], each
     averaged over the periods, "patching_by_period": the same per period}.
  """
  cfg = model.cfg
  if not periods:
    raise ValueError("periods: at least one probe period")
  fold_norm = cfg.norm_placement == "pre"
  composition = composition_scores(params, fold_norm=fold_norm)
  composition_rope = None
  if cfg.position == "rope":
    settings = cfg.settings("position")
    rope = composition_scores(
      params,
      fold_norm=fold_norm,
      rope_distances=range(2 * max(periods)),
      rope_base=settings.rope_base,
      rope_scale=settings.rope_scale,
    )
    composition_rope = {kind: rope[kind].tolist() for kind in ("q", "k")}
  names = ("clean", "corrupted_source", *PATTERN_PATHS)
  by_period: dict[str, list[dict[str, Any]]] = {}
  for period in periods:
    # A generator per period: its prompts are the head scores' probe at that
    # period (`induction_probe`), whichever other periods are probed.
    rng = np.random.default_rng(seed)
    clean_BxT = repeated_random_tokens(rng, batch, period, cfg.vocab_size, ids=ids)
    corrupt_BxT = corrupted_tokens(rng, clean_BxT, ids)
    by_period[str(period)] = []
    for layer in range(cfg.num_layers - 1):
      effects = path_patching(
        model, params, clean_BxT, corrupt_BxT, period, source_layer=layer, paths=PATTERN_PATHS
      )
      by_period[str(period)].append(
        {"source_layer": layer, **{name: effects[name].tolist() for name in names}}
      )
  averaged = [
    {
      "source_layer": layer,
      **{
        name: np.mean([entries[layer][name] for entries in by_period.values()], axis=0).tolist()
        for name in names
      },
    }
    for layer in range(cfg.num_layers - 1)
  ]
  return {
    "composition": {kind: values.tolist() for kind, values in composition.items()},
    "composition_rope": composition_rope,
    "baseline": random_composition_baseline(cfg.d_model, derived(cfg.head_dim)),
    "periods": list(periods),
    "patching": averaged,
    "patching_by_period": by_period,
  }
