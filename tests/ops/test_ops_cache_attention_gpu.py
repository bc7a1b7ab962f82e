"""The decoding step's GPU kernel (txf.ops.cache_attention_gpu: the KV
cache's update and the attention over it), run by Pallas's interpreter on
the CPU against the XLA path it stands in for: `dynamic_update_slice` of
the caches, then `ops.dot_product_attention` ('xla') with the causal (and
window) masks offset to the new token's position.

Tolerances: float32, 2e-6 (the same float32 math, another summation order:
an online softmax over blocks). bfloat16: the kernel computes in float32
and rounds once, so it is within half a unit in the last place (at most
2^-8 relative, plus float32's 2e-6) of the float32 XLA path on the same
bfloat16 inputs; against the bfloat16 XLA path, which also rounds the
weights to bfloat16 before the product, atol 3e-2 as in test_ops_attention.
The updated caches are exact.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import ops
from txf.ops import cache_attention_gpu


def xla_step(q, k_new, v_new, k_cache, v_cache, index, window=None, scale=None):
  """The XLA path: update, then masked attention over every slot."""
  start = (0, index, 0, 0)
  k_cache = jax.lax.dynamic_update_slice(k_cache, k_new.astype(k_cache.dtype), start)
  v_cache = jax.lax.dynamic_update_slice(v_cache, v_new.astype(v_cache.dtype), start)
  cache_len = k_cache.shape[1]
  mask = ops.causal_mask(1, cache_len, q_offset=index)
  if window is not None:
    mask = ops.combine_masks(
      mask, ops.sliding_window_mask(1, cache_len, window=window, q_offset=index)
    )
  out = ops.dot_product_attention(q, k_cache, v_cache, mask=mask, scale=scale, implementation="xla")
  return out, k_cache, v_cache


def inputs(seed, batch, cache_len, heads, kv_heads, head_dim, dtype=jnp.float32):
  rng = np.random.default_rng(seed)

  def normal(*shape):
    return jnp.asarray(rng.normal(size=shape), dtype)

  return (
    normal(batch, 1, heads, head_dim),
    normal(batch, 1, kv_heads, head_dim),
    normal(batch, 1, kv_heads, head_dim),
    normal(batch, cache_len, kv_heads, head_dim),
    normal(batch, cache_len, kv_heads, head_dim),
  )


def kernel_step(*args, **kwargs):
  return cache_attention_gpu.update_and_attend(*args, interpret=True, **kwargs)


def assert_step_matches(got, want, dtype):
  out, k_cache, v_cache = got
  want_out, want_k, want_v = want
  np.testing.assert_array_equal(np.asarray(k_cache), np.asarray(want_k))
  np.testing.assert_array_equal(np.asarray(v_cache), np.asarray(want_v))
  assert out.dtype == want_out.dtype == dtype
  out, want_out = np.asarray(out, np.float32), np.asarray(want_out, np.float32)
  if dtype == jnp.float32:
    np.testing.assert_allclose(out, want_out, atol=2e-6, rtol=2e-6)
  else:
    np.testing.assert_allclose(out, want_out, atol=3e-2)


@pytest.mark.parametrize(
  "heads,kv_heads,head_dim",
  [(4, 4, 16), (8, 2, 32), (4, 1, 8)],  # multi-head, grouped-query, multi-query
)
@pytest.mark.parametrize("index", [0, 21, 36])  # the first slot, one in between, the last
def test_kernel_equals_the_xla_path(heads, kv_heads, head_dim, index):
  """Over several blocks of 16 slots (the last one partial)."""
  args = inputs(index, 2, 37, heads, kv_heads, head_dim)
  assert_step_matches(
    kernel_step(*args, jnp.int32(index), block=16),
    xla_step(*args, index),
    jnp.float32,
  )


@pytest.mark.parametrize("window", [1, 5, 16, 40])
def test_a_window_attends_the_same_slots_as_the_xla_path(window):
  """Windows inside one block, across blocks, and wider than the cache."""
  args = inputs(window, 2, 37, 4, 2, 16)
  for index in (3, 30):
    assert_step_matches(
      kernel_step(*args, jnp.int32(index), window=window, block=16),
      xla_step(*args, index, window=window),
      jnp.float32,
    )


def test_bfloat16_and_a_scale():
  args = inputs(7, 3, 50, 4, 4, 64, jnp.bfloat16)
  got = kernel_step(*args, jnp.int32(33), scale=0.1)
  assert_step_matches(got, xla_step(*args, 33, scale=0.1), jnp.bfloat16)
  exact = xla_step(*(x.astype(jnp.float32) for x in args), 33, scale=0.1)[0]
  exact = np.asarray(exact)
  assert np.all(np.abs(np.asarray(got[0], np.float32) - exact) <= 2.0**-8 * np.abs(exact) + 2e-6)


def test_non_finite_slots_count_only_where_attended():
  """NaN and inf in the slots after the new token and before the window
  change nothing; an attended NaN key, or an inf value given weight, makes
  the rows that attend it NaN, as on the XLA path."""
  q, k_new, v_new, k_cache, v_cache = inputs(1, 2, 40, 4, 2, 16)
  index, window = 20, 8
  k_cache = k_cache.at[:, index + 1 :].set(jnp.nan).at[:, : index - window + 1].set(jnp.inf)
  v_cache = v_cache.at[:, index + 1 :].set(jnp.inf).at[:, : index - window + 1].set(jnp.nan)
  got = kernel_step(q, k_new, v_new, k_cache, v_cache, jnp.int32(index), window=window)
  want = xla_step(q, k_new, v_new, k_cache, v_cache, index, window=window)
  assert np.all(np.isfinite(np.asarray(got[0])))
  np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), atol=2e-6, rtol=2e-6)

  poisoned_k = k_cache.at[0, 15, 1, 3].set(jnp.nan)  # row 0, kv head 1: query heads 2, 3
  poisoned_v = v_cache.at[1, index - 1, 0, 5].set(jnp.inf)  # row 1, kv head 0: heads 0, 1
  for k, v in ((poisoned_k, v_cache), (k_cache, poisoned_v)):
    got = np.asarray(kernel_step(q, k_new, v_new, k, v, jnp.int32(index), window=window)[0])
    want = np.asarray(xla_step(q, k_new, v_new, k, v, index, window=window)[0])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any(axis=-1).sum() == 2  # the two query heads of one kv head
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], atol=2e-6, rtol=2e-6)


def test_applies_only_to_one_token_and_powers_of_two():
  q, _, _, k_cache, v_cache = inputs(0, 1, 8, 6, 2, 16)  # G = 3
  assert not cache_attention_gpu.applies(q, k_cache, v_cache)
  q, _, _, k_cache, v_cache = inputs(0, 1, 8, 4, 2, 12)  # D = 12
  assert not cache_attention_gpu.applies(q, k_cache, v_cache)
  q, k_new, v_new, k_cache, v_cache = inputs(0, 1, 8, 4, 2, 16)
  assert cache_attention_gpu.applies(q, k_cache, v_cache)
  two_tokens = jnp.concatenate([q, q], axis=1)
  assert not cache_attention_gpu.applies(two_tokens, k_cache, v_cache)
  # A row more than the caches hold: the kernel would write past them.
  assert not cache_attention_gpu.applies(jnp.concatenate([q, q]), k_cache, v_cache)
  with pytest.raises(ValueError, match="^update_and_attend takes one new token"):
    kernel_step(two_tokens, k_new, v_new, k_cache, v_cache, jnp.int32(0))
  with pytest.raises(ValueError, match=r"^block must be a power of 2 \(Triton's\), got 24$"):
    kernel_step(q, k_new, v_new, k_cache, v_cache, jnp.int32(0), block=24)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [None, 5])
def test_the_packed_query_key_and_value_give_the_same_step(dtype, window):
  """update_and_attend_packed of one [B, 1, 3, H, D] array: the output and
  caches of update_and_attend of its three parts, bit for bit (the same
  kernel reading them where they lie)."""
  q, k_new, v_new, k_cache, v_cache = inputs(11, 2, 37, 4, 4, 16, dtype)
  qkv = jnp.stack([q, k_new, v_new], axis=2)
  assert cache_attention_gpu.packs(qkv, k_cache, v_cache)
  for index in (0, 30):
    got = cache_attention_gpu.update_and_attend_packed(
      qkv, k_cache, v_cache, jnp.int32(index), window=window, block=16, interpret=True
    )
    want = kernel_step(q, k_new, v_new, k_cache, v_cache, jnp.int32(index), window=window, block=16)
    for got_array, want_array in zip(got, want, strict=True):
      np.testing.assert_array_equal(np.asarray(got_array), np.asarray(want_array))
    assert_step_matches(got, xla_step(q, k_new, v_new, k_cache, v_cache, index, window), dtype)


def test_the_packed_step_adds_the_biases_as_xla_adds_them():
  """Float32 biases as stored, a bfloat16 product: each rounded to bfloat16
  and added, rounded again, as `project` adds them (`y + bias.astype(dtype)`);
  the same step bit for bit as update_and_attend of the biased parts."""
  q, k_new, v_new, k_cache, v_cache = inputs(12, 2, 37, 4, 4, 16, jnp.bfloat16)
  rng = np.random.default_rng(13)
  biases = [jnp.asarray(rng.normal(size=(4, 16)), jnp.float32) for _ in range(3)]
  qkv = jnp.stack([q, k_new, v_new], axis=2)
  got = cache_attention_gpu.update_and_attend_packed(
    qkv, k_cache, v_cache, jnp.int32(20), biases=biases, block=16, interpret=True
  )
  biased = [x + b.astype(jnp.bfloat16) for x, b in zip((q, k_new, v_new), biases, strict=True)]
  want = kernel_step(*biased, k_cache, v_cache, jnp.int32(20), block=16)
  for got_array, want_array in zip(got, want, strict=True):
    np.testing.assert_array_equal(np.asarray(got_array), np.asarray(want_array))
  unbiased = cache_attention_gpu.update_and_attend_packed(
    qkv, k_cache, v_cache, jnp.int32(20), block=16, interpret=True
  )
  assert not np.array_equal(np.asarray(unbiased[0]), np.asarray(got[0]))
  with pytest.raises(ValueError, match=r"biases \[\(4, 16\), \(4, 16\)\]$"):
    cache_attention_gpu.update_and_attend_packed(
      qkv, k_cache, v_cache, jnp.int32(0), biases=biases[:2], interpret=True
    )


def test_packing_takes_multi_head_query_key_value_in_the_caches_dtype_only():
  q, k_new, v_new, k_cache, v_cache = inputs(0, 1, 8, 4, 4, 16)
  qkv = jnp.stack([q, k_new, v_new], axis=2)
  assert cache_attention_gpu.packs(qkv, k_cache, v_cache)
  assert not cache_attention_gpu.packs(qkv[:, :, :2], k_cache, v_cache)  # k and v alone
  assert not cache_attention_gpu.packs(qkv.astype(jnp.bfloat16), k_cache, v_cache)
  _, _, _, gqa_k, gqa_v = inputs(0, 1, 8, 4, 2, 16)  # 2 key/value heads
  assert not cache_attention_gpu.packs(qkv, gqa_k, gqa_v)
  with pytest.raises(ValueError, match=r"^update_and_attend_packed takes one new token's"):
    cache_attention_gpu.update_and_attend_packed(
      qkv[:, :, :2], k_cache, v_cache, jnp.int32(0), interpret=True
    )


def xla_cross(q, k, v, mask, scale=None):
  """The XLA path of a cached cross-attention step: query rows in groups
  sharing a key row, as MultiHeadAttention._attend regroups them."""
  rows, kv_rows = q.shape[0], k.shape[0]
  grouped = q.reshape((kv_rows, -1) + q.shape[2:])
  out = ops.dot_product_attention(grouped, k, v, mask=mask, scale=scale, implementation="xla")
  return out.reshape((rows, 1) + out.shape[2:])


@pytest.mark.parametrize("rows_per_kv_row", [1, 2])  # greedy; two beams sharing an encoding
def test_cross_attention_equals_the_xla_path(rows_per_kv_row):
  """Padding in the keys, a row whose every key is padding (output 0), and
  NaN and inf at the padded keys, over several blocks."""
  q, k, v, _, _ = (x for x in inputs(3, 3 * rows_per_kv_row, 1, 4, 2, 16))
  _, _, _, k, v = inputs(4, 3, 45, 4, 2, 16)
  lengths = np.array([45, 30, 0])
  mask = jnp.asarray(np.arange(45)[None] < lengths[:, None])[:, None, None, :]
  k = jnp.where(mask[:, 0, 0, :, None, None], k, jnp.nan)
  v = jnp.where(mask[:, 0, 0, :, None, None], v, jnp.inf)
  got = cache_attention_gpu.attend(q, k, v, mask, block=16, interpret=True)
  want = xla_cross(q, k, v, mask)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6, rtol=2e-6)
  assert not np.any(np.asarray(got[-rows_per_kv_row:]))  # the row with no key


def test_cross_attention_needs_whole_groups_of_rows():
  q, k, v, _, _ = inputs(0, 3, 1, 4, 2, 16)
  _, _, _, k, v = inputs(0, 2, 8, 4, 2, 16)
  assert not cache_attention_gpu.applies_to_cross(q, k, v)
  with pytest.raises(ValueError, match="^attend takes one query token"):
    cache_attention_gpu.attend(q, k, v, jnp.ones((2, 1, 1, 8), bool), interpret=True)


# --- the norm and the query, key and value products in the kernel --------


def normalized_operands(seed, dtype, *, center, biased, features=600, heads=4, head_dim=16):
  """A stream x [1, D] (D = 600: three blocks of the kernel's 256 rows at
  Dh = 16, the last part-masked), the norm's float32 scale and bias (None: RMSNorm),
  the query, key and value kernels [D, H * Dh] in x's dtype, float32
  biases [H, Dh] (or none) and caches of 37 slots."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape, scale=1.0: jnp.asarray(rng.normal(size=shape) * scale, jnp.float32)
  x = (normal(1, features, scale=2.0) + 0.5).astype(dtype)  # a mean far from 0
  norm_scale = 1.0 + normal(features, scale=0.2)
  norm_bias = normal(features, scale=0.2) if center else None
  kernels = [normal(features, heads * head_dim, scale=features**-0.5).astype(dtype) for _ in "qkv"]
  biases = [normal(heads, head_dim, scale=0.2) for _ in "qkv"] if biased else []
  caches = [normal(1, 37, heads, head_dim).astype(dtype) for _ in "kv"]
  return x, norm_scale, norm_bias, kernels, biases, caches


