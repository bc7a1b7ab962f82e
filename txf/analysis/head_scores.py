"""Per-head attention scores, head ablation and score tables.

Every score takes attention weights `weights_BxHxTxS` (float, softmax rows over
the S keys; e.g. `txf.ops.attention_weights` or a model's sown intermediates)
and returns one float64 number per head, `[H]`, averaged over the batch and
the queries. A query row that sums to 0 (no allowed key, as
`txf.ops.attention_weights` returns it) and a query that `query_mask` marks
False (padding) take no part in the average. The functions are numpy: they
run on host arrays after the model has run, so they accept numpy or jax
arrays and are not meant to be jitted.

  previous_token_score    attention from t to t - 1
  induction_score         attention from t to t - period + 1 on a repeated
                          random sequence (Olsson et al. 2022)
  head_roles              previous-token, induction or positional, from scores
                          at two or more probe periods (a fixed-offset head
                          scores like an induction head at one period)
  attention_entropy       entropy of each query's row, in nats
  mean_attended_distance  expected |t - s| under each query's row

Scores of a model are collected as `name -> [L, H]` arrays (one row per
layer) and written with `head_scores_table` (markdown) or
`write_head_scores_csv`. `head_ablation` measures the loss change of zeroing
one head at a time through a caller-supplied `loss_fn(head_mask_LxH)`;
`group_mask` zeroes a set of heads together (redundant heads hide from
single-head ablation).
"""

from __future__ import annotations

import csv
import io
import itertools
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from etils import epath

from txf.checks import int_at_least

# Row sums of weights computed in bfloat16 stray from 1 by up to ~1e-2.
_ROW_SUM_ATOL = 2e-2


def _check_weights(weights: Any, name: str = "weights") -> np.ndarray:
  """`weights` as float64 `[B, H, T, S]`; ValueError unless they look like softmax rows."""
  array = np.asarray(weights)
  if array.ndim != 4:
    raise ValueError(f"{name} must be [B, H, T, S], got shape {array.shape}")
  if not jnp.issubdtype(array.dtype, jnp.floating):  # numpy's says no to bfloat16
    raise ValueError(f"{name} must be a float array, got dtype {array.dtype}")
  if 0 in array.shape:
    raise ValueError(f"{name} must not be empty, got shape {array.shape}")
  array = array.astype(np.float64)
  if not np.all(np.isfinite(array)) or np.any(array < 0):
    raise ValueError(f"{name} must be finite and >= 0 (softmax weights, not logits)")
  sums_BxHxT = array.sum(axis=-1)
  if not np.all((np.abs(sums_BxHxT - 1) <= _ROW_SUM_ATOL) | (sums_BxHxT <= _ROW_SUM_ATOL)):
    worst = sums_BxHxT.flat[np.argmax(np.minimum(np.abs(sums_BxHxT - 1), sums_BxHxT))]
    raise ValueError(
      f"{name} rows must sum to 1 over the keys (or 0 for a query with no "
      f"allowed key), found a row summing to {worst:.4g}"
    )
  return array


def _check_square(weights_BxHxTxS: np.ndarray, name: str = "weights") -> None:
  """ValueError unless queries and keys are the same sequence (T == S)."""
  _, _, T, S = weights_BxHxTxS.shape
  if T != S:
    raise ValueError(
      f"{name} must be self-attention [B, H, T, T], got T={T} queries and S={S} keys"
    )


def _valid_queries(weights_BxHxTxS: np.ndarray, query_mask: Any) -> np.ndarray:
  """float 0/1 `[B, H, T]`: the queries that enter a score's average."""
  B, H, T, _ = weights_BxHxTxS.shape
  valid_BxHxT = weights_BxHxTxS.sum(axis=-1) > _ROW_SUM_ATOL
  if query_mask is not None:
    mask = np.asarray(query_mask)
    if mask.dtype != bool or mask.shape != (B, T):
      raise ValueError(f"query_mask must be bool [B, T] = {(B, T)}, got {mask.dtype} {mask.shape}")
    valid_BxHxT &= mask[:, None, :]
  return valid_BxHxT.astype(np.float64)


