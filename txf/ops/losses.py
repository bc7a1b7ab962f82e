"""Token-level cross-entropy with weights, label smoothing and z-loss: as a
function of the logits (`cross_entropy`), as sums with their own gradient
computed beside the statistics (`cross_entropy_sums`, what training uses; on
one GPU a kernel of its own, `cross_entropy_gpu`), and fused with the output
projection, chunked over positions (`linear_cross_entropy_sums`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from txf.ops import cross_entropy_gpu, platform

__all__ = [
  "cross_entropy",
  "cross_entropy_sums",
  "linear_cross_entropy_sums",
  "token_cross_entropy",
]


def _check_inputs(logits, labels, weights, label_smoothing, z_loss):
  if logits.ndim < 1 or not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(
      f"logits must be a floating array [..., V], got shape {logits.shape} dtype {logits.dtype}"
    )
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer, got dtype {labels.dtype}")
  if labels.shape != logits.shape[:-1]:
    raise ValueError(
      f"labels must have shape logits.shape[:-1] = {logits.shape[:-1]}, got shape {labels.shape}"
    )
  _check_label_ids(labels, logits.shape[-1])
  if weights is not None and weights.shape != labels.shape:
    raise ValueError(
      f"weights must have the shape of labels {labels.shape}, got shape {weights.shape}"
    )
  _check_hyperparameters(label_smoothing, z_loss)


def _check_label_ids(labels, vocab):
  """Labels in [0, vocab), checked when concrete (traced ones pass): an id
  outside the vocabulary gives each loss path another wrong value, never an
  error."""
  concrete = not isinstance(labels, jax.core.Tracer) and getattr(
    labels, "is_fully_addressable", True
  )
  if labels.size and concrete:
    ids = np.asarray(labels)  # numpy's reduction: jax's would be staged inside a trace
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab:
      raise ValueError(f"labels must be in [0, {vocab}), got ids from {low} to {high}")


def _concrete(value) -> float | None:
  """`value` as a float where it is a scalar known outside a trace (a
  Python, numpy or jax scalar), else None."""
  if isinstance(value, jax.core.Tracer) or jnp.ndim(value):
    return None
  return float(value)


def _concrete_zero(value) -> bool:
  """`value` is a zero known outside a trace."""
  return _concrete(value) == 0.0


def _check_hyperparameters(label_smoothing, z_loss):
  # Checked when concrete (a jax scalar too); traced values pass through.
  for name, value in (("label_smoothing", label_smoothing), ("z_loss", z_loss)):
    if jnp.ndim(value):  # an array failed in jax's core or broadcast over the tokens
      raise ValueError(f"{name} must be a scalar, got shape {jnp.shape(value)}")
  smoothing, z = _concrete(label_smoothing), _concrete(z_loss)
  if smoothing is not None and not 0.0 <= smoothing < 1.0:
    raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
  if z is not None and not z >= 0:
    raise ValueError(f"z_loss must be >= 0, got {z_loss}")


def _static(caller, label_smoothing, z_loss):
  """(label_smoothing, z_loss) as Python floats for `caller`, whose custom
  gradient takes them as static arguments; a traced one (a jitted function's
  argument) was jax's ConcretizationTypeError from float()."""
  for name, value in (("label_smoothing", label_smoothing), ("z_loss", z_loss)):
    if _concrete(value) is None:
      raise ValueError(
        f"{caller}: {name} must be known outside jit (a Python float: it shapes the "
        f"gradient's program), got a traced value; cross_entropy takes a traced one"
      )
  return float(label_smoothing), float(z_loss)


def _plus_z_loss(nll, log_z, z_loss):
  """nll + z_loss * log_z^2, the term left out where z_loss is 0 (selected
  away where it is traced): log_z^2 overflows float32 past |log_z| ~ 1.8e19,
  and 0 * inf is NaN, where the loss without it is finite."""
  if _concrete_zero(z_loss):
    return nll
  return jnp.where(jnp.asarray(z_loss) == 0, nll, nll + z_loss * jnp.square(log_z))


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
  return _per_token_and_log_z(logits.astype(jnp.float32), labels, label_smoothing, z_loss)[0]


