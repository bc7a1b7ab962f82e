"""The training loop: steps, throughput, metrics, evals, samples, checkpoints.

`run(run_config, workdir)` trains and evaluates a run config (a RunConfig:
txf.runconfig.run_config.parse of a ConfigDict) in a work directory (everything
it trains with is built by txf.train.run_setup.setup_run):

  workdir/config.json      the config the run trains with (txf.rundir.resume)
  workdir/checkpoints/     orbax checkpoints (state + data position)
  workdir/metrics.jsonl    one JSON record per logged step or eval
  workdir/tb/              TensorBoard event files
  workdir/samples.txt      text sampled at each eval (language models)
  workdir/run_record.json  each start of the run: environment, git commit,
                           command line, data, resolved config, start/end
                           (txf.rundir.record)

TensorBoard also gets the samples (text) and, when the run finishes, its
hyperparameters (every field of the resolved model, data, train and eval
sections, seed, replicas, and `hparams`, e.g. a sweep point's fields) with
its final eval metrics for the HParams dashboard. The trackers
`train.trackers` names (txf.rundir.trackers, e.g. wandb) get the resolved
config, every metrics row, the samples and the final metrics (process 0).

The work directory may be local or on Cloud Storage (gs://bucket/run, with
the `gcs` extra installed): every file goes through `etils.epath`.

Starting it again on the same work directory resumes from the latest good
checkpoint, including the data position, and reaches the same numbers as an
uninterrupted run.

A write that fails (a full or read-only disk) stops the run at once: every
output is written in the training thread and raises WriteError (metrics,
TensorBoard events, samples, config.json) or CheckpointWriteError (a
checkpoint; an asynchronous save's failure is seen at the next log step),
each naming the file and the reason. Checkpoints written before it are kept:
a failed save never deletes an older one (txf.rundir.checkpoint). Free the
space and rerun: it resumes from the last checkpoint exactly.

The loop adds little to the compiled step: no device sync between log
steps (non-finite updates are flagged on device and checked at each log
step), batches read and sent ahead in a thread, the eval step and the
sampler compiled in another thread while the first step compiles and
finished before the second, so neither the first evaluation nor a window of
steps pays for their compilation, and checkpoints compressed and written
in the background at a lower priority (txf.rundir.checkpoint;
benchmarks.run loop measures what the loop costs, piece by piece, and
benchmarks.run checkpoint_stall a step dispatched during a save).

A config with `replicas` = R > 1 trains seeds seed .. seed + R - 1 side by
side on the same batches, or each on its own with data.seed_per_replica
(txf.train.run_setup); every metric is logged per
replica with the replicas' mean and std (txf.rundir.metrics.replica_scalars),
a replica's non-finite update stops the run as for a single run, and the
samples come from the first replica.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Generator, Mapping
from typing import Any

import jax
import numpy as np
from etils import epath

from txf import decode, hardware
from txf.analysis import summarize
from txf.data import ProcessCountError
from txf.data.pipeline import keep_hf_tokenizer
from txf.decode import generation
from txf.progress import say, terminal_bar
from txf.runconfig.run_config import ConfigError, RunConfig, TrainConfig, to_json
from txf.runconfig.tasks import task_kind
from txf.rundir.checkpoint import (
  Checkpointer,
  CheckpointWriteError,
  PreemptionGuard,
  RestoreError,
  StoppedBeforeTraining,
  make_checkpointer,
)
from txf.rundir.console import format_duration, format_progress
from txf.rundir.derived import derived_after, move_aside
from txf.rundir.metrics import MetricsWriter, check_outputs
from txf.rundir.record import RunRecord
from txf.rundir.resume import (
  CONFIG_FILE,
  changes_since_step,
  check_optimizer_state,
  config_changes,
  end_written,
  evaluated,
  keep_run_warmup,
  prepare_resume,
  trained_to,
  write_config,
)
from txf.rundir.trackers import check_trackers, make_trackers
from txf.rundir.workdir import check_reachable, holding, run_path
from txf.train import replicas, sharding
from txf.train.distributed import check_processes_agree, gather_data_states
from txf.train.run_setup import (
  RunSetup,
  check_memory,
  check_sample_prompt,
  sampler_arguments,
  setup_run,
)


class TrainingDiverged(RuntimeError):
  """The loss or gradient became NaN/inf; the last good checkpoint is kept."""


PREFETCH_THREAD = "txf-prefetch"
PREFETCH_JOIN_SECONDS = 30.0
COMPILE_THREAD = "txf-compile-eval"


def _prefetch(dataset, to_device, size: int = 2) -> Generator[tuple[dict, dict], None, None]:
  """Yields (to_device(batch), data state after it), prepared in a thread so
  reading and the host-to-device copy overlap the previous step (size 0:
  in the caller's thread, when asked for).

  The state travels with its batch, so a checkpoint records the position
  after the last batch trained on, not after the ones waiting in the queue.
  Closing the generator stops the thread and waits (up to
  PREFETCH_JOIN_SECONDS) for it to finish its current batch: a sweep of many
  runs keeps no thread per run, and the process never exits while the thread
  is inside a device transfer (a daemon thread in JAX's C++ code at
  interpreter exit aborts the process).
  """
  if not size:
    for batch in dataset:
      yield to_device(batch), dataset.get_state()
    return
  slots: queue.Queue = queue.Queue(maxsize=size)
  stop = threading.Event()

  def put(item) -> bool:
    """Queues `item` unless the consumer has gone; whether it was queued."""
    while not stop.is_set():
      try:
        slots.put(item, timeout=0.1)
        return True
      except queue.Full:
        pass
    return False

  def produce():
    try:
      for batch in dataset:
        if stop.is_set() or not put((to_device(batch), dataset.get_state())):
          return
    except BaseException as error:  # surfaced in the consumer
      put(error)
      return
    put(StopIteration())

  producer = threading.Thread(target=produce, name=PREFETCH_THREAD, daemon=True)
  producer.start()
  try:
    while True:
      item = slots.get()
      if isinstance(item, StopIteration):
        return
      if isinstance(item, BaseException):
        raise item
      yield item
  finally:
    stop.set()
    # Bounded: a read that never returns (a stalled remote dataset) must not
    # hang the run's exit.
    producer.join(PREFETCH_JOIN_SECONDS)


def _samples(setup: RunSetup) -> bool:
  """Whether the run's evaluations sample text."""
  # Every lm-task model generates: a decoder, or an LSTM (its carry is its cache).
  return task_kind(setup.task).causal_lm and bool(setup.run.eval.sample_tokens)


def _sampler_arguments(setup: RunSetup, params, step: int) -> tuple[tuple, dict]:
  """`sampler_arguments` with the prompt on the run's mesh."""
  (model, params, prompt_1xP), options = sampler_arguments(setup, params, step)
  # Every process holds the same prompt; as one replicated global array it
  # can meet parameters sharded over other hosts' devices inside jit.
  prompt_1xP = jax.make_array_from_callback(
    prompt_1xP.shape, sharding.replicated(setup.mesh), lambda index: prompt_1xP[index]
  )
  return (model, params, prompt_1xP), options


def _sample_text(setup: RunSetup, params, step: int) -> str:
  """Samples a continuation of eval.sample_prompt with the KV cache."""
  args, kwargs = _sampler_arguments(setup, params, step)
  tokens_1xT = decode.generate(*args, **kwargs)
  return setup.train_data.tokenizer.decode(np.asarray(tokens_1xT[0]))


def _abstract(tree):
  """Shapes, dtypes and shardings of a tree of arrays, for `lower`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _compile_evaluation(setup: RunSetup, params) -> threading.Thread:
  """Starts compiling the eval step (and the sampler) in a thread.

  XLA compilation of the evaluation would otherwise stall training at the
  first eval (for gpt2_small, seconds to a minute of an idle accelerator);
  in a thread it overlaps the train step's own compilation, and the loop
  joins it after the first step, before the timed steps (compiled beside
  them, on an H200 it cost 1.4 s of steps 51-250: host cores and the
  autotuner's time on the device). JAX keeps the executables, so the first
  eval only retraces. Only shapes of `params` are used: the thread never
  touches arrays the train step donates. Join the thread before evaluating
  (a second compilation would start otherwise).
  """
  eval_batch = _abstract(setup.to_device(next(iter(setup.eval_data))))
  sampler = None
  if _samples(setup):
    args, kwargs = _sampler_arguments(setup, setup.replica_params(params, 0), step=0)
    sampler = ((*args[:1], _abstract(args[1]), *args[2:]), kwargs)
  params = _abstract(params)

  def compile_all():
    try:
      with setup.activation_sharding():
        setup.eval_step.lower(params, eval_batch).compile()
        if sampler is not None:
          generation.build_generate(lower=True)(*sampler[0], **sampler[1]).compile()
    except Exception:
      pass  # the eval itself compiles then, and raises whatever this met

  thread = threading.Thread(target=compile_all, name=COMPILE_THREAD, daemon=True)
  thread.start()
  return thread


class _Throughput:
  """Steps and seconds since the window opened (at each log and eval);
  the first step after (re)starting compiles and is kept out."""

  def __init__(self):
    self.restart()
    # The whole of this process's training, compilation and evaluations included.
    self.began, self.steps_run = self._start, 0
    # Since the first step compiled: what the ETA extrapolates (evaluations included).
    self.compiled, self.steps_compiled = self._start, 0

  def restart(self) -> None:
    self._start, self._steps = time.perf_counter(), 0

  def add(self, metrics: dict, *, compiling: bool) -> None:
    self.steps_run += 1
    if compiling:
      jax.block_until_ready(metrics)
      self.restart()
      self.compiled, self.steps_compiled = self._start, 0
    else:
      self._steps += 1
      self.steps_compiled += 1

  def timed(self) -> tuple[float, int]:
    """(seconds, steps) this process has trained since its first step compiled."""
    return time.perf_counter() - self.compiled, self.steps_compiled

  def figures(self, setup: RunSetup) -> dict[str, float]:
    """tokens/s (examples/s for a task of one label an example:
    examples_per_sec), steps/s, step time and MFU (where the peak is known);
    none right after (re)starting, when the window holds only the compiling
    step."""
    if not self._steps:
      return {}
    elapsed = time.perf_counter() - self._start
    units_per_sec = setup.tokens_per_step * self._steps / elapsed
    rate = "examples_per_sec" if task_kind(setup.task).per_example else "tokens_per_sec"
    figures = {
      rate: units_per_sec,
      "steps_per_sec": self._steps / elapsed,
      "step_time": elapsed / self._steps,
    }
    utilisation = hardware.mfu(
      setup.flops_per_token, units_per_sec, setup.mesh.size, setup.peak_flops
    )
    if utilisation is not None:
      figures["mfu"] = utilisation
    return figures


def _log_train(
  setup: RunSetup, metrics: dict, done: int, window: _Throughput, writer: MetricsWriter, log
) -> None:
  scalars = replicas.scalars(
    {name: metrics[name] for name in ("loss", "accuracy", "grad_norm")}, setup.run.replicas
  )
  scalars.update(learning_rate=setup.run.schedule(done - 1), **window.figures(setup))
  writer.write(done, scalars)
  elapsed = time.perf_counter() - window.began
  log(
    format_progress(
      done,
      setup.run.train.steps,
      scalars,
      elapsed=elapsed,
      steps_run=window.steps_run,
      timed=window.timed(),
    )
  )


def _check_finite(finite_flags: list, done: int, checkpointer: Checkpointer) -> None:
  """Raises TrainingDiverged if an update since the last check was skipped as
  non-finite (a flag [R] or scalar of 0 in `finite_flags`)."""
  if not all(np.all(flag) for flag in jax.device_get(finite_flags)):
    checkpointer.wait_until_finished()
    latest = checkpointer.latest_step()
    kept = (
      "no checkpoint had been written yet"
      if latest is None
      else f"the last good checkpoint (step {latest}) is kept"
    )
    raise TrainingDiverged(
      f"non-finite loss, gradient or update by step {done}; those updates were skipped and {kept}"
    )


def _eval_and_sample(
  setup: RunSetup, params, done: int, writer: MetricsWriter, log
) -> dict[str, float]:
  result = setup.evaluate(params)
  if _samples(setup):
    sample = _sample_text(setup, setup.replica_params(params, 0), done)
    writer.write_sample(done, sample)
    log(f"sample @ {done}: {sample[:200]!r}")
  writer.write(done, result)
  log(_eval_line(done, result))
  return result


def _eval_line(done: int, result: dict[str, float], note: str = "") -> str:
  # Per-replica values are in the metrics; the console gets mean (and std).
  return f"eval @ {done}{note}: " + ", ".join(
    f"{k}={v:.4f}" for k, v in result.items() if "/" not in k
  )


def _checkpoint(
  checkpointer: Checkpointer,
  guard: PreemptionGuard,
  state,
  data_state: dict,
  done: int,
  train: TrainConfig,
  evaluated: dict[str, float] | None,
  unchecked_flags: list,
  writer: MetricsWriter,
  log,
) -> bool:
  """Saves at checkpoint steps and at the last, with the evaluation at
  `done` (None: none ran) for train.keep_best to rank it by; returns True
  (after saving) when the run is preempted or interrupted (Ctrl-C). The
  finite flags of the steps since the last check (`unchecked_flags`,
  emptied) are checked before a save: a skipped update must not reach a
  checkpoint unreported, or a run resumed from it would never report it."""

  def save() -> bool:
    _check_finite(unchecked_flags, done, checkpointer)
    unchecked_flags.clear()
    return checkpointer.save(
      done, state, {"data": gather_data_states(data_state)}, force=True, metrics=evaluated
    )

  saved = (done % train.checkpoint_every == 0 or done == train.steps) and save()
  if saved:
    # On object storage rows are uploaded at most once a second: a run killed
    # after this checkpoint must not lose the rows up to it.
    writer.flush()
  # JAX's preemption service exists only under jax.distributed; its check
  # is a cross-process sync, so it is skipped when there is one process.
  preempted = guard.requested or (jax.process_count() > 1 and checkpointer.reached_preemption(done))
  if preempted:
    if not saved:  # a second save of the same step raises StepAlreadyExistsError
      save()
    checkpointer.wait_until_finished()
    if done < train.steps:
      log(f"{guard.reason}: saved step {done}; rerun the same command to resume")
    else:
      log(f"{guard.reason} at the last step: saved step {done}, the run is finished")
  return preempted


def _train(
  setup: RunSetup,
  state,
  start: int,
  checkpointer: Checkpointer,
  guard: PreemptionGuard,
  writer: MetricsWriter,
  log,
  prefetch: int,
  record: RunRecord,
) -> tuple[dict[str, float], int]:
  """Steps start+1 .. train.steps (or to a preemption); the last eval's
  metrics and the step training stopped at. `record.step` follows the
  steps trained, the end_step of a run an error stops."""
  train, eval_config = setup.run.train, setup.run.eval
  window, finite_flags, last_eval, done = _Throughput(), [], {}, start
  # The last step always evaluates, so this compilation is never wasted.
  compiling = _compile_evaluation(setup, state.params)
  # The first step's line comes once it has compiled (up to minutes for a
  # large model): say what the silence until then is.
  log(f"step {start + 1}/{train.steps}: compiling the train step (the evaluation beside it)")
  # Closing stops the prefetch thread also when training raises; the
  # compilation is waited for too (a thread inside XLA at exit aborts Python).
  with (
    contextlib.closing(_prefetch(setup.train_data, setup.train_to_device, prefetch)) as batches,
    _joining(compiling),
    terminal_bar("train", train.steps, unit="steps", done=start) as show_when_done,
  ):
    for step in range(start, train.steps):
      batch, data_state = next(batches)
      state, metrics = setup.train_step(state, batch)
      show_when_done(step + 1, metrics["finite"])
      if step == start:
        # The evaluation compiled beside the step's own compilation; done
        # before the second step, no window of steps shares the host (or,
        # autotuning, the accelerator) with it.
        compiling.join()
      # Kept on device (no sync, no dispatch per step), checked at every log step.
      finite_flags.append(metrics["finite"])
      window.add(metrics, compiling=step == start)
      done = record.step = step + 1
      if step == start and done % train.log_every and done != train.steps:
        compiled = format_duration(time.perf_counter() - window.began)
        log(f"step {done}/{train.steps}: compiled and ran in {compiled}")
      if done % train.log_every == 0 or done == train.steps:
        metrics = jax.device_get(metrics)
        _check_finite(finite_flags, done, checkpointer)
        finite_flags.clear()
        # A failed asynchronous save stops the run here, not at the next save.
        checkpointer.check_for_errors()
        _log_train(setup, metrics, done, window, writer, log)
        window.restart()
      evaluated = None
      if done % eval_config.every == 0 or done == train.steps:
        compiling.join()
        last_eval = evaluated = _eval_and_sample(setup, state.params, done, writer, log)
        window.restart()
      if _checkpoint(
        checkpointer, guard, state, data_state, done, train, evaluated, finite_flags, writer, log
      ):
        break
  return last_eval, done


@contextlib.contextmanager
def _joining(thread: threading.Thread):
  try:
    yield
  finally:
    thread.join()


def _continue_data(setup: RunSetup, data_state: dict, step: int, saved: RunConfig | None) -> None:
  """Makes the next training batch the one after checkpoint `step`'s; a
  refusal names the fields changed from `saved` (config.json) that shape
  the batches, where any did."""
  try:
    setup.train_data.set_state(data_state)
  except ProcessCountError as error:
    raise ConfigError(str(error)) from error
  except ValueError as error:  # e.g. a position between batches of a new size
    data = setup.run.data
    # A longer seq_len makes fewer windows an epoch: the position taken may lie past them.
    changed = [
      f"data.{name}"
      for name in ("batch_size", "seq_len")
      if saved is not None and getattr(saved.data, name) != getattr(data, name)
    ]
    raise ConfigError(
      f"{', '.join(changed) or 'data.batch_size'}: the data position of checkpoint step "
      f"{step}, {data_state}, does not "
      f"continue in batches of data.batch_size={data.batch_size}, data.seq_len="
      f"{data.seq_len}; continue training with the run's own (config.json), or, where "
      f"those are the run's, the checkpoint's position is damaged ({error})"
    ) from error


def run(
  run_config: RunConfig,
  workdir: str | os.PathLike,
  *,
  log=say,
  setup: RunSetup | None = None,
  prefetch: int = 2,
  preemption: PreemptionGuard | None = None,
  hparams: Mapping[str, Any] | None = None,
  config_file: str | None = None,
  resume_step: int | None = None,
) -> dict[str, float]:
  """Trains `run_config` in `workdir` (resuming if it holds checkpoints:
  from its newest that restores, or from `resume_step`'s, after moving the
  steps after it to `<step>.dropped`).

  `setup` is its RunSetup to train with (None: built here by setup_run;
  benchmarks pass one with pieces swapped, see benchmarks.run loop).
  `prefetch` batches are read and sent to the devices ahead in a thread (0:
  no thread, each batch read when its step is dispatched).
  `preemption` is the entered SIGTERM / SIGINT guard to train under (None:
  one of its own); a sweep, or txf-run, passes its own to learn that a run
  stopped for a preemption or a Ctrl-C (`PreemptionGuard.interrupted`).
  `hparams` (dotted field -> value, e.g. a sweep point's fields) are
  recorded for TensorBoard's HParams dashboard beside the resolved config's fields.
  `config_file` is the file the config was loaded from, for run_record.json.

  Returns the final evaluation metrics. Before anything is written it checks
  the config against the run in `workdir` (ConfigError, a ValueError,
  naming the field -- one that changes what the run's checkpoints depend on, see
  txf.rundir.resume.check_resumable, or the optimizer state they hold; a
  model, or a sample, far too large for the device's memory:
  txf.train.run_setup.check_memory), that
  the work directory (and data.tfds_data_dir) is on a file system that is
  installed (a gs:// one needs the `gcs` extra) and answers within
  txf.rundir.workdir.REACH_TIMEOUT_S, writable and held by no other run
  (WorkdirError), that the trackers can start (ConfigError: e.g. wandb
  without a login), and that a checkpoint restores (RestoreError). Training raises
  TrainingDiverged on a non-finite loss, CheckpointWriteError when a save
  fails and WriteError when another output (metrics.jsonl, tb/, samples.txt,
  config.json) cannot be written -- each as soon as it happens, and each
  one line naming the file and the reason. A finished run started again
  trains nothing and evaluates (at the config's data.seq_len and
  data.batch_size, which may differ from the training's); config.json is
  then left as it is -- unless what the run's end writes was lost
  (config.json, or the final eval row of metrics.jsonl): then the end is
  completed as training would have (final eval and sample logged,
  config.json written).

  A SIGTERM or Ctrl-C caught by `preemption` while the run sets up (reads
  its data, trains its tokenizer, builds and restores the model) stops it
  at once, before it writes anything: it says so and returns {} (the guard's
  `requested` set); one from then on is acted on at the end of a step,
  after saving.

  Metrics rows and samples logged after the step training continues from
  (0 without a checkpoint) are moved to metrics.dropped.jsonl /
  samples.dropped.txt, so every step has one row.
  """
  try:
    with _stopping_at_once(preemption):
      workdir = run_path(workdir)
      check_reachable(workdir)
      check_processes_agree(run_config, resume_step, workdir)
      is_chief = jax.process_index() == 0
      # Held before the run's files are read or written (config.json, the
      # tokenizer, a tracker's run id): a run started beside it is refused, not
      # checked against a directory this one is still filling. Only process 0
      # locks: the others write nothing that must be exclusive.
      with holding(workdir, lock=is_chief, undone_by=(StoppedBeforeTraining,)):
        try:
          if is_chief:
            check_trackers(run_config.train.trackers, workdir)
        except ValueError as error:
          raise ConfigError(str(error)) from error
        try:
          # The run's config.json (or, lost, its record's), read once: everything below
          # that compares with it (the changes line, the optimizer state's check) runs
          # before write_config.
          asked = run_config
          run_config, saved = prepare_resume(run_config, workdir, resume_step)
        except ValueError as error:
          raise ConfigError(str(error)) from error
        built_here = setup is None
        if setup is None:
          setup = setup_run(run_config, workdir)
        check_memory(setup, _samples(setup))
        if _samples(setup):
          check_sample_prompt(setup)
        check_outputs(workdir)
        checkpointer = make_checkpointer(setup.run.train, workdir)
        guarding = PreemptionGuard() if preemption is None else contextlib.nullcontext(preemption)
        with guarding as guard, _closing(checkpointer), contextlib.ExitStack() as inside:
          setup, run_config, start, state = _restored(
            setup,
            checkpointer,
            saved,
            workdir,
            guard,
            log,
            resume_step,
            asked=asked,
            prepared=run_config,
            built_here=built_here,
          )
          inside.enter_context(setup.activation_sharding())
          # A resume that changes settings says which, before training or the
          # evaluation they shape (config.json, which they are read from, is written below).
          for line in _resume_lines(setup, run_config, saved, workdir, start, resume_step):
            log(line)
          if start == 0 and setup.started_from:
            log(f"initialised from {setup.started_from}")
          for note in setup.run.notes:
            log(note)
          held = setup.eval_data.num_batches
          if held is not None and held < setup.run.eval.num_batches:
            # The evaluator stops at the split's end: its metrics are of fewer batches.
            log(
              f"eval.num_batches={setup.run.eval.num_batches}: the validation split holds "
              f"{held} batches of {setup.run.data.batch_size}; each evaluation reads those"
            )
          first_params = setup.replica_params(state.params, 0)
          log(
            f"data: {setup.train_data.description}\n"
            f"{summarize(first_params, setup.run.model, setup.run.data.seq_len)}"
            + "".join(f"\n{line}" for line in [replicas.describe(setup.run.seeds)] if line)
          )
          steps = setup.run.train.steps
          # Trained to its steps or past them (train.steps lowered): it only evaluates.
          if start >= steps and end_written(steps, workdir, start):
            log(f"already trained to step {start} of {steps}")
            result = setup.evaluate(state.params)
            data = setup.run.data
            why = "the run is finished" if start == steps else f"train.steps={steps} is past"
            log(
              _eval_line(
                start,
                result,
                f" (data.seq_len={data.seq_len}, data.batch_size="
                f"{data.batch_size}; not written: {why})",
              )
            )
            return result
          guard.defer()  # from here on the run writes, and saves before it stops
          trackers = make_trackers(setup.run.train.trackers, workdir) if is_chief else ()
          # A finished run whose end's writes were lost evaluates its last
          # step again, as does one whose evaluation at the step it resumes
          # from was lost (a kill as it was written): that evaluation's
          # records are replaced, not duplicated.
          completing = start >= steps
          # Due at `start` as the run trained to it: a resume's new eval.every says nothing of it.
          trained = setup.run if saved is None else trained_to(workdir, start, saved)
          evaluating_again = completing or _evaluation_lost(trained.eval.every, workdir, start)
          with MetricsWriter(
            workdir,
            enabled=is_chief,
            start_step=start,
            trackers=trackers,
            evaluating_again=evaluating_again,
          ) as writer:
            for name, count in writer.dropped.items():
              what = (
                f"of the evaluation at step {start} (evaluated again)"
                if evaluating_again
                else f"logged after step {start} (the step training continues from)"
              )
              records = "record" if count == 1 else "records"
              log(f"moved {count} {records} of {name} {what} to its .dropped file")
            write_config(setup.run, workdir)
            if is_chief:
              keep_hf_tokenizer(setup.run.data, setup.train_data.tokenizer, workdir)
            record = RunRecord(workdir, enabled=is_chief, log=log)
            try:
              record.start(setup.run, start, config_file)
              for tracker in trackers:
                tracker.log_config(to_json(setup.run))
              if evaluating_again:
                log(
                  f"trained to step {start}: completing its final evaluation"
                  if completing
                  else f"the evaluation at step {start} was lost: evaluating it again"
                )
                result, done = _eval_and_sample(setup, state.params, start, writer, log), start
              if not completing:
                result, done = _train(
                  setup, state, start, checkpointer, guard, writer, log, prefetch, record
                )
              if done >= steps:
                writer.write_hparams(done, _hparams(setup, hparams), result)
              # The last save is the run's too: one that fails ends the record
              # with its error, not "finished" (_closing then has none to wait for).
              checkpointer.wait_until_finished()
            except BaseException as error:
              # A second Ctrl-C, while the first's save is under way, is Ctrl-C too.
              ended = (
                "interrupted" if isinstance(error, KeyboardInterrupt) else type(error).__name__
              )
              with contextlib.suppress(Exception):  # the error that stopped the run is the one
                record.end(ended)
              raise
            finally:
              setup.train_data.close()  # stops the loader's worker processes
            record.end("finished" if done >= steps else guard.reason, done)
            return result
  except StoppedBeforeTraining as stopped:
    log(f"{stopped} while the run set up: nothing trained or saved; rerun the same command")
  return {}


@contextlib.contextmanager
def _stopping_at_once(preemption: PreemptionGuard | None):
  """While the run sets up, `preemption` (where given) stops it at once
  (PreemptionGuard.stop_at_once, until the loop's `guard.defer()` before its
  first write): StoppedBeforeTraining, raised on entering where a signal came
  before (so the body never starts) or where the body is when one comes."""
  try:
    if preemption is not None:
      preemption.stop_at_once()
    yield
  finally:
    if preemption is not None:
      preemption.defer()


def _hparams(setup: RunSetup, extra: Mapping[str, Any] | None) -> dict[str, Any]:
  """The hyperparameters TensorBoard compares runs by: every field of the
  run's model, data, train and eval sections (dotted names, derived ones
  filled in), seed and replicas, and `extra` (e.g. a sweep's)."""
  config = to_json(setup.run)
  values: dict[str, Any] = dict(seed=config["seed"], replicas=config["replicas"])
  for section in ("model", "data", "train", "eval"):
    values.update({f"{section}.{name}": value for name, value in config[section].items()})
  values.update(extra or {})
  return values


def _evaluation_lost(every: int, workdir: epath.Path, step: int) -> bool:
  """Whether the evaluation due at `step` (a multiple of eval.every), the
  step a run trains on from, has no readable row: it was cut off, or never
  written, by a kill between the step's save and its row."""
  return step > 0 and step % every == 0 and not evaluated(workdir, step)


def _resume_lines(
  setup: RunSetup,
  run_config: RunConfig,
  saved: RunConfig | None,
  workdir: epath.Path,
  start: int,
  resume_step: int | None,
) -> list[str]:
  """What a resume from `start` changes: the fields changed from config.json
  (`saved`) with the learning rate's move, and under --resume_step what the
  steps it trains again were first trained with (run_record.json's)."""
  lines = []
  changes = _changes_line(run_config, saved) if start else None
  if changes:
    lines.append(changes + _learning_rate_change(setup, saved, start))
  retrained = changes_since_step(run_config, workdir, start) if resume_step is not None else []
  if retrained:
    lines.append(
      f"resume_step: steps {start + 1} on were first trained with "
      + ", ".join(f"{name} {old!r}" for name, old, _ in retrained)
      + "; they are trained again with "
      + ", ".join(f"{name} {new!r}" for name, _, new in retrained)
    )
  return lines


def _changes_line(run_config: RunConfig, saved: RunConfig | None) -> str | None:
  """One line naming every field `run_config` changes from the run's
  config.json as read (`old -> new`), or None when it changes none."""
  changes = config_changes(run_config, saved)
  if not changes:
    return None
  return f"changed from the run's {CONFIG_FILE}: " + ", ".join(
    f"{name} {old!r} -> {new!r}" for name, old, new in changes
  )


def _learning_rate_change(setup: RunSetup, saved: RunConfig | None, start: int) -> str:
  """'; learning rate at step N: old -> new' where the changed schedule moves
  the next update's learning rate from the run's config.json's (`saved`), else ''.
  N = start + 1: the step that update makes, under which metrics.jsonl logs
  its rate (schedule(N - 1))."""
  if saved is None:
    return ""
  old, new = float(saved.schedule(start)), float(setup.run.schedule(start))
  if start >= setup.run.train.steps or np.isclose(old, new, rtol=1e-6, atol=0):
    return ""
  return f"; learning rate at step {start + 1}: {old:.3e} -> {new:.3e}"


def _restored(
  setup: RunSetup,
  checkpointer: Checkpointer,
  saved: RunConfig | None,
  workdir: epath.Path,
  guard: PreemptionGuard,
  log,
  resume_step: int | None,
  *,
  asked: RunConfig,
  prepared: RunConfig,
  built_here: bool,
) -> tuple[RunSetup, RunConfig, int, Any]:
  """(setup, the run config it trains, start step, state): `_restore` onto
  `setup`, built for `prepared`, which prepare_resume made of `asked` for the
  newest checkpoint (`keep_run_warmup`). Where that did not restore (moved
  aside) and the earlier step restored is inside the warmup kept for it,
  the setup is built again with the config's warmup, as --resume_step at
  that step sets it up, and the step restored onto that. A `setup` not
  `built_here` (the caller's) is refused then (ConfigError): a run again
  resumes from that step."""
  newest = checkpointer.latest_step()
  with setup.activation_sharding():
    start, state = _restore(setup, checkpointer, saved, workdir, guard, log, resume_step)
  if saved is None or not start or start == newest or resume_step is not None:
    return setup, prepared, start, state
  resumed = keep_run_warmup(asked, trained_to(workdir, start, saved), start)
  if resumed.train == prepared.train:
    return setup, prepared, start, state
  if not built_here:
    raise ConfigError(
      f"checkpoint step {start} restored in place of a newer one that did not, inside the "
      "warmup kept for that one: run again to set up for it"
    )
  setup = setup_run(resumed, workdir)
  with setup.activation_sharding():  # said once, by the first restore
    start, state = _restore(setup, checkpointer, saved, workdir, guard, lambda _: None, start)
  return setup, resumed, start, state


def _restore(
  setup: RunSetup,
  checkpointer: Checkpointer,
  saved: RunConfig | None,
  workdir: epath.Path,
  guard: PreemptionGuard,
  log,
  resume_step: int | None,
):
  """(start step, state) from `resume_step`'s checkpoint (the later ones
  moved aside), or else the latest that restores, or a fresh state at step
  0; `saved` is the run's config.json. A run that trains on from the
  checkpoint continues its data position, checked before anything moves;
  `guard` defers a signal from the first move on."""
  if checkpointer.latest_step() is not None:
    try:
      check_optimizer_state(setup.run, saved, workdir, setup.abstract_state.params)
    except ValueError as error:
      raise ConfigError(str(error)) from error
  if resume_step is not None:
    start = resume_step
    state, extras = checkpointer.restore_step(start, setup.abstract_state)
  else:
    restored = checkpointer.restore(setup.abstract_state)
    if restored is None:
      _drop_derived(setup, workdir, 0, guard, log)
      return 0, setup.init()
    start, state, extras = restored
  if "data" not in extras:
    raise RestoreError(
      f"checkpoint step {start} in {checkpointer.directory} holds no data position "
      "(its extras lack 'data')"
    )
  # A finished run only evaluates, at any batch size: its position is not read.
  if start < setup.run.train.steps:
    _continue_data(setup, extras["data"], start, saved)
  moved = ""
  if resume_step is not None:
    guard.defer()  # the moves are the run's first writes
    dropped = checkpointer.drop_after(start)
    if dropped:
      moved = f"; the later steps moved to {', '.join(p.name for p in dropped)}"
  log(f"resumed from step {start} in {checkpointer.directory}{moved}")
  _drop_derived(setup, workdir, start, guard, log)
  return start, state


def _drop_derived(
  setup: RunSetup, workdir: epath.Path, start: int, guard: PreemptionGuard, log
) -> None:
  """Moves aside what other commands derived from the run's checkpoints
  after `start` (txf.rundir.derived: an extrapolation, an analysis), where
  the run trains those steps again: they would pass for the new weights'."""
  if start >= setup.run.train.steps or jax.process_index():
    return
  stale = derived_after(workdir, start)
  if stale:
    guard.defer()  # the moves are writes
    moved = move_aside(stale)
    log(
      f"moved {', '.join(p.name for p in stale)} to {', '.join(p.name for p in moved)} (of a "
      f"checkpoint after step {start}, whose step training writes again)"
    )


@contextlib.contextmanager
def _closing(checkpointer: Checkpointer):
  """Finishes pending saves and closes the checkpointer, also when training
  raises -- then a save's failure (a full disk fails both) does not replace
  the error that stopped the run."""
  try:
    yield
  except BaseException:
    with contextlib.suppress(CheckpointWriteError):
      checkpointer.wait_until_finished()
      checkpointer.close()
    raise
  checkpointer.wait_until_finished()
  checkpointer.close()
