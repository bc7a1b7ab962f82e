"""The GPU cross-entropy kernel (txf.ops.cross_entropy_gpu), run by Pallas's
interpreter on the CPU, against numpy float64 and against the XLA path it
stands in for; and when `ops.cross_entropy_sums` picks it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.ops import cross_entropy_gpu, losses, platform

N, V = 5, 300


def np_statistics_and_gradient(logits, labels, weights, label_smoothing, z_loss):
  """float64: log-sum-exp, label's logit, first-argmax == label, sum, and
  d sum(w * loss) / d logits."""
  x = logits.astype(np.float64)
  top = x.max(-1, keepdims=True)
  log_z = (top + np.log(np.exp(x - top).sum(-1, keepdims=True)))[:, 0]
  rows = np.arange(len(x))
  target = (1 - label_smoothing) * np.eye(x.shape[-1])[labels] + label_smoothing / x.shape[-1]
  softmax = np.exp(x - log_z[:, None]) * (1 + 2 * z_loss * log_z)[:, None]
  grad = weights[:, None] * (softmax - target)
  correct = x.argmax(-1) == labels
  return log_z, x[rows, labels], correct, x.sum(-1), grad


@pytest.fixture
def rows():
  rng = np.random.default_rng(3)
  logits = (rng.normal(size=(N, V)) * 3).astype(np.float32)
  labels = rng.integers(0, V, size=N)
  labels[:2] = [0, V - 1]  # the first and last columns
  logits[2, labels[2]] = 20.0  # a label that is the argmax
  logits[3, [7, labels[3]]] = 25.0  # tied for the max after an earlier column: not correct
  labels[3] = max(labels[3], 8)
  logits[3, labels[3]] = 25.0
  weights = rng.uniform(0.5, 2.0, size=N).astype(np.float32)
  weights[4] = 0.0
  return jnp.asarray(logits, jnp.bfloat16), jnp.asarray(labels), jnp.asarray(weights)


@pytest.mark.parametrize("block", [None, 128])  # one block of 512; three, the last partial
@pytest.mark.parametrize("label_smoothing,z_loss", [(0.0, 0.0), (0.1, 1e-3)])
def test_kernel_matches_float64(rows, block, label_smoothing, z_loss):
  """Statistics to float32 rounding (rtol 1e-5). The gradient to bf16's
  half ulp (2^-8 relative) plus float32's error in exp(x - log_z), where
  x - log_z loses |log_z| 2^-24 (4x that, times the weight; it matters for
  the label of a row it nearly saturates, p - 1 ~ -2e-5); and within one
  bf16 ulp of the XLA path's."""
  logits, labels, weights = rows
  got = cross_entropy_gpu.statistics_and_gradient(
    logits,
    labels,
    weights,
    label_smoothing=label_smoothing,
    z_loss=z_loss,
    block=block,
    interpret=True,
  )
  want = np_statistics_and_gradient(
    np.asarray(logits, np.float64), np.asarray(labels), np.asarray(weights), label_smoothing, z_loss
  )
  for name, g, w in zip(
    ("log_z", "label_logit", "logits_sum"), got[:2] + got[3:4], want[:2] + want[3:4]
  ):
    np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5, err_msg=name)
  np.testing.assert_array_equal(np.asarray(got[2]), want[2])
  assert got[2].tolist()[2:4] == [True, False]  # the argmax row; the tie lost to column 7
  assert got[4].dtype == jnp.bfloat16
  grad = np.asarray(got[4], np.float64)
  float32_error = 4 * 2.0**-24 * np.abs(want[0]) * np.asarray(weights)
  assert np.all(np.abs(grad - want[4]) <= 2.0**-8 * np.abs(want[4]) + float32_error[:, None])
  xla_log_z = losses._logit_statistics(logits, labels, with_sum=False)[0]
  xla = losses._logit_gradient(logits, labels, weights, xla_log_z, label_smoothing, z_loss)
  xla = np.asarray(xla, np.float64)
  assert np.all(np.abs(grad - xla) <= 2.0**-7 * np.abs(xla))
  assert not np.any(grad[4])  # weight 0


def test_kernel_equals_the_xla_path_on_non_finite_rows():
  """A NaN logit makes its row's statistics and gradient NaN, +inf makes
  the log-sum-exp inf, as in `losses._logit_statistics`: the train step
  skips such an update by the loss."""
  logits = np.zeros((3, 40), np.float32)
  logits[0, 5] = np.nan
  logits[1, 9] = np.inf
  logits = jnp.asarray(logits, jnp.bfloat16)
  labels, weights = jnp.asarray([1, 2, 3]), jnp.ones(3)
  log_z, _, _, _, grad = cross_entropy_gpu.statistics_and_gradient(
    logits, labels, weights, label_smoothing=0.0, z_loss=0.0, block=16, interpret=True
  )
  xla_log_z = losses._logit_statistics(logits, labels, with_sum=False)[0]
  assert np.isnan(log_z[0]) and np.isnan(xla_log_z[0])
  assert log_z[1] == xla_log_z[1] == np.inf
  assert np.all(np.isnan(np.asarray(grad[0], np.float32)))
  np.testing.assert_allclose(np.asarray(log_z[2]), np.log(40.0), rtol=1e-6)


def _grad_jaxpr(logits, labels):
  def loss(x):
    return losses.cross_entropy_sums(x, labels)[0]

  return str(jax.make_jaxpr(jax.grad(loss))(logits))


def test_cross_entropy_sums_uses_the_kernel_on_one_gpu_only(monkeypatch):
  """The kernel under jax.grad on a GPU (here: traced for one), the XLA
  path on the CPU, on a mesh of several devices, without jax.grad, and
  where jax cannot lower the kernel (no Triton bindings in jaxlib)."""
  logits, labels = jnp.zeros((2, 4, 64), jnp.bfloat16), jnp.zeros((2, 4), jnp.int32)
  assert "pallas_call" not in _grad_jaxpr(logits, labels)
  with platform.compiling_for("gpu"):
    assert "pallas_call" in _grad_jaxpr(logits, labels)
    forward = jax.make_jaxpr(lambda x: losses.cross_entropy_sums(x, labels))(logits)
    assert "pallas_call" not in str(forward)
    mesh = jax.sharding.AbstractMesh((2,), ("data",))
    with jax.sharding.use_abstract_mesh(mesh):
      assert "pallas_call" not in _grad_jaxpr(logits, labels)
    monkeypatch.setattr(cross_entropy_gpu, "AVAILABLE", False)
    assert "pallas_call" not in _grad_jaxpr(logits, labels)


def test_the_gradient_is_scaled_by_the_loss_cotangent(rows):
  """The gradient kept from the forward pass times the cotangent: d(3 *
  loss_sum) is three times d(loss_sum), on both paths."""
  logits, labels, weights = rows

  def grad(scale):
    def loss(x):
      return scale * losses.cross_entropy_sums(x, labels, weights=weights)[0]

    return np.asarray(jax.grad(loss)(logits), np.float64)

  np.testing.assert_allclose(grad(3.0), 3.0 * grad(1.0), rtol=2.0**-7)


@pytest.mark.parametrize("name,value", [("block", 100), ("block", 0), ("num_warps", 3)])
def test_block_and_warps_must_be_powers_of_two(rows, name, value):
  logits, labels, weights = rows
  with pytest.raises(ValueError, match=rf"^{name} must be a power of 2 \(Triton's\), got {value}$"):
    cross_entropy_gpu.statistics_and_gradient(
      logits, labels, weights, label_smoothing=0.0, z_loss=0.0, interpret=True, **{name: value}
    )
