"""A task kind's loss and metrics are hooks of its entry (TaskKind.loss_sums,
metric_sums): a task registered with its own changes what the train and
eval steps return (float64 numpy references); one with its own loss cannot
use the fused loss, one with its own metrics only trains with it."""

import contextlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import tiny_config
from txf import ops, register
from txf.data.spec import TASKS
from txf.models import ModelConfig, build
from txf.runconfig.run_config import parse
from txf.runconfig.tasks import cross_entropy_sums, loss_metrics, token_inputs, token_labels
from txf.train.run_setup import RunSetup
from txf.train.step import init_state, make_eval_step, make_train_step

TINY = dict(vocab_size=32, d_model=16, num_heads=2, num_layers=1, max_len=16)
B, T = 4, 8


def last_double_loss_sums(logits, labels, weights, *, label_smoothing, z_loss):
  """The cross-entropy with the last position's weight doubled; the weight
  sum and correct count as the built-in's."""
  double_T = jnp.ones(labels.shape[-1]).at[-1].set(2.0)
  loss_sum, _, _ = ops.cross_entropy_sums(
    logits, labels, weights=weights * double_T, label_smoothing=label_smoothing, z_loss=z_loss
  )
  _, count, correct = ops.cross_entropy_sums(logits, labels, weights=weights)
  return loss_sum, count, correct


def count_squared_metric_sums(logits, labels, weights):
  """The built-in sums, the batch's token count squared, and whole rows
  right as a (rows whose weighted tokens are all argmax-right, rows) pair."""
  loss_sum, count, correct = last_double_loss_sums(
    logits, labels, weights, label_smoothing=0.0, z_loss=0.0
  )
  return {
    "loss_sum": loss_sum,
    "count": count,
    "correct": correct,
    "count_squared": count**2,
    "rows_right": rows_right(logits, labels, weights),
  }


def rows_right(logits, labels, weights):
  """(rows whose weighted tokens are all argmax-right, rows in the batch)."""
  wrong_BxT = (jnp.argmax(logits, -1) != labels) & (weights > 0)
  return (~wrong_BxT.any(-1)).sum().astype(jnp.float32), jnp.float32(labels.shape[0])


def rows_right_metric_sums(logits, labels, weights):
  """The built-in sums and whole rows right (`rows_right`)."""
  sums = cross_entropy_sums(logits, labels, weights, label_smoothing=0.0, z_loss=0.0)
  return {**loss_metrics(sums), "rows_right": rows_right(logits, labels, weights)}


@pytest.fixture
def last_double():
  """data.task 'last_double': lm batches, with the hooks above."""
  with TASKS.scoped():

    @register.task("last_double", batches="lm")
    class LastDouble:
      model_inputs = staticmethod(token_inputs)
      labels_and_weights = staticmethod(token_labels)
      loss_sums = staticmethod(last_double_loss_sums)
      metric_sums = staticmethod(count_squared_metric_sums)

    yield "last_double"


@pytest.fixture
def whole_rows():
  """data.task 'whole_rows': lm batches, the built-in loss, metrics of its own."""
  with TASKS.scoped():

    @register.task("whole_rows", batches="lm")
    class WholeRows:
      model_inputs = staticmethod(token_inputs)
      labels_and_weights = staticmethod(token_labels)
      metric_sums = staticmethod(rows_right_metric_sums)

    yield "whole_rows"


def batch_and_model():
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 32, (B, T + 1))
  weights = (rng.random((B, T)) > 0.3).astype(np.float32)
  batch = dict(
    inputs=jnp.asarray(ids[:, :-1], jnp.int32),
    targets=jnp.asarray(ids[:, 1:], jnp.int32),
    weights=jnp.asarray(weights),
  )
  return batch, build(ModelConfig(**TINY, family="decoder", head="lm"))


def reference_sums(logits_BxTxV, batch, last_weight=2.0):
  """float64 (loss sum with the last position's weight times `last_weight`,
  token count) of the logits."""
  logits = np.asarray(logits_BxTxV, np.float64)
  targets, weights = np.asarray(batch["targets"]), np.asarray(batch["weights"], np.float64)
  m = logits.max(-1)
  lse_BxT = m + np.log(np.exp(logits - m[..., None]).sum(-1))
  nll_BxT = lse_BxT - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  double_T = np.ones(T)
  double_T[-1] = last_weight
  return (weights * double_T * nll_BxT).sum(), weights.sum()


def reference_rows_right(logits_BxTxV, batch):
  """[rows whose weighted tokens are all argmax-right, rows in the batch]."""
  wrong_BxT = (np.argmax(np.asarray(logits_BxTxV), -1) != np.asarray(batch["targets"])) & (
    np.asarray(batch["weights"]) > 0
  )
  return [float((~wrong_BxT.any(-1)).sum()), float(B)]


