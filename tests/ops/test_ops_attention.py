"""Tests for txf.ops.attention against an independent float64 numpy reference.

Tolerances: float32 inputs vs the float64 reference: atol = rtol = 2e-5 (weights
and outputs are O(1)). bfloat16 vs float32: atol = 3e-2 (bf16 has an 8-bit
mantissa, relative step 2^-8 ~ 4e-3, and rounding of q, k, v and of the
weights compounds). Gradients vs a jnp float32 reference: atol = rtol = 1e-4.
"""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops.attention import apply_attention_weights, attention_weights, dot_product_attention

F32_TOL = dict(atol=2e-5, rtol=2e-5)
GRAD_TOL = dict(atol=1e-4, rtol=1e-4)
BF16_ATOL = 3e-2

B, T, S, H, D = 2, 5, 7, 4, 8


# ---------------------------------------------------------------------------
# Independent references.


def np_valid(B_, H_, T_, S_, mask=None, is_causal=False, window=None, kv_lengths=None):
  """bool [B, H, T, S] built elementwise."""
  m = np.ones((B_, H_, T_, S_), bool)
  if mask is not None:
    m &= np.broadcast_to(np.asarray(mask), m.shape)
  for b, t, s in itertools.product(range(B_), range(T_), range(S_)):
    ok = True
    if is_causal and s > t:
      ok = False
    if window is not None and abs(t - s) >= window:
      ok = False
    if kv_lengths is not None and s >= kv_lengths[b]:
      ok = False
    if not ok:
      m[b, :, t, s] = False
  return m


def np_reference(
  q, k, v, *, bias=None, mask=None, is_causal=False, scale=None, window=None, kv_lengths=None
):
  """float64 numpy attention with k/v heads repeated and a plain softmax per row.

  Returns (weights [B, H, T, S], out [B, T, H, Dv]); a row with no allowed key
  has zero weights.
  """
  q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
  B_, T_, H_, D_ = q.shape
  _, S_, K_, _ = k.shape
  G = H_ // K_
  k = np.repeat(k, G, axis=2)
  scale = 1.0 / math.sqrt(D_) if scale is None else scale
  scores = np.einsum("bthd,bshd->bhts", q, k) * scale
  if bias is not None:
    scores = scores + np.asarray(bias, np.float64)
  valid = np_valid(
    B_, H_, T_, S_, mask, is_causal, window, None if kv_lengths is None else np.asarray(kv_lengths)
  )
  weights = np.zeros_like(scores)
  for b, h, t in itertools.product(range(B_), range(H_), range(T_)):
    sel = valid[b, h, t]
    if sel.any():
      row = scores[b, h, t, sel]
      e = np.exp(row - row.max())
      weights[b, h, t, sel] = e / e.sum()
  out = None
  if v is not None:
    v = np.repeat(np.asarray(v, np.float64), G, axis=2)
    out = np.einsum("bhts,bshd->bthd", weights, v)
  return weights, out


def jnp_reference(q, k, v, bias, valid):
  """float32 jnp attention (repeat heads, jax.nn.softmax) for gradient checks."""
  G = q.shape[2] // k.shape[2]
  k = jnp.repeat(k, G, axis=2)
  v = jnp.repeat(v, G, axis=2)
  s = jnp.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1]) + bias
  s = jnp.where(valid, s, -1e30)
  w = jax.nn.softmax(s, axis=-1) * jnp.any(valid, axis=-1, keepdims=True)
  return jnp.einsum("bhts,bshd->bthd", w, v)


def make_inputs(seed, *, H_=H, K=H, T_=T, S_=S, D_=D, Dv=D, dtype=jnp.float32, lead=()):
  """Unit-normal q [B,T,H,D], k [B,S,K,D], v [B,S,K,Dv] (numpy RNG: no compiles)."""
  rng = np.random.default_rng(seed)
  return tuple(
    jnp.asarray(rng.standard_normal(lead + shape, np.float32), dtype)
    for shape in ((B, T_, H_, D_), (B, S_, K, D_), (B, S_, K, Dv))
  )


