"""The training loop: data, model, optimizer, checkpoints, metrics, samples.

`run(config, workdir)` trains and evaluates a config in a work directory:

  workdir/config.json      the resolved config
  workdir/checkpoints/     orbax checkpoints (state + data position)
  workdir/metrics.jsonl    one JSON record per logged step or eval
  workdir/tb/              TensorBoard event files
  workdir/samples.txt      text sampled at each eval (language models)

Starting it again on the same work directory resumes from the latest good
checkpoint, including the data position, and reaches the same numbers as an
uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import queue
import threading
import time
from typing import Any, Iterator

import jax
import numpy as np

from txf import decode, models
from txf.analysis import flops_per_token, summarize
from txf.data import make_dataset
from txf.train import hardware, sharding
from txf.train.checkpoint import Checkpointer, PreemptionGuard
from txf.train.config import ConfigError, check_run_config
from txf.train.metrics import MetricsWriter, format_progress
from txf.train.optim import make_optimizer, make_schedule
from txf.train.step import init_params, init_state, make_eval_step, make_train_step

# Sections that must not change when a run resumes: the checkpoint holds
# parameters of this model, trained on these data.
_RESUME_SECTIONS = ("seed", "model", "data")


class TrainingDiverged(RuntimeError):
  """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


def _prefetch(dataset, to_device, size: int = 2) -> Iterator[tuple[dict, dict]]:
  """Yields (to_device(batch), data state after it), prepared in a thread so
  reading and the host-to-device copy overlap the previous step.

  The state travels with its batch, so a checkpoint records the position
  after the last batch trained on, not after the ones waiting in the queue.
  """
  slots: queue.Queue = queue.Queue(maxsize=size)

  def produce():
    try:
      for batch in dataset:
        slots.put((to_device(batch), dataset.get_state()))
    except BaseException as error:  # surfaced in the consumer
      slots.put(error)
      return
    slots.put(StopIteration())

  threading.Thread(target=produce, daemon=True).start()
  while True:
    item = slots.get()
    if isinstance(item, StopIteration):
      return
    if isinstance(item, BaseException):
      raise item
    yield item


def _first_difference(old: Any, new: Any, name: str) -> str | None:
  """Dotted name of the first field that differs between two JSON trees."""
  if isinstance(old, dict) and isinstance(new, dict):
    for key in sorted(set(old) | set(new)):
      found = _first_difference(old.get(key), new.get(key), f"{name}.{key}")
      if found:
        return found
    return None
  return None if old == new else name


def _write_resolved_config(config, workdir: pathlib.Path) -> None:
  """Saves config.json; on resume, refuses a config that changed what the
  checkpoint depends on (other fields, e.g. train.steps, may change)."""
  path = workdir / "config.json"
  current = json.loads(config.to_json_best_effort())
  if path.exists():
    saved = json.loads(path.read_text())
    for section in _RESUME_SECTIONS:
      field = _first_difference(saved.get(section), current.get(section), section)
      if field:
        raise ValueError(f"{field}: differs from the run already in {workdir} "
                         f"(see {path}); use a new --workdir")
  if jax.process_index() == 0:
    # Written atomically: other processes of the run may be reading it.
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(current, indent=2) + "\n")
    os.replace(tmp, path)


def _evaluate(eval_step, params, dataset, to_device, task: str) -> dict[str, float]:
  totals = {"loss_sum": 0.0, "count": 0.0, "correct": 0.0}
  for batch in dataset:
    sums = jax.device_get(eval_step(params, to_device(batch)))
    for key in totals:
      totals[key] += float(sums[key])
  if totals["count"] == 0:
    raise ValueError("eval: the validation split produced no tokens")
  loss = totals["loss_sum"] / totals["count"]
  result = {"eval_loss": loss, "eval_accuracy": totals["correct"] / totals["count"]}
  if task in ("lm", "mlm"):
    result["eval_perplexity"] = math.exp(min(loss, 50.0))
  return result


