"""Tests for txf.analysis.extrapolation: window layouts and per-token losses
of the two protocols against a brute-force float64 reference that runs the
model once per scored token on exactly the context the protocol promises.

Tolerance: float32 logits from batched windows vs float64 log-softmax of the
same model's logits on single sequences: rtol 1e-5 (losses are ~ln 16 = 2.8).
"""

import functools

import jax
import numpy as np
import pytest

from txf import models
from txf.analysis.extrapolation import WindowLosses, window_losses, windows

T = 8  # evaluation length
N = 30  # tokens per stream: (N - 1 - T) = 21 is no multiple of strides 2 or 4
VOCAB = 16


def tiny_model(position="rope", **fields):
  cfg = dict(vocab_size=VOCAB, d_model=16, num_heads=2, num_layers=1, position=position, max_len=T)
  return models.build(cfg | fields)


@pytest.fixture(scope="module")
def tokens_BxN():
  return np.random.default_rng(0).integers(1, VOCAB, size=(2, N)).astype(np.int32)


@pytest.fixture(scope="module", params=["rope", "learned"])
def model_and_params(request, tokens_BxN):
  model = tiny_model(request.param)
  return model, model.init(jax.random.key(1), tokens_BxN[:, :T])["params"]


@functools.partial(jax.jit, static_argnums=0)
def logits_of(model, params, tokens_1xT):
  return model.apply({"params": params}, tokens_1xT, deterministic=True)


def reference_loss(model, params, context, target):
  """-log p(target | context) in float64, from the model run on `context` alone."""
  logits = np.asarray(logits_of(model, params, np.asarray(context)[None]), np.float64)[0, -1]
  shifted = logits - logits.max()
  return float(np.log(np.exp(shifted).sum()) - shifted[target])


def sliding_context_starts(num_tokens, seq_len, stride):
  """Token n -> the first token of the context it is scored with: that of the
  earliest window (starts 0, stride, 2 stride, ..., last one flush with the
  stream's end) holding n among its seq_len predicted tokens."""
  last = num_tokens - 1 - seq_len
  starts = list(range(0, last, stride)) + [last]
  return {n: next(s for s in starts if s < n <= s + seq_len) for n in range(1, num_tokens)}


