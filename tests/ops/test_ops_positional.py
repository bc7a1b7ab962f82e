"""Tests for txf.ops.positional against numpy float64 references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops.positional import (
  alibi_bias,
  alibi_slopes,
  apply_ntk_rope,
  apply_rope,
  last_bucket_start,
  relative_position_bias,
  relative_position_bucket,
  sinusoidal_embedding,
)


def np_sinusoidal(positions, dim, max_timescale=10000.0):
  pe = np.zeros(positions.shape + (dim,))
  for i in range(dim // 2):
    angle = positions.astype(np.float64) / max_timescale ** (2 * i / dim)
    pe[..., 2 * i] = np.sin(angle)
    pe[..., 2 * i + 1] = np.cos(angle)
  return pe


def np_rope(x, positions, base=10000.0, scale=1.0):
  """x [B,T,H,D] float64, positions [B,T]: rotates pairs (i, i + D/2)."""
  half = x.shape[-1] // 2
  out = np.empty_like(x, dtype=np.float64)
  for i in range(half):
    angle = (positions / scale / base ** (2 * i / x.shape[-1]))[:, :, None]
    a, b = x[..., i], x[..., i + half]
    out[..., i] = a * np.cos(angle) - b * np.sin(angle)
    out[..., i + half] = b * np.cos(angle) + a * np.sin(angle)
  return out


def np_alibi_slopes(n):
  """The reference implementation published with the ALiBi paper."""

  def power_of_2(n):
    start = 2 ** (-(2 ** -(math.log2(n) - 3)))
    return [start * start**i for i in range(n)]

  if math.log2(n).is_integer():
    return power_of_2(n)
  closest = 2 ** math.floor(math.log2(n))
  return power_of_2(closest) + np_alibi_slopes(2 * closest)[0::2][: n - closest]


def np_t5_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
  """Line-by-line port of mesh_tensorflow's _relative_position_bucket."""
  ret = 0
  n = -relative_position
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(np.int64) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  with np.errstate(divide="ignore"):
    val_if_large = max_exact + (
      np.log(n.astype(np.float64) / max_exact)
      / math.log(max_distance / max_exact)
      * (num_buckets - max_exact)
    )
  val_if_large = np.minimum(np.nan_to_num(val_if_large, neginf=0).astype(np.int64), num_buckets - 1)
  return ret + np.where(is_small, n, val_if_large)


# --- sinusoidal -------------------------------------------------------------


def test_sinusoidal_matches_formula():
  positions = np.array([[0, 1, 2, 7, 50], [3, 4, 5, 6, 99]])
  got = sinusoidal_embedding(positions, 16, max_timescale=1000.0)
  assert got.shape == (2, 5, 16) and got.dtype == jnp.float32
  np.testing.assert_allclose(got, np_sinusoidal(positions, 16, 1000.0), atol=2e-5)


def test_sinusoidal_float_positions():
  positions = np.array([0.5, 1.25, 3.75])
  np.testing.assert_allclose(
    sinusoidal_embedding(positions, 8), np_sinusoidal(positions, 8), atol=1e-6
  )


def test_sinusoidal_shift_is_fixed_rotation():
  dim, k = 12, 7
  positions = np.arange(20)
  # pe(pos + k) = M_k pe(pos), with one 2x2 rotation per frequency pair.
  m = np.zeros((dim, dim))
  for i in range(dim // 2):
    b = k / 10000.0 ** (2 * i / dim)
    m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[np.cos(b), np.sin(b)], [-np.sin(b), np.cos(b)]]
  pe = np.asarray(sinusoidal_embedding(positions, dim), np.float64)
  shifted = np.asarray(sinusoidal_embedding(positions + k, dim), np.float64)
  np.testing.assert_allclose(pe @ m.T, shifted, atol=2e-5)


# --- RoPE -------------------------------------------------------------------


@pytest.fixture
def qk():
  rng = np.random.default_rng(0)
  return rng.normal(size=(2, 6, 3, 8)).astype(np.float32)


def test_rope_matches_reference(qk):
  positions = np.array([[0, 1, 2, 3, 4, 5], [7, 3, 11, 2, 0, 40]])
  for scale in (1.0, 4.0):
    got = apply_rope(qk, positions, base=500.0, scale=scale)
    assert got.shape == qk.shape and got.dtype == jnp.float32
    np.testing.assert_allclose(
      got, np_rope(qk.astype(np.float64), positions, 500.0, scale), atol=1e-5
    )


def test_rope_preserves_pair_norms(qk):
  got = np.asarray(apply_rope(qk, np.arange(6) * 3), np.float64)
  half = qk.shape[-1] // 2

  def pair_norms(a):
    return np.hypot(a[..., :half], a[..., half:])

  np.testing.assert_allclose(pair_norms(got), pair_norms(qk.astype(np.float64)), rtol=1e-5)