def _sample_text(model, params, tokenizer, eval_config, seed: int, step: int, mesh) -> str:
  """Samples a continuation of eval.sample_prompt with the KV cache."""
  prompt_1xP = tokenizer.encode(eval_config.sample_prompt)[None]
  # Every process holds the same prompt; as one replicated global array it
  # can meet parameters sharded over other hosts' devices inside jit.
  prompt_1xP = jax.make_array_from_callback(prompt_1xP.shape, sharding.replicated(mesh),
                                            lambda index: prompt_1xP[index])
  tokens_1xT = decode.generate(model, params, prompt_1xP,
                               max_new_tokens=eval_config.sample_tokens,
                               rng=jax.random.fold_in(jax.random.key(seed), step),
                               temperature=eval_config.temperature, eos_id=tokenizer.eos_id)
  return tokenizer.decode(np.asarray(tokens_1xT[0]))


def run(config, workdir: str | pathlib.Path, *, log=print) -> dict[str, float]:
  """Trains `config` in `workdir` (resuming if it holds checkpoints).

  Returns the final evaluation metrics. Raises ConfigError (a ValueError)
  for a bad config before any compute, and TrainingDiverged on a non-finite
  loss.
  """
  workdir = pathlib.Path(workdir)
  is_chief = jax.process_index() == 0
  multi_process = jax.process_count() > 1
  shard = dict(process_index=jax.process_index(), process_count=jax.process_count())
  try:
    train_data = make_dataset(config.data, "train", seed=config.seed, workdir=workdir, **shard)
    model_cfg = check_run_config(config, vocab_size=train_data.vocab_size,
                                 num_classes=train_data.num_classes)
    optimizer = make_optimizer(config.train)
    schedule = make_schedule(config.train)
    eval_data = make_dataset(config.data, "validation", seed=config.seed, workdir=workdir,
                             num_batches=config.eval.num_batches, **shard)
    mesh = sharding.make_mesh(config.parallel)
    sharding.check_batch(config.data.batch_size, mesh)
    task = train_data.task
    model = models.build(model_cfg)
    first_batch = next(iter(eval_data))  # shapes only: train and eval batches match
    init_fn = lambda rng: init_state(model, optimizer, first_batch, task, rng)
    # Abstract evaluation only: a dimension that does not divide its mesh
    # axis fails here, before any parameter exists.
    key = jax.random.key(config.seed)
    state_sharding = sharding.state_shardings(
        jax.eval_shape(init_fn, key),
        jax.eval_shape(lambda rng: init_params(model, first_batch, task, rng), key), mesh)
    workdir.mkdir(parents=True, exist_ok=True)
    _write_resolved_config(config, workdir)
  except ValueError as error:
    raise ConfigError(str(error)) from error

  # Parameters and optimizer state are created already sharded: no host ever
  # holds the whole model. Restoring onto this abstract state (which carries
  # the shardings) reshards a checkpoint written on another mesh.
  init = jax.jit(init_fn, out_shardings=state_sharding)
  abstract_state = jax.eval_shape(init, jax.random.key(config.seed))
  to_device = lambda batch: sharding.shard_batch(batch, mesh)

  checkpointer = Checkpointer(workdir / "checkpoints", max_to_keep=config.train.max_to_keep,
                              save_interval_steps=config.train.checkpoint_every)
  restored = checkpointer.restore(abstract_state)
  if restored is None:
    state, start = init(jax.random.key(config.seed)), 0
  else:
    start, state, extras = restored
    train_data.set_state(extras["data"])
    log(f"resumed from step {start} in {checkpointer.directory}")
  log(f"data: {train_data.description}\n{summarize(state.params, model_cfg, config.data.seq_len)}")

  train_step = jax.jit(make_train_step(model, optimizer, task, seed=config.seed,
                                       grad_accum_steps=config.train.grad_accum_steps,
                                       label_smoothing=config.train.label_smoothing,
                                       z_loss=config.train.z_loss),
                       out_shardings=(state_sharding, sharding.replicated(mesh)),
                       donate_argnums=0)
  eval_step = jax.jit(make_eval_step(model, task), out_shardings=sharding.replicated(mesh))
  tokens_per_step = config.data.batch_size * (1 if task == "classify" else config.data.seq_len)
  flops = flops_per_token(model_cfg, config.data.seq_len)
  peak = hardware.peak_flops_per_device(dtype=model_cfg.dtype)

  writer = MetricsWriter(workdir, enabled=is_chief)
  last_eval: dict[str, float] = {}
  steps = config.train.steps
  batches = _prefetch(train_data, to_device)
  data_state = train_data.get_state()
  window_start, window_steps = time.perf_counter(), 0
  skipped_updates = 0

  def save(step: int, *, force: bool = False) -> bool:
    return checkpointer.save(step, state, {"data": data_state}, force=force)

  with (PreemptionGuard() as guard, _closing(checkpointer, writer),
        sharding.activation_sharding(mesh)):
    for step in range(start, steps):
      batch, data_state = next(batches)
      state, metrics = train_step(state, batch)
      # Counted on device (no sync per step), checked at every log step.
      skipped_updates = skipped_updates + 1 - metrics["finite"]
      if step == start:
        # Keep compilation out of the throughput figures.
        jax.block_until_ready(metrics)
        window_start = time.perf_counter()
      else:
        window_steps += 1
      done = step + 1
      if done % config.train.log_every == 0 or done == steps:
        metrics = jax.device_get(metrics)
        if int(skipped_updates):
          checkpointer.wait_until_finished()
          raise TrainingDiverged(
              f"non-finite loss, gradient or update by step {done}; those updates were skipped "
              f"and the last good checkpoint (step {checkpointer.latest_step()}) is kept")
        scalars = {"loss": metrics["loss"], "accuracy": metrics["accuracy"],
                   "grad_norm": metrics["grad_norm"], "learning_rate": schedule(done - 1)}
        if window_steps:  # none yet right after (re)starting: only the compiling step
          elapsed = time.perf_counter() - window_start
          tokens_per_sec = tokens_per_step * window_steps / elapsed
          scalars.update(tokens_per_sec=tokens_per_sec, steps_per_sec=window_steps / elapsed,
                         step_time=elapsed / window_steps)
          utilisation = hardware.mfu(flops, tokens_per_sec, jax.device_count(), peak)
          if utilisation is not None:
            scalars["mfu"] = utilisation
        writer.write(done, scalars)
        log(format_progress(done, steps, scalars))
        window_start, window_steps = time.perf_counter(), 0
      if done % config.eval.every == 0 or done == steps:
        last_eval = _evaluate(eval_step, state.params, eval_data, to_device, task)
        if task == "lm" and config.eval.sample_tokens and model_cfg.family == "decoder":
          sample = _sample_text(model, state.params, train_data.tokenizer, config.eval,
                                config.seed, done, mesh)
          if is_chief:
            with open(workdir / "samples.txt", "a") as f:
              f.write(f"=== step {done} ===\n{sample}\n")
          log(f"sample @ {done}: {sample[:200]!r}")
        writer.write(done, last_eval)
        log(f"eval @ {done}: " + ", ".join(f"{k}={v:.4f}" for k, v in last_eval.items()))
        window_start, window_steps = time.perf_counter(), 0
      saved = (done % config.train.checkpoint_every == 0 or done == steps) and save(
          done, force=True)
      # JAX's preemption service exists only under jax.distributed; its check
      # is a cross-process sync, so it is skipped when there is one process.
      preempted = guard.requested or (multi_process and checkpointer.reached_preemption(done))
      if preempted:
        if not saved:  # a second save of the same step raises StepAlreadyExistsError
          save(done, force=True)
        checkpointer.wait_until_finished()
        log(f"preempted: saved step {done}; rerun the same command to resume")
        break
    else:
      if start >= steps:  # a finished run started again: report, train nothing
        log(f"already trained to step {start} of {steps}")
        last_eval = _evaluate(eval_step, state.params, eval_data, to_device, task)
  return last_eval


@contextlib.contextmanager
def _closing(checkpointer: Checkpointer, writer: MetricsWriter):
  """Finishes pending saves and closes both, also when training raises."""
  try:
    yield
  finally:
    checkpointer.wait_until_finished()
    checkpointer.close()
    writer.close()
