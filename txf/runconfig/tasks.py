"""Task kinds, the entries of `data.task`: what a task feeds the model and
what its loss reads, in one place that the step, evaluation, sampling,
analysis and export ask instead of naming tasks.

  lm, mlm     model(inputs[, segment_ids, positions])  vs targets, weights
  seq2seq     model(encoder_inputs, decoder_inputs)    vs targets, weights
  classify    model(inputs) -> [B, C]                  vs labels (weight 1 each)

A kind's loss and evaluation metrics are hooks of its entry (`loss_sums`,
`metric_sums`), by default the weighted cross-entropy of the model's logits
against its labels (`ops.cross_entropy_sums`) and its loss, accuracy and
count; txf.train.step calls them. User code
registers a kind with `txf.register.task` (examples/extending/prefix_lm.py:
a prefix LM reading lm batches); the registry is txf.data.spec.TASKS, where
the data section's parse checks data.task and the data reads `batches`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from txf import ops
from txf.data.spec import TASKS

Batch = Mapping[str, Any]  # numpy (init, shapes) or jax arrays, keyed as txf/data/__init__.py
# (logits, labels, weights, *, label_smoothing, z_loss) -> (loss sum, weight sum, correct count)
LossSums = Callable[..., tuple[jax.Array, jax.Array, jax.Array]]
# (logits, labels, weights) -> {name: float32 scalar sum, or a (sum, denominator) pair}
MetricSums = Callable[[jax.Array, jax.Array, jax.Array], dict[str, jax.Array]]
BATCH_FORMATS = ("lm", "mlm", "seq2seq", "classify")
# What a registered task kind must have (txf.register.task); loss_sums and
# metric_sums are optional hooks.
TASK_FUNCTIONS = ("model_inputs", "labels_and_weights")


def cross_entropy_sums(
  logits: jax.Array, labels: jax.Array, weights: jax.Array, *, label_smoothing: float, z_loss: float
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The built-in loss: `ops.cross_entropy_sums` of logits [..., V] against
  labels [...] weighted by weights [...] (loss sum, weight sum, correct count)."""
  return ops.cross_entropy_sums(
    logits, labels, weights=weights, label_smoothing=label_smoothing, z_loss=z_loss
  )


@dataclasses.dataclass(frozen=True)
class TaskKind:
  """A `data.task` entry (txf.register.task).

  Attributes:
    batches: the batch format it reads, one of BATCH_FORMATS (the fields
      txf/data/__init__.py lists for it): a dataset giving it fits, and the
      model families and heads that train that built-in task train it.
    model_inputs: batch -> the model's positional inputs (a tuple).
    labels_and_weights: batch -> (int labels [B, T] or [B], float32 loss
      weights of the same shape).
    causal_lm: its model predicts each token from those before it only
      (lm): evaluations sample continuations (eval.sample_tokens), attention
      analyses treat its self-attention as causal, length extrapolation and
      decode compilation apply.
    perplexity: evaluations report eval_perplexity (the labels are tokens
      of a language model).
    per_example: one label per example: throughput counts examples, not tokens.
    loss_sums: (logits_BxTxV or logits_BxC, labels, weights, *,
      label_smoothing, z_loss) -> float32 scalars (weighted loss sum, weight
      sum, weighted count of correct predictions); the train step's loss is
      the first over the step's weight sum (weights come pre-scaled by its
      inverse) and only it is differentiated. Default `cross_entropy_sums`.
    metric_sums: (logits, labels, weights) -> {name: float32 scalar sum} for
      an eval batch, with at least 'loss_sum', 'count' and 'correct';
      evaluation adds them over its batches and reports each over the count
      (eval_loss, eval_accuracy, eval_<name>), or, for a value that is a
      (sum, denominator) pair, over its own denominator (a whole-answer
      accuracy over examples, not tokens; NaN if it is 0). None:
      `loss_metrics` of `loss_sums` without label smoothing or z-loss.
      Evaluation computes the logits it reads even where the train step
      fuses the loss with the LM head (train.loss_chunk_len).
  """

  batches: str
  model_inputs: Callable[[Batch], tuple[Any, ...]]
  labels_and_weights: Callable[[Batch], tuple[jax.Array, jax.Array]]
  causal_lm: bool = False
  perplexity: bool = False
  per_example: bool = False
  loss_sums: LossSums = cross_entropy_sums
  metric_sums: MetricSums | None = None

  def __post_init__(self) -> None:
    if self.batches not in BATCH_FORMATS:
      raise ValueError(f"data.task: batches {self.batches!r} is not one of {BATCH_FORMATS}")

  @property
  def builtin_loss(self) -> bool:
    """It trains with the built-in loss, which the fused loss
    (train.loss_chunk_len) computes without the logits."""
    return self.loss_sums is cross_entropy_sums

  @property
  def cross_entropy(self) -> bool:
    """It trains and evaluates with the built-in hooks: the fused loss
    computes its evaluation's sums too, without the logits."""
    return self.builtin_loss and self.metric_sums is None

  def eval_sums(self, logits: jax.Array, labels: jax.Array, weights: jax.Array) -> dict:
    """An eval batch's sums (`metric_sums`, by default `loss_metrics`)."""
    if self.metric_sums is not None:
      return self.metric_sums(logits, labels, weights)
    return loss_metrics(self.loss_sums(logits, labels, weights, label_smoothing=0.0, z_loss=0.0))


def loss_metrics(sums: tuple[jax.Array, jax.Array, jax.Array]) -> dict[str, jax.Array]:
  """The built-in eval sums {loss_sum, count, correct} from `loss_sums`' triple."""
  loss_sum, count, correct = sums
  return {"loss_sum": loss_sum, "count": count, "correct": correct}


def token_inputs(batch: Batch) -> tuple[Any, ...]:
  """(inputs [B, T],) or, for packed rows (txf.data's packed TFDS streams),
  (inputs, segment_ids, positions)."""
  if "segment_ids" in batch:
    return batch["inputs"], batch["segment_ids"], batch["positions"]
  return (batch["inputs"],)


def token_labels(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """(targets [B, T], float32 weights [B, T])."""
  return batch["targets"], batch["weights"].astype(jnp.float32)


def example_labels(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """(labels [B], weights [B] of 1)."""
  labels = batch["labels"]
  return labels, jnp.ones(labels.shape, jnp.float32)


TASKS.register("lm", TaskKind("lm", token_inputs, token_labels, causal_lm=True, perplexity=True))
TASKS.register("mlm", TaskKind("mlm", token_inputs, token_labels, perplexity=True))
TASKS.register(
  "seq2seq",
  TaskKind(
    "seq2seq", lambda batch: (batch["encoder_inputs"], batch["decoder_inputs"]), token_labels
  ),
)
TASKS.register(
  "classify",
  TaskKind("classify", lambda batch: (batch["inputs"],), example_labels, per_example=True),
)


def task_kind(task: str) -> TaskKind:
  """The entry of data.task `task` (ValueError naming data.task for an unknown one)."""
  return TASKS[task]  # type: ignore[return-value]  # every entry is a TaskKind (register.task)
