"""Model-level learning check (issue 12): a small decoder trained end to end on
in-context copying must land in a loss band measured from several seeds.

Each sequence is [a_1..a_n, a_1..a_n] of uniform random tokens. The second
copy is predictable only by attending back to the first, so the loss on it
measures the attention wiring; the first copy is unpredictable, so its loss
cannot fall below the entropy log(V - 1) without a leak from the future.
The period n never changes, so the model copies with fixed-offset
positional heads (attending n - 1 back), not an induction circuit: probed
at another period those heads score nothing (issue 23; the test below).
configs/induction.py, whose period varies, is where induction heads form.
"""

import functools

import jax
import ml_collections
import numpy as np
import pytest

from conftest import optimised
from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.head_scores import head_roles, induction_score, repeated_random_tokens
from txf.models import ModelConfig, build
from txf.runconfig.optim import make_optimizer
from txf.train.step import init_state, make_eval_step, make_train_step

VOCAB = 16  # tokens 1..15 (0 is the pad id, never drawn)
COPY_LEN = 12  # n
BATCH = 32
STEPS = 300
EVAL_ROWS = 256

# Held-out losses after STEPS, measured with this file's code for seeds 0..4
# on CPU (float32). Training weights every target; the two halves are scored
# apart. The second copy's loss still falls fast at STEPS, so seeds spread
# 4x: band [min / 1.5, max * 1.5], two-sided because several wiring bugs
# learn copying *faster*. The first copy's loss sits at its entropy
# log(15) = 2.708 and spreads little: band mean +- 4 std (ddof=1).
SECOND_COPY_SEEDS = (0.1987, 0.0706, 0.0688, 0.1177, 0.0538)
FIRST_COPY_SEEDS = (2.7601, 2.7583, 2.7488, 2.7764, 2.7409)
SECOND_COPY_BAND = (min(SECOND_COPY_SEEDS) / 1.5, max(SECOND_COPY_SEEDS) * 1.5)
FIRST_COPY_BAND = (
  np.mean(FIRST_COPY_SEEDS) - 4 * np.std(FIRST_COPY_SEEDS, ddof=1),
  np.mean(FIRST_COPY_SEEDS) + 4 * np.std(FIRST_COPY_SEEDS, ddof=1),
)


def copy_batch(rng: np.random.Generator, rows: int) -> dict:
  """LM batch of [a, a] sequences: inputs/targets [rows, 2n - 1], every target weighted."""
  a_RxN = rng.integers(1, VOCAB, size=(rows, COPY_LEN))
  seq_Rx2N = np.concatenate([a_RxN, a_RxN], axis=1)
  return {
    "inputs": seq_Rx2N[:, :-1].astype(np.int32),
    "targets": seq_Rx2N[:, 1:].astype(np.int32),
    "weights": np.ones((rows, 2 * COPY_LEN - 1), np.float32),
  }


def only_targets(batch: dict, first: int, stop: int) -> dict:
  """The batch with weight 1 on target positions [first, stop) only."""
  weights_RxT = np.zeros_like(batch["weights"])
  weights_RxT[:, first:stop] = 1.0
  return dict(batch, weights=weights_RxT)


def train_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
    dict(
      learning_rate=3e-3,
      warmup_steps=20,
      decay="constant",
      steps=STEPS,
      end_lr_fraction=0.1,
      weight_decay=0.0,
      b1=0.9,
      b2=0.98,
      eps=1e-9,
      grad_clip_norm=1.0,
    )
  )


def model_config() -> ModelConfig:
  # num_kv_heads=2 of 4 runs the GQA path; every switch the check relies on is explicit.
  return ModelConfig(
    family="decoder",
    vocab_size=VOCAB,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    position="rope",
    norm_placement="pre",
    tie_embeddings=True,
    max_len=2 * COPY_LEN,
  )


