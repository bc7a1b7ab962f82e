"""Packed rows (several documents in one row): segment ids and positions.

* ops.segment_mask against a numpy reference;
* a Decoder or Encoder given a packed row [document A | document B] with
  segment ids and per-document positions computes, for every position
  encoding, the logits each document gets alone: attention never crosses a
  document and positions restart -- and its recorded attention weights
  (txf.analysis.attention_maps) are exactly 0 across documents;
* without segment ids nothing changes: same parameters, same logits as with
  one segment at positions 0..T-1;
* the train step feeds a batch's segment ids and positions to the model.

Tolerance: two float32 computations of the same logits, atol = rtol = 1e-5.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import ops
from txf.analysis import attention_maps
from txf.layers.model_config import POSITIONS
from txf.models import ModelConfig, build
from txf.train.step import model_inputs

TOL = dict(atol=1e-5, rtol=1e-5)
TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=2, max_len=16)
A_LEN, B_LEN, PAD = 5, 7, 2
LENGTH = A_LEN + B_LEN + PAD  # every row here: eager ops compile once per shape
KEY = jax.random.key(0)


def rows(seed=0):
  """Packed rows [A | B | pad], [B | A | pad] (tokens, segment ids, positions,
  each [2, LENGTH]) and the documents alone, padded: [A | pad], [B | pad]."""
  rng = np.random.default_rng(seed)
  a, b = rng.integers(1, 32, A_LEN), rng.integers(1, 32, B_LEN)
  pad = lambda *parts: np.concatenate([*parts, np.zeros(LENGTH - sum(map(len, parts)))])
  tokens = np.stack([pad(a, b), pad(b, a)])
  segment_ids = np.stack(
    [pad(np.full(A_LEN, 1), np.full(B_LEN, 2)), pad(np.full(B_LEN, 1), np.full(A_LEN, 2))]
  )
  positions = np.stack(
    [pad(np.arange(A_LEN), np.arange(B_LEN)), pad(np.arange(B_LEN), np.arange(A_LEN))]
  )
  alone = np.stack([pad(a), pad(b)])
  return tuple(jnp.asarray(x, jnp.int32) for x in (tokens, segment_ids, positions, alone))


def model_and_params(family, position):
  head = "lm" if family == "decoder" else "mlm"
  model = build(ModelConfig(**TINY, family=family, head=head, position=position))
  return model, model.init(KEY, jnp.ones((2, LENGTH), jnp.int32))["params"]


def test_segment_mask_matches_a_reference():
  q = np.array([[1, 1, 2, 2, 0], [1, 2, 3, 3, 3]])
  k = np.array([[1, 2, 2, 0], [3, 3, 1, 2]])
  expected = np.array([[[[qi == kj for kj in k[b]] for qi in q[b]]] for b in range(2)])
  np.testing.assert_array_equal(ops.segment_mask(q, k), expected)
  assert ops.segment_mask(q).shape == (2, 1, 5, 5)
  np.testing.assert_array_equal(ops.segment_mask(q)[0, 0], q[0][:, None] == q[0][None, :])
  with pytest.raises(ValueError, match="q_segment_ids must be an int array"):
    ops.segment_mask(np.ones((2, 3), np.float32))
  with pytest.raises(ValueError, match="differ in batch size"):
    ops.segment_mask(q, k[:1])


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_packed_documents_get_their_own_logits(family, position):
  model, params = model_and_params(family, position)
  tokens, segment_ids, positions, alone = rows()
  packed = model.apply({"params": params}, tokens, segment_ids, positions)
  # Padding after a document changes none of its logits (causal decoder,
  # padding-masked encoder), so each document's logits alone are these:
  logits_a, logits_b = model.apply({"params": params}, alone)
  pairs = [(A_LEN, logits_a, logits_b), (B_LEN, logits_b, logits_a)]  # row 0: [A|B], 1: [B|A]
  for row, (first_len, first, second) in enumerate(pairs):
    second_len = A_LEN + B_LEN - first_len
    np.testing.assert_allclose(packed[row, :first_len], first[:first_len], **TOL)
    np.testing.assert_allclose(packed[row, first_len : A_LEN + B_LEN], second[:second_len], **TOL)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_attention_weights_never_cross_documents(family):
  model, params = model_and_params(family, "learned")
  tokens, segment_ids, positions, _ = rows(1)
  across_BxTxT = ~np.asarray(ops.segment_mask(segment_ids))[:, 0]
  maps = attention_maps(model, params, tokens, segment_ids, positions)
  assert len(maps) == TINY["num_layers"]
  for weights_BxHxTxT in maps.values():
    assert np.all(np.asarray(weights_BxHxTxT).transpose(0, 2, 3, 1)[across_BxTxT] == 0.0)
  # Without segment ids the same rows attend across their documents.
  crossing = attention_maps(model, params, tokens)
  assert all(np.asarray(w).transpose(0, 2, 3, 1)[across_BxTxT].max() > 0 for w in crossing.values())


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_one_segment_changes_nothing(family):
  model, plain = model_and_params(family, "sinusoidal")
  tokens, _, _, _ = rows(2)
  ones, arange = jnp.ones_like(tokens), jnp.broadcast_to(jnp.arange(LENGTH), tokens.shape)
  packed = model.init(KEY, tokens, ones, arange)["params"]
  assert jax.tree.structure(plain) == jax.tree.structure(packed)
  for x, y in zip(jax.tree.leaves(plain), jax.tree.leaves(packed)):
    np.testing.assert_array_equal(x, y)
  np.testing.assert_allclose(
    model.apply({"params": plain}, tokens, ones, arange),
    model.apply({"params": plain}, tokens),
    **TOL,
  )


def test_bad_packing_inputs_are_named():
  model, params = model_and_params("decoder", "rope")
  tokens, segment_ids, _, _ = rows()
  with pytest.raises(ValueError, match=r"segment_ids: expected int \[B, T\]"):
    model.apply({"params": params}, tokens, segment_ids[:, 1:])
  with pytest.raises(ValueError, match="positions: expected int"):
    model.apply({"params": params}, tokens, None, segment_ids.astype(jnp.float32))
  with pytest.raises(ValueError, match="use_cache"):
    model.init(KEY, tokens, segment_ids, use_cache=True)


def test_train_step_feeds_segments_to_the_model():
  batch = dict(
    inputs=np.ones((2, 4), np.int32),
    targets=np.ones((2, 4), np.int32),
    weights=np.ones((2, 4), np.float32),
  )
  assert len(model_inputs(batch, "lm")) == 1
  packed = dict(
    batch,
    segment_ids=np.full((2, 4), 1, np.int32),
    positions=np.tile(np.arange(4, dtype=np.int32), (2, 1)),
  )
  inputs, segment_ids, positions = model_inputs(packed, "mlm")
  assert inputs is packed["inputs"] and segment_ids is packed["segment_ids"]
  assert positions is packed["positions"]