def _per_token_and_log_z(logits_xV, labels, label_smoothing, z_loss):
  """(each token's loss, logsumexp of its logits), float32 logits in."""
  log_z = jax.nn.logsumexp(logits_xV, axis=-1)
  # -sum(target * log_softmax) split into its one-hot and uniform parts, so
  # no [..., V] target array is built.
  label_logit = jnp.take_along_axis(logits_xV, labels[..., None], axis=-1)[..., 0]
  per_token = log_z - label_logit
  # Without smoothing the uniform part is left out, not multiplied by 0: it
  # is infinite where a logit is -inf (a masked vocabulary), and 0 * inf is
  # NaN (a traced smoothing may be 0 too: selected away, not multiplied).
  if not _concrete_zero(label_smoothing):
    uniform_nll = log_z - jnp.mean(logits_xV, axis=-1)
    smoothed = (1.0 - label_smoothing) * per_token + label_smoothing * uniform_nll
    per_token = jnp.where(jnp.asarray(label_smoothing) == 0, per_token, smoothed)
  return _plus_z_loss(per_token, log_z, z_loss), log_z


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
  per_token = token_cross_entropy(logits, labels, label_smoothing=label_smoothing, z_loss=z_loss)
  weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
  num_tokens = jnp.sum(weights)
  # Dividing by 1 where no token counts gives 0 (the numerator is 0) not NaN.
  loss = jnp.sum(weights * per_token) / jnp.where(num_tokens == 0, 1.0, num_tokens)
  return loss, num_tokens


def _combine_statistics(a, b):
  """The reduction of `_logit_statistics`'s first pass: two partial results
  in one, (max, max before the label, the label's logit[, sum of x])."""
  return (jnp.maximum(a[0], b[0]), jnp.maximum(a[1], b[1])) + tuple(
    x + y for x, y in zip(a[2:], b[2:])
  )


def _logit_statistics(logits_xV, labels, with_sum):
  """(log-sum-exp, the label's logit, whether the label is the argmax, sum
  of the logits or None without `with_sum`) of each row, float32, from two
  passes over the logits: the maxima and sums, then the sum of exp(x - max).

  Two passes, not one online log-sum-exp: as an XLA reduction the online
  form rescales its sum at every element (two exps and a guard each), and
  on an H100 that one pass took 3.9 ms over gpt2_small's [32, 1024, 50304]
  bf16 logits, where the argmax's (max, index) pass took 1.35 ms and the
  exp-sum pass of jax.nn.logsumexp 1.33 ms (docs/benchmarks.md, GPU figures).

  "The argmax" as jnp.argmax picks it: the first index of the largest logit,
  so the label is it iff its logit is the largest and every earlier one is
  smaller.
  """
  x_xV = logits_xV.astype(jnp.float32)
  index_xV = jax.lax.broadcasted_iota(jnp.int32, x_xV.shape, x_xV.ndim - 1)
  label_x1 = labels[..., None]
  minus_inf = jnp.float32(-jnp.inf)
  operands = (
    x_xV,
    jnp.where(index_xV < label_x1, x_xV, minus_inf),
    jnp.where(index_xV == label_x1, x_xV, 0.0),
  ) + ((x_xV,) if with_sum else ())
  init = (minus_inf, minus_inf, jnp.float32(0)) + ((jnp.float32(0),) if with_sum else ())
  top, before, label_logit, *total = jax.lax.reduce(
    operands, init, _combine_statistics, (x_xV.ndim - 1,)
  )
  # A row whose max is not finite is shifted by 0, not by inf (exp(inf - inf) = NaN).
  shift = jnp.where(jnp.isfinite(top), top, 0.0)
  log_z = shift + jnp.log(jnp.sum(jnp.exp(x_xV - shift[..., None]), axis=-1))
  correct = (label_logit == top) & (before < top)
  return log_z, label_logit, correct, total[0] if total else None


