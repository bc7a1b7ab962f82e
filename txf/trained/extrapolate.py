"""Length extrapolation of a trained run: its validation loss at multiples of
its training length, with both protocols of txf.analysis.extrapolation.

  result = extrapolate_run("runs/pe_ln/rope_pre", factors=(1, 2, 4, 8, 16))
  print(format_table(result))

The run is restored once through txf.train.run_setup.load_run; its validation
split gives one token stream (the windows the run's evaluator reads,
concatenated in stream order), which every length and protocol scores. By
default the stream is exactly the evaluator's eval.num_batches x
data.batch_size windows, so at 1x the non-overlapping loss is the run's
eval_loss (but for a packed TFDS run evaluated document by document, whose
documents the stream joins: the model reads no segment ids here). A length
the run's config refuses as data.seq_len (a learned position table shorter
than it) is not applicable: its losses are null and the reason is recorded.
A run of R seed replicas is evaluated replica by replica: "loss" and the
per-position losses are the replicas' means, "replica_loss" holds each
replica's. The run directory gains
extrapolation.json (format: txf.sweep.results), extrapolation.png and
per_position_loss.png (where no length applies, the record alone, and the
earlier figures are removed); nothing else in it changes. Each is written
atomically (txf.storage.write_file), the plots first: extrapolation.json, which
tells a sweep that the point is extrapolated, is never cut and comes last.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from txf.analysis.extrapolation import (
  DEFAULT_FACTORS,
  PROTOCOLS,
  WindowLosses,
  check_factors,
  check_language_model,
  default_stride,
  tokens_per_batch,
  window_losses,
  windows,
)
from txf.checks import int_at_least
from txf.progress import Progress
from txf.runconfig.run_config import ConfigError
from txf.rundir.console import format_duration
from txf.rundir.derived import EXTRAPOLATION_FILE, EXTRAPOLATION_PNG, PER_POSITION_PNG
from txf.rundir.resume import read_held_config
from txf.rundir.workdir import check_reachable, run_path
from txf.storage import write_files
from txf.sweep.results import LOSS_UNITS
from txf.train.run_setup import RunSetup, TrainedRun, load_run


def _validation_stream(setup: RunSetup) -> np.ndarray:
  """int32 [N]: the validation tokens the run's eval batches hold, in stream
  order: their windows of seq_len + 1 tokens tile the split's token stream
  (txf.data.lm, txf.data.packed), so concatenated they are its first N
  tokens. Padding is left out: a window's tokens are real up to its last
  weighted target (a packed stream's last row is padded after its end, and
  its padding was scored as text)."""
  parts = []
  for batch in setup.eval_data:
    windows_RxT1 = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    targets_RxT = batch["weights"] > 0
    real_RxT1 = np.concatenate([targets_RxT.any(axis=1, keepdims=True), targets_RxT], axis=1)
    parts.append(windows_RxT1[real_RxT1])
  return np.concatenate(parts)


def _not_applicable(setup: RunSetup, length: int) -> str | None:
  """Why the run's config refuses `length` as data.seq_len; None if it accepts it."""
  try:
    setup.run.override({"data.seq_len": length})
  except ConfigError as error:
    return str(error)
  return None


@dataclasses.dataclass(frozen=True)
class ExtrapolationRequest:
  """An evaluation checked against its run (`check_extrapolation`): the run,
  the validation tokens it scores and extrapolation.json's settings."""

  workdir: epath.Path
  run: TrainedRun
  tokens_N: np.ndarray
  batch_tokens: int
  settings: dict[str, Any]  # step, train_length, factors, lengths, num_tokens, stride, ...


