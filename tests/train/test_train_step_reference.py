"""The train step built from a config (setup_run) against references of its
own: the loss with the config's label smoothing and z-loss, the accuracy
and the gradient norm of a step, each recomputed apart from txf.train.step
(numpy float64 from the model's logits; the gradient of a jnp loss written
here). The step was only ever compared with itself on other paths (fused
against plain, accumulated against whole), so a smoothing or z-loss that
never reached it, an accuracy that was a count and a norm of the wrong tree
all passed."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from txf.runconfig.run_config import parse
from txf.runconfig.tasks import task_kind
from txf.train.run_setup import setup_run


def np_loss_terms(logits_BxTxV, labels_BxT):
  """(negative log-likelihood, mean over the vocabulary of -log p, logsumexp), float64."""
  log_z = np.logaddexp.reduce(logits_BxTxV, axis=-1)
  log_p = logits_BxTxV - log_z[..., None]
  nll = -np.take_along_axis(log_p, labels_BxT[..., None], axis=-1)[..., 0]
  return nll, -log_p.mean(-1), log_z


def jnp_mean_loss(logits_BxTxV, labels_BxT, weights_BxT, smoothing, z_loss):
  """The same loss as np_loss_terms's, weighted mean, in jnp (for its gradient)."""
  log_z = jax.nn.logsumexp(logits_BxTxV, axis=-1)
  log_p = logits_BxTxV - log_z[..., None]
  nll = -jnp.take_along_axis(log_p, labels_BxT[..., None], axis=-1)[..., 0]
  per_token = (1 - smoothing) * nll - smoothing * log_p.mean(-1) + z_loss * log_z**2
  return (weights_BxT * per_token).sum() / weights_BxT.sum()


@pytest.mark.parametrize("smoothing, z_loss", [(0.0, 0.0), (0.2, 0.02)])
def test_a_steps_loss_accuracy_and_gradient_norm_match_a_reference(smoothing, z_loss):
  setup = setup_run(
    parse(
      tiny_config(train__label_smoothing=smoothing, train__z_loss=z_loss, model__dropout_rate=0.0)
    )
  )
  kind = task_kind(setup.task)
  state = setup.init()
  batch = setup.to_device(next(iter(setup.train_data)))
  labels, weights = kind.labels_and_weights(batch)
  # Some rows padded: the weights must select the tokens.
  weights = np.asarray(weights, np.float64)
  assert weights.sum() > 0

  def logits_of(params):
    return setup.model.apply({"params": params}, *kind.model_inputs(batch)).astype(jnp.float32)

  logits = np.asarray(logits_of(state.params), np.float64)
  labels_np = np.asarray(labels)
  nll, uniform, log_z = np_loss_terms(logits, labels_np)
  per_token = (1 - smoothing) * nll + smoothing * uniform + z_loss * log_z**2
  want_loss = (weights * per_token).sum() / weights.sum()
  want_accuracy = (weights * (logits.argmax(-1) == labels_np)).sum() / weights.sum()
  grads = jax.grad(
    lambda p: jnp_mean_loss(
      logits_of(p), labels, jnp.asarray(weights, jnp.float32), smoothing, z_loss
    )
  )(state.params)
  want_norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))

  with setup.activation_sharding():
    _, metrics = setup.train_step(state, batch)  # donates the state: last
  np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=2e-6)
  np.testing.assert_allclose(float(metrics["accuracy"]), want_accuracy, rtol=1e-6)
  np.testing.assert_allclose(float(metrics["grad_norm"]), want_norm, rtol=1e-4)
  assert float(metrics["tokens"]) == weights.sum()