def _token_losses(log_z, label_logit, logits_sum, vocab_size, label_smoothing, z_loss):
  """Each token's loss from its statistics (as `token_cross_entropy`)."""
  nll = log_z - label_logit
  if label_smoothing:
    nll = (1.0 - label_smoothing) * nll + label_smoothing * (log_z - logits_sum / vocab_size)
  return _plus_z_loss(nll, log_z, z_loss)


def _logit_gradient(logits_xV, labels, weights, log_z, label_smoothing, z_loss):
  """d sum(w * loss) / d logits = w * (softmax * (1 + 2 z log_z) - (1 - ls)
  onehot - ls / V): one elementwise pass, written in the logits' dtype."""
  x_xV = logits_xV.astype(jnp.float32)
  index_xV = jax.lax.broadcasted_iota(jnp.int32, x_xV.shape, x_xV.ndim - 1)
  softmax_xV = jnp.exp(x_xV - log_z[..., None]) * (1.0 + 2.0 * z_loss * log_z)[..., None]
  target_xV = jnp.where(index_xV == labels[..., None], 1.0 - label_smoothing, 0.0)
  if label_smoothing:
    target_xV = target_xV + label_smoothing / x_xV.shape[-1]
  return (weights[..., None] * (softmax_xV - target_xV)).astype(logits_xV.dtype)


def uses_gpu_kernel():
  """Whether the forward pass under jax.grad runs `cross_entropy_gpu`'s
  kernel: on a GPU, with the program on one device (a Pallas call is not
  split over a mesh by XLA; on more devices the XLA path runs), where this
  jax can lower it."""
  return (
    cross_entropy_gpu.AVAILABLE
    and platform.backend() == "gpu"
    and jax.sharding.get_abstract_mesh().size <= 1
  )


def _weighted_sums(statistics, weights, vocab_size, label_smoothing, z_loss):
  """(sum of w * token loss, sum of w * correct) from `_logit_statistics`'s
  (log-sum-exp, label's logit, correct, logits' sum or None)."""
  log_z, label_logit, correct, logits_sum = statistics
  per_token = _token_losses(log_z, label_logit, logits_sum, vocab_size, label_smoothing, z_loss)
  return jnp.sum(weights * per_token), jnp.sum(weights * correct)


def _statistics_and_gradient_by_xla(logits_xV, labels, weights, label_smoothing, z_loss):
  """`_statistics_and_gradient` as XLA's passes: the two statistics passes,
  then the gradient's elementwise pass."""
  statistics = _logit_statistics(logits_xV, labels, with_sum=bool(label_smoothing))
  grad_xV = _logit_gradient(logits_xV, labels, weights, statistics[0], label_smoothing, z_loss)
  return (*statistics, grad_xV)


def _statistics_and_gradient(logits_xV, labels, weights, label_smoothing, z_loss):
  """(log-sum-exp, label's logit, correct, logits' sum or None, gradient of
  the weighted loss sum in the logits' dtype), each row's."""
  if not uses_gpu_kernel():
    return _statistics_and_gradient_by_xla(logits_xV, labels, weights, label_smoothing, z_loss)
  rows = labels.shape
  flat = cross_entropy_gpu.statistics_and_gradient(
    logits_xV.reshape(-1, logits_xV.shape[-1]),
    labels.reshape(-1),
    weights.reshape(-1),
    label_smoothing=label_smoothing,
    z_loss=z_loss,
  )
  return tuple(x.reshape(rows + x.shape[1:]) for x in flat)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _sums(logits_xV, labels, weights, label_smoothing, z_loss):
  statistics = _logit_statistics(logits_xV, labels, with_sum=bool(label_smoothing))
  return _weighted_sums(statistics, weights, logits_xV.shape[-1], label_smoothing, z_loss)


def _sums_forward(logits_xV, labels, weights, label_smoothing, z_loss):
  # The gradient is computed here, where the statistics are, and kept in
  # place of the logits: the backward pass only scales it by the loss's
  # cotangent, which XLA drops where that is the 1.0 jax.grad starts from
  # (the train step passes weights already divided by the batch's weight).
  *statistics, grad_xV = _statistics_and_gradient(
    logits_xV, labels, weights, label_smoothing, z_loss
  )
  sums = _weighted_sums(statistics, weights, logits_xV.shape[-1], label_smoothing, z_loss)
  return sums, grad_xV