def normalized_reference(x, norm_scale, norm_bias, kernels, biases, caches, index, window, eps):
  """The step in float64 numpy: the norm of x, its products with the
  kernels plus the biases, the new key and value written at `index`, the
  query's softmax attention over slots max(0, index + 1 - window)..index."""
  x = np.asarray(x, np.float64)[0]
  centred = x - x.mean() if norm_bias is not None else x
  y = centred / np.sqrt(np.mean(np.square(centred)) + eps) * np.asarray(norm_scale, np.float64)
  if norm_bias is not None:
    y = y + np.asarray(norm_bias, np.float64)
  heads, head_dim = caches[0].shape[2:]
  q, k, v = (
    (y @ np.asarray(w, np.float64)).reshape(heads, head_dim)
    + (np.asarray(b, np.float64) if biases else 0.0)
    for w, b in zip(kernels, biases or [None] * 3, strict=True)
  )
  k_cache, v_cache = (np.array(c, np.float64) for c in caches)
  k_cache[0, index], v_cache[0, index] = k, v
  first = 0 if window is None else max(index + 1 - window, 0)
  scores = np.einsum("hd,shd->hs", q, k_cache[0, first : index + 1]) / np.sqrt(head_dim)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum("hs,shd->hd", weights, v_cache[0, first : index + 1])
  return out[None, None], k_cache, v_cache