def assert_matches_reference(result, model, params, tokens_BxN, context_start):
  """Every token n in `context_start` is scored from tokens[context_start[n]:n];
  no other token is scored."""
  B, num_tokens = tokens_BxN.shape
  expected_loss = np.full((B, num_tokens), np.nan)
  expected_position = np.full((B, num_tokens), -1)
  for b in range(B):
    for n, start in context_start.items():
      expected_loss[b, n] = reference_loss(model, params, tokens_BxN[b, start:n], tokens_BxN[b, n])
      expected_position[b, n] = n - start - 1
  np.testing.assert_array_equal(result.position_BxN, expected_position)
  np.testing.assert_allclose(result.loss_BxN, expected_loss, rtol=1e-5)
  assert result.num_scored == B * len(context_start)


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_non_overlapping_scores_disjoint_windows_of_t_plus_one_tokens(model_and_params, tokens_BxN):
  model, params = model_and_params
  result = window_losses(
    model, params, tokens_BxN, seq_len=T, protocol="non_overlapping", batch_size=2
  )
  # Windows [0, 9), [9, 18), [18, 27); tokens 27..29 are too few for a window.
  context_start = {n: (n // (T + 1)) * (T + 1) for n in range(N - N % (T + 1)) if n % (T + 1)}
  assert_matches_reference(result, model, params, tokens_BxN, context_start)


@pytest.mark.parametrize("stride", [1, 4, T])
def test_sliding_scores_each_token_once_with_its_windows_context(
  model_and_params, tokens_BxN, stride
):
  model, params = model_and_params
  calls = []
  result = window_losses(
    model,
    params,
    tokens_BxN,
    seq_len=T,
    protocol="sliding",
    stride=stride,
    batch_size=3,
    on_windows=calls.append,
  )
  assert_matches_reference(result, model, params, tokens_BxN, sliding_context_starts(N, T, stride))
  # Each model call reports its windows (the last may be short): all B x W in all.
  total = len(tokens_BxN) * len(windows(N, seq_len=T, protocol="sliding", stride=stride)[0])
  assert sum(calls) == total and calls[:-1] == [3] * (len(calls) - 1) and 0 < calls[-1] <= 3


def test_sliding_with_stride_one_gives_every_later_token_t_tokens_of_context(tokens_BxN):
  model = tiny_model()
  params = model.init(jax.random.key(2), tokens_BxN[:, :T])["params"]
  result = window_losses(model, params, tokens_BxN, seq_len=T, protocol="sliding", stride=1)
  assert np.all(result.position_BxN[:, T + 1 :] == T - 1)
  np.testing.assert_array_equal(
    result.position_BxN[:, : T + 1], np.broadcast_to(np.arange(-1, T), (2, T + 1))
  )


def test_per_position_loss_has_one_mean_per_position(model_and_params, tokens_BxN):
  model, params = model_and_params
  result = window_losses(model, params, tokens_BxN, seq_len=T, protocol="non_overlapping")
  per_position_T = result.per_position_loss()
  assert per_position_T.shape == (T,)
  # Window w's position t predicts token w (T + 1) + t + 1 of each stream.
  losses_BxWxT = result.loss_BxN[:, : 3 * (T + 1)].reshape(2, 3, T + 1)[:, :, 1:]
  np.testing.assert_allclose(per_position_T, losses_BxWxT.mean(axis=(0, 1)), rtol=1e-12)
  # Every window is whole, so each position holds equally many tokens.
  assert per_position_T.mean() == pytest.approx(result.mean_loss, rel=1e-12)
  assert result.mean_loss == pytest.approx(losses_BxWxT.mean(), rel=1e-12)


def test_per_position_loss_is_nan_where_nothing_was_scored():
  result = WindowLosses(
    loss_BxN=np.array([[np.nan, 1.0, 2.0, 4.0]]),
    position_BxN=np.array([[-1, 0, 1, 1]], np.int32),
    seq_len=3,
  )
  np.testing.assert_array_equal(result.per_position_loss(), [1.0, 3.0, np.nan])
  assert result.num_scored == 3 and result.mean_loss == pytest.approx(7 / 3, rel=1e-12)


def test_a_scored_token_whose_loss_is_nan_makes_the_mean_nan():
  """A model failing past some position: its NaN losses were left out of the
  mean (a finite loss over the healthy positions) and counted as scored."""
  result = WindowLosses(
    loss_BxN=np.array([[np.nan, 1.0, np.nan, 4.0]]),
    position_BxN=np.array([[-1, 0, 1, 1]], np.int32),
    seq_len=3,
  )
  assert result.num_scored == 3 and np.isnan(result.mean_loss)
  np.testing.assert_array_equal(result.per_position_loss(), [1.0, np.nan, np.nan])


@pytest.mark.parametrize("num_tokens", [9, 27, 35, 36])  # T + 1, 3(T + 1), 4(T + 1) - 1, 4(T + 1)
def test_non_overlapping_windows_hold_every_whole_window_of_the_stream(num_tokens):
  # A stream of exactly k windows lost its last one with a bound off by one
  # (N = 30 never lands on a multiple of T + 1 = 9).
  starts_W, first_W = windows(num_tokens, seq_len=8, protocol="non_overlapping")
  want, start = [], 0
  while start + 9 <= num_tokens:  # a window reads 8 tokens and scores the 9th's
    want.append(start)
    start += 9
  np.testing.assert_array_equal(starts_W, want)
  assert not first_W.any()


def test_windows_of_the_sliding_protocol_cover_the_stream():
  starts_W, first_W = windows(30, seq_len=8, protocol="sliding", stride=4)
  assert starts_W[-1] + 8 == 29  # the last window ends at the last token
  scored = np.concatenate([s + 1 + np.arange(f, 8) for s, f in zip(starts_W, first_W)])
  np.testing.assert_array_equal(scored, np.arange(1, 30))
  default_starts, _ = windows(30, seq_len=8, protocol="sliding")
  assert np.all(np.diff(default_starts)[:-1] == 4)  # stride None: seq_len // 2


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(protocol="overlapping"), "protocol must be one of"),
    (dict(protocol="sliding", stride=0), "stride: must be an integer >= 1"),
    (dict(protocol="sliding", stride=T + 1), f"stride must be at most seq_len={T}"),
    (dict(protocol="non_overlapping", stride=2), "stride: only the sliding protocol"),
    (dict(seq_len=N), f"tokens: a stream of {N} tokens holds no window"),
    (dict(seq_len=0), "seq_len: must be an integer >= 1"),
    (dict(batch_size=0), "batch_size: must be an integer >= 1"),
  ],
)
def test_bad_arguments_are_refused_naming_them(tokens_BxN, kwargs, message):
  model = tiny_model()
  arguments = dict(seq_len=T, protocol="non_overlapping") | kwargs
  with pytest.raises(ValueError, match=message):
    window_losses(model, {}, tokens_BxN, **arguments)


def test_models_that_cannot_be_scored_are_refused(tokens_BxN):
  learned = tiny_model("learned")
  params = learned.init(jax.random.key(4), tokens_BxN[:, :T])["params"]
  with pytest.raises(
    ValueError,
    match="model.max_len: a sequence of 16 positions is longer than the learned position table",
  ):
    window_losses(learned, params, tokens_BxN, seq_len=2 * T)
  encoder = tiny_model(family="encoder", head="mlm")
  with pytest.raises(ValueError, match="model must be a txf language model"):
    window_losses(encoder, {}, tokens_BxN, seq_len=T)
  with pytest.raises(ValueError, match=r"tokens_BxN must be an int \[B, N\] array"):
    window_losses(tiny_model(), {}, tokens_BxN[0], seq_len=T)