def check_extrapolation(
  workdir: str | os.PathLike,
  factors: Sequence[int] = DEFAULT_FACTORS,
  *,
  stride: int | None = None,
  num_tokens: int | None = None,
  batch_tokens: int | None = None,
) -> ExtrapolationRequest:
  """Restores the run in `workdir`, reads its validation tokens and checks
  the evaluation `extrapolate_run`'s arguments ask for, before any model runs.

  Raises:
    ConfigError: `workdir` holds no run or checkpoint.
    WorkdirError: `workdir` on a file system that is not installed (a gs://
      one needs the `gcs` extra) or that cannot be reached.
    ValueError: naming the argument (or data.task for a run that is not a
      language model).
  """
  factors = check_factors(factors)
  for name, value, minimum in (
    ("stride", stride, 1),
    ("num_tokens", num_tokens, 2),
    ("batch_tokens", batch_tokens, 1),
  ):
    if value is not None:
      int_at_least(value, name, minimum)
  if jax.process_count() > 1:
    raise ValueError(
      "extrapolate_run: runs in one process (the validation stream is read "
      f"whole), got {jax.process_count()}"
    )
  workdir = run_path(workdir)
  check_reachable(workdir)
  run, tokens_N = load_with_stream(workdir, num_tokens)
  train_length = run.setup.run.data.seq_len
  lengths = [factor * train_length for factor in factors]
  if stride is not None and stride > lengths[0]:
    raise ValueError(f"stride must be at most the shortest length {lengths[0]}, got {stride}")
  reasons = [_not_applicable(run.setup, length) for length in lengths]
  for length, reason in zip(lengths, reasons):
    if reason is None and len(tokens_N) < length + 1:
      raise ValueError(
        f"num_tokens: {len(tokens_N)} validation tokens hold no window of "
        f"{length + 1} tokens (length {length}); evaluate more tokens or "
        "lower the largest factor"
      )
  settings = {
    "step": run.step,
    "train_length": train_length,
    "factors": list(factors),
    "lengths": lengths,
    "num_tokens": len(tokens_N),
    "stride": [
      None if reason else stride or default_stride(length)
      for length, reason in zip(lengths, reasons)
    ],
    "applicable": [reason is None for reason in reasons],
    "reason": reasons,
  }
  return ExtrapolationRequest(
    workdir=workdir,
    run=run,
    tokens_N=tokens_N,
    batch_tokens=batch_tokens or (run.setup.run.data.batch_size * train_length),
    settings=settings,
  )


