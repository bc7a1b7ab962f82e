"""Train and eval steps: one jitted function each, the same for every task.

The task's entry (txf.runconfig.tasks: data.task) decides which batch fields
feed the model and which are labels and loss weights.

Each token's loss is weighted by its weight over the step's token count, so
the loss summed over micro-batches is the step's mean, and gradient
accumulation gives the gradient of the full batch. In model.dtype float16
that mean is scaled by `FLOAT16_LOSS_SCALE` before the backward pass and the
gradient divided by it after (static loss scaling, Micikevicius et al. 2018,
"Mixed Precision Training"): a token's share of the mean gradient, about
1 / (vocabulary * tokens), sits below float16's smallest normal number (6e-5)
and loses its bits or rounds to 0 (8,192 tokens of a 512-token vocabulary:
gradients 7% off float32's, where bfloat16's are 0.2% off). A step whose
scaled gradient overflows float16 (a value of the mean loss's gradient above
65504 / 2**15 = 2) is not finite: skipped, and the run stops as diverged, as
at any non-finite step (txf.train.loop).

With `loss_chunk_len` > 0 (lm and seq2seq, whose LM head is linear) the
model runs without its head and the loss is `ops.linear_cross_entropy_sums`
of the hidden states and the head's kernel: the same loss, with the [B, T, V]
logits never held at once (to float32 rounding; in model.dtype bfloat16 the
default head rounds its logits to bfloat16 before the float32 loss, where
the fused loss accumulates them in float32, so the two differ by that
rounding, about 1e-4 of the loss).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from txf import ops
from txf.models.output_heads import LMHead
from txf.runconfig import optim
from txf.runconfig.tasks import loss_metrics, task_kind

Batch = dict[str, jax.Array]
# A batch as the data pipeline gives it (numpy) or on the device: init and
# model_inputs take either.
AnyBatch = Mapping[str, jax.Array | np.ndarray]
ArrayT = TypeVar("ArrayT", bound=jax.Array | np.ndarray)

# 2**15: the gradient of the mean loss times this is about that of the loss
# summed over a step of 32,768 tokens (gpt2_small's), half PyTorch's initial
# dynamic scale (2**16), so an overflow of a unit-scale activation's gradient
# needs a step of gradients far above those of training.
FLOAT16_LOSS_SCALE = 2.0**15


def loss_scale_for(dtype: str) -> float:
  """The static loss scale of a model computing in `dtype` (model.dtype):
  FLOAT16_LOSS_SCALE for float16, 1 (none) for float32 and bfloat16, whose
  exponent is float32's."""
  return FLOAT16_LOSS_SCALE if dtype == "float16" else 1.0


@flax.struct.dataclass
class TrainState:
  """Everything a checkpoint must hold besides the data position.

  Dropout keys are derived from (seed, step), so no RNG state is stored.
  """

  step: jax.Array  # int32 scalar: updates applied so far
  params: Any
  opt_state: Any


def init_params(model: nn.Module, batch: AnyBatch, task: str, rng: jax.Array) -> Any:
  """The model's initial parameters, each boxed (`nn.Partitioned`) with the
  logical axes its layer declares: under `jax.eval_shape`, what
  `txf.train.sharding.state_shardings` reads the axes from."""
  return model.init(rng, *model_inputs(batch, task))["params"]


def init_state(
  model: nn.Module,
  optimizer: optax.GradientTransformation,
  batch: AnyBatch,
  task: str,
  rng: jax.Array,
) -> TrainState:
  """Initial state from a batch of the right shapes (its values are unused).

  The state holds plain arrays (the boxes of `init_params` removed): the
  optimizer, the steps and checkpoints never see logical-axis metadata.
  """
  params = nn.meta.unbox(init_params(model, batch, task, rng))
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params))


def model_inputs(batch: Mapping[str, ArrayT], task: str) -> tuple[ArrayT, ...]:
  """The model's positional inputs, as data.task `task`'s entry feeds them."""
  return task_kind(task).model_inputs(batch)


def labels_and_weights(batch: Batch, task: str) -> tuple[jax.Array, jax.Array]:
  """Labels [B, T] (or [B]) and float32 weights of the same shape, as data.task
  `task`'s entry reads them."""
  return task_kind(task).labels_and_weights(batch)


def _apply_without_head(
  model: nn.Module, params: Any, inputs: tuple[jax.Array, ...], **kwargs
) -> tuple[jax.Array, jax.Array]:
  """(hidden states [B, T, D] that reach the LM head, the head's float32
  kernel [D, V] with any logit scaling folded in: `LMHead.scaled_kernel`).

  The head is taken as its matrix, not as its product with an identity: XLA
  finds no GPU GEMM tiling for some such products' gradients under seed
  replicas (bf16[780, 128] for 3 replicas of the byte vocabulary).
  """
  kernels = []

  def skip_head(next_fun, args, kwargs, context):
    if context.method_name != "__call__" or not isinstance(context.module, LMHead):
      return next_fun(*args, **kwargs)
    # Heads are called as head(x_BxTxD, tokens_BxT, embedder) (txf.models.output_heads).
    x_BxTxD, _, embedder = args
    kernels.append(context.module.scaled_kernel(embedder))
    return x_BxTxD

  with nn.intercept_methods(skip_head):
    # Any: flax types apply's result as the output or (output, mutated variables).
    hidden_BxTxD: Any = model.apply({"params": params}, *inputs, **kwargs)
  (kernel_DxV,) = kernels
  return hidden_BxTxD, kernel_DxV


