"""Tests for txf.ops.masks against masks built elementwise in numpy."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops.masks import causal_mask, combine_masks, padding_mask, sliding_window_mask


def np_causal(T, S, offset=0):
  m = np.zeros((T, S), bool)
  for i, j in itertools.product(range(T), range(S)):
    m[i, j] = j <= offset + i
  return m


def np_window(T, S, window, offset=0):
  m = np.zeros((T, S), bool)
  for i, j in itertools.product(range(T), range(S)):
    m[i, j] = abs(offset + i - j) < window
  return m


# ---------------------------------------------------------------------------
# causal_mask


@pytest.mark.parametrize("T,S", [(5, 5), (3, 6), (6, 3), (1, 4)])
def test_causal_mask_matches_elementwise(T, S):
  m = causal_mask(T, S)
  assert m.shape == (1, 1, T, S) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(m)[0, 0], np_causal(T, S))


def test_causal_mask_k_len_defaults_to_q_len():
  np.testing.assert_array_equal(np.asarray(causal_mask(4))[0, 0], np.tril(np.ones((4, 4), bool)))


@pytest.mark.parametrize("offset", [0, 2, 5, jnp.int32(3), np.int64(1)])
def test_causal_mask_scalar_offset_matches_rows_of_full_mask(offset):
  S, T = 8, 3
  full = np.asarray(causal_mask(S))[0, 0]
  o = int(offset)
  m = causal_mask(T, S, q_offset=offset)
  assert m.shape == (1, 1, T, S)
  np.testing.assert_array_equal(np.asarray(m)[0, 0], full[o : o + T])


def test_causal_mask_per_batch_offset_for_kv_cache():
  S, T = 8, 2
  offsets = jnp.array([0, 3, 6], jnp.int32)
  full = np.asarray(causal_mask(S))[0, 0]
  m = causal_mask(T, S, q_offset=offsets)
  assert m.shape == (3, 1, T, S)
  for b, o in enumerate(np.asarray(offsets)):
    np.testing.assert_array_equal(np.asarray(m)[b, 0], full[o : o + T])
    np.testing.assert_array_equal(np.asarray(m)[b, 0], np_causal(T, S, o))


def test_causal_mask_traced_offset_under_jit():
  f = jax.jit(lambda o: causal_mask(1, 6, q_offset=o))
  for o in (0, 4):
    np.testing.assert_array_equal(np.asarray(f(jnp.int32(o)))[0, 0], np_causal(1, 6, o))
  offsets = jnp.array([1, 5])
  out = jax.jit(lambda o: causal_mask(1, 6, q_offset=o))(offsets)
  assert out.shape == (2, 1, 1, 6)
  np.testing.assert_array_equal(
    np.asarray(out)[:, 0, 0], [np_causal(1, 6, 1)[0], np_causal(1, 6, 5)[0]]
  )


def test_causal_mask_bad_args():
  with pytest.raises(ValueError, match="q_offset"):
    causal_mask(2, 4, q_offset=jnp.zeros((2, 2), jnp.int32))
  with pytest.raises(ValueError, match="q_offset"):
    causal_mask(2, 4, q_offset=0.5)
  with pytest.raises(ValueError, match="q_len"):
    causal_mask(-1)
  with pytest.raises(ValueError, match="k_len"):
    causal_mask(2, 3.0)


def test_masks_take_lengths_of_zero():
  """0 is the lower end of every length (an empty prompt, no keys yet), not
  refused as -1 is: empty masks of the documented shapes (traced only: an
  empty array's ops compile for nothing)."""
  shape = lambda make: jax.eval_shape(make).shape
  assert shape(lambda: causal_mask(0, 3)) == (1, 1, 0, 3)
  assert shape(lambda: causal_mask(2, 0)) == (1, 1, 2, 0)
  assert shape(lambda: sliding_window_mask(0, 4, window=2)) == (1, 1, 0, 4)
  assert shape(lambda: padding_mask(lengths=jnp.array([0, 0]), k_len=0)) == (2, 1, 1, 0)


# ---------------------------------------------------------------------------
# sliding_window_mask


@pytest.mark.parametrize(
  "T,S,window,offset",
  [(6, 6, 1, 0), (6, 6, 2, 0), (6, 6, 3, 0), (4, 9, 3, 0), (4, 9, 2, 5), (6, 6, 100, 0)],
)
def test_sliding_window_matches_elementwise(T, S, window, offset):
  m = sliding_window_mask(T, S, window=window, q_offset=offset)
  assert m.shape == (1, 1, T, S) and m.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(m)[0, 0], np_window(T, S, window, offset))


def test_sliding_window_semantics():
  m = np.asarray(sliding_window_mask(5, window=2))[0, 0]
  # window=2: the query sees itself and one key on each side.
  np.testing.assert_array_equal(m[2], [False, True, True, True, False])
  np.testing.assert_array_equal(
    np.asarray(sliding_window_mask(4, window=1))[0, 0], np.eye(4, dtype=bool)
  )
  # AND causal: itself and window-1 previous keys.
  local = np.asarray(combine_masks(causal_mask(6), sliding_window_mask(6, window=3)))[0, 0]
  for i in range(6):
    np.testing.assert_array_equal(np.nonzero(local[i])[0], np.arange(max(0, i - 2), i + 1))


