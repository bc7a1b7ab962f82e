"""Token-level cross-entropy with weights, label smoothing and z-loss."""

import numbers

import jax
import jax.numpy as jnp

__all__ = ['cross_entropy', 'token_cross_entropy']


def _check_inputs(logits, labels, weights, label_smoothing, z_loss):
  if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(
        f'logits must be a floating array [..., V], got shape {logits.shape} '
        f'dtype {logits.dtype}')
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f'labels must be integer, got dtype {labels.dtype}')
  if labels.shape != logits.shape[:-1]:
    raise ValueError(
        f'labels must have shape logits.shape[:-1] = {logits.shape[:-1]}, '
        f'got shape {labels.shape}')
  if weights is not None and weights.shape != labels.shape:
    raise ValueError(
        f'weights must have the shape of labels {labels.shape}, got shape {weights.shape}')
  # Hyperparameters are checked when concrete; traced values pass through.
  if isinstance(label_smoothing, numbers.Real) and not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f'label_smoothing must be in [0, 1), got {label_smoothing}')
  if isinstance(z_loss, numbers.Real) and z_loss < 0:
    raise ValueError(f'z_loss must be >= 0, got {z_loss}')


def token_cross_entropy(logits, labels, *, label_smoothing=0.0, z_loss=0.0):
  """Per-token cross-entropy, computed in float32 (unreduced `cross_entropy`).

  The target distribution is (1 - label_smoothing) * onehot(labels) +
  label_smoothing / V. With z_loss > 0 each token also pays
  z_loss * logsumexp(logits)^2 (PaLM), which keeps the softmax normaliser
  near 1.

  Args:
    logits: float `[..., V]`.
    labels: int `[...]` in [0, V).
    label_smoothing: in [0, 1).
    z_loss: coefficient of the z-loss term, >= 0.

  Returns:
    float32 `[...]`: each token's loss (nats).
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  _check_inputs(logits, labels, None, label_smoothing, z_loss)
  logits_xV = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits_xV, axis=-1)
  # -sum(target * log_softmax) split into its one-hot and uniform parts, so
  # no [..., V] target array is built.
  label_logit = jnp.take_along_axis(logits_xV, labels[..., None], axis=-1)[..., 0]
  nll = log_z - label_logit
  uniform_nll = log_z - jnp.mean(logits_xV, axis=-1)
  per_token = (1.0 - label_smoothing) * nll + label_smoothing * uniform_nll
  return per_token + z_loss * jnp.square(log_z)


def cross_entropy(logits, labels, *, weights=None, label_smoothing=0.0, z_loss=0.0):
  """Weighted mean token cross-entropy, computed in float32.

  Each token's loss is `token_cross_entropy(logits, labels, ...)`.

  Args:
    logits: float `[..., V]`.
    labels: int `[...]` in [0, V).
    weights: float or bool `[...]`, 0 for padding; None weighs every token 1.
    label_smoothing: in [0, 1).
    z_loss: coefficient of the z-loss term, >= 0.

  Returns:
    (loss, num_tokens): float32 scalars; loss = sum(w * l) / sum(w) (0 when
    sum(w) == 0) and num_tokens = sum(w).
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  weights = None if weights is None else jnp.asarray(weights)
  _check_inputs(logits, labels, weights, label_smoothing, z_loss)
  per_token = token_cross_entropy(logits, labels, label_smoothing=label_smoothing,
                                  z_loss=z_loss)
  weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(
      jnp.float32)
  num_tokens = jnp.sum(weights)
  # Dividing by 1 where no token counts gives 0 (the numerator is 0) not NaN.
  loss = jnp.sum(weights * per_token) / jnp.where(num_tokens == 0, 1.0, num_tokens)
  return loss, num_tokens
