"""Task kinds, the entries of `data.task`: what a task feeds the model and
what its loss reads, in one place that the step, evaluation, sampling,
analysis and export ask instead of naming tasks.

  lm, mlm     model(inputs[, segment_ids, positions])  vs targets, weights
  seq2seq     model(encoder_inputs, decoder_inputs)    vs targets, weights
  classify    model(inputs) -> [B, C]                  vs labels (weight 1 each)

The loss of every kind is `ops.cross_entropy_sums` of the model's logits
against its labels, each weighted by its weight (txf.train.step). User code
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

from txf.data.spec import TASKS

Batch = Mapping[str, Any]  # numpy (init, shapes) or jax arrays, keyed as txf/data/__init__.py
BATCH_FORMATS = ("lm", "mlm", "seq2seq", "classify")


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
  """

  batches: str
  model_inputs: Callable[[Batch], tuple[Any, ...]]
  labels_and_weights: Callable[[Batch], tuple[jax.Array, jax.Array]]
  causal_lm: bool = False
  perplexity: bool = False
  per_example: bool = False

  def __post_init__(self) -> None:
    if self.batches not in BATCH_FORMATS:
      raise ValueError(f"data.task: batches {self.batches!r} is not one of {BATCH_FORMATS}")


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
