"""Attention analysis of a trained run: heatmaps, per-head scores, head ablation.

  record = analyze_run("runs/pe_ln/rope_pre")
  print(record["table"])

The run is restored once through txf.train.run_setup.load_run. Its attention is
read through the model's own layers (txf.analysis.attention_maps) and its
heads are ablated through the model's own 'head_mask' collection
(txf.analysis.ablation), evaluated with the run's eval step. Each attention
kind (txf.analysis.attention.attention_kind: 'self' for a decoder or an
encoder; 'encoder_self', 'decoder_self' and 'cross' for an encoder-decoder)
gets, in <workdir>/analysis/:

  attention_<kind>.png  heatmaps per layer and head of validation sample 0
  head_scores.csv       one row per (kind, layer, head), full precision
  head_scores.md        the same as markdown tables, one per kind

and, for a causal decoder, on request (txf.analysis.circuits):

  circuits=True         circuits.json, circuits.md: composition scores
                        between consecutive layers' heads and path patching
                        of each head's output into the next layer;
                        composition.png, patching.png, head_scores_sorted.png
  checkpoints=True      training_scores.csv, training_scores.png and
                        circuits.md: validation loss, head scores and
                        K-composition at every kept checkpoint (the phase
                        change)

Scores per head (txf.analysis.head_scores): previous-token score and mean entropy
and distance on the first validation batch; induction score on repeated
random token sequences, for causal self-attention only (n/a elsewhere: a
bidirectional encoder sees the answer, cross-attention keys are the source);
and the validation-loss change when the head's output is zeroed, over the
run's evaluator's batches. analysis.json records what was analysed (the
checkpoint, the seed replica, the validation batches read, which the
induction probe draws its ids from too, and the probe's periods and seed)
and the files of its analyses: a rerun of the same adds to them (the
circuits, then an ablation), one of another checkpoint, replica, number of
batches, periods or probe seed removes those it does not write again,
saying so. Nothing else in the run
directory changes.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
from etils import epath
from matplotlib.figure import Figure

from txf.analysis.ablation import (
  ablation_loss_fns,
  ablation_metric_fns,
  attention_shapes,
  head_name,
  parse_heads,
)
from txf.analysis.attention import KINDS, attention_maps, maps_by_kind
from txf.analysis.circuit_report import (
  circuit_table,
  composition_figure,
  patching_figure,
  phase_change_table,
  sorted_scores_figure,
  sorted_scores_table,
  training_figure,
)
from txf.analysis.circuits import analyze_circuits
from txf.analysis.composition import composition_scores
from txf.analysis.head_scores import (
  attention_entropy,
  group_mask,
  head_ablation,
  head_roles,
  head_score_rows,
  head_scores_table,
  in_distribution_ids,
  induction_probe,
  induction_score,
  mean_attended_distance,
  previous_token_score,
  probe_periods,
)
from txf.analysis.phase_change import read_training_csv, steepest_fall, training_csv
from txf.analysis.plots import attention_grid_figure, png_bytes
from txf.checks import int_at_least
from txf.data.incontext import repeat_periods
from txf.hardware import check_fits
from txf.progress import stage, timestamped
from txf.runconfig.tasks import task_kind
from txf.rundir.checkpoint import make_checkpointer
from txf.rundir.console import format_duration
from txf.rundir.derived import ANALYSIS_DIR, ANALYSIS_RECORD
from txf.rundir.workdir import check_reachable, run_path
from txf.storage import read_json, write_file, write_files
from txf.train.run_setup import RunSetup, TrainedRun, load_run
from txf.train.step import make_eval_step, model_inputs

SCORES_CSV = "head_scores.csv"
SCORES_MD = "head_scores.md"
CIRCUITS_JSON = "circuits.json"
CIRCUITS_MD = "circuits.md"
COMPOSITION_PNG = "composition.png"
PATCHING_PNG = "patching.png"
SORTED_PNG = "head_scores_sorted.png"
TRAINING_CSV = "training_scores.csv"
TRAINING_PNG = "training_scores.png"


def attention_png(kind: str) -> str:
  """The heatmap file of one attention kind."""
  return f"attention_{kind}.png"


# Fewer kept checkpoints than this place the phase change too coarsely to
# report without saying so (the induction page's runs keep 300).
MIN_PHASE_CHECKPOINTS = 5
# What the record of the analysis files in <workdir>/analysis/ holds
# (ANALYSIS_RECORD, analysis.json): {"step": the checkpoint analysed,
# "replica": the seed replica, "num_batches": the validation batches read
# (the ablation's, and those the induction probe draws its ids from),
# "probe_seed" and "periods": the induction probe's (periods None: no causal
# attention), "files": their names, "group_ablation": head_scores.md's group
# ablation or null}. The fields saying what was analysed (files of another's
# are stale):
SETTINGS = ("step", "replica", "num_batches", "probe_seed", "periods")
# Every file an analysis can write.
OUTPUTS = (
  *(attention_png(kind) for kind in KINDS),
  SCORES_CSV,
  SCORES_MD,
  CIRCUITS_JSON,
  CIRCUITS_MD,
  COMPOSITION_PNG,
  PATCHING_PNG,
  SORTED_PNG,
  TRAINING_CSV,
  TRAINING_PNG,
)


def _read_record(out: epath.Path) -> dict[str, Any] | None:
  """analysis.json of an earlier analysis in `out`; None where there is none.

  Raises:
    ValueError: naming the file, where it is not such a record.
  """
  path = out / ANALYSIS_RECORD
  record = read_json(path)
  if record is None:
    return None
  files = record.get("files") if isinstance(record, dict) else None
  step = record.get("step") if isinstance(record, dict) else None
  if not (isinstance(step, int) and isinstance(files, list) and set(files) <= set(OUTPUTS)):
    raise ValueError(f"{path}: not an analysis record ({{'step': int, 'files': [names]}})")
  return record


def _described(settings: dict[str, Any]) -> str:
  """'step 40, replica 0, num_batches 4, probe_seed 0, periods [23, 19]'
  (an older record's missing fields: 'not recorded')."""
  return ", ".join(f"{name} {settings.get(name, 'not recorded')}" for name in SETTINGS)


def _settle(
  out: epath.Path,
  settings: dict[str, Any],
  written: list[epath.Path],
  earlier: dict[str, Any] | None,
  log: Callable[[str], Any] | None,
  group: dict[str, Any] | None = None,
) -> epath.Path:
  """Leaves `out` holding analyses of `settings` ({name: value} of each of
  SETTINGS) only and records them, with `group` (head_scores.md's group
  ablation, kept for a later analysis of the same settings that does not
  ablate a group).

  An earlier analysis of the same settings adds to this one (txf-analyze
  --circuits --checkpoints, then --ablate: both kept); the files of one of
  other settings (another checkpoint, replica, number of validation
  batches, probe periods or seed; a record from before the settings were
  recorded) that this one did not write again are removed. Files from
  before the record existed (no analysis.json) are kept. `log` says what
  was removed or kept. Returns the record's path."""
  names = [path.name for path in written]
  others = [name for name in OUTPUTS if name not in names and (out / name).exists()]
  if earlier is not None and _same_settings(earlier, settings) is None:
    stale = [name for name in others if name in earlier["files"]]
    for name in stale:
      (out / name).unlink()
    if stale and log is not None:
      log(
        f"removed {', '.join(stale)} of the analysis of {_described(earlier)} "
        f"(not computed for {_described(settings)})"
      )
    others = [name for name in others if name not in stale]
  elif earlier is None:  # files of an analysis before the record: kept, not this one's
    if others and log is not None:
      log(f"kept {', '.join(others)} of an earlier analysis (what it analysed is not recorded)")
    others = []
  files = [name for name in OUTPUTS if name in names or name in others]
  record = {**settings, "files": files, "group_ablation": group}
  return write_file(out / ANALYSIS_RECORD, json.dumps(record, indent=1) + "\n")


def _same_settings(earlier: dict[str, Any] | None, settings: dict[str, Any]) -> dict | None:
  """`earlier` (an analysis record) where it analysed `settings`: its files
  are this analysis's too; else None."""
  if earlier is None or any(earlier.get(name) != settings[name] for name in SETTINGS):
    return None
  return earlier


def _kept_file(out: epath.Path, kept: dict[str, Any] | None, name: str, read: Callable) -> Any:
  """read(out / name) where the analysis `kept` (of this one's settings)
  holds the file; else None."""
  if kept is None or name not in kept["files"] or not (out / name).exists():
    return None
  return read(out / name)


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
  return kind == "decoder_self" or (kind == "self" and task_kind(setup.task).causal_lm)


def _unpadded_length(tokens_T: np.ndarray, pad_id: int) -> int:
  """Positions up to the last token that is not padding (all, if every one is)."""
  kept = np.nonzero(tokens_T != pad_id)[0]
  return int(kept[-1]) + 1 if kept.size else len(tokens_T)


def _labels(setup: RunSetup, tokens_T: np.ndarray) -> list[str]:
  """One readable label per token id: its text, quoted if blank, else <id>."""
  labels = []
  for token in tokens_T:
    text = setup.train_data.tokenizer.decode([int(token)])
    labels.append(
      text if text.strip() and text.isprintable() else repr(text) if text else f"<{int(token)}>"
    )
  return labels


def _sample_figure(
  setup: RunSetup, kind: str, layers: list[Any], batch: dict[str, np.ndarray], step: int
) -> Figure:
  """Heatmaps of validation sample 0 for one kind, padding cut off."""
  pad_id = setup.run.model.pad_id
  queries_T, keys_S = _query_tokens(batch, kind)[0], _key_tokens(batch, kind)[0]
  T, S = _unpadded_length(queries_T, pad_id), _unpadded_length(keys_S, pad_id)
  return attention_grid_figure(
    [np.asarray(weights_BxHxTxS[0, :, :T, :S]) for weights_BxHxTxS in layers],
    _labels(setup, queries_T[:T]),
    title=f"{kind} attention, validation sample 0 (step {step})",
    key_tokens=_labels(setup, keys_S[:S]),
  )


def _probe_ids(setup: RunSetup, kind: str, batches: list[dict[str, np.ndarray]]) -> np.ndarray:
  """The ids the induction probe draws: those in the validation batches'
  `kind` queries, special ids left out (the run's own token distribution)."""
  tokens = np.concatenate([_query_tokens(batch, kind).ravel() for batch in batches])
  return in_distribution_ids(tokens, setup.train_data.tokenizer.special_ids)


def _probe_periods(
  setup: RunSetup, length: int, num_ids: int, periods: list[int] | None
) -> list[int]:
  """The probe periods: `periods`, checked to fit, or the two longest that fit
  and that the training data does not repeat with (`probe_periods`)."""
  if periods is None:
    return probe_periods(length, num_ids, repeat_periods(setup.run.data))
  twice = sorted({period for period in periods if periods.count(period) > 1})
  if twice:
    raise ValueError(f"periods: {', '.join(map(str, twice))} given twice, got {periods}")
  if len(periods) < 2:
    raise ValueError(
      f"periods: two or more probe periods are needed to tell induction from "
      f"positional heads, got {periods}"
    )
  limit = min(length // 2, num_ids)
  for period in periods:
    if not 2 <= period <= limit:
      raise ValueError(
        f"periods: {period} must be in 2..{limit} (two blocks of distinct "
        f"tokens fit the run's {length} query positions and {num_ids} "
        "in-distribution ids)"
      )
  return periods


def _induction(
  setup: RunSetup,
  maps_fn: Callable[..., dict[str, Any]],
  params: Any,
  batch: dict[str, np.ndarray],
  kind: str,
  period: int,
  seed: int,
  ids: np.ndarray,
) -> np.ndarray:
  """[L, H] induction scores of `kind` on repeated blocks of `ids` (an
  encoder-decoder's source: the batch's encoder inputs), attention from
  `maps_fn(params, *inputs)`."""
  B = _query_tokens(batch, kind).shape[0]
  tokens_BxT = induction_probe(seed, B, period, setup.run.model.vocab_size, ids)
  # An encoder-decoder's analysed tokens are its decoder inputs, beside its source.
  seq2seq = task_kind(setup.task).batches == "seq2seq"
  inputs = (batch["encoder_inputs"], tokens_BxT) if seq2seq else (tokens_BxT,)
  layers = maps_by_kind(maps_fn(params, *inputs))[kind]
  return np.stack([induction_score(weights, period) for weights in layers])


def _attention_scores(
  setup: RunSetup,
  kind: str,
  layers: list[Any],
  batch: dict[str, np.ndarray],
  induction_by_period: dict[int, np.ndarray],
) -> dict[str, np.ndarray]:
  """The [L, H] scores of one kind in table order: previous-token
  (self-attention only; NaN for cross), induction (the lowest over the probe
  periods: a content match scores at every period; NaN without periods), the induction score at
  each probe period, entropy and distance on the batch, padded queries left
  out."""
  query_mask_BxT = _query_tokens(batch, kind) != setup.run.model.pad_id
  per_layer = lambda score: np.stack(
    [score(weights, query_mask=query_mask_BxT) for weights in layers]
  )
  entropy_LxH = per_layer(attention_entropy)
  previous_LxH = (
    np.full_like(entropy_LxH, np.nan) if kind == "cross" else per_layer(previous_token_score)
  )
  by_period = {
    f"induction_p{period}": scores_LxH for period, scores_LxH in induction_by_period.items()
  }
  # No probe periods (no causal attention in the run: an encoder): NaN.
  induction_LxH = (
    np.min(np.stack(list(by_period.values())), axis=0)
    if by_period
    else np.full_like(entropy_LxH, np.nan)
  )
  return {
    "previous_token": previous_LxH,
    "induction": induction_LxH,
    **by_period,
    "entropy_nats": entropy_LxH,
    "distance_tokens": per_layer(mean_attended_distance),
  }


def _eval_sums(task: str):
  """(model, params, batch) -> {loss_sum, count, correct}: the run's eval step."""
  return lambda model, params, batch: make_eval_step(model, task)(params, batch)


def _eval_loss_sums(task: str):
  """(model, params, batch) -> (loss_sum, count) with the run's eval step."""

  def loss_sums(model, params, batch):
    sums = _eval_sums(task)(model, params, batch)
    return sums["loss_sum"], sums["count"]

  return loss_sums


def _roles(scores: dict[str, dict[str, np.ndarray]], periods: list[int]) -> dict[str, dict]:
  """{kind: {role: ['L<l>H<h>', ...]}} of the causal kinds (`head_roles`)."""
  named: dict[str, dict] = {}
  for kind, kind_scores in scores.items():
    if np.all(np.isnan(kind_scores["induction"])):
      continue
    roles_LxH = head_roles(
      kind_scores["previous_token"],
      {period: kind_scores[f"induction_p{period}"] for period in periods},
    )
    named[kind] = {role: [] for role in ("previous_token", "induction", "positional")}
    for (layer, head), labels in np.ndenumerate(roles_LxH):
      for role in filter(None, labels.split("+")):
        named[kind][role].append(head_name(layer, head))
  return named


def _group_ablation(
  metric_fn: Callable[[np.ndarray], dict[str, float]],
  spec: str,
  shape: tuple[int, int],
  kind: str,
) -> dict[str, Any]:
  """Loss and accuracy with every head on and with the heads of `spec` of
  attention `kind` zeroed together."""
  heads = parse_heads(spec, *shape)
  return {
    "attention": kind,
    "heads": [head_name(layer, head) for layer, head in heads],
    "baseline": metric_fn(np.ones(shape, np.float32)),
    "ablated": metric_fn(group_mask(heads, *shape)),
  }


def format_head_progress(
  kind: str, layer: int, head: int, num_layers: int, num_heads: int, delta: float, elapsed: float
) -> str:
  """The progress line of one head's ablation, e.g. 'analyze: self head L0H1
  (2 of 8) | loss_delta +0.0123 | elapsed 3s | eta 9s' (the ETA at the
  mean time per head of `kind` so far)."""
  done, total = layer * num_heads + head + 1, num_layers * num_heads
  return (
    f"analyze: {kind} head L{layer}H{head} ({done} of {total}) | loss_delta {delta:+.4f} | "
    f"elapsed {format_duration(elapsed)} | eta {format_duration(elapsed / done * (total - done))}"
  )


@dataclasses.dataclass(frozen=True)
class AnalysisRequest:
  """An analysis checked against its run (`check_analysis`): what `analyze`
  computes, with the run restored and its validation batches read."""

  workdir: epath.Path
  run: TrainedRun
  params: Any  # the replica's parameters
  batches: list[dict[str, np.ndarray]]
  shapes: dict[str, tuple[int, int]]  # {kind: (layers, heads)}
  causal: list[str]  # the kinds of causal self-attention
  ids: np.ndarray | None  # the induction probe's ids (None: no causal kind)
  periods: list[int] | None  # the probe's periods (None: no causal kind)
  seed: int
  replica: int
  ablate: str | None
  circuits: bool
  checkpoints: bool
  earlier: dict[str, Any] | None  # the record of an earlier analysis
  # What this analysis's circuits.md keeps of an earlier one of the same
  # settings (`_with_kept_results`): its circuits.json record and its scores
  # over checkpoints (None: computed now, or none kept).
  kept_circuits: dict[str, Any] | None = None
  kept_training: dict[str, Any] | None = None

  @property
  def settings(self) -> dict[str, Any]:
    """What the analysis is of (SETTINGS). Without causal attention there
    is no probe: its seed is not used."""
    return dict(
      step=self.run.step,
      replica=self.replica,
      num_batches=len(self.batches),
      probe_seed=self.seed if self.causal else None,
      periods=self.periods,
    )


def check_analysis(
  workdir: str | os.PathLike,
  *,
  num_batches: int | None = None,
  periods: list[int] | None = None,
  seed: int = 0,
  replica: int = 0,
  ablate: str | None = None,
  circuits: bool = False,
  checkpoints: bool = False,
) -> AnalysisRequest:
  """Restores the run in `workdir` and checks the analysis `analyze_run`'s
  arguments ask for, before any model runs.

  Raises:
    ConfigError: `workdir` holds no run or checkpoint.
    WorkdirError: `workdir` on a file system that is not installed (a gs://
      one needs the `gcs` extra) or that cannot be reached.
    ValueError: naming the argument.
  """
  if num_batches is not None:
    int_at_least(num_batches, "num_batches", 1)
  if periods is not None:
    periods = [int_at_least(period, "periods", 1) for period in periods]
  int_at_least(seed, "seed", 0)
  if jax.process_count() > 1:
    raise ValueError(f"analyze_run: runs in one process, got {jax.process_count()}")
  workdir = run_path(workdir)
  check_reachable(workdir)
  run = load_run(workdir, {} if num_batches is None else {"eval.num_batches": num_batches})
  setup = run.setup
  if setup.run.model.family == "lstm":
    raise ValueError(
      f"model.family: the run in {workdir} is an LSTM; it has no attention to analyse"
    )
  try:
    params = setup.replica_params(run.params, replica)
  except ValueError as error:
    raise ValueError(f"{error} (in {workdir})") from None
  if num_batches is not None:
    _check_batches_fit(setup, num_batches)
  batches = list(setup.eval_data)
  if num_batches is not None and len(batches) < num_batches:
    # The evaluator stops at the split's end: fewer were read, without a word.
    raise ValueError(
      f"num_batches: the validation split holds only {len(batches)} batches of "
      f"{setup.run.data.batch_size}, asked for {num_batches}"
    )
  shapes = attention_shapes(params)
  if not shapes:  # a registered family without txf's attention layers: a KeyError
    raise ValueError(
      f"model.family: the run in {workdir} ({setup.run.model.family!r}) has no attention "
      "layers of txf's to analyse"
    )
  causal = [kind for kind in shapes if _is_causal(setup, kind)]
  if ablate is not None and not causal:
    raise ValueError("ablate: the model has no causal self-attention to ablate")
  if periods is not None and not causal:
    raise ValueError("periods: the model has no causal self-attention to probe for induction")
  ids = None
  if causal:
    ids = _probe_ids(setup, causal[0], batches)
    length = _query_tokens(batches[0], causal[0]).shape[1]
    periods = _probe_periods(setup, length, len(ids), periods)
  if ablate is not None:
    parse_heads(ablate, *shapes[causal[0]])
  if circuits or checkpoints:
    _check_circuits(setup, circuits=circuits)
  if checkpoints:
    with make_checkpointer(setup.run.train, workdir, read_only=True) as checkpointer:
      kept = checkpointer.steps()
    if len(kept) < 2:
      raise ValueError(
        f"checkpoints: the run in {workdir} kept {len(kept)} checkpoint(s); scores over "
        "training need two or more (train with a small train.checkpoint_every and a "
        "large train.max_to_keep)"
      )
  request = AnalysisRequest(
    workdir=workdir,
    run=run,
    params=params,
    batches=batches,
    shapes=shapes,
    causal=causal,
    ids=ids,
    periods=periods,
    seed=seed,
    replica=replica,
    ablate=ablate,
    circuits=circuits,
    checkpoints=checkpoints,
    earlier=_read_record(workdir / ANALYSIS_DIR),  # a damaged one stops here
  )
  return _with_kept_results(request)


def _with_kept_results(request: AnalysisRequest) -> AnalysisRequest:
  """`request` with what its circuits.md keeps of an earlier analysis of the
  same settings: its training_scores.csv where this one computes only the
  circuits, its circuits.json where only the scores over checkpoints. Read
  now, so that a damaged one is refused before any model runs.

  Raises:
    ValueError: naming the file, where it does not read as the one an
      analysis writes.
  """
  if request.circuits == request.checkpoints:  # both computed, or no circuits.md
    return request
  kept = _same_settings(request.earlier, request.settings)
  name, read, field = (
    (TRAINING_CSV, read_training_csv, "kept_training")
    if request.circuits
    else (CIRCUITS_JSON, read_json, "kept_circuits")
  )
  out = request.workdir / ANALYSIS_DIR
  try:
    value = _kept_file(out, kept, name, read)
    result = dataclasses.replace(request, **{field: value})
    _circuits_report(_label(result), result.kept_circuits, result.kept_training)
  except (KeyError, TypeError, ValueError, IndexError) as error:
    raise ValueError(
      f"{out / name}: not the {name} an analysis writes ({type(error).__name__}: {error}); "
      "move it away to write circuits.md without it"
    ) from None
  return result


def _check_batches_fit(setup: RunSetup, num_batches: int) -> None:
  """Refuses `num_batches` validation batches that would not fit on the
  device that holds them while the heads are ablated (generated data has no
  split's end to stop at: they were read until memory ran out), from the
  first batch's size, before the others are read.

  Raises:
    ValueError: naming num_batches and both sizes.
  """
  first = next(iter(setup.eval_data), None)
  if first is None:
    return
  nbytes = num_batches * sum(np.asarray(value).nbytes for value in first.values())
  what = f"{num_batches:,} validation batches (held while the heads are ablated)"
  check_fits("num_batches", what, nbytes, jax.local_devices()[0])


def analyze_run(
  workdir: str | os.PathLike,
  *,
  num_batches: int | None = None,
  periods: list[int] | None = None,
  seed: int = 0,
  replica: int = 0,
  ablate: str | None = None,
  circuits: bool = False,
  checkpoints: bool = False,
  log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
  """Writes the attention analysis of the run in `workdir` into
  <workdir>/analysis/ (see the module docstring) and returns it:
  `analyze(check_analysis(...), log)`.

  Args:
    workdir: a trained run (config.json and a checkpoint): decoder, encoder
      or encoder-decoder (not an LSTM).
    num_batches: validation batches the ablation evaluates and the induction
      probe draws its ids from (None: the run's eval.num_batches); the other
      scores use the first.
    periods: two or more block lengths of the induction probe (None: the two
      longest that fit the run's query length and its in-distribution ids
      and that its training data does not repeat with).
    seed: seed of the induction inputs' random tokens.
    replica: which seed replica of a run of several to analyse (0: the
      first, whose seed is the run's `seed`).
    ablate: heads of the causal self-attention to zero together, e.g.
      'L1H0,L1H2' (None: none); their loss and accuracy change is reported.
    circuits: also composition scores and path patching (a Pre-LN,
      unscanned decoder LM; txf.analysis.circuits.analyze_circuits) on the
      induction probe's periods and ids.
    checkpoints: also the validation loss, previous-token and induction
      scores and K-composition at every checkpoint the run kept (keep many:
      train.checkpoint_every small, train.max_to_keep large).
    log: called with a progress line, stamped with the wall-clock time, as
      each head's ablation (and each checkpoint) is done
      (`format_head_progress`), and with the files written at the end;
      None: quiet.

  Returns:
    {"step": checkpoint step, "baseline_loss": validation loss with every
     head, "periods": induction probe periods (None without a causal kind),
     "scores": {kind: {score name: [L, H] list}}, "roles": {kind:
     {"previous_token" | "induction" | "positional": ["L<l>H<h>", ...]}}
     (causal kinds), "group_ablation": {"attention", "heads", "baseline", "ablated"} with
     {"loss", "accuracy"} each (None without `ablate`), "circuits": the
     record of circuits.json (None without `circuits`), "training": the
     scores over checkpoints as `read_training_csv` returns them (None
     without `checkpoints`), "files": [paths written], "table": the markdown
     of head_scores.md}.

  Raises:
    ConfigError, WorkdirError, ValueError: as `check_analysis`, before the
      model runs.
  """
  request = check_analysis(
    workdir,
    num_batches=num_batches,
    periods=periods,
    seed=seed,
    replica=replica,
    ablate=ablate,
    circuits=circuits,
    checkpoints=checkpoints,
  )
  return analyze(request, log)


def _stage(what: str, log: Callable[[str], Any] | None) -> contextlib.AbstractContextManager:
  """`txf.progress.stage` on `log`; nothing where `log` is None (quiet)."""
  return stage(what, log=log) if log else contextlib.nullcontext()


def analyze(request: AnalysisRequest, log: Callable[[str], Any] | None = None) -> dict[str, Any]:
  """Computes the analysis `request` checked, then writes its files as one
  set (none before everything is computed, and all or none of them: a
  failure or a full disk leaves the previous analysis as it was) and returns
  its record (as `analyze_run`)."""
  run, params, first = request.run, request.params, request.batches[0]
  setup, causal, periods, ids = run.setup, request.causal, request.periods, request.ids
  out = request.workdir / ANALYSIS_DIR
  contents: dict[epath.Path, str | bytes] = {}  # written once all is computed
  scores: dict[str, dict[str, np.ndarray]] = {}
  with setup.activation_sharding():
    maps_fn = jax.jit(functools.partial(attention_maps, setup.model))
    # Both compile first: the longest silence before the heads' lines.
    batches = f"{len(request.batches)} batch" + ("es" if len(request.batches) > 1 else "")
    with _stage(f"analyze: attention maps and the baseline loss on {batches}", log):
      layers_by_kind = maps_by_kind(maps_fn(params, *model_inputs(first, setup.task)))
      device_batches = [setup.to_device(batch) for batch in request.batches]
      loss_fns = ablation_loss_fns(setup.model, params, device_batches, _eval_loss_sums(setup.task))
      any_kind, any_shape = next(iter(request.shapes.items()))
      baseline = loss_fns[any_kind](np.ones(any_shape, np.float32))  # every head on
    for kind, (num_layers, num_heads) in request.shapes.items():
      layers = layers_by_kind[kind]
      figure = _sample_figure(setup, kind, layers, first, run.step)
      contents[out / attention_png(kind)] = png_bytes(figure)
      induction = {
        period: (
          _induction(setup, maps_fn, params, first, kind, period, request.seed, ids)
          if kind in causal and ids is not None  # ids: None <=> no causal kind
          else np.full((num_layers, num_heads), np.nan)
        )
        for period in periods or ()
      }
      began = time.perf_counter()

      def progress(layer, head, delta, kind=kind, shape=(num_layers, num_heads), began=began):
        if log is not None:
          elapsed = time.perf_counter() - began
          log(timestamped(format_head_progress(kind, layer, head, *shape, delta, elapsed)))

      scores[kind] = {
        **_attention_scores(setup, kind, layers, first, induction),
        "ablation_delta_loss": head_ablation(
          loss_fns[kind], num_layers, num_heads, progress=progress
        ),
      }
    group = None
    if request.ablate is not None:
      metric_fns = ablation_metric_fns(setup.model, params, device_batches, _eval_sums(setup.task))
      group = _group_ablation(
        metric_fns[causal[0]], request.ablate, request.shapes[causal[0]], causal[0]
      )
    circuit_record = training = None
    if request.circuits or request.checkpoints:
      asked = " and ".join(
        name
        for name, on in (("circuits", request.circuits), ("checkpoints", request.checkpoints))
        if on
      )
      with _stage(f"analyze: {asked}", log):
        circuit_record, training = _circuits_and_training(request, scores, maps_fn, log, contents)
  settings = request.settings
  kept = _same_settings(request.earlier, settings)
  if group is None and kept is not None:
    group = kept.get("group_ablation")  # kept with its analysis's files
  if request.circuits or request.checkpoints:
    contents[out / CIRCUITS_MD] = _circuits_report(
      _label(request),
      circuit_record or request.kept_circuits,
      training or request.kept_training,
    )
  roles = _roles(scores, periods) if causal and periods is not None else {}  # causal: periods set
  seeds = setup.run.seeds
  replica = request.replica
  which = f" (replica {replica} of {len(seeds)}, seed {seeds[replica]})" if len(seeds) > 1 else ""
  table = _markdown(
    scores, f"{run.step}{which}", baseline, periods, len(request.batches), roles, group
  )
  contents.update({out / SCORES_MD: table, out / SCORES_CSV: _csv(scores)})
  files = write_files(contents)
  files.append(_settle(out, settings, files, request.earlier, log, group))
  if log is not None:
    log("wrote " + ", ".join(str(path) for path in files))
  return {
    "step": run.step,
    "baseline_loss": baseline,
    "periods": periods,
    "scores": {
      kind: {name: values.tolist() for name, values in kind_scores.items()}
      for kind, kind_scores in scores.items()
    },
    "roles": roles,
    "group_ablation": group,
    "circuits": circuit_record,
    "training": training,
    "files": [str(path) for path in files],
    "table": table,
  }


def _circuits_and_training(
  request: AnalysisRequest,
  scores: dict[str, dict[str, np.ndarray]],
  maps_fn: Callable,
  log: Callable[[str], Any] | None,
  contents: dict[epath.Path, str | bytes],
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
  """(circuits.json's record or None, the scores over checkpoints or None)
  of a causal decoder (`_check_circuits`), as `request` asks; adds their
  files' contents to `contents`."""
  run, periods, ids, seed = request.run, request.periods, request.ids, request.seed
  setup, out, first = run.setup, request.workdir / ANALYSIS_DIR, request.batches[0]
  assert periods is not None and ids is not None  # a causal decoder
  label = _label(request)
  head_scores = {name: scores["self"][name] for name in ("previous_token", "induction")}
  circuit_record = training = None
  if request.circuits:
    circuit_record = {
      "step": run.step,
      "replica": request.replica,
      "replica_seed": setup.run.seeds[request.replica],
      "probe_seed": seed,
      "scores": {name: values.tolist() for name, values in head_scores.items()},
      **analyze_circuits(
        setup.model,
        request.params,
        ids,
        periods,
        batch=_query_tokens(first, "self").shape[0],
        seed=seed,
      ),
    }
    contents.update(_circuit_files(out, circuit_record, label, run.step))
  if request.checkpoints:
    training = _training_scores(
      request.workdir, setup, request.replica, first, periods, ids, seed, maps_fn, log
    )
    figure = training_figure(
      {label: training},
      title="Loss and head scores over training, at every kept checkpoint",
      max_step=_training_xlim(training),
    )
    contents[out / TRAINING_CSV] = training_csv(training)
    contents[out / TRAINING_PNG] = png_bytes(figure)
  return circuit_record, training


def _label(request: AnalysisRequest) -> str:
  """The run as the circuit reports name it: 'run (seed 0)'."""
  return f"{request.workdir.name} (seed {request.run.setup.run.seeds[request.replica]})"


def _circuits_report(
  label: str, circuit_record: dict[str, Any] | None, training: Mapping[str, Any] | None
) -> str:
  """circuits.md: the circuits at the step analysed (circuits.json's record)
  and when they formed (the scores over checkpoints), each where given: an
  analysis that computes one keeps the other of an earlier analysis of the
  same settings."""
  parts = [_circuits_markdown(circuit_record, label)] if circuit_record else []
  if training is not None:
    kept = len(training["steps"])
    coarse = (
      f" Only {kept} checkpoints: too few to place a change (train with a smaller "
      "train.checkpoint_every and a larger train.max_to_keep)."
      if kept < MIN_PHASE_CHECKPOINTS
      else ""
    )
    parts.append(
      "## When the circuit forms\n\nSteepest change between consecutive checkpoints "
      f"({kept} checkpoints, steps {training['steps'][0]}.."
      f"{training['steps'][-1]}).{coarse}\n\n{phase_change_table({label: training})}"
    )
  return "\n".join(parts)


def _check_circuits(setup: RunSetup, *, circuits: bool) -> None:
  """ValueError, before compute, unless the run is a decoder LM with two or
  more layers (and, for `circuits`' patching, Pre-LN and unscanned)."""
  cfg = setup.run.model
  flag = "circuits" if circuits else "checkpoints"
  if cfg.family != "decoder" or not task_kind(setup.task).causal_lm:
    raise ValueError(
      f"{flag}: needs a decoder language model; the run's model.family is "
      f"{cfg.family!r} (task {setup.task!r})"
    )
  if cfg.num_layers < 2:
    raise ValueError(f"{flag}: needs two or more layers to compose, the run has {cfg.num_layers}")
  if circuits and cfg.norm_placement != "pre":
    raise ValueError("circuits: path patching needs Pre-LN (model.norm_placement='pre')")
  if circuits and cfg.scan_layers:
    raise ValueError("circuits: path patching needs unscanned layers (model.scan_layers=False)")


def _circuit_files(
  out: epath.Path, record: dict[str, Any], label: str, step: int
) -> dict[epath.Path, str | bytes]:
  """The contents of circuits.json and of the figures of layer 0 -> 1."""
  periods = ", ".join(str(period) for period in record["periods"])
  figures = {
    COMPOSITION_PNG: composition_figure(
      record, title=f"Composition of layer-0 heads into layer-1 heads ({label}, step {step})"
    ),
    PATCHING_PNG: patching_figure(
      record,
      title=f"Path patching: layer-1 induction scores ({label}, step {step}, periods {periods})",
    ),
    SORTED_PNG: sorted_scores_figure(
      {label: record["scores"]}, title=f"Every head's scores, sorted ({label}, step {step})"
    ),
  }
  return {
    out / CIRCUITS_JSON: json.dumps(record, indent=1) + "\n",
    **{out / name: png_bytes(figure) for name, figure in figures.items()},
  }


def _circuits_markdown(record: dict[str, Any], label: str) -> str:
  baseline = record["baseline"]
  return (
    f"# Circuits at step {record['step']}\n\n"
    "Composition scores (Elhage et al. 2021) from the weights, Pre-LN norm's scale "
    "and centring folded in, RoPE and the FFNs ignored (random Gaussian weights of "
    f"these shapes score q {baseline['q']:.3f}, k {baseline['k']:.3f}, v {baseline['v']:.3f}); "
    "path patching: the fall of layer 1's induction scores when one layer-0 head's "
    "output is taken from a corrupted prompt (two unrelated blocks) on one path, mean "
    f"over the probe periods {record['periods']} and over layer 1's heads "
    "(txf.analysis.composition, txf.analysis.patching).\n\n"
    f"{circuit_table({label: record})}\n"
    f"Every head's scores, sorted:\n\n{sorted_scores_table({label: record})}"
  )


def _training_scores(
  workdir: epath.Path,
  setup: RunSetup,
  replica: int,
  batch: dict[str, np.ndarray],
  periods: list[int],
  ids: np.ndarray,
  seed: int,
  maps_fn: Callable[..., dict[str, Any]],
  log: Callable[[str], Any] | None,
) -> dict[str, Any]:
  """Validation loss and accuracy, previous-token and induction scores (as
  `_attention_scores`) and K-composition at every checkpoint in `workdir`."""
  rows: dict[str, list[Any]] = {
    name: []
    for name in ("steps", "loss", "accuracy", "previous_token", "induction", "k_composition")
  }
  query_mask_BxT = _query_tokens(batch, "self") != setup.run.model.pad_id
  suffix = f"/{replica}" if setup.run.replicas > 1 else ""
  began = time.perf_counter()
  with make_checkpointer(setup.run.train, workdir, read_only=True) as checkpointer:
    steps = checkpointer.steps()
    for done, step in enumerate(steps, 1):
      state, _ = checkpointer.restore_step(step, setup.abstract_state)
      metrics = setup.evaluate(state.params)
      params = setup.replica_params(state.params, replica)
      layers = maps_by_kind(maps_fn(params, *model_inputs(batch, setup.task)))["self"]
      induction = [
        _induction(setup, maps_fn, params, batch, "self", period, seed, ids) for period in periods
      ]
      rows["steps"].append(step)
      rows["loss"].append(float(metrics[f"eval_loss{suffix}"]))
      rows["accuracy"].append(float(metrics[f"eval_accuracy{suffix}"]))
      rows["previous_token"].append(
        np.stack([previous_token_score(weights, query_mask=query_mask_BxT) for weights in layers])
      )
      rows["induction"].append(np.min(np.stack(induction), axis=0))
      rows["k_composition"].append(
        composition_scores(params, fold_norm=setup.run.model.norm_placement == "pre")["k"]
      )
      if log is not None:
        elapsed = time.perf_counter() - began
        log(
          timestamped(
            f"analyze: checkpoint step {step} ({done} of {len(steps)}) | eval_loss "
            f"{rows['loss'][-1]:.4f} | elapsed {format_duration(elapsed)} | eta "
            f"{format_duration(elapsed / done * (len(steps) - done))}"
          )
        )
  return {name: np.asarray(values) for name, values in rows.items()}


def _training_xlim(training: dict[str, Any]) -> int:
  """The training figure's last step: 4x where the accuracy stops rising
  fastest (the phase change in the first quarter), or the last checkpoint."""
  steps = training["steps"]
  _, after, _ = steepest_fall(steps, -np.asarray(training["accuracy"]))
  return int(min(steps[-1], 4 * after))


def _markdown(
  scores: dict[str, dict[str, np.ndarray]],
  step: str,
  baseline: float,
  periods: list[int] | None,
  num_batches: int,
  roles: dict[str, dict],
  group: dict[str, Any] | None,
) -> str:
  """head_scores.md: a header saying what the columns mean, one table per kind,
  the heads' roles and the group ablation; `step` says the checkpoint (and,
  in a run of several seeds, the replica) analysed."""
  induction = (
    f"attention to the token after the previous occurrence, on random blocks of "
    f"in-distribution tokens repeated twice; the lowest over the probe periods "
    f"{periods} (induction_p<P>: at period P); causal self-attention only"
    if periods
    else "n/a (the model has no causal self-attention)"
  )
  parts = [
    f"# Attention heads at step {step}\n\n"
    f"- previous_token: mean attention from t to t - 1 (self-attention only)\n"
    f"- entropy_nats: mean entropy of a query's attention, nats\n"
    f"- distance_tokens: mean expected |query - key| position distance, tokens\n"
    f"- induction: {induction}\n"
    f"- ablation_delta_loss: the run's validation loss (nats; {num_batches} "
    f"batch{'es' if num_batches > 1 else ''}, baseline {baseline:.4f}) with the head's "
    f"output zeroed, minus the baseline\n"
  ]
  for kind, kind_scores in scores.items():
    parts.append(f"\n## {kind} attention\n\n{head_scores_table(kind_scores)}")
    if kind in roles:
      parts.append(
        "\nRoles (score >= 0.5; positional: an induction score >= 0.5 at one probe "
        "period and under 0.25 at another):\n\n"
        + "".join(
          f"- {role}: {', '.join(heads) or 'none'}\n" for role, heads in roles[kind].items()
        )
      )
  if group is not None:
    before, after = group["baseline"], group["ablated"]
    parts.append(
      f"\n## Group ablation of {', '.join(group['heads'])} ({group['attention']} attention)\n\n"
      f"| | loss (nats) | accuracy |\n|---|---|---|\n"
      f"| every head | {before['loss']:.4f} | {before['accuracy']:.4f} |\n"
      f"| heads zeroed | {after['loss']:.4f} | {after['accuracy']:.4f} |\n"
    )
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