def _sums_backward(label_smoothing, z_loss, grad_xV, cotangents):
  del label_smoothing, z_loss
  # The correct count is not differentiable; labels and weights are constants.
  return grad_xV * cotangents[0].astype(grad_xV.dtype), None, None


_sums.defvjp(_sums_forward, _sums_backward)


def cross_entropy_sums(logits, labels, *, weights=None, label_smoothing=0.0, z_loss=0.0):
  """`token_cross_entropy` summed with weights, with its own gradient.

  The same loss as `cross_entropy` (times the token count), computed as
  training needs it from [B, T, V] logits: each row's log-sum-exp, the
  label's logit and whether the label is the argmax come from two passes
  over the vocabulary (no separate mean or argmax passes). Under jax.grad the
  forward pass also writes the gradient, in the logits' dtype (no scatter of
  the label's gradient into a zero array): on one GPU statistics and
  gradient are one kernel (`cross_entropy_gpu`, the logits read once),
  elsewhere a third, elementwise pass. The backward pass scales it by the
  loss's cotangent, which XLA drops where that is 1.0 (the train step's
  weights are divided by the step's tokens so that it is). Only the loss sum
  is differentiable; labels and weights are constants.

  Args:
    logits: float `[..., V]`.
    labels: int `[...]` in [0, V).
    weights: float or bool `[...]`, 0 for padding; None weighs every token 1.
    label_smoothing: in [0, 1), a Python float.
    z_loss: coefficient of the z-loss term, >= 0, a Python float.

  Returns:
    (loss_sum, num_tokens, num_correct): float32 scalars, the weighted sum of
    the token losses, sum(weights) and the weighted count of tokens whose
    argmax logit (the first, as `jnp.argmax`) is the label.
  """
  logits = jnp.asarray(logits)
  labels = jnp.asarray(labels)
  weights = None if weights is None else jnp.asarray(weights)
  _check_inputs(logits, labels, weights, label_smoothing, z_loss)
  weights = jnp.ones(labels.shape, jnp.float32) if weights is None else weights.astype(jnp.float32)
  loss_sum, num_correct = _sums(
    logits, labels, weights, *_static("cross_entropy_sums", label_smoothing, z_loss)
  )
  return loss_sum, jnp.sum(weights), num_correct


def _chunk_sums(
  x_BxCxD, kernel_DxV, labels_BxC, weights_BxC, label_smoothing, z_loss, dtype, with_grads
):
  """One chunk: (loss sum, correct count[, d sum / d x, d sum / d kernel])."""
  logits_BxCxV = jnp.einsum(
    "bcd,dv->bcv",
    x_BxCxD.astype(dtype),
    kernel_DxV.astype(dtype),
    preferred_element_type=jnp.float32,
  )
  if with_grads:
    *statistics, grad_logits_BxCxV = _statistics_and_gradient(
      logits_BxCxV, labels_BxC, weights_BxC, label_smoothing, z_loss
    )
  else:
    statistics = _logit_statistics(logits_BxCxV, labels_BxC, with_sum=bool(label_smoothing))
  loss, correct = _weighted_sums(
    statistics, weights_BxC, logits_BxCxV.shape[-1], label_smoothing, z_loss
  )
  if not with_grads:
    return loss, correct
  grad_logits_BxCxV = grad_logits_BxCxV.astype(dtype)
  grad_x_BxCxD = jnp.einsum(
    "bcv,dv->bcd", grad_logits_BxCxV, kernel_DxV.astype(dtype), preferred_element_type=jnp.float32
  )
  grad_kernel_DxV = jnp.einsum(
    "bcd,bcv->dv", x_BxCxD.astype(dtype), grad_logits_BxCxV, preferred_element_type=jnp.float32
  )
  return loss, correct, grad_x_BxCxD, grad_kernel_DxV