_rng = np.random.default_rng(0)
BIAS_FULL = _rng.normal(size=(B, H, T, S)).astype(np.float32)
BIAS_BCAST = _rng.normal(size=(1, H, 1, S)).astype(np.float32)
MASK_RANDOM = _rng.random((B, 1, T, S)) < 0.6
MASK_RANDOM[0, 0, 1] = False  # one fully masked row
MASK_2D = _rng.random((T, S)) < 0.7

# name -> (shape kwargs, attention kwargs)
CASES = {
  "mha": (dict(K=4, S_=T), {}),
  "gqa": (dict(K=2, S_=T), {}),
  "mqa": (dict(K=1, S_=T), {}),
  "cross_T_ne_S": (dict(K=4), {}),
  "gqa_cross": (dict(K=2), {}),
  "bias": (dict(K=2), dict(bias=BIAS_FULL)),
  "bias_broadcast": (dict(K=1), dict(bias=BIAS_BCAST)),
  "mask": (dict(K=2), dict(mask=MASK_RANDOM)),
  "mask_2d": (dict(K=4), dict(mask=MASK_2D)),
  "causal": (dict(K=2, S_=T), dict(is_causal=True)),
  "causal_T_ne_S": (dict(K=4), dict(is_causal=True)),
  "window": (dict(K=4), dict(window=2)),
  "causal_window": (dict(K=2, S_=T), dict(is_causal=True, window=3)),
  "kv_lengths": (dict(K=2), dict(kv_lengths=np.array([3, 7], np.int32))),
  "kv_lengths_zero": (dict(K=2), dict(kv_lengths=np.array([0, 4], np.int32))),
  "scale": (dict(K=2), dict(scale=0.3)),
  "dv_ne_d": (dict(K=2, Dv=6), {}),
  "everything": (
    dict(K=2, Dv=6),
    dict(
      bias=BIAS_BCAST,
      mask=MASK_RANDOM,
      is_causal=True,
      window=4,
      kv_lengths=np.array([6, 2], np.int32),
      scale=0.5,
    ),
  ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_numpy_reference(name):
  shape_kw, kw = CASES[name]
  q, k, v = make_inputs(1, **shape_kw)
  ref_w, ref_out = np_reference(q, k, v, **kw)
  w = attention_weights(q, k, **kw)
  out = dot_product_attention(q, k, v, implementation="xla", **kw)
  assert w.dtype == jnp.float32 and w.shape == ref_w.shape
  assert out.dtype == q.dtype and out.shape == ref_out.shape
  np.testing.assert_allclose(np.asarray(w), ref_w, **F32_TOL)
  np.testing.assert_allclose(np.asarray(out), ref_out, **F32_TOL)
  # implementation=None on CPU is the xla path.
  if jax.default_backend() == "cpu":
    np.testing.assert_array_equal(np.asarray(dot_product_attention(q, k, v, **kw)), np.asarray(out))


def test_rows_sum_to_one_and_masked_weights_are_exactly_zero():
  _, kw = CASES["everything"]
  q, k, _ = make_inputs(2, K=2)
  w = np.asarray(attention_weights(q, k, **kw))
  valid = np_valid(B, H, T, S, kw["mask"], True, kw["window"], kw["kv_lengths"])
  has_key = valid.any(-1)
  assert has_key.any() and not has_key.all()  # both kinds of rows are exercised
  np.testing.assert_allclose(w.sum(-1)[has_key], 1.0, atol=1e-6)
  assert np.all(w[~valid] == 0.0)
  assert np.all(w[~has_key] == 0.0)
  assert np.all(w[valid] > 0.0)


def test_fully_masked_rows_give_zero_output_and_zero_finite_grads():
  q, k, v = make_inputs(3, K=2)
  bias = jnp.asarray(BIAS_FULL)
  mask = np.ones((B, 1, T, S), bool)
  mask[0, 0, 2] = False  # row (b=0, t=2) sees nothing
  kv_lengths = jnp.array([7, 0], jnp.int32)  # batch 1 sees nothing at all

  def f(q, k, v, bias):
    out = dot_product_attention(q, k, v, bias=bias, mask=mask, kv_lengths=kv_lengths)
    return out, jnp.sum(out * jnp.cos(out + 1.0))

  out, _ = jax.jit(f)(q, k, v, bias)
  out = np.asarray(out)
  assert np.all(np.isfinite(out))
  assert np.all(out[0, 2] == 0.0) and np.all(out[1] == 0.0)
  assert np.any(out[0, 1] != 0.0)
  grads = jax.jit(jax.grad(lambda *a: f(*a)[1], argnums=(0, 1, 2, 3)))(q, k, v, bias)
  for g in grads:
    assert np.all(np.isfinite(np.asarray(g)))
  gq, _, _, gbias = (np.asarray(g) for g in grads)
  assert np.all(gq[0, 2] == 0.0) and np.all(gq[1] == 0.0)
  assert np.all(gbias[0, :, 2] == 0.0) and np.all(gbias[1] == 0.0)
  assert np.any(gq[0, 1] != 0.0)


def test_bias_of_minus_inf_row_gives_zero_not_nan():
  q, k, v = make_inputs(4, K=4)
  bias = np.zeros((1, 1, T, S), np.float32)
  bias[0, 0, 3] = -np.inf
  w = np.asarray(attention_weights(q, k, bias=bias))
  out = np.asarray(dot_product_attention(q, k, v, bias=bias))
  assert np.all(np.isfinite(w)) and np.all(w[:, :, 3] == 0.0)
  assert np.all(np.isfinite(out)) and np.all(out[:, 3] == 0.0)


@pytest.mark.parametrize("K", [2, 1])
def test_gqa_equals_mha_with_repeated_heads(K):
  q, k, v = make_inputs(5, K=K)
  G = H // K
  kw = dict(bias=BIAS_FULL, is_causal=True)
  out = dot_product_attention(q, k, v, **kw)
  out_rep = dot_product_attention(q, jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2), **kw)
  np.testing.assert_allclose(np.asarray(out), np.asarray(out_rep), atol=1e-6, rtol=1e-6)
  w = attention_weights(q, k, **kw)
  w_rep = attention_weights(q, jnp.repeat(k, G, axis=2), **kw)
  np.testing.assert_allclose(np.asarray(w), np.asarray(w_rep), atol=1e-6, rtol=1e-6)


def _score_variance(D_, scale):
  """Variance of q.k * scale over N independent unit-variance (q, k) pairs.

  Each batch row b has one query and two keys: a random k_b and the zero
  vector, whose score is 0; so score_b = log(w_b0) - log(w_b1), read off the
  softmax weights exactly (float32 keeps w_b1 >= exp(-103) ~ 1e-45 > 0 for
  |score| < 103, far beyond the ~6 sigma seen here).
  """
  N = 4096
  rng = np.random.default_rng(D_)
  q = rng.standard_normal((N, 1, 1, D_), np.float32)
  k = rng.standard_normal((N, 1, 1, D_), np.float32)
  k = np.concatenate([k, np.zeros_like(k)], axis=1)  # [N, 2, 1, D]
  w = attention_weights(q, k, scale=scale)[:, 0, 0]  # [N, 2]
  scores = np.log(np.asarray(w[:, 0], np.float64)) - np.log(np.asarray(w[:, 1], np.float64))
  assert np.all(np.isfinite(scores))
  return scores.var()


def test_default_scale_gives_unit_variance_scores():
  # Var(q.k) = D for unit-variance q, k; 1/sqrt(D) brings it to 1. With N=4096
  # the sample variance has a relative standard error of sqrt((2 + 6/D)/N) < 0.03,
  # so +-15% is a > 5 sigma bound, and a missing or wrong scale (off by a
  # factor >= 2 in variance for these D) falls far outside it.
  for D_ in (16, 256):
    scaled = _score_variance(D_, None)
    unscaled = _score_variance(D_, 1.0)
    assert 0.85 < scaled < 1.15, (D_, scaled)
    assert 0.85 * D_ < unscaled < 1.15 * D_, (D_, unscaled)


# ---------------------------------------------------------------------------
# dtypes and gradients


GRAD_MASK = np.ones((B, 1, T, S), bool)
GRAD_MASK[0, 0, 2] = False
GRAD_KW = dict(mask=GRAD_MASK, is_causal=True, window=3, kv_lengths=np.array([7, 0], np.int32))


def _loss(q, k, v, bias, **kw):
  out = dot_product_attention(q, k, v, bias=bias, **kw)
  return jnp.sum(jnp.sin(out.astype(jnp.float32)))


_grad_fn = jax.jit(jax.grad(_loss, argnums=(0, 1, 2, 3)), static_argnames=("is_causal", "window"))


def test_grads_match_jnp_reference_float32():
  q, k, v = make_inputs(6, K=2)
  bias = jnp.asarray(BIAS_FULL)
  kw = GRAD_KW
  grads = _grad_fn(q, k, v, bias, **kw)
  valid = np_valid(B, H, T, S, kw["mask"], True, kw["window"], kw["kv_lengths"])

  def ref_loss(q, k, v, bias):
    return jnp.sum(jnp.sin(jnp_reference(q, k, v, bias, valid)))

  ref = jax.grad(ref_loss, argnums=(0, 1, 2, 3))(q, k, v, bias)
  for g, r in zip(grads, ref):
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), **GRAD_TOL)


