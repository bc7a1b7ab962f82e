"""Linear attention's weights (Katharopoulos et al. 2020, "Transformers are RNNs").

For every batch row b, query head h, query position t and allowed key s::

    weights[b, h, t, s] = phi(q[b, t, h]) . phi(k[b, s, h // G])
                          / sum_{s' allowed} phi(q[b, t, h]) . phi(k[b, s', h // G])
    phi(x) = elu(x) + 1   (elementwise, > 0)

and the output mixes values by them as softmax attention's do
(`txf.ops.apply_attention_weights`). Shapes, GQA grouping and the mask sources
(`mask`, `is_causal`, `window`, `kv_lengths`, ANDed) are those of
`txf.ops.attention`. A query with no allowed key gets all-zero weights.

Under a causal mask this is a recurrence with a fixed-size state per head: with
S_t = sum_{s<=t} phi(k_s) v_s^T [D, Dv] and z_t = sum_{s<=t} phi(k_s) [D],
out_t = phi(q_t)^T S_t / phi(q_t)^T z_t. Zoology (Arora et al. 2023) puts such
models' recall limit on that state. Here the weights are computed in their
quadratic form (every [T, S] product, as softmax attention's XLA path), which
gives the recurrence's outputs exactly up to rounding, so a model can record,
ablate and decode them as softmax attention's; its memory grows as T * S.
There is no scale: a factor on q.k cancels in the normalisation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from txf.ops.attention import _combined_mask, _grouped_queries, _validate

__all__ = ["linear_attention_weights"]


def elu_feature_map(x: jax.Array) -> jax.Array:
  """phi(x) = elu(x) + 1 in float32: positive, so every allowed weight is > 0
  (for features above float32's exp underflow, about -87).

  Below 0 it is exp(x), not elu's expm1(x) + 1: that sum cancels, off by
  1e-3 relative at x = -14 and exactly 0 from about -17 on, where rows of
  allowed keys came out all zeros. The minimum keeps the branch not taken
  finite, so that its gradient does not poison the one taken."""
  x = x.astype(jnp.float32)
  return jnp.where(x > 0, x + 1.0, jnp.exp(jnp.minimum(x, 0.0)))


def linear_attention_weights(
  q, k, *, mask=None, is_causal=False, window=None, kv_lengths=None
) -> jax.Array:
  """Linear attention's weights, float32 ``[B, H, T, S]`` (formula: module docstring).

  Args:
    q: ``[B, T, H, D]`` queries.
    k: ``[B, S, K, D]`` keys, ``H % K == 0``; finite (a non-finite key poisons
      the gradient even where masked).
    mask: optional bool, broadcastable to ``[B, H, T, S]``; True = may attend.
    is_causal: key ``j`` allowed for query ``i`` iff ``j <= i``.
    window: optional int ``>= 1``; key ``j`` allowed iff ``|i - j| < window``.
    kv_lengths: optional int ``[B]``; only keys ``j < kv_lengths[b]`` are valid.

  Returns:
    float32 ``[B, H, T, S]``; each row sums to 1, or is all zeros where no key
    is allowed.

  Raises:
    ValueError: as `txf.ops.attention_weights` for shapes, dtypes and masks.
  """
  q, k = jnp.asarray(q), jnp.asarray(k)
  _, mask, kv_lengths, window = _validate(q, k, None, None, mask, kv_lengths, window, is_causal)
  B, T, H, _ = q.shape
  _, S, K, _ = k.shape
  scores_BxKxGxTxS = jnp.einsum(
    "btkgd,bskd->bkgts",
    elu_feature_map(_grouped_queries(q, K)),
    elu_feature_map(k),
  )
  scores_BxHxTxS = scores_BxKxGxTxS.reshape(B, H, T, S)
  valid = _combined_mask(mask, bool(is_causal), window, kv_lengths, T, S)
  if valid is not None:
    scores_BxHxTxS = jnp.where(valid, scores_BxHxTxS, 0.0)
  total_BxHxTx1 = jnp.sum(scores_BxHxTxS, axis=-1, keepdims=True)
  return scores_BxHxTxS / jnp.where(total_BxHxTx1 > 0, total_BxHxTx1, 1.0)