def _chunked(x_BxTxD, chunk_len):
  """[B, T, ...] -> [T / chunk_len, B, chunk_len, ...] (the scan axis first)."""
  B, T = x_BxTxD.shape[:2]
  return jnp.moveaxis(x_BxTxD.reshape(B, T // chunk_len, chunk_len, *x_BxTxD.shape[2:]), 1, 0)


def _chunked_inputs(x_BxTxD, labels_BxT, weights_BxT, chunk_len):
  """The scan's inputs: x, labels and weights, chunk by chunk."""
  return tuple(_chunked(a, chunk_len) for a in (x_BxTxD, labels_BxT, weights_BxT))


def _unchunked(x_NxBxCx_):
  N, B, C = x_NxBxCx_.shape[:3]
  return jnp.moveaxis(x_NxBxCx_, 0, 1).reshape(B, N * C, *x_NxBxCx_.shape[3:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _linear_ce_sums(
  x_BxTxD, kernel_DxV, labels_BxT, weights_BxT, chunk_len, label_smoothing, z_loss, dtype
):
  """(weighted loss sum, weighted correct count), chunk by chunk."""

  def body(carry, chunk):
    x_BxCxD, labels_BxC, weights_BxC = chunk
    loss, correct = _chunk_sums(
      x_BxCxD, kernel_DxV, labels_BxC, weights_BxC, label_smoothing, z_loss, dtype, with_grads=False
    )
    return (carry[0] + loss, carry[1] + correct), None

  chunks = _chunked_inputs(x_BxTxD, labels_BxT, weights_BxT, chunk_len)
  sums, _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.float32)), chunks)
  return sums


def _linear_ce_forward(
  x_BxTxD, kernel_DxV, labels_BxT, weights_BxT, chunk_len, label_smoothing, z_loss, dtype
):
  """The sums and, computed on the way, their gradients (no [B, T, V] residual)."""

  def body(carry, chunk):
    x_BxCxD, labels_BxC, weights_BxC = chunk
    loss, correct, grad_x_BxCxD, grad_kernel_DxV = _chunk_sums(
      x_BxCxD, kernel_DxV, labels_BxC, weights_BxC, label_smoothing, z_loss, dtype, with_grads=True
    )
    loss_sum, correct_sum, grad_kernel_sum = carry
    return (
      (loss_sum + loss, correct_sum + correct, grad_kernel_sum + grad_kernel_DxV),
      grad_x_BxCxD.astype(x_BxTxD.dtype),
    )

  chunks = _chunked_inputs(x_BxTxD, labels_BxT, weights_BxT, chunk_len)
  zeros = (
    jnp.zeros((), jnp.float32),
    jnp.zeros((), jnp.float32),
    jnp.zeros(kernel_DxV.shape, jnp.float32),
  )
  (loss, correct, grad_kernel_DxV), grad_x = jax.lax.scan(body, zeros, chunks)
  residuals = (_unchunked(grad_x), grad_kernel_DxV.astype(kernel_DxV.dtype))
  return (loss, correct), residuals


def _linear_ce_backward(chunk_len, label_smoothing, z_loss, dtype, residuals, cotangents):
  del chunk_len, label_smoothing, z_loss, dtype
  grad_x_BxTxD, grad_kernel_DxV = residuals
  loss_cotangent = cotangents[0]  # the correct count is not differentiable
  return (
    grad_x_BxTxD * loss_cotangent.astype(grad_x_BxTxD.dtype),
    grad_kernel_DxV * loss_cotangent.astype(grad_kernel_DxV.dtype),
    None,
    None,
  )


_linear_ce_sums.defvjp(_linear_ce_forward, _linear_ce_backward)


def linear_cross_entropy_sums(
  x_BxTxD,
  kernel_DxV,
  labels_BxT,
  *,
  weights_BxT=None,
  chunk_len,
  label_smoothing=0.0,
  z_loss=0.0,
  dtype=None,
):
  """`token_cross_entropy` of the logits x @ kernel, summed, without ever
  holding the [B, T, V] logits: positions go through in chunks of chunk_len.

  Equal to `cross_entropy(einsum('btd,dv->btv', x, kernel), labels, ...)`
  (times the token count) up to the rounding of the matmul. The matmuls take
  `dtype` operands (x's dtype by default) with float32 accumulation; the
  logits, the softmax and the loss are float32. Under `jax.grad`, each chunk's
  gradients with respect to x and kernel are computed in the forward pass
  (as Liger-Kernel's fused linear cross-entropy), so the backward pass holds
  no logits and recomputes nothing: the FLOPs equal the plain path's, and
  the memory of the logits falls from B * T * V to B * chunk_len * V floats.
  Only the loss sum is differentiable; labels and weights are constants.

  Args:
    x_BxTxD: float hidden states.
    kernel_DxV: float output projection (any scaling folded in).
    labels_BxT: int targets in [0, V).
    weights_BxT: float weights, 0 for padding; None weighs every token 1.
    chunk_len: positions per chunk; must divide T.
    label_smoothing, z_loss: as in `token_cross_entropy`.
    dtype: the matmuls' operand dtype; None: x's.

  Returns:
    (loss_sum, num_tokens, num_correct): float32 scalars, the weighted sum
    of the token losses, sum(weights) and the weighted count of tokens whose
    argmax logit is the label. Sums, so micro-batches add up exactly.
  """
  x_BxTxD, kernel_DxV, labels_BxT = map(jnp.asarray, (x_BxTxD, kernel_DxV, labels_BxT))
  if x_BxTxD.ndim != 3 or kernel_DxV.ndim != 2 or x_BxTxD.shape[-1] != kernel_DxV.shape[0]:
    raise ValueError(
      f"x must be [B, T, D] and kernel [D, V] with the same D, got x "
      f"{x_BxTxD.shape} and kernel {kernel_DxV.shape}"
    )
  for name, array in (("x", x_BxTxD), ("kernel", kernel_DxV)):
    if not jnp.issubdtype(array.dtype, jnp.floating):
      raise ValueError(f"{name} must be floating, got dtype {array.dtype}")
  if not jnp.issubdtype(labels_BxT.dtype, jnp.integer):
    raise ValueError(f"labels must be integer, got dtype {labels_BxT.dtype}")
  if labels_BxT.shape != x_BxTxD.shape[:2]:
    raise ValueError(
      f"labels must have shape x.shape[:2] = {x_BxTxD.shape[:2]}, got {labels_BxT.shape}"
    )
  _check_label_ids(labels_BxT, kernel_DxV.shape[1])
  weights_BxT = (
    jnp.ones(labels_BxT.shape, jnp.float32)
    if weights_BxT is None
    else jnp.asarray(weights_BxT).astype(jnp.float32)
  )
  if weights_BxT.shape != labels_BxT.shape:
    raise ValueError(
      f"weights must have the shape of labels {labels_BxT.shape}, got {weights_BxT.shape}"
    )
  if isinstance(chunk_len, bool) or not isinstance(chunk_len, int) or chunk_len < 1:
    raise ValueError(f"chunk_len must be a positive int, got {chunk_len!r}")
  if x_BxTxD.shape[1] % chunk_len:
    raise ValueError(f"chunk_len {chunk_len} does not divide the length T = {x_BxTxD.shape[1]}")
  _check_hyperparameters(label_smoothing, z_loss)
  label_smoothing, z_loss = _static("linear_cross_entropy_sums", label_smoothing, z_loss)
  dtype = jnp.dtype(x_BxTxD.dtype if dtype is None else dtype)
  if not jnp.issubdtype(dtype, jnp.floating):  # an int would truncate the GEMM's operands
    raise ValueError(f"dtype must be floating, got {dtype}")
  loss_sum, num_correct = _linear_ce_sums(
    x_BxTxD, kernel_DxV, labels_BxT, weights_BxT, chunk_len, label_smoothing, z_loss, dtype
  )
  return loss_sum, jnp.sum(weights_BxT), num_correct