def test_grads_match_finite_differences():
  # Central differences along a random direction per argument, float32:
  # truncation O(eps^2) ~ 1e-4 and rounding ~ 1e-7 / eps ~ 1e-5 relative.
  q, k, v = make_inputs(7, K=2)
  bias = jnp.asarray(BIAS_FULL)
  args = (q, k, v, bias)
  grads = _grad_fn(*args, **GRAD_KW)
  loss = jax.jit(_loss, static_argnames=("is_causal", "window"))
  rng = np.random.default_rng(1007)  # directions independent of the inputs
  eps = 1e-2
  for i, g in enumerate(grads):
    d = jnp.asarray(rng.standard_normal(args[i].shape, np.float32))
    plus = list(args)
    minus = list(args)
    plus[i] = args[i] + eps * d
    minus[i] = args[i] - eps * d
    fd = (float(loss(*plus, **GRAD_KW)) - float(loss(*minus, **GRAD_KW))) / (2 * eps)
    analytic = float(jnp.vdot(g, d))
    assert abs(fd - analytic) <= 2e-3 * max(1.0, abs(analytic)), (i, fd, analytic)


def test_bfloat16_output_dtype_matches_float32_and_grads_finite():
  q, k, v = make_inputs(8, K=2)
  bias = jnp.asarray(BIAS_FULL)
  kw = GRAD_KW
  q16, k16, v16, b16 = (x.astype(jnp.bfloat16) for x in (q, k, v, bias))
  out16 = dot_product_attention(q16, k16, v16, bias=b16, **kw)
  assert out16.dtype == jnp.bfloat16
  out32 = dot_product_attention(
    q16.astype(jnp.float32),
    k16.astype(jnp.float32),
    v16.astype(jnp.float32),
    bias=b16.astype(jnp.float32),
    **kw,
  )
  np.testing.assert_allclose(
    np.asarray(out16, np.float32), np.asarray(out32), atol=BF16_ATOL, rtol=0
  )
  w16 = attention_weights(
    q16, k16, bias=b16, **{n: kw[n] for n in ("mask", "is_causal", "window", "kv_lengths")}
  )
  assert w16.dtype == jnp.float32

  # Scores and softmax in float32 whatever the inputs' dtype, a float32 bias
  # added as it is: against float64 of the bfloat16 inputs, to float32's
  # rounding (a bfloat16 step anywhere: ~1e-2).
  bias30 = 30 * bias  # long-distance ALiBi / T5 sizes, where bf16 rounds by 0.1
  masks = {n: kw[n] for n in ("mask", "is_causal", "window", "kv_lengths")}
  want, _ = np_reference(
    np.asarray(q16, np.float64), np.asarray(k16, np.float64), None, bias=bias30, **masks
  )
  for b in (bias30, bias30.astype(jnp.bfloat16)):
    got = attention_weights(q16, k16, bias=b, **masks)
    ref = (
      want
      if b.dtype == jnp.float32
      else np_reference(
        np.asarray(q16, np.float64),
        np.asarray(k16, np.float64),
        None,
        bias=np.asarray(b, np.float64),
        **masks,
      )[0]
    )
    np.testing.assert_allclose(np.asarray(got, np.float64), ref, atol=2e-6, rtol=0)

  grads16 = _grad_fn(q16, k16, v16, b16, **kw)
  grads32 = _grad_fn(q, k, v, bias, **kw)
  for g16, g32 in zip(grads16, grads32):
    assert g16.dtype == jnp.bfloat16
    g16 = np.asarray(g16, np.float32)
    assert np.all(np.isfinite(g16))
    g32 = np.asarray(g32)
    # normwise: bf16 rounding of inputs and intermediates, ~1e-2 relative.
    assert np.linalg.norm(g16 - g32) <= 5e-2 * np.linalg.norm(g32) + 1e-3


