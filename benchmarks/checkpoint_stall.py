"""A step dispatched while txf's Checkpointer saves, against the same step
without a save, in one run (`python -m benchmarks.run checkpoint_stall`).

  python -m benchmarks.run checkpoint_stall                  # 1.49 GB in 64 arrays
  python -m benchmarks.run checkpoint_stall --leaves=591     # gpt2_small's 591 arrays

The state is --state_mb of float32 arrays in --leaves leaves (gpt2_small's
float32 train state, its parameters and AdamW's two moments, is 1.49 GB in
591) and a step counter. The step is jitted and donates the state, as the
train step does, and only counts (as benchmarks.loop's no-op step: the
arrays pass through in place), so what is timed is the dispatch and what
holds it up. One step is due every --interval_ms (a loop ahead of its
accelerator waits between dispatches; here it sleeps), and each dispatch is
timed from when it was due (or from the previous one's return, if that was
later) to its return: a wait for the interpreter lock on waking counts.

Each of --saves rounds times the dispatches from a save's start
(Checkpointer.save of the state, as the loop calls it after a step) until
its files are written and committed, then as many dispatches without a
save. `check_for_errors` is called every --log_every dispatches, as the loop
does at its log steps, and timed with them.

Reported for both: the dispatch time's median, p90, p99 and max (ms), and
the time the loop's thread was blocked in all (dispatches, error checks,
and with a save the save call); per save, the save call's time, how long the
save took until written and the longest block; the garbage collector's
pauses in each. The issue's target (issue 57): dispatch p99 during a save
<= 2 ms on this benchmark, and no block of the save's length.
"""

from __future__ import annotations

import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.loop import GcPauses
from txf.rundir.checkpoint import Checkpointer

FLAGS = flags.FLAGS


def make_state(state_mb: float, leaves: int, seed: int = 0) -> dict:
  """About `state_mb` MB of float32 arrays in `leaves` equal leaves and a
  step counter. The values are random normal, as trained weights are near
  enough for the save's compression (zstd, which a constant array would
  make nearly free)."""
  size = max(1, int(state_mb * 1e6 / 4 / leaves))
  rng = np.random.default_rng(seed)
  arrays = [jnp.asarray(rng.standard_normal(size, dtype=np.float32)) for _ in range(leaves)]
  return jax.block_until_ready({"arrays": arrays, "step": jnp.zeros((), jnp.int32)})


def _count(state: dict) -> dict:
  return {"arrays": state["arrays"], "step": state["step"] + 1}


# The arrays pass through donated, as the train step's state does.
step_fn = jax.jit(_count, donate_argnums=0)


def distribution(samples_ms: list[float]) -> dict:
  """Median, p90, p99, max and sum of `samples_ms`, and their count."""
  samples = np.asarray(samples_ms, dtype=np.float64)
  return dict(
    dispatches=len(samples),
    median_ms=float(np.median(samples)),
    p90_ms=float(np.percentile(samples, 90)),
    p99_ms=float(np.percentile(samples, 99)),
    max_ms=float(samples.max()),
    dispatch_ms=float(samples.sum()),
  )


class Dispatcher:
  """Dispatches the step on a schedule, one every `interval` seconds, timing
  each dispatch and the checkpointer's error checks (every `log_every`)."""

  def __init__(self, state: dict, checkpointer: Checkpointer, interval: float, log_every: int):
    self.state, self.checkpointer = state, checkpointer
    self.interval, self.log_every = interval, log_every
    self.done = 0  # steps dispatched
    self._last_return = time.perf_counter()

  def dispatch(self) -> tuple[float, float]:
    """One step when due; (its dispatch time, the error check's time) in ms."""
    due = max(self._last_return + self.interval, time.perf_counter())
    pause = due - time.perf_counter()
    if pause > 0:
      time.sleep(pause)
    self.state = step_fn(self.state)
    returned = time.perf_counter()
    self.done += 1
    check = 0.0
    if self.done % self.log_every == 0:
      self.checkpointer.check_for_errors()
      check = time.perf_counter() - returned
    self._last_return = time.perf_counter()
    return 1e3 * (returned - due), 1e3 * check


