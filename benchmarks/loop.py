"""The real training loop against its bare step (`python -m benchmarks.run loop`).

One process, one RunSetup (so the step compiles once): first the bare step
(benchmarks.step's benchmark, a fresh host batch every step, windows timed
asynchronously, as the loop dispatches), then txf.train.loop.run in a fresh
temporary work directory once per variant, each with one piece of what the
loop adds to the step switched off or swapped:

  full           the run as configured (eval, samples, checkpoints at their
                 config intervals inside the timed steps)
  checkpoint_only checkpoints at the config's interval, evals and samples
                 only after the last timed step: the checkpoint's own cost
  no_eval        evals, samples and checkpoints only after the last timed step
  random_ids     no_eval on uniform random token ids instead of text batches
  no_prefetch    no_eval with each batch read and sent in the loop's thread
  log_every_step no_eval with metrics fetched (a device sync) every step
  host_only      no_eval with the step replaced by a no-op of its signature:
                 how fast the loop's own host work could drive the device

Every run trains --steps steps and logs every --window. Per run it reports
the loop's own windows (tokens/s between logs, evals excluded), the
amortised tokens/s from the first log to the last (evals and checkpoints
between them included) and its ratio to the bare step, and the Python
garbage collector's pauses. The issue's target: amortised >= 0.95 x step,
flat from step 50. A jax.profiler trace of a few steps of `full` is written
with --profile_dir (open it with TensorBoard or Perfetto).
"""

from __future__ import annotations

import dataclasses
import gc
import re
import statistics
import tempfile
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.step import benchmark, define_steps_and_window
from txf.aot.compile import abstract_batch
from txf.runconfig.run_config import parse
from txf.rundir.metrics import read_metrics
from txf.train import loop, sharding
from txf.train.run_setup import RunSetup, setup_run

FLAGS = flags.FLAGS

VARIANTS = (
  "full",
  "checkpoint_only",
  "no_eval",
  "random_ids",
  "no_prefetch",
  "log_every_step",
  "host_only",
)
# The cadence's progress lines ('step 2/4 (50.0%) | ...'), not the first
# step's 'step 1/4: compiling ...' / ': compiled and ran in ...' lines.
PROGRESS = re.compile(r"^step (\d+)/\d+ \(")


class RandomIds:
  """A training dataset's interface over uniform random ids in [1, vocab):
  batches of the same shapes and weights, free of the text's statistics."""

  def __init__(self, dataset, vocab_size: int, seed: int = 0):
    self._dataset, self._vocab_size = dataset, vocab_size
    self._rng = np.random.default_rng(seed)

  def __getattr__(self, name):
    return getattr(self._dataset, name)  # tokenizer, get_state, set_state, ...

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    batch = dict(next(self._dataset))
    for key in ("inputs", "targets"):
      batch[key] = self._rng.integers(1, self._vocab_size, batch[key].shape, dtype=np.int32)
    return batch


def null_step(setup: RunSetup):
  """A jitted step with the train step's signature and outputs that only
  counts the step: the loop around it runs at its host-side ceiling."""
  batch_shapes = abstract_batch(setup)
  with setup.activation_sharding():
    metrics = jax.eval_shape(setup.train_step, setup.abstract_state, batch_shapes)[1]

  def step(state, batch):
    del batch
    return (
      state.replace(step=state.step + 1),
      jax.tree.map(lambda m: jnp.ones(m.shape, m.dtype), metrics),
    )

  return jax.jit(
    step, donate_argnums=0, out_shardings=(setup.state_sharding, sharding.replicated(setup.mesh))
  )


def traced(train_step, directory: str, first: int, last: int):
  """`train_step` writing a jax.profiler trace of its calls first..last."""
  calls = iter(range(1, 1 << 62))

  def step(state, batch):
    call = next(calls)
    if call == first:
      jax.profiler.start_trace(directory)
    out = train_step(state, batch)
    if call == last:
      jax.block_until_ready(out)
      jax.profiler.stop_trace()
    return out

  return step