def _loss_sums(
  model: nn.Module,
  params: Any,
  batch: Batch,
  task: str,
  *,
  label_smoothing: float,
  z_loss: float,
  dropout_rng: jax.Array | None,
  loss_chunk_len: int = 0,
  weight_scale: jax.Array | float = 1.0,
):
  """(weighted loss sum, weight sum, correct-prediction count) for one batch,
  as data.task's entry computes them (`TaskKind.loss_sums`), each label
  weighted by its weight times `weight_scale`."""
  kind = task_kind(task)
  labels, weights = kind.labels_and_weights(batch)
  weights = weights * weight_scale
  if loss_chunk_len:  # the built-in loss only (run_config's parse)
    hidden_BxTxD, kernel_DxV = _apply_without_head(
      model, params, kind.model_inputs(batch), **_dropout(dropout_rng)
    )
    return ops.linear_cross_entropy_sums(
      hidden_BxTxD,
      kernel_DxV,
      labels,
      weights_BxT=weights,
      chunk_len=loss_chunk_len,
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      dtype=model.cfg.dtype,
    )
  logits = _logits(model, params, batch, task, dropout_rng)
  return kind.loss_sums(logits, labels, weights, label_smoothing=label_smoothing, z_loss=z_loss)


def _eval_sums(model: nn.Module, params: Any, batch: Batch, task: str, loss_chunk_len: int):
  """One eval batch's sums, as data.task's entry computes them
  (`TaskKind.eval_sums`): fused with the LM head for the built-in metrics, from
  the logits for a `metric_sums` hook (which reads them)."""
  kind = task_kind(task)
  if loss_chunk_len and kind.cross_entropy:
    sums = _loss_sums(
      model,
      params,
      batch,
      task,
      label_smoothing=0.0,
      z_loss=0.0,
      dropout_rng=None,
      loss_chunk_len=loss_chunk_len,
    )
    return loss_metrics(sums)
  labels, weights = kind.labels_and_weights(batch)
  return kind.eval_sums(_logits(model, params, batch, task, None), labels, weights)


def _logits(
  model: nn.Module, params: Any, batch: Batch, task: str, dropout_rng: jax.Array | None
) -> Any:
  """The model's output for data.task `task`'s inputs: logits [B, T, V] or [B, C];
  dropout on unless `dropout_rng` is None."""
  kind = task_kind(task)
  apply: Callable[..., Any] = functools.partial(model.apply, **_dropout(dropout_rng))
  cfg: Any = getattr(model, "cfg", None)  # wrappers (the analyses' HeadMasked) have none
  if kind.cross_entropy and ops.losses.uses_gpu_kernel() and getattr(cfg, "head", None) == "lm":
    # The loss's GPU kernel reads the logits as the head's GEMM writes them,
    # in the compute dtype: the float32 copy the head returns by default
    # would be one more pass over [B, T, V] each way, which XLA cannot fuse
    # into a Pallas kernel.
    apply = functools.partial(_apply_with_logits_in, jnp.dtype(cfg.dtype), apply)
  return apply({"params": params}, *kind.model_inputs(batch))


def _dropout(dropout_rng: jax.Array | None) -> dict[str, Any]:
  """model.apply's dropout arguments: on with `dropout_rng`, off for None."""
  return {
    "deterministic": dropout_rng is None,
    "rngs": {} if dropout_rng is None else {"dropout": dropout_rng},
  }


def _apply_with_logits_in(dtype: jnp.dtype, apply: Callable, *args: Any) -> Any:
  """`apply(*args)` with the LM head's logits in `dtype`, not float32."""

  def logits_in_dtype(next_fun, args, kwargs, context):
    if context.method_name == "__call__" and isinstance(context.module, LMHead):
      kwargs = {**kwargs, "dtype": dtype}
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(logits_in_dtype):
    return apply(*args)


