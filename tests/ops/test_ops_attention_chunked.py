"""The memory-efficient 'chunked' attention path against the float64 numpy reference.

Cases of tests/ops/test_ops_attention.py that together cover every input (MQA,
cross T != S, a 2-D mask, kv_lengths with an empty row, and 'everything':
GQA, bias, mask, causal, window, kv_lengths, scale and Dv != D at once; the
non-finite checks add plain causal) run with key blocks of 3 (S = 5 or 7
keys: several blocks, the last one padded). Tolerances as there: float32 vs float64,
atol = rtol = 2e-5; gradients vs the xla path, atol = rtol = 1e-4.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_ops_attention import (
  CASES,
  F32_TOL,
  GRAD_TOL,
  NONFINITE_KEY,
  B,
  H,
  make_inputs,
  np_reference,
  np_valid,
)

from txf import models
from txf.ops.attention import dot_product_attention


def chunked(q, k, v, chunk_size, **kw):
  """The chunked path, jitted (one compile instead of one per op in the scan)."""
  static = ("is_causal", "window", "scale", "chunk_size")
  f = jax.jit(
    lambda q, k, v, **kw: dot_product_attention(q, k, v, implementation="chunked", **kw),
    static_argnames=static,
  )
  return f(q, k, v, chunk_size=chunk_size, **kw)


REFERENCE_CASES = ["mqa", "cross_T_ne_S", "mask_2d", "kv_lengths_zero", "everything"]


@pytest.mark.parametrize("name", REFERENCE_CASES)
def test_matches_numpy_reference(name):
  shape_kw, kw = CASES[name]
  q, k, v = make_inputs(1, **shape_kw)
  _, ref_out = np_reference(q, k, v, **kw)
  # Blocks of 3 keys: S = 5 or 7 takes several blocks, the last one padded.
  out = chunked(q, k, v, 3, **kw)
  assert out.dtype == q.dtype and out.shape == ref_out.shape
  np.testing.assert_allclose(np.asarray(out), ref_out, **F32_TOL)
  if name == "everything":  # one block holding every key
    np.testing.assert_allclose(np.asarray(chunked(q, k, v, 512, **kw)), ref_out, **F32_TOL)


@pytest.mark.parametrize("name", ["everything"])
def test_gradients_match_the_xla_path(name):
  shape_kw, kw = CASES[name]
  q, k, v = make_inputs(2, **shape_kw)
  cotangent = jnp.asarray(
    np.random.default_rng(3).standard_normal((B, q.shape[1], H, v.shape[-1])), jnp.float32
  )

  def loss(implementation, q, k, v):
    extra = dict(chunk_size=2) if implementation == "chunked" else {}
    out = dot_product_attention(q, k, v, implementation=implementation, **extra, **kw)
    return jnp.sum(out * cotangent)

  grads = lambda implementation: jax.jit(
    jax.grad(lambda *a: loss(implementation, *a), argnums=(0, 1, 2))
  )(q, k, v)
  for got, want in zip(grads("chunked"), grads("xla")):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **GRAD_TOL)


@pytest.mark.parametrize("name", ["causal", "everything"])
def test_nonfinite_key_and_value_at_masked_positions_do_not_contribute(name):
  """As for 'xla': k = inf, v = NaN at key s leave the rows that may not attend
  s equal to the reference and make the rows that may attend it NaN."""
  shape_kw, kw = CASES[name]
  q, k, v = make_inputs(4, **shape_kw)
  _, ref_out = np_reference(q, k, v, **kw)
  s = NONFINITE_KEY[name]
  k_bad, v_bad = k.at[:, s].set(jnp.inf), v.at[:, s].set(jnp.nan)
  out = np.asarray(chunked(q, k_bad, v_bad, 2, **kw))
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
  clean_bth = ~valid[..., s].transpose(0, 2, 1)
  assert clean_bth.any() and (~clean_bth).any()
  np.testing.assert_allclose(out[clean_bth], ref_out[clean_bth], **F32_TOL)
  assert np.isnan(out[~clean_bth]).all()


def test_fully_masked_rows_and_minus_inf_bias_give_zero_not_nan():
  q, k, v = make_inputs(5, K=2)
  mask = np.ones((B, 1, q.shape[1], k.shape[1]), bool)
  mask[0, 0, 2] = False
  bias = np.zeros((1, 1, q.shape[1], k.shape[1]), np.float32)
  bias[0, 0, 3] = -np.inf
  out = np.asarray(chunked(q, k, v, 3, mask=mask, bias=bias))
  assert np.all(out[0, 2] == 0) and np.all(out[:, 3] == 0)
  assert np.isfinite(out).all()


def test_memory_grows_as_t_squared_for_xla_and_as_t_for_chunked():
  """XLA's compiled temporary memory of self-attention at T = S = n and 2n:
  'xla' holds [T, T] scores (x4), 'chunked' [T, chunk_size] ones (x2)."""

  def temp_bytes(implementation, n):
    qkv = jax.ShapeDtypeStruct((1, n, 1, 16), jnp.float32)
    extra = dict(chunk_size=32) if implementation == "chunked" else {}
    f = jax.jit(
      lambda q, k, v: dot_product_attention(q, k, v, implementation=implementation, **extra)
    )
    return f.lower(qkv, qkv, qkv).compile().memory_analysis().temp_size_in_bytes

  xla = [temp_bytes("xla", n) for n in (512, 1024)]
  chunked_ = [temp_bytes("chunked", n) for n in (512, 1024)]
  assert xla[0] >= 512 * 512 * 4  # at least one float32 [T, T]
  assert 3.5 <= xla[1] / xla[0] <= 4.5
  assert 1.5 <= chunked_[1] / chunked_[0] <= 2.5
  assert chunked_[1] < xla[1] / 8


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(implementation="chunked", chunk_size=0), "chunk_size must be a python int >= 1"),
    (dict(implementation="chunked", chunk_size=2.0), "chunk_size must be a python int >= 1"),
    (dict(implementation="xla", chunk_size=4), "applies only to implementation='chunked'"),
  ],
)
def test_bad_chunk_size_is_a_value_error(kwargs, message):
  q, k, v = make_inputs(0)
  with pytest.raises(ValueError, match=message):
    dot_product_attention(q, k, v, **kwargs)


def test_model_attention_impl_chunked_gives_the_xla_logits():
  """model.attention_impl='chunked' selects the path inside the layers (ALiBi
  bias, GQA, causal mask): the same parameters give the same logits."""
  fields = dict(
    family="decoder",
    vocab_size=50,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    position="alibi",
    num_layers=1,
  )
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, 50, (2, 40)), jnp.int32)
  xla = models.build(models.ModelConfig(**fields, attention_impl="xla"))
  chunked_model = models.build(models.ModelConfig(**fields, attention_impl="chunked"))
  params = jax.jit(xla.init)(jax.random.key(0), tokens)["params"]
  logits = lambda model: np.asarray(jax.jit(model.apply)({"params": params}, tokens))
  np.testing.assert_allclose(logits(chunked_model), logits(xla), **F32_TOL)