def save_round(dispatcher: Dispatcher) -> tuple[dict, list[float], list[float]]:
  """A save and the dispatches until it is written, then as many without one:
  (the save's figures, its dispatch times, the quiet ones) in ms."""
  checkpointer = dispatcher.checkpointer
  start = time.perf_counter()
  checkpointer.save(dispatcher.done, dispatcher.state, {"data": {"position": dispatcher.done}})
  save_call = 1e3 * (time.perf_counter() - start)
  saving, checks = [], 0.0
  with GcPauses() as pauses:
    while True:  # at least one dispatch, however fast the save
      dispatch, check = dispatcher.dispatch()
      saving.append(dispatch)
      checks += check
      if not checkpointer.saving:
        break
  written = time.perf_counter() - start
  checkpointer.check_for_errors()  # the save's own error, if any, is raised here
  quiet, quiet_checks = [], 0.0
  with GcPauses() as quiet_pauses:
    for _ in saving:
      dispatch, check = dispatcher.dispatch()
      quiet.append(dispatch)
      quiet_checks += check
  figures = dict(
    step=dispatcher.done - len(saving) - len(quiet),
    save_call_ms=save_call,
    save_seconds=written,
    dispatches=len(saving),
    longest_block_ms=max([save_call, *saving]),
    check_ms=checks,
    quiet_check_ms=quiet_checks,
    gc=_gc(pauses),
    quiet_gc=_gc(quiet_pauses),
  )
  return figures, saving, quiet


def _gc(pauses: GcPauses) -> dict:
  return dict(
    pauses=pauses.count,
    seconds=pauses.seconds,
    longest_ms=1e3 * pauses.longest,
    full=pauses.full_count,
    full_seconds=pauses.full_seconds,
  )


def measure(
  *, state_mb: float, leaves: int, interval_ms: float, saves: int, log_every: int, warmup: int = 50
) -> dict:
  """The figures of `saves` rounds (module docstring)."""
  state = make_state(state_mb, leaves)
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  print(f"state {state_bytes / 1e6:,.0f} MB in {leaves} arrays; a step due every {interval_ms} ms")
  rounds, saving, quiet = [], [], []
  with tempfile.TemporaryDirectory() as directory, Checkpointer(directory, max_to_keep=2) as ckpt:
    dispatcher = Dispatcher(state, ckpt, interval_ms / 1e3, log_every)
    for _ in range(warmup):  # compiles, and fills the jit's fast path
      dispatcher.dispatch()
    for _ in range(saves):
      figures, during, without = save_round(dispatcher)
      rounds.append(figures)
      saving += during
      quiet += without
      print(
        f"save at step {figures['step']}: call {figures['save_call_ms']:.0f} ms, written after "
        f"{figures['save_seconds']:.2f} s, {figures['dispatches']} dispatches meanwhile, "
        f"longest block {figures['longest_block_ms']:.1f} ms"
      )
    jax.block_until_ready(dispatcher.state)
  with_save = distribution(saving)
  with_save["blocked_ms"] = with_save["dispatch_ms"] + sum(
    r["save_call_ms"] + r["check_ms"] for r in rounds
  )
  without_save = distribution(quiet)
  without_save["blocked_ms"] = without_save["dispatch_ms"] + sum(
    r["quiet_check_ms"] for r in rounds
  )
  for name, figures in (("without a save", without_save), ("during a save", with_save)):
    print(
      f"{name:15s} {figures['dispatches']:5d} dispatches: median {figures['median_ms']:.3f} ms, "
      f"p90 {figures['p90_ms']:.3f}, p99 {figures['p99_ms']:.3f}, max {figures['max_ms']:.1f}; "
      f"blocked {figures['blocked_ms']:.0f} ms in all"
    )
  return dict(
    state_bytes=state_bytes,
    leaves=leaves,
    interval_ms=interval_ms,
    log_every=log_every,
    saves=rounds,
    without_save=without_save,
    during_save=with_save,
    samples_ms=dict(without_save=quiet, during_save=saving),
  )


def define_flags() -> None:
  flags.DEFINE_float(
    "state_mb", 1490.0, "MB of float32 arrays saved (gpt2_small's train state: 1,490)."
  )
  flags.DEFINE_integer("leaves", 64, "Arrays the state is split into (gpt2_small's: 591).")
  flags.DEFINE_float("interval_ms", 5.0, "A step is due every this many ms.")
  flags.DEFINE_integer("saves", 3, "Saves timed, each against as many dispatches without one.")
  flags.DEFINE_integer("log_every", 50, "check_for_errors every this many dispatches.")
  for name in ("state_mb", "interval_ms"):
    flags.register_validator(name, lambda value: value > 0, f"--{name} must be > 0")
  for name in ("leaves", "saves", "log_every"):
    flags.register_validator(name, lambda value: value >= 1, f"--{name} must be >= 1")


def main() -> dict:
  return measure(
    state_mb=FLAGS.state_mb,
    leaves=FLAGS.leaves,
    interval_ms=FLAGS.interval_ms,
    saves=FLAGS.saves,
    log_every=FLAGS.log_every,
  )