def test_a_task_kinds_loss_and_metrics_are_what_the_steps_return(last_double):
  batch, model = batch_and_model()
  opt = optax.sgd(0.0)
  state = init_state(model, opt, batch, "lm", jax.random.key(0))
  logits = model.apply({"params": state.params}, batch["inputs"])
  loss_sum, count = reference_sums(logits, batch)

  _, metrics = jax.jit(make_train_step(model, opt, last_double, seed=0))(state, batch)
  np.testing.assert_allclose(float(metrics["loss"]), loss_sum / count, rtol=1e-5)
  _, lm_metrics = jax.jit(make_train_step(model, opt, "lm", seed=0))(state, batch)
  assert abs(float(metrics["loss"]) - float(lm_metrics["loss"])) > 1e-3  # the hook counts
  assert float(metrics["accuracy"]) == float(lm_metrics["accuracy"])

  sums = jax.jit(make_eval_step(model, last_double))(state.params, batch)
  assert set(sums) == {"loss_sum", "count", "correct", "count_squared", "rows_right"}
  np.testing.assert_allclose(float(sums["loss_sum"]), loss_sum, rtol=1e-5)
  assert float(sums["count"]) == count and float(sums["count_squared"]) == count**2
  assert [float(x) for x in sums["rows_right"]] == reference_rows_right(logits, batch)


def test_a_task_with_its_own_loss_refuses_the_fused_loss(last_double):
  config = tiny_config(data__task=last_double, train__loss_chunk_len=16)
  with pytest.raises(ValueError, match="train.loss_chunk_len: data.task='last_double' has its own"):
    parse(config)
  parse(tiny_config(data__task=last_double))


def test_a_task_with_its_own_metrics_only_trains_with_the_fused_loss(whole_rows):
  parse(tiny_config(data__task=whole_rows, train__loss_chunk_len=16))
  batch, model = batch_and_model()
  opt = optax.sgd(0.0)
  state = init_state(model, opt, batch, "lm", jax.random.key(0))
  logits_shape = f"f32[{B},{T},{TINY['vocab_size']}]"  # the whole batch's logits, in a jaxpr

  fused = make_train_step(model, opt, whole_rows, seed=0, loss_chunk_len=T // 2)
  _, metrics = jax.jit(fused)(state, batch)
  assert logits_shape not in str(jax.make_jaxpr(fused)(state, batch))

  # Evaluation computes the logits its hook reads, fused loss or not.
  eval_step = make_eval_step(model, whole_rows, loss_chunk_len=T // 2)
  sums = jax.jit(eval_step)(state.params, batch)
  assert logits_shape in str(jax.make_jaxpr(eval_step)(state.params, batch))
  expected = jax.jit(make_eval_step(model, whole_rows))(state.params, batch)
  assert jax.tree.map(float, sums) == jax.tree.map(float, expected)
  assert set(sums) == {"loss_sum", "count", "correct", "rows_right"}
  logits = model.apply({"params": state.params}, batch["inputs"])
  loss_sum, count = reference_sums(logits, batch, last_weight=1.0)
  np.testing.assert_allclose(float(metrics["loss"]), loss_sum / count, rtol=1e-5)
  np.testing.assert_allclose(float(sums["loss_sum"]), loss_sum, rtol=1e-5)
  assert [float(x) for x in sums["rows_right"]] == reference_rows_right(logits, batch)


def test_evaluation_reports_each_sum_over_the_count_and_a_pair_over_its_own():
  batch_sums = [
    dict(loss_sum=6.0, count=3.0, correct=1.0, count_squared=9.0, rows_right=(1.0, 2.0)),
    dict(loss_sum=2.0, count=4.0, correct=3.0, count_squared=16.0, rows_right=(2.0, 3.0)),
  ]
  run = SimpleNamespace(
    eval_data=batch_sums,
    eval_step=lambda params, sums: jax.tree.map(np.float32, sums),
    to_device=lambda batch: batch,
    activation_sharding=contextlib.nullcontext,
    task="classify",
    run=SimpleNamespace(replicas=1),
  )
  result = RunSetup.evaluate(run, params=None)  # type: ignore[arg-type]  # what evaluate reads
  assert result == {
    "eval_loss": 8 / 7,
    "eval_accuracy": 4 / 7,
    "eval_count_squared": 25 / 7,
    "eval_rows_right": 3 / 5,
  }
  run.eval_data = [dict(batch, rows_right=(0.0, 0.0)) for batch in batch_sums]
  result = RunSetup.evaluate(run, params=None)  # type: ignore[arg-type]
  assert np.isnan(result["eval_rows_right"]) and result["eval_count_squared"] == 25 / 7