def normalized_step(x, norm_scale, norm_bias, kernels, biases, caches, index, window=None):
  return cache_attention_gpu.normalize_project_and_attend(
    x, norm_scale, norm_bias, kernels, *caches, jnp.int32(index),
    eps=1e-5, biases=biases, window=window, block=16, interpret=True,
  )  # fmt: skip


@pytest.mark.parametrize(
  "center, biased, index, window",
  [
    (True, True, 0, None),  # LayerNorm, the first slot
    (True, False, 36, 5),  # no biases, the last slot, a window
    (False, True, 21, None),  # RMSNorm
  ],
)
def test_the_normalized_step_equals_a_float64_reference(center, biased, index, window):
  """float32: the norm, the products and the attention within 2e-5 of
  float64 (float32 sums over D = 600 and 37 slots, in another order); the
  caches' other slots untouched."""
  operands = normalized_operands(21, jnp.float32, center=center, biased=biased)
  out, k_cache, v_cache = normalized_step(*operands, index, window)
  want_out, want_k, want_v = normalized_reference(*operands, index, window, eps=1e-5)
  np.testing.assert_allclose(np.asarray(out, np.float64), want_out, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(np.asarray(k_cache, np.float64), want_k, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(np.asarray(v_cache, np.float64), want_v, atol=2e-5, rtol=2e-5)
  others = np.arange(37) != index
  for got, given in zip((k_cache, v_cache), operands[-1], strict=True):
    np.testing.assert_array_equal(np.asarray(got)[:, others], np.asarray(given)[:, others])


def test_the_normalized_step_adds_eps_where_it_matters():
  """The first case above with its stream scaled down so that its variance
  is about 0.4 eps: there eps changes the norm by O(1), so a dropped eps
  fails (the operands above have variance ~4, where eps = 1e-5 moves the
  output by ~1e-6). The same shapes: the step compiled there runs again."""
  x, *rest = normalized_operands(23, jnp.float32, center=True, biased=True)
  x = x * 1e-3
  out, k_cache, _ = normalized_step(x, *rest, 5)
  want_out, want_k, _ = normalized_reference(x, *rest, 5, None, eps=1e-5)
  np.testing.assert_allclose(np.asarray(out, np.float64), want_out, atol=2e-5, rtol=2e-5)
  np.testing.assert_allclose(np.asarray(k_cache, np.float64), want_k, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("center", [True, False])
def test_the_normalized_step_rounds_as_the_layers_do_in_bfloat16(center):
  """bfloat16: the step of the norm (ops.layer_norm / ops.rms_norm),
  XLA's product and update_and_attend_packed, which the layer runs without
  it: the new key and value within a unit in the last place (the float32
  sums' order differs before one rounding), the output within 3e-2 as the
  other bfloat16 checks."""
  x, norm_scale, norm_bias, kernels, biases, caches = normalized_operands(
    22, jnp.bfloat16, center=center, biased=True
  )
  got = normalized_step(x, norm_scale, norm_bias, kernels, biases, caches, 20)
  if center:
    h = ops.layer_norm(x, norm_scale, norm_bias, eps=1e-5)
  else:
    h = ops.rms_norm(x, norm_scale, eps=1e-5)
  qkv = jnp.stack([jnp.dot(h, w) for w in kernels], axis=1).reshape(1, 1, 3, 4, 16)
  want = cache_attention_gpu.update_and_attend_packed(
    qkv, *caches, jnp.int32(20), biases=biases, block=16, interpret=True
  )
  for got_cache, want_cache in zip(got[1:], want[1:], strict=True):
    np.testing.assert_allclose(
      np.asarray(got_cache, np.float32), np.asarray(want_cache, np.float32), rtol=2**-7, atol=0
    )
  np.testing.assert_allclose(
    np.asarray(got[0], np.float32), np.asarray(want[0], np.float32), atol=3e-2
  )


def test_the_normalized_step_refuses_operands_of_other_shapes():
  x, norm_scale, norm_bias, kernels, biases, caches = normalized_operands(
    23, jnp.float32, center=True, biased=True
  )
  for bad in (
    dict(kernels=kernels[:2]),
    dict(kernels=[w[:, :32] for w in kernels]),
    dict(kernels=[w.astype(jnp.bfloat16) for w in kernels]),
    dict(norm_scale=norm_scale[:8]),
    dict(biases=biases[:2]),
    dict(x=x[0]),
    dict(x=jnp.concatenate([x, x])),  # two rows for caches of one
  ):
    args = dict(x=x, norm_scale=norm_scale, norm_bias=norm_bias, kernels=kernels, biases=biases)
    args.update(bad)
    with pytest.raises(ValueError, match=r"^normalize_project_and_attend takes one new token's"):
      normalized_step(*args.values(), caches, 0)