def _split_micro_batches(batch: Batch, num: int) -> Batch:
  """[B, ...] leaves -> [num, B / num, ...], micro-batch i = rows i, i+num, ...

  Strided rows keep every micro-batch spread over all data-parallel devices
  (a contiguous split would put each on a fraction of them).
  """

  def split(x):
    if x.shape[0] % num:
      raise ValueError(
        f"train.grad_accum_steps: {num} does not divide the batch of {x.shape[0]} rows"
      )
    return x.reshape(x.shape[0] // num, num, *x.shape[1:]).swapaxes(0, 1)

  return jax.tree.map(split, batch)


def make_train_step(
  model: nn.Module,
  optimizer: optax.GradientTransformation,
  task: str,
  *,
  seed: int,
  grad_accum_steps: int = 1,
  label_smoothing: float = 0.0,
  z_loss: float = 0.0,
  loss_chunk_len: int = 0,
  sharded_params: bool = False,
  loss_scale: float = 1.0,
) -> Callable[[TrainState, Batch], tuple[TrainState, dict]]:
  """Returns `train_step(state, batch) -> (state, metrics)` (not yet jitted).

  loss_scale: the loss is multiplied by it before the backward pass and the
  gradient (and the reported loss and accuracy) divided by it after
  (`loss_scale_for(model.dtype)`: module docstring); 1 compiles no scaling.

  loss_chunk_len > 0 computes the loss fused with the LM head, that many
  positions at a time (module docstring). sharded_params: the parameters
  (and so the gradients) are split over devices, so the gradient norm is
  reduced leaf by leaf (`optim.global_norm`).

  An update whose loss or gradient is not finite is skipped (the state is
  returned unchanged) and reported through `metrics['finite'] == 0`, so a
  NaN never reaches the parameters or a checkpoint.
  """

  # Any optax transformation; one of make_optimizer's takes the norm computed here.
  optimizer = optax.with_extra_args_support(optimizer)

  def mean_loss(params, micro_batch, rng, inverse_weight):
    # Each token weighted by its weight over the step's, so the loss is
    # already the step's mean (and its accuracy), and the cotangent its
    # gradient starts from is jax.grad's 1.0: XLA drops the scaling by it, so
    # the loss's gradient (`ops.cross_entropy_sums`) is written once.
    loss, _, accuracy = _loss_sums(
      model,
      params,
      micro_batch,
      task,
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      dropout_rng=rng,
      loss_chunk_len=loss_chunk_len,
      weight_scale=inverse_weight,
    )
    return loss, accuracy

  value_and_grad_fn = jax.value_and_grad(mean_loss, has_aux=True)

  def train_step(state: TrainState, batch: Batch):
    rng = jax.random.fold_in(jax.random.key(seed), state.step)
    tokens = labels_and_weights(batch, task)[1].sum()
    inverse_weight = loss_scale / jnp.maximum(tokens, 1.0)
    if grad_accum_steps == 1:
      (loss, accuracy), grads = value_and_grad_fn(state.params, batch, rng, inverse_weight)
    else:
      micro = _split_micro_batches(batch, grad_accum_steps)

      def accumulate(carry, xs):
        i, micro_batch = xs
        (m_loss, m_accuracy), m_grads = value_and_grad_fn(
          state.params, micro_batch, jax.random.fold_in(rng, i), inverse_weight
        )
        g, loss, accuracy = carry
        return (jax.tree.map(jnp.add, g, m_grads), loss + m_loss, accuracy + m_accuracy), None

      zeros = jax.tree.map(jnp.zeros_like, state.params)
      (grads, loss, accuracy), _ = jax.lax.scan(
        accumulate, (zeros, jnp.zeros(()), jnp.zeros(())), (jnp.arange(grad_accum_steps), micro)
      )
    if loss_scale != 1.0:  # the gradient (float32, as the parameters) of the mean loss again
      loss, accuracy, grads = jax.tree.map(lambda x: x / loss_scale, (loss, accuracy, grads))
    grad_norm = optim.global_norm(grads, concatenated=not sharded_params)

    def update(state: TrainState) -> TrainState:
      updates, opt_state = optimizer.update(
        grads, state.opt_state, state.params, grad_norm=grad_norm
      )
      params = optax.apply_updates(state.params, updates)
      return TrainState(step=state.step + 1, params=params, opt_state=opt_state)

    # Decided from what the step already has: a non-finite gradient has a
    # non-finite norm. (Adam's update is at most about the learning rate per
    # parameter, so a finite gradient cannot make it overflow.) A select per
    # leaf, not lax.cond: XLA fuses it into that leaf's update, which reads
    # the old values anyway, while jax 0.10's XLA copies the whole state into
    # and out of a conditional (docs/benchmarks.md: 2,053 against 812 kernels).
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old), update(state), state)
    metrics = {
      "loss": loss,
      "accuracy": accuracy,
      "grad_norm": grad_norm,
      "tokens": tokens,
      "finite": finite.astype(jnp.int32),
    }
    return new_state, metrics

  return train_step


def make_eval_step(
  model: nn.Module, task: str, *, loss_chunk_len: int = 0
) -> Callable[[Any, Batch], dict]:
  """Returns `eval_step(params, batch) -> sums`: loss_sum, count, correct and
  any more of data.task's `TaskKind.metric_sums` (sums or (sum, denominator)
  pairs, so results over many batches add up exactly); loss_chunk_len as in
  `make_train_step`."""

  def eval_step(params, batch):
    return _eval_sums(model, params, batch, task, loss_chunk_len)

  return eval_step