@functools.cache  # both tests read seed 0's run: trained once per process
def train(seed: int):
  """(model, trained state) after STEPS on copy batches."""
  model = build(model_config())
  optimizer = make_optimizer(train_config())
  rng = np.random.default_rng(seed)
  state = init_state(model, optimizer, copy_batch(rng, BATCH), "lm", jax.random.key(seed))
  step = jax.jit(make_train_step(model, optimizer, "lm", seed=seed), donate_argnums=0)
  step = optimised(step, state, copy_batch(np.random.default_rng(), BATCH))
  for _ in range(STEPS):
    state, _ = step(state, copy_batch(rng, BATCH))
  return model, state


def train_and_eval(seed: int) -> tuple[float, float]:
  """(second-copy loss, first-copy loss) on a held-out batch after STEPS."""
  model, state = train(seed)
  eval_step = jax.jit(make_eval_step(model, "lm"))
  held_out = copy_batch(np.random.default_rng(10_000 + seed), EVAL_ROWS)
  # Second copy: targets a_2..a_n (a_1 after a_n needs no induction).
  # First copy: targets a_2..a_n, independent of everything before them.
  losses = []
  for first, stop in ((COPY_LEN, 2 * COPY_LEN - 1), (0, COPY_LEN - 1)):
    sums = eval_step(state.params, only_targets(held_out, first, stop))
    losses.append(float(sums["loss_sum"] / sums["count"]))
  return losses[0], losses[1]


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_decoder_learns_copying_within_the_seed_bands():
  """Seed 0 of a 2-layer GQA decoder (RoPE, Pre-LN, tied logits) lands in both
  bands (second copy [0.036, 0.298], first copy [2.704, 2.810]).

  Planted bugs, seed 0 (second-copy loss, first-copy loss):
    RoPE on queries only              (2.466,  2.754)  caught: second copy
    residual dropped (Pre-LN block)   (0.022,  2.755)  caught: second copy, low
    Pre-LN norm on the output         (0.027,  2.736)  caught: second copy, low
    causal mask k < q (no self)       (0.027,  2.716)  caught: second copy, low
    attention 1/sqrt(d) scale dropped (0.306,  2.892)  caught: first copy
    tied logits without 1/sqrt(D)     (0.114,  2.940)  caught: first copy
    causal mask k <= q + 1 (leak)     (0.204,  0.012)  caught: first copy
    GQA groups tiled, not blocked     (0.052,  2.772)  NOT caught: a fixed
      permutation of query heads, an exact symmetry of training from scratch
      (tests/ops/test_ops_attention.py checks the grouping against a reference).
  The "low" catches and the no-scale one on the second copy are one seed's
  outcome, not a separation of distributions. About 10 s of CPU (user time).
  """
  second, first = train_and_eval(seed=0)
  assert SECOND_COPY_BAND[0] <= second <= SECOND_COPY_BAND[1], (second, SECOND_COPY_BAND)
  assert FIRST_COPY_BAND[0] <= first <= FIRST_COPY_BAND[1], (first, FIRST_COPY_BAND)


@pytest.mark.slow
def test_fixed_period_copying_heads_are_positional_not_induction():
  """The copying heads of seed 0 score as induction at the training period n
  only: probed at n and another period they are reported positional, and at
  two untrained periods no head is reported induction."""
  model, state = train(seed=0)
  scores = {}
  for period in (COPY_LEN, 7, 9):
    tokens = repeated_random_tokens(np.random.default_rng(period), 64, period, VOCAB, low=1)
    layers = maps_by_kind(attention_maps(model, state.params, tokens))["self"]
    scores[period] = np.stack([induction_score(weights, period) for weights in layers])
  previous_LxH = np.zeros_like(scores[COPY_LEN])
  at_training_period = head_roles(previous_LxH, {COPY_LEN: scores[COPY_LEN], 7: scores[7]})
  assert "positional" in set(at_training_period.ravel()), scores
  unseen = head_roles(previous_LxH, {7: scores[7], 9: scores[9]})
  assert "induction" not in set(unseen.ravel()), scores