def extrapolate_run(
  workdir: str | os.PathLike,
  factors: Sequence[int] = DEFAULT_FACTORS,
  *,
  stride: int | None = None,
  num_tokens: int | None = None,
  batch_tokens: int | None = None,
  log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
  """Evaluates the run in `workdir` at `factors` x its training length and
  writes extrapolation.json, extrapolation.png and per_position_loss.png there:
  `extrapolate(check_extrapolation(...), log)`.

  Args:
    workdir: a trained decoder LM run (config.json and a checkpoint).
    factors: evaluation lengths as multiples of data.seq_len, increasing.
    stride: tokens a sliding window advances, at most the shortest length;
      None: half of each length.
    num_tokens: validation tokens to score, from the split's start; None:
      the run's evaluator's (eval.num_batches x data.batch_size windows).
    batch_tokens: tokens per model call (windows per call = batch_tokens //
      length, at least 1); None: a training batch's (data.batch_size x
      data.seq_len).
    log: called with a progress line as each length is done (`format_length_progress`),
      and with the files written at the end; None: quiet.

  Returns:
    The contents of extrapolation.json (format: txf.sweep.results).

  Raises:
    ConfigError, WorkdirError, ValueError: as `check_extrapolation`, before
      any model is run.
    WriteError: a file could not be written (one line naming it; the
      previous figures and extrapolation.json are intact: one set).
  """
  request = check_extrapolation(
    workdir, factors, stride=stride, num_tokens=num_tokens, batch_tokens=batch_tokens
  )
  return extrapolate(request, log)


def extrapolate(
  request: ExtrapolationRequest, log: Callable[[str], Any] | None = None
) -> dict[str, Any]:
  """Evaluates what `request` checked, then writes its files; returns
  extrapolation.json's contents (as `extrapolate_run`)."""
  record = dict(request.settings)
  record.update(_losses(request.run, request.tokens_N, record, request.batch_tokens, log))
  workdir = request.workdir
  figures = _figures(record) if record["per_position"] is not None else {}
  # One set: a full disk leaves the previous figures and record as they were.
  contents: dict[str, str | bytes] = {
    **figures,
    EXTRAPOLATION_FILE: json.dumps(record, indent=2) + "\n",
  }
  written = write_files({workdir / name: text for name, text in contents.items()})
  for stale in {EXTRAPOLATION_PNG, PER_POSITION_PNG} - set(figures):
    # No length applied: an earlier record's figures would pass for this one's.
    (workdir / stale).unlink(missing_ok=True)
  if log is not None:
    log("wrote " + ", ".join(str(path) for path in written))
  return record


def load_with_stream(workdir: epath.Path, num_tokens: int | None) -> tuple[TrainedRun, np.ndarray]:
  """The trained run and its first `num_tokens` validation tokens (None: its
  evaluator's), with eval.num_batches raised to hold them."""
  saved, overrides = None, {}
  if num_tokens is not None:
    saved, _ = read_held_config(workdir, trained=False)
    if saved is not None:  # else load_run says why there is no run
      data = saved.data
      per_batch = tokens_per_batch(data.batch_size, data.seq_len)
      overrides["eval.num_batches"] = math.ceil(num_tokens / per_batch)
  run = load_run(workdir, overrides, saved=saved)
  run.setup.run.check_extrapolates(f"the run in {workdir}")
  try:  # a registered family's: found only as the first window was scored
    check_language_model(run.setup.model)
  except ValueError as error:
    raise ValueError(f"model.family: {error} (the run in {workdir})") from None
  tokens_N = _validation_stream(run.setup)
  if num_tokens is None:
    return run, tokens_N
  if len(tokens_N) < num_tokens:
    raise ValueError(
      f"num_tokens: the validation split holds only {len(tokens_N)} tokens, asked for {num_tokens}"
    )
  return run, tokens_N[:num_tokens]


def format_length_progress(
  at: int, record: dict[str, Any], losses: dict[str, float | None], elapsed: float
) -> str:
  """The progress line of the `at`-th length of `record`, e.g.
  'extrapolate: length 256 (2 of 5, 2x) | non_overlapping 2.3456 | sliding 2.3012 |
  elapsed 12s'; `losses`: each protocol's mean loss (None: not applicable)."""
  lengths = record["lengths"]
  parts = [
    f"extrapolate: length {lengths[at]} ({at + 1} of {len(lengths)}, {record['factors'][at]}x)"
  ]
  if not record["applicable"][at]:
    parts.append(f"n/a ({record['reason'][at]})")
  else:
    parts += [f"{protocol} {losses[protocol]:.4f}" for protocol in PROTOCOLS]
  parts.append(f"elapsed {format_duration(elapsed)}")
  return " | ".join(parts)


def _window_losses(
  model: Any,
  replica_params: list[Any],
  tokens_N: np.ndarray,
  length: int,
  stride: int,
  batch_tokens: int,
) -> dict[str, list[WindowLosses]]:
  """{protocol: each replica's WindowLosses} of `tokens_N` at `length`
  (`stride`: the sliding protocol's), its windows counted as they are
  scored (txf.progress)."""
  strides = {protocol: stride if protocol == "sliding" else None for protocol in PROTOCOLS}
  count = len(replica_params) * sum(
    len(windows(len(tokens_N), seq_len=length, protocol=p, stride=strides[p])[0]) for p in PROTOCOLS
  )
  with Progress(f"extrapolate: length {length}", count, unit="windows") as scored:
    return {
      protocol: [
        window_losses(
          model,
          params,
          tokens_N[None],
          seq_len=length,
          protocol=protocol,
          stride=strides[protocol],
          batch_size=max(batch_tokens // length, 1),
          on_windows=scored.advance,
        )
        for params in replica_params
      ]
      for protocol in PROTOCOLS
    }


def _losses(
  run: TrainedRun,
  tokens_N: np.ndarray,
  record: dict[str, Any],
  batch_tokens: int,
  log: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
  """The record's "loss", "replica_loss", "scored_tokens" and "per_position":
  both protocols at each applicable length of `record`, for every replica
  of the run; "loss" and "per_position" are the replicas' means."""
  replica_loss: dict[str, list[Any]] = {protocol: [] for protocol in PROTOCOLS}
  scored: dict[str, list[Any]] = {protocol: [] for protocol in PROTOCOLS}
  per_position = None
  replica_params = [run.setup.replica_params(run.params, r) for r in range(run.setup.run.replicas)]
  began = time.perf_counter()
  for at, (length, stride, applicable) in enumerate(
    zip(record["lengths"], record["stride"], record["applicable"])
  ):
    by_protocol = (
      _window_losses(run.setup.model, replica_params, tokens_N, length, stride, batch_tokens)
      if applicable
      else dict.fromkeys(PROTOCOLS)
    )
    for protocol in PROTOCOLS:
      results = by_protocol[protocol]
      replica_loss[protocol].append(
        None if results is None else [result.mean_loss for result in results]
      )
      scored[protocol].append(None if results is None else results[0].num_scored)
      if results is not None and protocol == "non_overlapping":  # the longest length's last
        # Every replica scores the same positions: null where none is scored,
        # NaN where a replica's loss is.
        mean_loss = np.mean([result.per_position_loss() for result in results], axis=0)
        scored_T = np.bincount(
          results[0].position_BxN[results[0].position_BxN >= 0], minlength=length
        )
        per_position = {
          "length": length,
          "loss": [float(v) if n else None for v, n in zip(mean_loss, scored_T)],
        }
    if log is not None:
      means = {
        protocol: None if by_length[at] is None else float(np.mean(by_length[at]))
        for protocol, by_length in replica_loss.items()
      }
      log(format_length_progress(at, record, means, time.perf_counter() - began))
  loss = {
    protocol: [None if values is None else float(np.mean(values)) for values in by_length]
    for protocol, by_length in replica_loss.items()
  }
  return {
    "loss": loss,
    "replica_loss": replica_loss,
    "scored_tokens": scored,
    "per_position": per_position,
  }


def _figures(record: dict[str, Any]) -> dict[str, bytes]:
  """{name: PNG}: extrapolation.png (loss vs length per protocol, log x) and
  per_position_loss.png (loss vs window position at the longest applicable length)."""
  # Loads matplotlib: only when the plots are drawn.
  from txf.analysis.plots import line_plot_figure, png_bytes

  kept = [at for at, applicable in enumerate(record["applicable"]) if applicable]
  lengths = np.array([record["lengths"][at] for at in kept])
  ylabel = f"validation loss ({LOSS_UNITS})"
  train_length = record["train_length"]
  by_length = line_plot_figure(
    {
      protocol.replace("_", "-") + " windows": (
        lengths,
        np.array([record["loss"][protocol][at] for at in kept], np.float64),
      )
      for protocol in PROTOCOLS
    },
    title=f"Length extrapolation (training length {train_length}, step {record['step']})",
    xlabel="evaluation length (tokens)",
    ylabel=ylabel,
    logx=True,
  )
  per_position = record["per_position"]
  length = per_position["length"]
  by_position = line_plot_figure(
    {
      f"non-overlapping windows of {length} tokens": (
        np.arange(length),
        np.array(per_position["loss"], np.float64),
      )
    },
    title=f"Loss by token position at {length} tokens "
    f"({length // train_length}x the training length {train_length})",
    xlabel="position in the window (tokens from its start)",
    ylabel=ylabel,
  )
  return {EXTRAPOLATION_PNG: png_bytes(by_length), PER_POSITION_PNG: png_bytes(by_position)}


def format_table(record: dict[str, Any]) -> str:
  """The extrapolation record as a text table, one row per length."""
  lines = [
    f"step {record['step']}, training length {record['train_length']} tokens, "
    f"{record['num_tokens']} validation tokens; loss in {LOSS_UNITS}",
    f"{'length':>7} {'factor':>6} {'non-overlapping':>15} {'sliding':>9} {'stride':>6}",
  ]
  for at, length in enumerate(record["lengths"]):
    if not record["applicable"][at]:
      lines.append(
        f"{length:>7} {record['factors'][at]:>5}x {'n/a':>15} {'n/a':>9} {'':>6}  "
        f"({record['reason'][at]})"
      )
      continue
    lines.append(
      f"{length:>7} {record['factors'][at]:>5}x "
      f"{record['loss']['non_overlapping'][at]:>15.4f} "
      f"{record['loss']['sliding'][at]:>9.4f} {record['stride'][at]:>6}"
    )
  return "\n".join(lines)
