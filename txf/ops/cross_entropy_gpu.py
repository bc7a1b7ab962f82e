"""The cross-entropy's row statistics and its gradient in one GPU kernel
(Pallas, lowered to Triton): what `ops.cross_entropy_sums` runs under
`jax.grad` on one GPU.

Per row of the logits, one kernel instance walks the vocabulary in blocks
twice: first an online log-sum-exp (the running max and the sum of exp(x -
max), rescaled once per block, not per element) with the label's logit,
the largest logit before the label (for the argmax test) and the logits'
sum; then the gradient `w * (softmax * (1 + 2 z log_z) - target)`, written
in the logits' dtype. The second walk reads the row back while the first
one's blocks are still in L2 (a row of gpt2_small's 50,304 bf16 logits is
98 KiB), so the [N, V] logits cross HBM once in and the gradient once out.
XLA compiles the same work as three passes over the logits (a max, an
exp-sum, the gradient), and an online log-sum-exp as an XLA reduction
rescales at every element (docs/benchmarks.md).

The block size and warp count are Triton's usual choices for row-wise
kernels of this width, not tuned on a GPU (`python -m benchmarks.run
loss_kernel` times the alternatives).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Whether this jax can lower the kernel (`ops.losses` uses XLA's passes where
# not): it needs jaxlib's Triton bindings, and txf imports without them.
try:
  from jax.experimental.pallas import triton as plgpu

  AVAILABLE = True
except ImportError:
  AVAILABLE = False

__all__ = ["AVAILABLE", "statistics_and_gradient"]

_MAX_BLOCK = 8192
_NUM_WARPS = 16


def _row_kernel(
  logits_ref,
  label_ref,
  weight_ref,
  grad_ref,
  log_z_ref,
  label_logit_ref,
  correct_ref,
  logits_sum_ref,
  *,
  block: int,
  label_smoothing: float,
  z_loss: float,
):
  """One row: logits_ref [V], label_ref, weight_ref scalars in; grad_ref
  [V] and the four float32 scalars out."""
  vocab = logits_ref.shape[0]
  label = label_ref[...]
  minus_inf = jnp.float32(-jnp.inf)

  def load(i, eviction_policy):
    """Block i: (column indices [block], in the row [block], float32 logits
    [block], -inf past the row's end)."""
    index = i * block + jnp.arange(block)
    valid = index < vocab
    x = plgpu.load(
      logits_ref.at[index], mask=valid, other=minus_inf, eviction_policy=eviction_policy
    )
    return index, valid, x.astype(jnp.float32)

  def finite_or_zero(top):
    # A row whose max is not finite is shifted by 0, as `losses._logit_statistics`.
    return jnp.where(jnp.isfinite(top), top, 0.0)

  def statistics(i, carry):
    top, sum_exp, before, label_logit, logits_sum = carry
    index, valid, x = load(i, "evict_last")  # read again by the gradient's walk
    new_top = jnp.maximum(top, jnp.max(x))
    shift, new_shift = finite_or_zero(top), finite_or_zero(new_top)
    # sum_exp is relative to the old shift; 0 stays 0 (0 * exp(inf) is NaN).
    kept = jnp.where(sum_exp > 0, sum_exp * jnp.exp(shift - new_shift), sum_exp)
    sum_exp = kept + jnp.sum(jnp.exp(x - new_shift))
    before = jnp.maximum(before, jnp.max(jnp.where(index < label, x, minus_inf)))
    label_logit = label_logit + jnp.sum(jnp.where(index == label, x, 0.0))
    logits_sum = logits_sum + jnp.sum(jnp.where(valid, x, 0.0))
    return new_top, sum_exp, before, label_logit, logits_sum

  zero = jnp.float32(0.0)
  top, sum_exp, before, label_logit, logits_sum = jax.lax.fori_loop(
    0, pl.cdiv(vocab, block), statistics, (minus_inf, zero, minus_inf, zero, zero)
  )
  log_z = finite_or_zero(top) + jnp.log(sum_exp)
  log_z_ref[...] = log_z
  label_logit_ref[...] = label_logit
  # The label is the argmax (the first largest, as jnp.argmax) iff its logit
  # is the max and every earlier one is smaller.
  correct_ref[...] = ((label_logit == top) & (before < top)).astype(jnp.float32)
  logits_sum_ref[...] = logits_sum

  weight = weight_ref[...]
  softmax_scale = 1.0 + 2.0 * z_loss * log_z

  @pl.loop(0, pl.cdiv(vocab, block))
  def _(i):
    index, valid, x = load(i, "evict_first")
    target = jnp.where(index == label, 1.0 - label_smoothing, 0.0) + label_smoothing / vocab
    grad = weight * (jnp.exp(x - log_z) * softmax_scale - target)
    plgpu.store(grad_ref.at[index], grad.astype(grad_ref.dtype), mask=valid)


def statistics_and_gradient(
  logits_NxV,
  labels_N,
  weights_N,
  *,
  label_smoothing: float,
  z_loss: float,
  block: int | None = None,
  num_warps: int = _NUM_WARPS,
  interpret: bool = False,
):
  """Each row's cross-entropy statistics and the gradient of the weighted
  loss sum, in one kernel.

  Args:
    logits_NxV: float logits.
    labels_N: int targets in [0, V).
    weights_N: float32 weights.
    label_smoothing, z_loss: as `losses.token_cross_entropy`'s.
    block: logits per block of the walks, a power of 2 (None: the row's
      width rounded up to one, at most 8,192).
    num_warps: Triton warps per row (benchmarks/loss_kernel.py times the
      choices on a GPU).
    interpret: run the kernel in Pallas's interpreter (on any backend; the
      tests' way to check it without a GPU).

  Returns:
    (log_z_N, label_logit_N, correct_N, logits_sum_N, grad_NxV): the
    log-sum-exp, the label's logit, whether the label is the (first) argmax
    (bool), the sum of the row's logits (float32 each) and d(sum_n w_n
    loss_n) / d logits in the logits' dtype.
  """
  for name, value in (("block", block), ("num_warps", num_warps)):
    if value is not None and (value < 1 or value & (value - 1)):
      raise ValueError(f"{name} must be a power of 2 (Triton's), got {value}")
  vocab = logits_NxV.shape[-1]
  kernel = functools.partial(
    _row_kernel,
    block=block or min(pl.next_power_of_2(vocab), _MAX_BLOCK),
    label_smoothing=float(label_smoothing),
    z_loss=float(z_loss),
  )
  row = pl.pallas_call(
    kernel,
    out_shape=(jax.ShapeDtypeStruct((vocab,), logits_NxV.dtype),)
    + (jax.ShapeDtypeStruct((), jnp.float32),) * 4,
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    # The gradient overwrites the logits (each block is read before its
    # gradient is stored, by the one instance that owns the row): without
    # it the step holds both [N, V] arrays at once, 3 GiB more at gpt2_small's size.
    input_output_aliases={0: 0},
    interpret=interpret,
    name="cross_entropy_statistics_and_gradient",
  )
  grad_NxV, log_z_N, label_logit_N, correct_N, logits_sum_N = jax.vmap(row)(
    logits_NxV, labels_N.astype(jnp.int32), weights_N.astype(jnp.float32)
  )
  return log_z_N, label_logit_N, correct_N > 0.5, logits_sum_N, grad_NxV