# ---------------------------------------------------------------------------
# Transformations


def test_jit_matches_eager():
  _, kw = CASES["everything"]
  q, k, v = make_inputs(9, K=2, Dv=6)
  f = jax.jit(
    dot_product_attention, static_argnames=("is_causal", "window", "implementation", "scale")
  )
  np.testing.assert_allclose(
    np.asarray(f(q, k, v, **kw)),
    np.asarray(dot_product_attention(q, k, v, **kw)),
    atol=1e-6,
    rtol=1e-6,
  )
  g = jax.jit(attention_weights, static_argnames=("is_causal", "window", "scale"))
  np.testing.assert_allclose(
    np.asarray(g(q, k, **kw)), np.asarray(attention_weights(q, k, **kw)), atol=1e-6, rtol=1e-6
  )


def test_vmap_over_extra_leading_axis():
  E = 3
  q, k, v = make_inputs(10, K=2, lead=(E,))
  kv_lengths = jnp.array([[7, 3], [1, 0], [5, 5]], jnp.int32)  # [E, B]
  bias = jnp.asarray(BIAS_BCAST)

  def f(q, k, v, kv_lengths):
    return dot_product_attention(q, k, v, bias=bias, is_causal=True, kv_lengths=kv_lengths)

  out = jax.vmap(f)(q, k, v, kv_lengths)
  assert out.shape == (E, B, T, H, D)
  for e in range(E):
    _, ref = np_reference(
      q[e], k[e], v[e], bias=BIAS_BCAST, is_causal=True, kv_lengths=np.asarray(kv_lengths[e])
    )
    np.testing.assert_allclose(np.asarray(out[e]), ref, **F32_TOL)
  w = jax.vmap(lambda q, k: attention_weights(q, k, window=2))(q, k)
  assert w.shape == (E, B, H, T, S)


