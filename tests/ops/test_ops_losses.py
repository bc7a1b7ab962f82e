"""Tests for txf.ops.losses against numpy float64 references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops.losses import (
  cross_entropy,
  cross_entropy_sums,
  linear_cross_entropy_sums,
  token_cross_entropy,
)

V = 11


def np_log_softmax(logits):
  logits = logits.astype(np.float64)
  m = logits.max(-1, keepdims=True)
  lse = m + np.log(np.exp(logits - m).sum(-1, keepdims=True))
  return logits - lse, lse[..., 0]


def np_target(labels, label_smoothing):
  return (1 - label_smoothing) * np.eye(V)[labels] + label_smoothing / V


def np_token_cross_entropy(logits, labels, label_smoothing=0.0, z_loss=0.0):
  log_probs, lse = np_log_softmax(logits)
  return -(np_target(labels, label_smoothing) * log_probs).sum(-1) + z_loss * lse**2


def np_cross_entropy(logits, labels, weights, label_smoothing=0.0, z_loss=0.0):
  per_token = np_token_cross_entropy(logits, labels, label_smoothing, z_loss)
  return (weights * per_token).sum() / weights.sum(), weights.sum()


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  logits = (rng.normal(size=(3, 7, V)) * 4).astype(np.float32)
  labels = rng.integers(0, V, size=(3, 7))
  weights = (rng.random((3, 7)) > 0.3).astype(np.float32) * rng.uniform(0.5, 2, (3, 7))
  return logits, labels, weights.astype(np.float32)


@pytest.mark.parametrize(
  "label_smoothing,z_loss", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-2), (0.2, 1e-3)]
)
def test_matches_reference(batch, label_smoothing, z_loss):
  logits, labels, weights = batch
  loss, num_tokens = cross_entropy(
    logits, labels, weights=weights, label_smoothing=label_smoothing, z_loss=z_loss
  )
  assert loss.dtype == num_tokens.dtype == jnp.float32 and loss.shape == ()
  ref_loss, ref_num = np_cross_entropy(logits, labels, weights, label_smoothing, z_loss)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  np.testing.assert_allclose(num_tokens, ref_num, rtol=1e-6)


@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.2, 1e-3)])
def test_token_losses_match_reference(batch, label_smoothing, z_loss):
  logits, labels, _ = batch
  per_token = token_cross_entropy(logits, labels, label_smoothing=label_smoothing, z_loss=z_loss)
  assert per_token.dtype == jnp.float32 and per_token.shape == labels.shape
  np.testing.assert_allclose(
    per_token, np_token_cross_entropy(logits, labels, label_smoothing, z_loss), rtol=1e-5
  )


def test_default_weights_and_bool_weights(batch):
  logits, labels, weights = batch
  loss, num_tokens = cross_entropy(logits, labels)
  ref_loss, _ = np_cross_entropy(logits, labels, np.ones(labels.shape))
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  assert num_tokens == labels.size
  mask = weights > 0
  loss, num_tokens = cross_entropy(logits, labels, weights=mask)
  np.testing.assert_allclose(loss, np_cross_entropy(logits, labels, mask * 1.0)[0], rtol=1e-5)
  assert num_tokens == mask.sum()


def test_padded_tokens_do_not_change_loss(batch):
  logits, labels, weights = batch
  pad = weights == 0
  rng = np.random.default_rng(1)
  other_logits = np.where(pad[..., None], rng.normal(size=logits.shape) * 50, logits)
  other_labels = np.where(pad, rng.integers(0, V, labels.shape), labels)
  base = cross_entropy(logits, labels, weights=weights, label_smoothing=0.1, z_loss=1e-3)
  other = cross_entropy(
    other_logits.astype(np.float32), other_labels, weights=weights, label_smoothing=0.1, z_loss=1e-3
  )
  assert pad.any() and not np.allclose(other_logits, logits)
  np.testing.assert_allclose(other[0], base[0], rtol=1e-6)
  assert other[1] == base[1]


def test_zero_weights_give_zero(batch):
  logits, labels, _ = batch
  zeros = np.zeros(labels.shape, np.float32)
  loss, num_tokens = cross_entropy(logits, labels, weights=zeros)
  assert loss == 0.0 and num_tokens == 0.0
  grad = jax.grad(lambda z: cross_entropy(z, labels, weights=zeros)[0])(logits)
  np.testing.assert_array_equal(grad, 0.0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_gradient_is_softmax_minus_target(batch, label_smoothing):
  logits, labels, weights = batch
  grad = jax.grad(
    lambda z: cross_entropy(z, labels, weights=weights, label_smoothing=label_smoothing)[0]
  )(logits)
  log_probs, _ = np_log_softmax(logits)
  ref = (np.exp(log_probs) - np_target(labels, label_smoothing)) * weights[..., None]
  np.testing.assert_allclose(grad, ref / weights.sum(), atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_transformations(batch, dtype):
  logits, labels, weights = batch
  logits = jnp.asarray(logits, dtype)
  ref_loss, _ = np_cross_entropy(np.asarray(logits, np.float64), labels, weights, 0.1, 1e-3)

  fn = lambda z, y, w: cross_entropy(z, y, weights=w, label_smoothing=0.1, z_loss=1e-3)
  loss, _ = jax.jit(fn)(logits, labels, weights)
  # Statistics are float32 even for bfloat16 logits, so only float32 rounding remains.
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
  rows, counts = jax.vmap(fn)(logits, labels, weights)
  for b in range(labels.shape[0]):
    np.testing.assert_allclose(
      rows[b],
      np_cross_entropy(np.asarray(logits[b], np.float64), labels[b], weights[b], 0.1, 1e-3)[0],
      rtol=1e-5,
    )
  np.testing.assert_allclose(counts, weights.sum(-1), rtol=1e-6)
  grad = jax.grad(lambda z: fn(z, labels, weights)[0])(logits)
  assert grad.dtype == dtype and np.all(np.isfinite(np.asarray(grad, np.float32)))


@pytest.mark.parametrize(
  "kwargs,name",
  [
    (dict(labels=np.zeros((3, 6), np.int32)), "labels"),
    (dict(labels=np.zeros((3, 7), np.float32)), "labels"),
    (dict(labels=np.full((3, 7), V, np.int32)), rf"labels must be in \[0, {V}\), got ids from {V}"),
    (dict(labels=np.full((3, 7), -1, np.int32)), rf"labels must be in \[0, {V}\), got ids from -1"),
    (dict(weights=np.ones((3, 6))), "weights"),
    (dict(label_smoothing=1.0), "label_smoothing"),
    (dict(label_smoothing=-0.1), "label_smoothing"),
    (dict(z_loss=-1.0), "z_loss"),
    (dict(label_smoothing=np.array([0.1, 0.2])), r"^label_smoothing must be a scalar, got shape"),
    (dict(z_loss=np.zeros((3, 7))), r"^z_loss must be a scalar, got shape \(3, 7\)"),
    (dict(logits=np.zeros((3, 7, V), np.int32)), "logits"),
  ],
)
def test_bad_input_raises(batch, kwargs, name):
  logits, labels, _ = batch
  args = dict(logits=logits, labels=labels) | kwargs
  with pytest.raises(ValueError, match=name):
    cross_entropy(**args)


@pytest.mark.parametrize("label", [-1, 5])
def test_every_loss_path_refuses_a_label_outside_the_vocabulary(label):
  """Each path gave another wrong value: NaN, a wrapped id, or log_z."""
  x_BxTxD, kernel_DxV = np.ones((1, 2, 3), np.float32), np.ones((3, 5), np.float32)
  labels_BxT = np.array([[0, label]])
  logits = x_BxTxD @ kernel_DxV
  paths = [
    lambda: cross_entropy(logits, labels_BxT),
    lambda: token_cross_entropy(logits, labels_BxT),
    lambda: cross_entropy_sums(logits, labels_BxT),
    lambda: linear_cross_entropy_sums(x_BxTxD, kernel_DxV, labels_BxT, chunk_len=1),
  ]
  for path in paths:
    with pytest.raises(ValueError, match=r"^labels must be in \[0, 5\), got ids from "):
      path()


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.bool_])
def test_the_fused_loss_refuses_an_operand_dtype_that_is_not_floating(dtype):
  """An int dtype truncated x and the kernel to integers: a wrong loss."""
  x_BxTxD, kernel_DxV = np.ones((1, 2, 3), np.float32), np.ones((3, 5), np.float32)
  with pytest.raises(ValueError, match="^dtype must be floating, got "):
    linear_cross_entropy_sums(x_BxTxD, kernel_DxV, np.zeros((1, 2), int), chunk_len=1, dtype=dtype)


# ---------------------------------------------------------------------------
# cross_entropy_sums: the training loss, one pass over the logits each way.


def np_grad(logits, labels, weights, label_smoothing, z_loss):
  """d sum(w * loss) / d logits in float64."""
  log_probs, lse = np_log_softmax(logits)
  softmax = np.exp(log_probs) * (1 + 2 * z_loss * lse)[..., None]
  return weights[..., None] * (softmax - np_target(labels, label_smoothing))


@pytest.mark.parametrize(
  "label_smoothing,z_loss", [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-2), (0.2, 1e-3)]
)
def test_sums_and_their_gradient_match_float64(batch, label_smoothing, z_loss):
  logits, labels, weights = batch
  sums = lambda z: cross_entropy_sums(  # noqa: E731
    z, labels, weights=weights, label_smoothing=label_smoothing, z_loss=z_loss
  )
  loss_sum, num_tokens, correct = sums(logits)
  ref_loss, ref_num = np_cross_entropy(logits, labels, weights, label_smoothing, z_loss)
  np.testing.assert_allclose(loss_sum, ref_loss * ref_num, rtol=1e-5)
  np.testing.assert_allclose(num_tokens, ref_num, rtol=1e-6)
  np.testing.assert_allclose(correct, ((logits.argmax(-1) == labels) * weights).sum(), rtol=1e-6)
  grad = jax.grad(lambda z: sums(z)[0])(logits)
  ref = np_grad(logits, labels, weights, label_smoothing, z_loss)
  np.testing.assert_allclose(grad, ref, atol=1e-6, rtol=1e-5)
  # The same as differentiating the reference implementation.
  plain = jax.grad(
    lambda z: (
      cross_entropy(z, labels, weights=weights, label_smoothing=label_smoothing, z_loss=z_loss)[0]
      * weights.sum()
    )
  )(logits)
  np.testing.assert_allclose(grad, plain, atol=1e-6)


def test_the_sums_gradient_scales_with_the_loss_cotangent(batch):
  """The backward pass multiplies the forward pass's gradient by the loss
  sum's cotangent: a loss scaled by 0.5 (or divided by its token count
  outside) has half the gradient, against float64."""
  logits, labels, weights = batch
  grad = jax.grad(lambda z: 0.5 * cross_entropy_sums(z, labels, weights=weights)[0])(logits)
  np.testing.assert_allclose(
    grad, 0.5 * np_grad(logits, labels, weights, 0.0, 0.0), atol=1e-6, rtol=1e-5
  )


def test_correct_counts_the_first_largest_logit_as_argmax_does():
  # Ties: argmax picks the first index of the largest logit.
  logits = np.array([[[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [5.0, 1.0, 5.0, 4.0]]] * 2)
  labels = np.array([[1, 0, 2], [2, 3, 0]])
  _, _, correct = cross_entropy_sums(logits.astype(np.float32), labels)
  assert correct == (logits.argmax(-1) == labels).sum() == 3


def test_masked_vocabulary_entries_and_zero_weights_stay_finite(batch):
  logits, labels, weights = batch
  logits = logits.copy()
  logits[..., -3:] = -np.inf  # ids a model may never emit
  labels = labels % (V - 3)
  weights[0] = 0.0
  loss_sum, _, _ = cross_entropy_sums(logits, labels, weights=weights)
  grad = jax.grad(lambda z: cross_entropy_sums(z, labels, weights=weights)[0])(logits)
  _, lse = np_log_softmax(logits[..., : V - 3])
  nll = lse - np.take_along_axis(logits, labels[..., None], -1)[..., 0]
  np.testing.assert_allclose(loss_sum, (weights * nll).sum(), rtol=1e-5)
  assert np.all(np.isfinite(grad)) and np.all(grad[..., -3:] == 0) and np.all(grad[0] == 0)
  # The per-token and mean paths too (they were NaN: 0 * the infinite
  # uniform part of label smoothing, which is off).
  np.testing.assert_allclose(token_cross_entropy(logits, labels), nll, rtol=1e-5)
  mean, _ = cross_entropy(logits, labels, weights=weights)
  np.testing.assert_allclose(mean, (weights * nll).sum() / weights.sum(), rtol=1e-5)
  # A zero smoothing of numpy's or jax's scalar types is off too (it was NaN).
  for zero in (0, np.float32(0.0), jnp.float32(0.0)):
    smoothed = token_cross_entropy(logits, labels, label_smoothing=zero)
    np.testing.assert_allclose(smoothed, nll, rtol=1e-5)
  # And one traced (a smoothing swept under jit or vmap), with its gradient.
  traced = jax.jit(lambda s: token_cross_entropy(logits, labels, label_smoothing=s))
  np.testing.assert_allclose(traced(0.0), nll, rtol=1e-5)
  grad = jax.grad(lambda z: token_cross_entropy(z, labels, label_smoothing=jnp.float32(0)).sum())
  assert np.all(np.isfinite(jax.jit(grad)(logits)))


def test_bfloat16_logits_give_a_bfloat16_gradient_of_float32_statistics(batch):
  logits, labels, weights = batch
  low = jnp.asarray(logits, jnp.bfloat16)
  loss_sum, _, _ = jax.jit(lambda z: cross_entropy_sums(z, labels, weights=weights))(low)
  ref_loss, ref_num = np_cross_entropy(np.asarray(low, np.float64), labels, weights)
  np.testing.assert_allclose(loss_sum, ref_loss * ref_num, rtol=1e-5)
  grad = jax.grad(lambda z: cross_entropy_sums(z, labels, weights=weights)[0])(low)
  assert grad.dtype == jnp.bfloat16
  ref = np_grad(np.asarray(low, np.float64), labels, weights, 0.0, 0.0)
  np.testing.assert_allclose(np.asarray(grad, np.float64), ref, atol=1e-2)


def test_a_zero_z_loss_leaves_out_its_term_where_log_z_squared_overflows():
  """z_loss=0 (the default) added 0 * log_z^2: NaN once log_z^2 overflows
  float32 (|log_z| past ~1.8e19), where the loss is finite (0 here: the
  label holds the row's largest logit). Concrete, jax-scalar and traced zeros."""
  logits = jnp.array([[2e19, 0.0, -1.0]], jnp.float32)
  labels = jnp.array([0])
  for zero in (0.0, jnp.float32(0.0)):
    assert float(token_cross_entropy(logits, labels, z_loss=zero)[0]) == 0.0
    assert float(cross_entropy(logits, labels, z_loss=zero)[0]) == 0.0
    assert float(cross_entropy_sums(logits, labels, z_loss=zero)[0]) == 0.0
  traced = jax.jit(lambda z: token_cross_entropy(logits, labels, z_loss=z))
  assert float(traced(0.0)[0]) == 0.0
  loss_sum = linear_cross_entropy_sums(logits[None], jnp.eye(3), labels[None], chunk_len=1)[0]
  assert float(loss_sum) == 0.0


@pytest.mark.parametrize("hyperparameter, value", [("label_smoothing", 1.5), ("z_loss", -1.0)])
def test_out_of_range_hyperparameters_are_refused_as_jax_scalars_too(hyperparameter, value):
  """Concrete values are checked: numpy's were, jax's passed silently."""
  logits, labels = jnp.zeros((2, V)), jnp.array([0, 1])
  for scalar in (value, np.float32(value), jnp.float32(value)):
    for loss in (cross_entropy, cross_entropy_sums):
      with pytest.raises(ValueError, match=rf"^{hyperparameter} must be"):
        loss(logits, labels, **{hyperparameter: scalar})


@pytest.mark.parametrize("hyperparameter", ["label_smoothing", "z_loss"])
def test_the_summed_losses_refuse_a_traced_hyperparameter_in_one_line(hyperparameter):
  """Their custom gradients take them as static floats: a traced one was
  jax's ConcretizationTypeError from float(); cross_entropy takes it."""
  logits, labels = jnp.zeros((1, 4, V)), jnp.zeros((1, 4), jnp.int32)
  x, kernel = jnp.zeros((1, 4, 3)), jnp.zeros((3, V))
  for name, loss in [
    ("cross_entropy_sums", lambda value: cross_entropy_sums(logits, labels, **value)),
    ("linear_cross_entropy_sums", lambda value: linear_cross_entropy_sums(
      x, kernel, labels, chunk_len=2, **value
    )),
  ]:  # fmt: skip
    with pytest.raises(ValueError, match=rf"^{name}: {hyperparameter} must be known outside jit"):
      jax.jit(lambda v, loss=loss: loss({hyperparameter: v})[0])(0.1)
  traced = jax.jit(lambda v: cross_entropy(logits, labels, **{hyperparameter: v})[0])(0.1)
  eager = cross_entropy(logits, labels, **{hyperparameter: 0.1})[0]
  np.testing.assert_allclose(traced, eager, rtol=1e-6)