def test_sliding_window_per_batch_offset():
  offsets = jnp.array([0, 4])
  m = sliding_window_mask(2, 8, window=2, q_offset=offsets)
  assert m.shape == (2, 1, 2, 8)
  for b, o in enumerate((0, 4)):
    np.testing.assert_array_equal(np.asarray(m)[b, 0], np_window(2, 8, 2, o))


@pytest.mark.parametrize("window", [0, -1, 1.5, None])
def test_sliding_window_bad_window(window):
  with pytest.raises(ValueError, match="window"):
    sliding_window_mask(4, window=window)


# ---------------------------------------------------------------------------
# padding_mask / combine_masks


def test_padding_mask_from_lengths_and_tokens():
  lengths = jnp.array([3, 0, 5])
  m = padding_mask(lengths=lengths, k_len=5)
  assert m.shape == (3, 1, 1, 5) and m.dtype == jnp.bool_
  expected = np.array([[j < L for j in range(5)] for L in (3, 0, 5)])
  np.testing.assert_array_equal(np.asarray(m)[:, 0, 0], expected)

  tokens = jnp.array([[5, 6, 0, 0], [7, 0, 8, 0]])
  m = padding_mask(tokens=tokens)
  assert m.shape == (2, 1, 1, 4)
  np.testing.assert_array_equal(np.asarray(m)[:, 0, 0], [[1, 1, 0, 0], [1, 0, 1, 0]])
  m = padding_mask(tokens=tokens, pad_id=7)
  np.testing.assert_array_equal(np.asarray(m)[:, 0, 0], [[1, 1, 1, 1], [0, 1, 1, 1]])


def test_padding_mask_bad_args():
  with pytest.raises(ValueError, match="exactly one of lengths= or tokens="):
    padding_mask()
  with pytest.raises(ValueError, match="exactly one of lengths= or tokens="):
    padding_mask(lengths=jnp.array([1]), tokens=jnp.ones((1, 3), jnp.int32), k_len=3)
  with pytest.raises(ValueError, match="k_len"):
    padding_mask(lengths=jnp.array([1, 2]))
  with pytest.raises(ValueError, match="lengths"):
    padding_mask(lengths=jnp.ones((2, 2), jnp.int32), k_len=3)
  with pytest.raises(ValueError, match="tokens"):
    padding_mask(tokens=jnp.ones((3,), jnp.int32))
  with pytest.raises(ValueError, match="k_len"):
    padding_mask(tokens=jnp.ones((1, 3), jnp.int32), k_len=4)


def test_combine_causal_and_padding_matches_elementwise():
  B, T, S = 3, 4, 6
  lengths = np.array([6, 2, 4])
  got = np.asarray(
    combine_masks(causal_mask(T, S), padding_mask(lengths=jnp.asarray(lengths), k_len=S))
  )
  assert got.shape == (B, 1, T, S)
  expected = np.zeros((B, 1, T, S), bool)
  for b, i, j in itertools.product(range(B), range(T), range(S)):
    expected[b, 0, i, j] = (j <= i) and (j < lengths[b])
  np.testing.assert_array_equal(got, expected)


def test_combine_masks_none_and_broadcasting():
  assert combine_masks() is None
  assert combine_masks(None, None) is None
  a = jnp.array([[True, False, True]])  # [1, 3]
  np.testing.assert_array_equal(np.asarray(combine_masks(None, a, None)), np.asarray(a))
  b = jnp.array([[True], [False]])  # [2, 1]
  out = combine_masks(a, b)
  assert out.shape == (2, 3)
  np.testing.assert_array_equal(np.asarray(out), [[True, False, True], [False, False, False]])


def test_combine_masks_rejects_bad_inputs():
  with pytest.raises(ValueError, match="boolean"):
    combine_masks(jnp.ones((2, 2)), None)
  with pytest.raises(ValueError, match="broadcast"):
    combine_masks(jnp.ones((2, 3), bool), jnp.ones((4,), bool))


def test_masks_under_vmap():
  # vmap over per-example offsets gives the same as the [B] offset form.
  offsets = jnp.array([0, 2, 5])
  per_ex = jax.vmap(lambda o: causal_mask(2, 8, q_offset=o)[0])(offsets)
  np.testing.assert_array_equal(np.asarray(per_ex), np.asarray(causal_mask(2, 8, q_offset=offsets)))
  lengths = jnp.array([1, 4])
  per_ex = jax.vmap(lambda L: padding_mask(lengths=L[None], k_len=5)[0])(lengths)
  np.testing.assert_array_equal(
    np.asarray(per_ex), np.asarray(padding_mask(lengths=lengths, k_len=5))
  )


def test_txf_ops_exports_each_ops_module_public_function_and_nothing_else():
  """Each module's __all__ is what txf.ops exports from it (prefix_lm_mask
  and last_bucket_start were exported but missing from their modules'
  lists, apply_ntk_rope listed but not exported)."""
  import importlib

  import txf.ops

  names = set()
  for module in ("attention", "linear_attention", "losses", "masks", "norms", "positional"):
    listed = importlib.import_module(f"txf.ops.{module}").__all__
    names |= set(listed)
    for name in listed:
      assert getattr(txf.ops, name) is getattr(importlib.import_module(f"txf.ops.{module}"), name)
  assert set(txf.ops.__all__) == names