# ---------------------------------------------------------------------------
# Validation


def _arr(*shape, dtype=jnp.float32):
  return jnp.zeros(shape, dtype)


Q, K4, V4 = _arr(B, T, H, D), _arr(B, S, 2, D), _arr(B, S, 2, 6)

BAD_CALLS = [
  ("q must have rank 4", dict(q=_arr(T, H, D))),
  ("k must have rank 4", dict(k=_arr(S, 2, D))),
  ("v must have rank 4", dict(v=_arr(B, S, 2, 6, 1))),
  ("batch sizes", dict(k=_arr(B + 1, S, 2, D), v=_arr(B + 1, S, 2, 6))),
  ("batch sizes", dict(v=_arr(B + 1, S, 2, 6))),
  ("k and v lengths differ", dict(v=_arr(B, S + 1, 2, 6))),
  ("multiple of key/value heads", dict(k=_arr(B, S, 3, D), v=_arr(B, S, 3, 6))),
  ("q and k head dims differ", dict(k=_arr(B, S, 2, D + 1))),
  ("k and v head counts differ", dict(v=_arr(B, S, 1, 6))),
  ("bias of shape", dict(bias=_arr(B, H, T, S + 1))),
  ("bias of shape", dict(bias=_arr(1, B, H, T, S))),
  ("bias must be a float", dict(bias=_arr(B, H, T, S, dtype=bool))),
  ("mask of shape", dict(mask=_arr(3, 1, T, S, dtype=bool))),
  ("mask must be boolean", dict(mask=_arr(B, 1, T, S))),
  ("implementation", dict(implementation="flash")),
  ("window", dict(window=0)),
  ("window", dict(window=2.5)),
  ("kv_lengths", dict(kv_lengths=jnp.array([1, 2, 3]))),
  ("kv_lengths", dict(kv_lengths=jnp.array([1.0, 2.0]))),
  # A per-head scale broadcast against the grouped scores' last axis; a traced
  # or array is_causal passed through `if` untested.
  ("scale must be a number", dict(scale=jnp.ones((H,)))),
  ("scale must be a number", dict(scale="0.5")),
  ("is_causal must be a python bool", dict(is_causal=jnp.array(True))),
  ("is_causal must be a python bool", dict(is_causal=1)),
]