class GcPauses:
  """Counts the collector's pauses while entered (Python's threads stop then),
  in all and of full (generation 2) collections, whose cost grows with the
  number of live objects."""

  def __enter__(self):
    self.count, self.seconds, self.longest, self._start = 0, 0.0, 0.0, None
    self.full_count, self.full_seconds = 0, 0.0
    gc.callbacks.append(self._callback)
    return self

  def _callback(self, phase, info):
    if phase == "start":
      self._start = time.perf_counter()
    elif self._start is not None:
      pause = time.perf_counter() - self._start
      self.count, self.seconds = self.count + 1, self.seconds + pause
      self.longest = max(self.longest, pause)
      if info["generation"] == 2:
        self.full_count, self.full_seconds = self.full_count + 1, self.full_seconds + pause

  def __exit__(self, *exc_info):
    gc.callbacks.remove(self._callback)


def variant_setup(setup: RunSetup, variant: str, profile) -> tuple[RunSetup, int]:
  """The setup `variant` trains with and its prefetch depth."""
  train, eval_config = setup.run.train, setup.run.eval
  # The last step always evaluates and saves, after its log.
  if variant != "full":
    eval_config = dataclasses.replace(eval_config, every=train.steps)
  if variant not in ("full", "checkpoint_only"):
    train = dataclasses.replace(train, checkpoint_every=train.steps)
  if variant == "log_every_step":
    train = dataclasses.replace(train, log_every=1)
  run = dataclasses.replace(setup.run, train=train, eval=eval_config)
  changes: dict[str, Any] = dict(run=run)
  if variant == "random_ids":
    changes["train_data"] = RandomIds(setup.train_data, setup.run.model.vocab_size)
  if variant == "host_only":
    changes["train_step"] = null_step(setup)
  if variant == "full" and profile is not None:
    directory, first, last = profile
    changes["train_step"] = traced(setup.train_step, directory, first, last)
  return dataclasses.replace(setup, **changes), 0 if variant == "no_prefetch" else 2


def time_loop(setup: RunSetup, variant: str, step_tokens_per_sec: float, profile=None) -> dict:
  """Trains `variant` of the setup's run once; its figures."""
  run_setup, prefetch = variant_setup(setup, variant, profile)
  progress = []  # (seconds, step) at each progress line

  def log(line: str) -> None:
    if match := PROGRESS.match(line):
      progress.append((time.perf_counter(), int(match.group(1))))

  with tempfile.TemporaryDirectory() as workdir, GcPauses() as pauses:
    start = time.perf_counter()
    loop.run(run_setup.run, workdir, log=log, setup=run_setup, prefetch=prefetch)
    wall = time.perf_counter() - start
    rows = read_metrics(workdir)
  windows = [
    dict(
      last_step=row["step"],
      tokens_per_sec=row["tokens_per_sec"],
      loss=row["loss"],
      mfu=row.get("mfu"),
    )
    for row in rows
    if "tokens_per_sec" in row
  ]
  (t_first, first), (t_last, last) = progress[0], progress[-1]
  amortised = setup.tokens_per_step * (last - first) / (t_last - t_first)
  figures = dict(
    variant=variant,
    windows=windows,
    first_step=first,
    last_step=last,
    amortised_tokens_per_sec=amortised,
    ratio_to_step=amortised / step_tokens_per_sec,
    window_tokens_per_sec_min=min(w["tokens_per_sec"] for w in windows),
    window_tokens_per_sec_last=windows[-1]["tokens_per_sec"],
    wall_seconds=wall,
    gc_pauses=pauses.count,
    gc_seconds=pauses.seconds,
    gc_longest=pauses.longest,
    gc_full_collections=pauses.full_count,
    gc_full_seconds=pauses.full_seconds,
  )
  print(
    f"{variant:15s} steps {first}-{last}: {amortised:12,.0f} tokens/s amortised "
    f"({figures['ratio_to_step']:.3f} x step); windows min "
    f"{figures['window_tokens_per_sec_min']:,.0f}, last "
    f"{figures['window_tokens_per_sec_last']:,.0f}; gc {pauses.count} pauses, "
    f"{pauses.seconds:.2f} s, longest {1e3 * pauses.longest:.0f} ms, "
    f"{pauses.full_count} full ({pauses.full_seconds:.2f} s)"
  )
  return figures