def _mean_over_queries(values_BxHxT: np.ndarray, valid_BxHxT: np.ndarray) -> np.ndarray:
  """`[H]`: the mean of `values` over the batch and the valid queries of each head."""
  counts_H = valid_BxHxT.sum(axis=(0, 2))
  if np.any(counts_H == 0):
    raise ValueError("no valid query to average over (every query is masked or has no allowed key)")
  return (values_BxHxT * valid_BxHxT).sum(axis=(0, 2)) / counts_H


def _diagonal_mean(
  weights_BxHxTxT: np.ndarray, offset: int, first_query: int, valid_BxHxT: np.ndarray
) -> np.ndarray:
  """`[H]`: mean weight from query t to key t - offset, over queries t >= first_query."""
  T = weights_BxHxTxT.shape[-1]
  queries = np.arange(first_query, T)
  on_diagonal_BxHxQ = weights_BxHxTxT[:, :, queries, queries - offset]
  return _mean_over_queries(on_diagonal_BxHxQ, valid_BxHxT[:, :, first_query:])


def previous_token_score(weights_BxHxTxT: Any, *, query_mask: Any = None) -> np.ndarray:
  """Mean attention from each position t to t - 1, over queries t >= 1.

  A previous-token head scores 1; uniform causal attention scores the mean of
  1 / (t + 1).

  Args:
    weights_BxHxTxT: self-attention weights `[B, H, T, T]`, T >= 2.
    query_mask: optional bool `[B, T]`, False for queries to leave out (padding).

  Returns:
    float64 `[H]` in [0, 1].
  """
  weights = _check_weights(weights_BxHxTxT, "weights_BxHxTxT")
  _check_square(weights, "weights_BxHxTxT")
  if weights.shape[-1] < 2:
    raise ValueError(
      f"weights_BxHxTxT needs T >= 2 for a previous token, got T={weights.shape[-1]}"
    )
  return _diagonal_mean(weights, 1, 1, _valid_queries(weights, query_mask))


def induction_score(weights_BxHxTxT: Any, period: int) -> np.ndarray:
  """Mean attention to the token after the previous occurrence (Olsson et al. 2022).

  The weights come from sequences that repeat with period `period`
  (tokens[t] == tokens[t - period], e.g. `repeated_random_tokens`). An
  induction head at a query t >= period attends to t - period + 1: the token
  that followed the previous occurrence of tokens[t], which is the one to
  predict next. The score is that weight averaged over the queries
  t in [period, T); 1 for a perfect induction head, about 1 / T for uniform
  attention.

  Args:
    weights_BxHxTxT: self-attention weights `[B, H, T, T]`, T > period.
    period: the length of the repeated block, >= 1.

  Returns:
    float64 `[H]` in [0, 1].
  """
  weights = _check_weights(weights_BxHxTxT, "weights_BxHxTxT")
  _check_square(weights, "weights_BxHxTxT")
  T = weights.shape[-1]
  if int_at_least(period, "period", 1) >= T:
    raise ValueError(f"period must be < T={T} (the weights need a second occurrence), got {period}")
  return _diagonal_mean(weights, period - 1, period, _valid_queries(weights, None))