@pytest.mark.parametrize(
  "message,override", BAD_CALLS, ids=[f"{i}:{m}" for i, (m, _) in enumerate(BAD_CALLS)]
)
def test_validation_errors(message, override):
  args = dict(q=Q, k=K4, v=V4)
  args.update(override)
  q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
  with pytest.raises(ValueError, match=message):
    dot_product_attention(q, k, v, **args)
  args.pop("implementation", None)
  if (
    "v must" in message
    or "lengths differ" in message
    or "head counts" in message
    or override.keys() == {"v"}
    or "implementation" in message
  ):
    return  # attention_weights takes no v / implementation
  with pytest.raises(ValueError, match=message):
    attention_weights(q, k, **args)


@pytest.mark.parametrize("implementation", ["xla", "chunked"])
def test_no_keys_is_the_zero_output_of_rows_with_none_allowed(implementation):
  # S = 0: every query is a row with no allowed key (zero output, zero
  # weights), as a fully masked row is; it was a reduction error (xla) and a
  # division by zero (chunked).
  k0, v0 = _arr(B, 0, 2, D), _arr(B, 0, 2, 6)
  out = dot_product_attention(Q, k0, v0, implementation=implementation)
  assert out.shape == (B, T, H, 6) and out.dtype == Q.dtype
  np.testing.assert_array_equal(np.asarray(out), 0.0)
  weights = attention_weights(Q, k0)
  assert weights.shape == (B, H, T, 0) and weights.dtype == jnp.float32


def test_scalar_scales_are_taken_alike():
  # A python float and a 0-d array (a learned temperature) are one scale.
  by_float = dot_product_attention(Q, K4, V4, scale=0.3)
  by_array = dot_product_attention(Q, K4, V4, scale=jnp.asarray(0.3))
  np.testing.assert_array_equal(np.asarray(by_float), np.asarray(by_array))


def test_error_messages_name_shapes():
  with pytest.raises(ValueError, match=r"mask of shape \(3, 1, 5, 7\).*\[2, 4, 5, 7\]"):
    dot_product_attention(Q, K4, V4, mask=_arr(3, 1, T, S, dtype=bool))
  with pytest.raises(ValueError, match=r"H=4.*K=3"):
    attention_weights(Q, _arr(B, S, 3, D))


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the non-GPU error")
def test_cudnn_on_cpu_raises_and_says_why():
  q, k, v = (x.astype(jnp.bfloat16) for x in (Q, K4, _arr(B, S, 2, D)))
  with pytest.raises(ValueError, match="implementation='cudnn'.*GPU.*default_backend"):
    dot_product_attention(q, k, v, implementation="cudnn")
  # float32 and an odd head dim are named too.
  with pytest.raises(ValueError, match="bfloat16 or float16.*multiple of 8"):
    dot_product_attention(
      _arr(B, T, H, 6), _arr(B, S, 2, 6), _arr(B, S, 2, 6), implementation="cudnn"
    )


def test_apply_attention_weights_matches_dot_product_attention_for_gqa():
  """Weights from attention_weights mixed by apply_attention_weights equal the
  fused op (GQA: 4 query heads over 2 kv heads), and equal numpy float64."""
  rng = np.random.default_rng(7)
  q = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)
  k = rng.standard_normal((2, 6, 2, 8)).astype(np.float32)
  v = rng.standard_normal((2, 6, 2, 3)).astype(np.float32)
  w = attention_weights(q, k, is_causal=True)
  out = apply_attention_weights(w, v)
  np.testing.assert_allclose(
    out, dot_product_attention(q, k, v, is_causal=True, implementation="xla"), atol=1e-5
  )
  v_rep = np.repeat(v.astype(np.float64), 2, axis=2)
  ref = np.einsum("bhts,bshd->bthd", np.asarray(w, np.float64), v_rep)
  np.testing.assert_allclose(out, ref, atol=1e-5)
  with pytest.raises(ValueError, match="weights"):
    apply_attention_weights(w[:, :3], v[:, :4])