def compare(config, *, steps: int, window: int, variants, profile=None) -> dict:
  """The bare step's figures, then each variant's run (module docstring)."""
  config = config.copy_and_resolve_references()
  config.train.steps, config.train.log_every = steps, window
  # A shorter run than configured: warmup must still fit (a schedule change
  # that does not change the speed of a step).
  config.train.warmup_steps = min(config.train.warmup_steps, steps)
  setup = setup_run(parse(config))
  print(f"{setup.tokens_per_step} tokens/step; bare step:")
  with setup.activation_sharding():
    step_windows, _, _ = benchmark(
      setup, steps=steps, window=window, fresh_batches=True, sync=False
    )
  step_tokens_per_sec = setup.tokens_per_step / statistics.median(
    w["step_time"] for w in step_windows
  )
  print(f"{'bare step':15s} {step_tokens_per_sec:,.0f} tokens/s (median window)")
  runs = [time_loop(setup, variant, step_tokens_per_sec, profile) for variant in variants]
  return dict(
    tokens_per_step=setup.tokens_per_step,
    flops_per_token=setup.flops_per_token,
    peak_flops=setup.peak_flops,
    steps=steps,
    window=window,
    step=dict(windows=step_windows, tokens_per_sec=step_tokens_per_sec),
    loop=runs,
  )


def profile_range(texts: list[str]) -> tuple[int, int] | None:
  """--profile_steps as (first, last) steps of a trace; None unless two whole
  numbers with 1 <= first <= last."""
  try:
    first, last = (int(text) for text in texts)
  except ValueError:  # not numbers, or not two of them
    return None
  return (first, last) if 1 <= first <= last else None


def profile_fits(values: dict) -> bool:
  """Whether --profile_dir's trace ends within the runs' --steps (else it
  would never be written); a malformed --profile_steps is its own check's."""
  steps = profile_range(values["profile_steps"])
  return values["profile_dir"] is None or steps is None or steps[1] <= values["steps"]


def define_flags() -> None:
  define_steps_and_window("train.steps of each run.", "log_every of each run.")
  flags.register_multi_flags_validator(
    ["steps", "window"],
    lambda values: values["steps"] > values["window"],
    "--steps must exceed --window (the amortised figure runs from a run's first log to its "
    "last, so it needs two)",
  )
  flags.DEFINE_list("loop_variants", list(VARIANTS), f"Runs, from {', '.join(VARIANTS)}.")
  flags.register_validator(
    "loop_variants",
    lambda names: set(names) <= set(VARIANTS),
    f"--loop_variants must come from {', '.join(VARIANTS)}",
  )
  flags.DEFINE_string(
    "profile_dir", None, "Write a jax.profiler trace of --profile_steps of the 'full' run here."
  )
  flags.DEFINE_list("profile_steps", ["300", "305"], "First and last step of the trace.")
  flags.register_validator(
    "profile_steps",
    lambda texts: profile_range(texts) is not None,
    "--profile_steps must be FIRST,LAST: two step numbers, 1 <= FIRST <= LAST",
  )
  flags.register_multi_flags_validator(
    ["profile_dir", "profile_steps", "steps"],
    profile_fits,
    "--profile_steps must end at or before --steps (a trace past the last step is never written)",
  )
  flags.register_multi_flags_validator(
    ["profile_dir", "loop_variants"],
    lambda values: values["profile_dir"] is None or "full" in values["loop_variants"],
    "--profile_dir traces the 'full' run: --loop_variants must include full",
  )


def main() -> dict:
  profile = (FLAGS.profile_dir, *profile_range(FLAGS.profile_steps)) if FLAGS.profile_dir else None
  return compare(
    FLAGS.config,
    steps=FLAGS.steps,
    window=FLAGS.window,
    variants=FLAGS.loop_variants,
    profile=profile,
  )