def repeated_random_tokens(
  rng: np.random.Generator,
  batch: int,
  period: int,
  vocab_size: int,
  *,
  low: int = 4,
  ids: Any = None,
) -> np.ndarray:
  """Inputs for `induction_score`: a random block of `period` tokens, twice.

  The tokens of one block are distinct (drawn without replacement from
  `ids`, or else from [low, vocab_size)), so each token's previous
  occurrence, and the token after it, is unambiguous.

  Args:
    rng: numpy generator (e.g. `np.random.default_rng(seed)`).
    batch: number of sequences, >= 1.
    period: block length, >= 1.
    vocab_size: ids are < vocab_size.
    low: smallest id drawn; the default 4 skips pad, bos, eos and the byte
      tokenizer's mask id (`txf.data.tokenizers`).
    ids: optional int array of the ids to draw from, e.g. the model's own
      token distribution (`in_distribution_ids`), all in [0, vocab_size);
      then `low` is not used.

  Returns:
    int32 `[batch, 2 * period]`, row[t] == row[t + period].
  """
  batch, period = int_at_least(batch, "batch", 1), int_at_least(period, "period", 1)
  low, vocab_size = int_at_least(low, "low", 0), int_at_least(vocab_size, "vocab_size", 1)
  if ids is None:
    pool = np.arange(low, vocab_size)
    where = f"vocab_size - low = {vocab_size} - {low}"
  else:
    pool = np.unique(np.asarray(ids))
    if pool.size and (pool[0] < 0 or pool[-1] >= vocab_size):
      raise ValueError(f"ids must lie in [0, vocab_size={vocab_size}), got {pool[0]}..{pool[-1]}")
    where = f"len(ids) = {pool.size}"
  if pool.size < period:
    raise ValueError(f"{where} must be >= period={period} to draw a block of distinct tokens")
  blocks = [rng.choice(pool, size=period, replace=False) for _ in range(batch)]
  return np.tile(np.stack(blocks), (1, 2)).astype(np.int32)


def induction_probe(seed: int, batch: int, period: int, vocab_size: int, ids: Any) -> np.ndarray:
  """int [batch, 2 * period]: the induction probe at `period`, drawn by a
  generator of its own seeded `seed` (`repeated_random_tokens` of `ids`):
  each period's blocks are the same whichever other periods are probed, so
  txf-analyze and the heads experiment score one run on the same inputs."""
  return repeated_random_tokens(np.random.default_rng(seed), batch, period, vocab_size, ids=ids)


def in_distribution_ids(tokens: Any, special_ids: Any) -> np.ndarray:
  """The distinct ids that occur in `tokens` (e.g. a run's validation inputs),
  minus `special_ids` (pad, bos, ...): the ids an induction probe may draw
  without leaving the model's training distribution.

  Returns:
    int64 `[N]`, sorted.
  """
  return np.setdiff1d(np.unique(np.asarray(tokens)), np.asarray(list(special_ids)))