def test_rope_scores_depend_only_on_offset(qk):
  q, k = qk[:, :1], qk[:, 1:2]  # [B, 1, H, D]

  def score(i, j):
    rq = apply_rope(q, np.array([i]))
    rk = apply_rope(k, np.array([j]))
    return np.einsum("bqhd,bkhd->bhqk", rq, rk)

  np.testing.assert_allclose(score(2, 9), score(7, 14), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(score(9, 2), score(14, 7), rtol=1e-5, atol=1e-5)
  # Scores do depend on the offset itself.
  assert not np.allclose(score(2, 9), score(2, 10), atol=1e-3)


def test_rope_scale_is_position_interpolation(qk):
  positions = np.arange(6)
  np.testing.assert_allclose(
    apply_rope(qk, 2 * positions, scale=2.0), apply_rope(qk, positions), atol=1e-6
  )


def test_rope_batched_positions_equal_per_row(qk):
  positions = np.array([[0, 1, 2, 3, 4, 5], [9, 8, 7, 1, 2, 3]])
  batched = apply_rope(qk, positions)
  for b in range(2):
    np.testing.assert_allclose(
      batched[b : b + 1], apply_rope(qk[b : b + 1], positions[b]), atol=1e-6
    )


def test_rope_bfloat16_keeps_dtype(qk):
  positions = np.arange(6)
  got = apply_rope(jnp.asarray(qk, jnp.bfloat16), positions)
  assert got.dtype == jnp.bfloat16
  ref = np_rope(
    np.asarray(jnp.asarray(qk, jnp.bfloat16), np.float64), np.broadcast_to(positions, (2, 6))
  )
  np.testing.assert_allclose(np.asarray(got, np.float64), ref, atol=2e-2, rtol=1e-2)


def test_rope_bfloat16_rotates_by_exact_positions_past_256(qk):
  # bfloat16 holds integers exactly only to 256: positions rounded to the
  # input's dtype rotated position 1001 as 1000 (off by 1.65).
  positions = np.arange(998, 1004)
  x16 = jnp.asarray(qk, jnp.bfloat16)
  got = apply_rope(x16, positions)
  want = apply_rope(x16.astype(jnp.float32), positions).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


# --- ALiBi ------------------------------------------------------------------


def test_alibi_slopes_power_of_two():
  got = alibi_slopes(8)
  assert got.dtype == jnp.float32
  np.testing.assert_array_equal(got, 2.0 ** -np.arange(1, 9))


@pytest.mark.parametrize("num_heads", [1, 3, 6, 12, 16])
def test_alibi_slopes_paper_rule(num_heads):
  np.testing.assert_allclose(alibi_slopes(num_heads), np_alibi_slopes(num_heads), rtol=1e-6)


def test_alibi_bias_values():
  q_pos, k_pos = np.array([0, 3, 5]), np.array([0, 1, 2, 3, 4, 5, 6])
  got = alibi_bias(6, q_pos, k_pos)
  assert got.shape == (1, 6, 3, 7) and got.dtype == jnp.float32
  ref = -np.asarray(np_alibi_slopes(6))[:, None, None] * np.abs(q_pos[:, None] - k_pos[None])
  np.testing.assert_allclose(got[0], ref, rtol=1e-6)


def test_alibi_bias_batched():
  q_pos = np.array([[0, 1, 2], [4, 5, 6]])
  got = alibi_bias(4, q_pos, np.arange(5))
  assert got.shape == (2, 4, 3, 5)
  for b in range(2):
    np.testing.assert_allclose(got[b : b + 1], alibi_bias(4, q_pos[b], np.arange(5)))


# --- T5 relative buckets ----------------------------------------------------


@pytest.mark.parametrize(
  "bidirectional,num_buckets,max_distance",
  [(True, 32, 128), (False, 32, 128), (True, 16, 40), (False, 8, 20)],
)
def test_t5_buckets_match_reference(bidirectional, num_buckets, max_distance):
  offsets = np.arange(-300, 301)
  got = relative_position_bucket(
    offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
  )
  assert got.dtype == jnp.int32
  ref = np_t5_bucket(offsets, bidirectional, num_buckets, max_distance)
  np.testing.assert_array_equal(got, ref)
  assert got.min() >= 0 and got.max() == num_buckets - 1


# The t5_distance sweep's points: where its docstring's table says each
# max distance (32 buckets) starts the last bucket.
SWEEP_LAST_BUCKETS = {32: 31, 64: 59, 128: 113, 512: 413}


@pytest.mark.parametrize(
  # 3: the smallest max distance 4 buckets take (2 exact ones).
  "num_buckets,max_distance",
  [(4, 3), (8, 10_000)] + [(32, distance) for distance in SWEEP_LAST_BUCKETS],
)
def test_last_bucket_start_is_the_first_distance_in_the_last_causal_bucket(
  num_buckets, max_distance
):
  start = last_bucket_start(num_buckets=num_buckets, max_distance=max_distance)
  ref = np_t5_bucket(-np.arange(max_distance + 2), False, num_buckets, max_distance)
  assert ref[start] == ref[max_distance + 1] == num_buckets - 1 > ref[start - 1]
  assert start == SWEEP_LAST_BUCKETS.get(max_distance, start)
  # Concrete under jit too, where a registered bias asks for it.
  traced = jax.jit(
    lambda: jnp.int32(last_bucket_start(num_buckets=num_buckets, max_distance=max_distance))
  )
  assert traced() == start


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_monotone_within_sign(bidirectional):
  distance = np.arange(0, 400)
  for sign in (1, -1):
    buckets = np.asarray(relative_position_bucket(sign * distance, bidirectional=bidirectional))
    if sign == 1 and not bidirectional:
      np.testing.assert_array_equal(buckets, 0)  # future keys are all in bucket 0
    else:
      assert np.all(np.diff(buckets) >= 0)
      # Small offsets get exact buckets; offset 0 is bucket 0 for both signs.
      np.testing.assert_array_equal(buckets[1:8], distance[1:8] + (16 if sign == 1 else 0))


@pytest.mark.parametrize(
  # The smallest counts each direction takes (an odd one only causal), each
  # with the smallest max distance past its exact buckets.
  "bidirectional,num_buckets,max_distance",
  [(True, 4, 2), (False, 2, 2), (False, 3, 2)],
)
def test_t5_buckets_at_the_ends_of_their_ranges_match_reference(
  bidirectional, num_buckets, max_distance
):
  offsets = np.arange(-6, 7)
  got = relative_position_bucket(
    offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
  )
  np.testing.assert_array_equal(
    got, np_t5_bucket(offsets, bidirectional, num_buckets, max_distance)
  )


@pytest.mark.parametrize(
  "bidirectional,num_buckets,max_distance,name",
  [
    (True, 7, 128, "num_buckets"),  # odd: a side would get 3 of them and one none
    (True, 2, 128, "num_buckets"),
    (False, 1, 128, "num_buckets"),
    (True, 4, 1, "max_distance"),  # not past the 1 exact bucket
    (False, 8, 4, "max_distance"),
  ],
)
def test_t5_buckets_past_the_ends_of_their_ranges_are_refused(
  bidirectional, num_buckets, max_distance, name
):
  with pytest.raises(ValueError, match=f"^{name} must"):
    relative_position_bucket(
      np.arange(3), bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )


def test_relative_position_bias_gathers():
  rng = np.random.default_rng(1)
  table = rng.normal(size=(16, 3)).astype(np.float32)
  q_pos, k_pos = np.array([[0, 1, 2, 3], [10, 50, 90, 130]]), np.arange(5)
  got = relative_position_bias(table, q_pos, k_pos, max_distance=40)
  assert got.shape == (2, 3, 4, 5) and got.dtype == jnp.float32
  buckets = np_t5_bucket(k_pos[None, None, :] - q_pos[:, :, None], True, 16, 40)
  np.testing.assert_array_equal(got, table[buckets].transpose(0, 3, 1, 2))


# --- transformations --------------------------------------------------------


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transformations(qk, dtype):
  x = jnp.asarray(qk, dtype)
  positions = jnp.arange(6)
  # Fusion under jit may round differently; allow one ulp of the dtype.
  ulp = float(jnp.finfo(dtype).eps)
  eager = np.asarray(apply_rope(x, positions), np.float32)

  rope_jit = jax.jit(apply_rope)(x, positions)
  np.testing.assert_allclose(np.asarray(rope_jit, np.float32), eager, rtol=ulp, atol=ulp)
  rope_vmap = jax.vmap(apply_rope, in_axes=(0, None))(x[:, None], positions)
  np.testing.assert_allclose(np.asarray(rope_vmap[:, 0], np.float32), eager, rtol=ulp, atol=ulp)
  grad_x = jax.grad(lambda x: jnp.sum(apply_rope(x, positions).astype(jnp.float32) ** 2))(x)
  assert grad_x.dtype == dtype
  # The rotation is orthogonal, so d|R x|^2/dx = 2x.
  np.testing.assert_allclose(
    np.asarray(grad_x, np.float32), 2 * np.asarray(x, np.float32), rtol=2e-2, atol=2e-2
  )

  table = jnp.asarray(np.arange(32 * 3).reshape(32, 3), dtype)
  grad_table = jax.grad(lambda t: jnp.sum(relative_position_bias(t, positions, positions)))(table)
  # Each (t, s) pair adds one count to its bucket in every head.
  buckets = np_t5_bucket(np.arange(6)[None] - np.arange(6)[:, None])
  counts = np.bincount(buckets.ravel(), minlength=32)
  np.testing.assert_array_equal(np.asarray(grad_table, np.float32), counts[:, None] * np.ones(3))

  grad_pos = jax.grad(lambda p: jnp.sum(alibi_bias(4, p, p)) + jnp.sum(sinusoidal_embedding(p, 4)))(
    positions.astype(dtype)
  )
  assert np.all(np.isfinite(np.asarray(grad_pos, np.float32)))
  sin_vmap = jax.jit(jax.vmap(lambda p: sinusoidal_embedding(p, 4)))(positions[:, None])
  np.testing.assert_allclose(sin_vmap, sinusoidal_embedding(positions[:, None], 4), atol=1e-6)


# --- validation -------------------------------------------------------------


@pytest.mark.parametrize(
  "call,name",
  [
    (lambda: sinusoidal_embedding(np.arange(4), 5), "dim"),
    (lambda: sinusoidal_embedding(np.int32(3), 4), "positions"),
    (lambda: apply_rope(np.zeros((1, 4, 2, 5)), np.arange(4)), "head dim"),
    (lambda: apply_rope(np.zeros((4, 2, 6)), np.arange(4)), "x"),
    (lambda: apply_rope(np.zeros((1, 4, 2, 6)), np.arange(5)), "positions"),
    (lambda: apply_rope(np.zeros((1, 4, 2, 6), np.int32), np.arange(4)), "x must be a float"),
    (lambda: apply_rope(np.zeros((1, 4, 2, 6)), np.arange(4), scale=0.0), "scale"),
    (lambda: apply_ntk_rope(np.zeros((1, 4, 2, 2)), np.arange(4), scale=2.0), "head dim"),
    (lambda: apply_ntk_rope(np.zeros(()), np.arange(4)), r"x must have shape \[B, T, H, D\]"),
    (lambda: alibi_slopes(0), "num_heads"),
    (lambda: alibi_bias(4, np.zeros((2, 3)), np.zeros((3, 3))), "q_positions and k_positions"),
    (lambda: alibi_bias(4, np.zeros((1, 2, 3)), np.arange(3)), "q_positions"),
    (lambda: relative_position_bucket(np.arange(3.0)), "relative_position"),
    (lambda: relative_position_bucket(np.arange(3), num_buckets=3), "num_buckets"),
    (lambda: relative_position_bucket(np.arange(3), max_distance=8), "max_distance"),
    (lambda: relative_position_bias(np.zeros((32,)), np.arange(3), np.arange(3)), "table"),
    (
      lambda: relative_position_bias(np.zeros((32, 2)), np.arange(3.0), np.arange(3)),
      "q_positions and k_positions",
    ),
  ],
)
def test_bad_input_raises(call, name):
  with pytest.raises(ValueError, match=name):
    call()


def test_rope_ntk_scales_the_base_not_the_positions():
  """NTK: the fastest pair turns as in RoPE, the slowest `scale` times slower."""
  dim, scale = 8, 4.0
  x = jnp.zeros((1, 2, 1, dim)).at[..., 0].set(1.0).at[..., dim // 2 - 1].set(1.0)
  position_1xT = jnp.array([[0, 5]])
  rotated = apply_ntk_rope(x, position_1xT, scale=scale)[0, 1, 0]
  fastest = jnp.arctan2(rotated[dim // 2], rotated[0])
  slowest = jnp.arctan2(rotated[-1], rotated[dim // 2 - 1])
  np.testing.assert_allclose(fastest, np.angle(np.exp(5j)), rtol=1e-5)
  np.testing.assert_allclose(slowest, 5 * 10000.0 ** (-(dim - 2) / dim) / scale, rtol=1e-5)


def test_rope_ntk_at_the_smallest_head_dim_scales_the_base_by_scale_squared():
  x = jax.random.normal(jax.random.key(0), (1, 3, 2, 4))
  scaled = apply_rope(x, jnp.arange(3), base=10000.0 * 3.0**2)  # D / (D - 2) = 2
  np.testing.assert_allclose(apply_ntk_rope(x, jnp.arange(3), scale=3.0), scaled, rtol=1e-6)


def test_rope_ntk_without_scaling_is_rope():
  x = jax.random.normal(jax.random.key(0), (2, 5, 3, 8))
  np.testing.assert_allclose(apply_ntk_rope(x, jnp.arange(5)), apply_rope(x, jnp.arange(5)))
  with pytest.raises(ValueError, match=r"^scale must be a number >= 1, got 0.5"):
    apply_ntk_rope(x, jnp.arange(5), scale=0.5)  # documented >= 1, as model.options.rope_scale