# ---------------------------------------------------------------------------
# Non-float inputs and non-finite keys/values at masked positions.


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_non_float_q_k_v_is_a_value_error_naming_argument_and_dtype(name, dtype):
  """An int q used to give a silently truncated int output."""
  args = dict(q=Q, k=K4, v=V4)
  args[name] = args[name].astype(dtype)
  message = f"{name} must be a floating-point array, got dtype {jnp.dtype(dtype)}"
  with pytest.raises(ValueError, match=message):
    dot_product_attention(**args)
  if name != "v":
    with pytest.raises(ValueError, match=message):
      attention_weights(args["q"], args["k"])
  weights = _arr(B, H, T, S)
  with pytest.raises(ValueError, match="weights must be a floating-point array"):
    apply_attention_weights(weights.astype(dtype), V4)
  if name == "v":
    with pytest.raises(ValueError, match=message):
      apply_attention_weights(weights, args["v"])


# case -> key index made non-finite; each is masked for some queries and
# allowed for others, so both kinds of rows are checked.
NONFINITE_KEY = {
  "mask": 3,
  "causal": 3,
  "window": 5,
  "causal_window": 2,
  "kv_lengths": 4,
  "everything": 1,
}


@pytest.mark.parametrize("name", list(NONFINITE_KEY))
def test_nonfinite_key_and_value_at_masked_positions_do_not_contribute(name):
  """k = inf and v = NaN at key s: rows that may not attend s equal the float64
  reference computed with finite k, v (s has weight 0 there); rows that may
  attend s are NaN; gradients of the clean rows are finite."""
  shape_kw, kw = CASES[name]
  q, k, v = make_inputs(4, **shape_kw)
  ref_w, ref_out = np_reference(q, k, v, **kw)
  s = NONFINITE_KEY[name]
  k_bad, v_bad = k.at[:, s].set(jnp.inf), v.at[:, s].set(jnp.nan)
  w = np.asarray(attention_weights(q, k_bad, **kw))
  out = np.asarray(dot_product_attention(q, k_bad, v_bad, implementation="xla", **kw))
  valid = np_valid(
    B,
    H,
    q.shape[1],
    k.shape[1],
    kw.get("mask"),
    kw.get("is_causal", False),
    kw.get("window"),
    kw.get("kv_lengths"),
  )
  attends_bad_bht = valid[..., s]
  clean_bth = ~attends_bad_bht.transpose(0, 2, 1)
  assert clean_bth.any() and (~clean_bth).any()  # both kinds of rows exercised
  np.testing.assert_allclose(w[~attends_bad_bht], ref_w[~attends_bad_bht], **F32_TOL)
  np.testing.assert_allclose(out[clean_bth], ref_out[clean_bth], **F32_TOL)
  assert np.isnan(out[~clean_bth]).all()

  def clean_loss(q, k, v):
    out = dot_product_attention(q, k, v, implementation="xla", **kw)
    return jnp.sum(jnp.where(jnp.asarray(clean_bth)[..., None], out, 0.0) ** 2)

  grads = jax.grad(clean_loss, argnums=(0, 1, 2))(q, k_bad, v_bad)
  for grad in grads:
    assert np.isfinite(np.asarray(grad)).all()


def test_apply_attention_weights_skips_nonfinite_values_with_zero_weight():
  """Caller-given weights (e.g. after dropout): weight 0 on a NaN value leaves
  the row equal to the float64 sum over the other values; weight > 0 gives NaN."""
  rng = np.random.default_rng(5)
  w = rng.random((1, 2, 3, 4)).astype(np.float32)
  v = rng.standard_normal((1, 4, 1, 2)).astype(np.float32)
  w[:, :, :2, 1] = 0.0  # queries 0, 1 drop key 1; query 2 keeps it
  v_bad = v.copy()
  v_bad[:, 1] = np.nan
  out = np.asarray(apply_attention_weights(w, v_bad))
  ref = np.einsum("bhts,bsd->bthd", w.astype(np.float64), v[:, :, 0].astype(np.float64))
  np.testing.assert_allclose(out[:, :2], ref[:, :2], **F32_TOL)
  assert np.isnan(out[:, 2]).all()
