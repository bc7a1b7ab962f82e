"""Length extrapolation: a causal LM's loss on long token streams, scored in
windows of a chosen evaluation length (Press et al. 2022, "Train Short, Test
Long").

A window of length T is T + 1 consecutive tokens of a stream: the model reads
the first T and predicts each of the last T from the tokens before it inside
the window. Token n of a stream is predicted at window position t (0..T-1)
with t + 1 tokens of context. Two protocols choose the windows:

  non_overlapping  the stream cut into consecutive windows of T + 1 tokens,
                   each scored in full; tokens after the last whole window
                   are dropped. These are the windows a training run's
                   evaluator sees at data.seq_len = T (txf.data.lm), so at
                   the training length the loss is the evaluator's.
  sliding          windows advance by `stride` tokens (1 <= stride <= T):
                   the first window scores all T of its tokens, every later
                   one only the tokens no earlier window scored, i.e. its last
                   `stride`, each then predicted from at least T - stride + 1
                   tokens of context (stride 1: every token after the first
                   window from T tokens). The last window ends at the
                   stream's end, so every token but the first is scored once.

`window_losses` runs the model over a batch of streams and returns every
scored token's loss with the window position it was predicted at;
`WindowLosses.mean_loss` and `.per_position_loss()` reduce them.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from txf import ops
from txf.checks import int_at_least
from txf.layers.model_config import FAMILIES, HEADS

PROTOCOLS = ("non_overlapping", "sliding")
# Evaluation lengths, as multiples of the training length, unless a caller names others.
DEFAULT_FACTORS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True)
class WindowLosses:
  """Per-token losses of streams scored in windows of `seq_len`.

  Attributes:
    loss_BxN: float64 [B, N]: the loss (nats) of predicting token n of
      stream b; NaN where the protocol scores no prediction (n = 0, and for
      non_overlapping each window's first token and the dropped tail).
    position_BxN: int32 [B, N]: the window position 0..seq_len-1 token n was
      predicted at (position + 1 tokens of context); -1 where not scored.
    seq_len: T, the window length.
  """

  loss_BxN: np.ndarray
  position_BxN: np.ndarray
  seq_len: int

  @property
  def num_scored(self) -> int:
    """Tokens scored."""
    return int(np.sum(self.position_BxN >= 0))

  @property
  def mean_loss(self) -> float:
    """Mean loss over the scored tokens (nats/token): NaN where one of them
    is (a model failing at this length says so; it was left out of the mean)."""
    return float(np.mean(self.loss_BxN[self.position_BxN >= 0]))

  def per_position_loss(self) -> np.ndarray:
    """float64 [T]: mean loss of the tokens predicted at each window
    position; NaN at a position where none was scored."""
    scored = self.position_BxN >= 0
    positions = self.position_BxN[scored]
    sums_T = np.bincount(positions, weights=self.loss_BxN[scored], minlength=self.seq_len)
    counts_T = np.bincount(positions, minlength=self.seq_len)
    with np.errstate(invalid="ignore", divide="ignore"):
      return np.where(counts_T > 0, sums_T / counts_T, np.nan)


def check_factors(factors: Sequence[int]) -> tuple[int, ...]:
  """`factors` as distinct positive ints in increasing order; ValueError otherwise."""
  factors = tuple(int_at_least(f, f"factors[{i}]", 1) for i, f in enumerate(factors))
  if not factors or list(factors) != sorted(set(factors)):
    raise ValueError(f"factors must be distinct positive ints in increasing order, got {factors}")
  return factors


def tokens_per_batch(batch_size: int, seq_len: int) -> int:
  """Validation tokens one evaluation batch of a text stream holds: its rows
  are windows of seq_len + 1 tokens that tile the stream (txf.data.lm)."""
  return batch_size * (seq_len + 1)


def check_num_tokens(
  num_tokens: int, seq_len: int, factors: Sequence[int] = DEFAULT_FACTORS
) -> None:
  """Raises ValueError unless `num_tokens` validation tokens hold one window
  at the largest factor: a sweep checks this before it trains anything."""
  longest = max(check_factors(factors)) * seq_len
  if num_tokens < longest + 1:
    raise ValueError(
      f"{num_tokens} validation tokens hold no window of {longest + 1} tokens "
      f"({max(factors)} x data.seq_len {seq_len}); give at least {longest + 1}"
    )


def default_stride(seq_len: int) -> int:
  """The sliding stride when none is given: half the window, so every token
  after the first window is predicted from at least T / 2 tokens."""
  return max(seq_len // 2, 1)


def windows(
  num_tokens: int, *, seq_len: int, protocol: str, stride: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """Where the protocol's windows lie in a stream of `num_tokens` tokens.

  Returns:
    (starts_W, first_W), int64 [W]: window w reads tokens starts_W[w] ..
    starts_W[w] + seq_len - 1 and scores its predictions at positions
    first_W[w] .. seq_len - 1 (of tokens starts_W[w] + first_W[w] + 1 ..
    starts_W[w] + seq_len).

  Raises:
    ValueError: naming the argument: an unknown protocol, a stride outside
      [1, seq_len] (or given for non_overlapping), or a stream shorter than
      one window (seq_len + 1 tokens).
  """
  seq_len = int_at_least(seq_len, "seq_len", 1)
  if protocol not in PROTOCOLS:
    raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
  if num_tokens < seq_len + 1:
    raise ValueError(
      f"tokens: a stream of {num_tokens} tokens holds no window of "
      f"seq_len + 1 = {seq_len + 1} tokens"
    )
  if protocol == "non_overlapping":
    if stride is not None:
      raise ValueError(f"stride: only the sliding protocol takes one, got {stride!r}")
    starts_W = np.arange(num_tokens // (seq_len + 1)) * (seq_len + 1)
    return starts_W, np.zeros_like(starts_W)
  stride = default_stride(seq_len) if stride is None else int_at_least(stride, "stride", 1)
  if stride > seq_len:
    raise ValueError(f"stride must be at most seq_len={seq_len}, got {stride}")
  last_start = num_tokens - 1 - seq_len
  starts_W = np.minimum(np.arange(1 + -(-last_start // stride)) * stride, last_start)
  # Each window scores what lies beyond the previous window's last target.
  first_W = np.concatenate([[0], starts_W[:-1] + seq_len - starts_W[1:]])
  return starts_W, first_W


@functools.partial(jax.jit, static_argnums=0)
def _token_losses(
  model: nn.Module, params: Any, inputs_BxT: jax.Array, targets_BxT: jax.Array
) -> jax.Array:
  """float32 [B, T]: the loss of each next-token prediction."""
  logits_BxTxV = model.apply({"params": params}, inputs_BxT, deterministic=True)
  return ops.token_cross_entropy(logits_BxTxV, targets_BxT)


def check_language_model(model: nn.Module) -> None:
  """Refuses a model the windows cannot score (ValueError): one that is not
  a txf language model, a model.family and a model.head of data.task 'lm'
  (txf's decoder and LSTM, or registered ones)."""
  cfg = getattr(model, "cfg", None)
  if cfg is None or not {"lm"} <= set(FAMILIES[cfg.family].tasks) & set(HEADS[cfg.head].tasks):
    got = type(model).__name__ if cfg is None else f"family {cfg.family!r}, head {cfg.head!r}"
    raise ValueError(
      "model must be a txf language model (a model.family and a model.head of "
      f"data.task 'lm', as 'decoder' or 'lstm' with 'lm'), got {got}"
    )


def window_losses(
  model: nn.Module,
  params: Any,
  tokens_BxN: Any,
  *,
  seq_len: int,
  protocol: str = "non_overlapping",
  stride: int | None = None,
  batch_size: int = 8,
  on_windows: Callable[[int], Any] | None = None,
) -> WindowLosses:
  """Scores each row of `tokens_BxN` as a token stream in windows of `seq_len`.

  Args:
    model: a txf decoder language model (`txf.models.build`).
    params: its parameters.
    tokens_BxN: int [B, N]: B independent token streams, N >= seq_len + 1.
    seq_len: T, the evaluation length: the most tokens the model reads at once.
    protocol: 'non_overlapping' or 'sliding' (module docstring).
    stride: sliding only: tokens each window advances, in [1, T]; None:
      `default_stride(T)`.
    batch_size: windows per model call (memory: the model's activations at
      batch_size x T tokens).
    on_windows: called with the number of windows each model call scored
      (B x the protocol's windows in all), e.g. a txf.progress.Progress's
      `advance`.

  Returns:
    The WindowLosses.

  Raises:
    ValueError: naming the argument, before any compute; a learned position
      table shorter than seq_len is refused by the model itself (naming
      model.max_len) when the first window is traced.
  """
  tokens_BxN = np.asarray(tokens_BxN)
  if tokens_BxN.ndim != 2 or not np.issubdtype(tokens_BxN.dtype, np.integer):
    raise ValueError(
      f"tokens_BxN must be an int [B, N] array, got {tokens_BxN.dtype} {tokens_BxN.shape}"
    )
  batch_size = int_at_least(batch_size, "batch_size", 1)
  B, N = tokens_BxN.shape
  starts_W, first_W = windows(N, seq_len=seq_len, protocol=protocol, stride=stride)
  check_language_model(model)

  # Every stream has the same windows: window w of row b is item b * W + w.
  rows_I = np.repeat(np.arange(B), len(starts_W))
  starts_I, first_I = np.tile(starts_W, B), np.tile(first_W, B)
  batch_size = min(batch_size, len(rows_I))
  offsets_T = np.arange(seq_len)
  loss_BxN = np.full((B, N), np.nan)
  position_BxN = np.full((B, N), -1, np.int32)
  for begin in range(0, len(rows_I), batch_size):
    items_b = np.arange(begin, min(begin + batch_size, len(rows_I)))
    # A short last batch is padded by repeating its windows: one shape, one compilation.
    padded_b = np.resize(items_b, batch_size)
    windows_bxT1 = tokens_BxN[
      rows_I[padded_b, None], starts_I[padded_b, None] + np.arange(seq_len + 1)
    ]
    losses_bxT = np.asarray(
      _token_losses(model, params, windows_bxT1[:, :-1], windows_bxT1[:, 1:]), np.float64
    )[: len(items_b)]
    scored_bxT = offsets_T >= first_I[items_b, None]
    # The S scored predictions: their stream (row), token (column) and position.
    rows_S = np.broadcast_to(rows_I[items_b, None], scored_bxT.shape)[scored_bxT]
    columns_S = (starts_I[items_b, None] + 1 + offsets_T)[scored_bxT]
    loss_BxN[rows_S, columns_S] = losses_bxT[scored_bxT]
    position_BxN[rows_S, columns_S] = np.broadcast_to(offsets_T, scored_bxT.shape)[scored_bxT]
    if on_windows is not None:
      on_windows(len(items_b))
  return WindowLosses(loss_BxN=loss_BxN, position_BxN=position_BxN, seq_len=seq_len)