def probe_periods(length: int, num_ids: int, seen_periods: Any = (), count: int = 2) -> list[int]:
  """The `count` longest induction-probe periods that fit and were not trained on.

  A period P fits when two blocks fit `length` positions (2 P <= length) and
  a block of distinct ids fits `num_ids`. Periods in `seen_periods` (those
  the training data repeats with) are skipped: at a trained period a
  fixed-offset positional head scores like an induction head.

  Returns:
    `count` ints, longest first; ValueError if fewer fit.
  """
  seen = set(seen_periods)
  fitting = range(min(length // 2, num_ids), 0, -1)
  periods = [period for period in fitting if period not in seen and period > 1][:count]
  if len(periods) < count:
    longest = min(length // 2, num_ids)
    raise ValueError(
      f"only {len(periods)} induction-probe periods in 2..{longest} "
      f"(two blocks in {length} positions, {num_ids} distinct ids) avoid the "
      f"training periods {sorted(seen)}; {count} are needed"
    )
  return periods


def head_roles(
  previous_LxH: Any, induction_by_period: Mapping[int, Any], *, threshold: float = 0.5
) -> np.ndarray:
  """What each head does, from its scores: object `[L, H]` of str.

  'previous_token' if its previous-token score is >= threshold; 'induction'
  if its induction score is >= threshold at every probe period (it follows
  content); 'positional' if it is >= threshold at some probe period and
  below threshold / 2 at another (it attends a fixed offset, which matches
  the induction target at one period and collapses at the others: a head
  just under the threshold at one period still follows content, and is
  neither); '' if none. Several roles are joined with '+'.

  Args:
    previous_LxH: previous-token scores `[L, H]`.
    induction_by_period: probe period -> induction scores `[L, H]`, at least two
      periods (one cannot tell a fixed offset from a content match).
    threshold: score above which a head counts as doing the thing.
  """
  if len(induction_by_period) < 2:
    raise ValueError(
      "induction_by_period needs scores at two or more probe periods, got "
      f"{sorted(induction_by_period)}"
    )
  induction_PxLxH = np.stack(
    [np.asarray(scores, np.float64) for scores in induction_by_period.values()]
  )
  previous_LxH = np.asarray(previous_LxH, np.float64)
  labels = [
    (previous_LxH >= threshold, "previous_token"),
    (np.all(induction_PxLxH >= threshold, axis=0), "induction"),
    (
      np.any(induction_PxLxH >= threshold, axis=0)
      & np.any(induction_PxLxH < threshold / 2, axis=0),
      "positional",
    ),
  ]
  roles = np.empty(previous_LxH.shape, object)
  for index in np.ndindex(previous_LxH.shape):
    roles[index] = "+".join(name for is_role, name in labels if is_role[index])
  return roles


def attention_entropy(weights_BxHxTxS: Any, *, query_mask: Any = None) -> np.ndarray:
  """Mean entropy -sum_s w log w of the query rows, in nats.

  Keys with weight 0 (masked) contribute 0 (0 log 0 = 0), so a row spread
  evenly over n allowed keys has entropy log(n) and a row on one key has 0.

  Args:
    weights_BxHxTxS: attention weights `[B, H, T, S]` (self or cross).
    query_mask: optional bool `[B, T]`, False for queries to leave out (padding).

  Returns:
    float64 `[H]`, >= 0.
  """
  weights = _check_weights(weights_BxHxTxS, "weights_BxHxTxS")
  # log of 1 where w == 0 keeps 0 * log 0 out of the sum (no NaN, no warning).
  log_weights = np.log(np.where(weights > 0, weights, 1.0))
  entropy_BxHxT = -(weights * log_weights).sum(axis=-1)
  return _mean_over_queries(entropy_BxHxT, _valid_queries(weights, query_mask))


def mean_attended_distance(weights_BxHxTxS: Any, *, query_mask: Any = None) -> np.ndarray:
  """Mean over queries of the expected distance sum_s w[t, s] * |t - s|.

  Positions are the array indices: query t is at position t and key s at
  position s. For self-attention that is the token distance. For
  cross-attention (T != S allowed) it is the distance between the target
  index and the source index, meaningful where the two are aligned
  (copying, monotone translation); note that uniform attention then still
  scores about S / 3, not 0.

  Args:
    weights_BxHxTxS: attention weights `[B, H, T, S]`.
    query_mask: optional bool `[B, T]`, False for queries to leave out (padding).

  Returns:
    float64 `[H]`, in positions (>= 0).
  """
  weights = _check_weights(weights_BxHxTxS, "weights_BxHxTxS")
  _, _, T, S = weights.shape
  distance_TxS = np.abs(np.arange(T)[:, None] - np.arange(S)[None, :]).astype(np.float64)
  distance_BxHxT = (weights * distance_TxS).sum(axis=-1)
  return _mean_over_queries(distance_BxHxT, _valid_queries(weights, query_mask))


def head_ablation(
  loss_fn: Callable[[np.ndarray], Any],
  num_layers: int,
  num_heads: int,
  *,
  progress: Callable[[int, int, float], Any] | None = None,
) -> np.ndarray:
  """Loss change from zeroing each head's output, one head at a time.

  Calls `loss_fn` 1 + L * H times: once with every head on (the baseline),
  then once per head (l, h) with a mask that is 0 at (l, h) and 1 elsewhere.
  The model-side meaning of the mask (multiplying head outputs before the
  output projection) is `loss_fn`'s; it should evaluate the same batches
  every call so the deltas measure the head, not the data.

  Args:
    loss_fn: `head_mask_LxH` (float32 numpy `[L, H]` of 0/1) -> scalar loss.
    num_layers: L, >= 1.
    num_heads: H, >= 1.
    progress: called as `progress(l, h, delta)` once head (l, h) is done.

  Returns:
    float64 `[L, H]`: loss with head (l, h) zeroed minus the baseline loss
    (positive: the head helps).
  """
  num_layers = int_at_least(num_layers, "num_layers", 1)
  num_heads = int_at_least(num_heads, "num_heads", 1)
  all_on_LxH = np.ones((num_layers, num_heads), np.float32)
  baseline = float(loss_fn(all_on_LxH.copy()))
  deltas_LxH = np.empty((num_layers, num_heads), np.float64)
  for layer, head in itertools.product(range(num_layers), range(num_heads)):
    mask_LxH = all_on_LxH.copy()
    mask_LxH[layer, head] = 0
    deltas_LxH[layer, head] = float(loss_fn(mask_LxH)) - baseline
    if progress is not None:
      progress(layer, head, deltas_LxH[layer, head])
  return deltas_LxH


def group_mask(heads: Any, num_layers: int, num_heads: int) -> np.ndarray:
  """float32 `[L, H]` head mask: 0 at each (layer, head) of `heads`, 1 elsewhere."""
  mask_LxH = np.ones(
    (int_at_least(num_layers, "num_layers", 1), int_at_least(num_heads, "num_heads", 1)), np.float32
  )
  for layer, head in heads:
    if not (0 <= layer < num_layers and 0 <= head < num_heads):
      raise ValueError(
        f"head L{layer}H{head} is not in the model's {num_layers} layers x {num_heads} heads"
      )
    mask_LxH[layer, head] = 0
  return mask_LxH


def head_score_rows(scores: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
  """Header and rows (layer, head, one float per score) of `name -> [L, H]` scores."""
  if not scores:
    raise ValueError("scores must hold at least one name -> [L, H] array")
  arrays = {name: np.asarray(values, np.float64) for name, values in scores.items()}
  shape = next(iter(arrays.values())).shape
  for name, array in arrays.items():
    if array.ndim != 2 or array.shape != shape:
      raise ValueError(
        f"scores[{name!r}] must be [L, H] like the first score {shape}, got {array.shape}"
      )
  header = ["layer", "head", *arrays]
  rows = [
    [layer, head, *(float(array[layer, head]) for array in arrays.values())]
    for layer, head in itertools.product(range(shape[0]), range(shape[1]))
  ]
  return header, rows


def head_scores_table(scores: Mapping[str, Any]) -> str:
  """A markdown table with one row per (layer, head) and one column per score.

  Args:
    scores: name -> `[L, H]` array (all the same shape), e.g.
      {'previous_token': ..., 'induction': ..., 'loss_delta': ...}.

  Returns:
    The table, 4 significant digits (NaN, a score that does not apply, as
    'n/a'), ending in a newline.
  """
  header, rows = head_score_rows(scores)
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for layer, head, *values in rows:
    cells = [
      str(layer),
      str(head),
      *("n/a" if np.isnan(value) else f"{value:.4g}" for value in values),
    ]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def write_head_scores_csv(scores: Mapping[str, Any], path: str | os.PathLike) -> epath.Path:
  """Writes `scores` (as `head_scores_table`) to a CSV file at full precision.

  Args:
    scores: name -> `[L, H]` array (all the same shape).
    path: the file (local or `gs://`); parent directories are created.

  Returns:
    The path written.
  """
  header, rows = head_score_rows(scores)
  text = io.StringIO()
  writer = csv.writer(text, lineterminator="\n")
  writer.writerow(header)
  writer.writerows(
    [layer, head, *(repr(value) for value in values)] for layer, head, *values in rows
  )
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text.getvalue())
  return path
