"""Tests for txf.ops.linear_attention against float64 numpy references.

The causal case is checked against the recurrence linear attention is (a
fixed-size state per head, Katharopoulos et al. 2020, eq. 16-20), computed
step by step; masks, windows and key lengths against the weights formula.
Tolerances: float32 inputs vs float64: atol = rtol = 2e-5 (weights and
outputs are O(1)).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops import apply_attention_weights, attention_weights, linear_attention_weights

F32_TOL = dict(atol=2e-5, rtol=2e-5)
B, T, S, H, K, D = 2, 6, 6, 4, 2, 8


def elu1(x):
  return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def recurrent_outputs(q_BxTxHxD, k_BxTxKxD, v_BxTxKxD):
  """Causal linear attention as a recurrence: the state S_t [D, Dv] and
  normaliser z_t [D] per head accumulate phi(k_t) v_t^T and phi(k_t)."""
  q, k, v = (np.asarray(a, np.float64) for a in (q_BxTxHxD, k_BxTxKxD, v_BxTxKxD))
  out = np.zeros(q.shape[:3] + v.shape[-1:])
  for b in range(q.shape[0]):
    for h in range(q.shape[2]):
      g = h // (q.shape[2] // k.shape[2])
      state, normaliser = np.zeros((k.shape[-1], v.shape[-1])), np.zeros(k.shape[-1])
      for t in range(q.shape[1]):
        state += np.outer(elu1(k[b, t, g]), v[b, t, g])
        normaliser += elu1(k[b, t, g])
        phi_q = elu1(q[b, t, h])
        out[b, t, h] = phi_q @ state / (phi_q @ normaliser)
  return out


def random_qkv(seed, s_len=S):
  keys = jax.random.split(jax.random.key(seed), 3)
  q = jax.random.normal(keys[0], (B, T, H, D))
  k = jax.random.normal(keys[1], (B, s_len, K, D))
  v = jax.random.normal(keys[2], (B, s_len, K, D))
  return q, k, v


def test_causal_linear_attention_is_the_recurrence():
  q, k, v = random_qkv(0)
  weights = linear_attention_weights(q, k, is_causal=True)
  out = apply_attention_weights(weights, v)
  np.testing.assert_allclose(out, recurrent_outputs(q, k, v), **F32_TOL)
  # Not softmax attention's weights: the option changes the outcome.
  softmax = attention_weights(q, k, is_causal=True)
  assert float(jnp.abs(weights - softmax).max()) > 0.05


@pytest.mark.parametrize("centre", [-14.0, -30.0])
def test_strongly_negative_features_keep_their_weights_and_a_finite_gradient(centre):
  """Query features all near `centre`: phi as elu's expm1(x) + 1 cancelled
  in float32 (weights 1e-3 off at -14; rows of allowed keys all zeros from
  about -17). Weights relative 1e-5 of the float64 formula; the gradient
  finite where the branch not taken overflows."""
  q, k, _ = random_qkv(4)
  q = q * 0.5 + centre
  weights = linear_attention_weights(q, k, is_causal=True)
  q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
  scores = np.einsum("bthd,bshd->bhts", elu1(q64), elu1(np.repeat(k64, H // K, axis=2)))
  scores = np.where(np.tril(np.ones((T, S), bool)), scores, 0.0)
  np.testing.assert_allclose(weights, scores / scores.sum(-1, keepdims=True), rtol=1e-5, atol=0)
  # Keys past 89, where exp overflows float32, on the branch not taken.
  weights_of_k = lambda k: linear_attention_weights(q, k, is_causal=True)[..., 0].sum()
  assert np.isfinite(np.asarray(jax.grad(weights_of_k)(k * 50.0))).all()


def test_masks_window_and_key_lengths_match_the_formula():
  q, k, _ = random_qkv(1, s_len=7)
  mask = np.ones((B, 1, T, 7), bool)
  mask[0, 0, 2, 3] = False
  window, kv_lengths = 3, np.array([7, 2])
  weights = linear_attention_weights(q, k, mask=mask, window=window, kv_lengths=kv_lengths)
  q64, k64 = np.asarray(q, np.float64), np.asarray(k, np.float64)
  expected = np.zeros((B, H, T, 7))
  for b in range(B):
    for h in range(H):
      for t in range(T):
        allowed = [
          s for s in range(7) if mask[b, 0, t, s] and abs(t - s) < window and s < kv_lengths[b]
        ]
        scores = {s: elu1(q64[b, t, h]) @ elu1(k64[b, s, h // (H // K)]) for s in allowed}
        for s, score in scores.items():
          expected[b, h, t, s] = score / sum(scores.values())
  np.testing.assert_allclose(weights, expected, **F32_TOL)
  # Row 1's queries from position 4 on see no key (window 3, 2 keys): zeros.
  assert float(jnp.abs(weights[1, :, 4:]).max()) == 0.0
  np.testing.assert_allclose(weights[0].sum(-1), np.ones((H, T)), **F32_TOL)


def test_bad_inputs_are_rejected_as_softmax_attention_rejects_them():
  q, k, _ = random_qkv(2)
  with pytest.raises(ValueError, match=r"H=4.*K=3"):
    linear_attention_weights(q, jnp.zeros((B, S, 3, D)))
  with pytest.raises(ValueError, match="mask must be boolean"):
    linear_attention_weights(q, k, mask=jnp.ones((B, 1, T, S)))
  # A string flag read as True (it was not checked here).
  with pytest.raises(ValueError, match="is_causal must be a python bool, got 'yes'"):
    linear_attention_weights(q, k, is_causal="yes")
