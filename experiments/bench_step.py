"""The bare training step, timed (`experiments.bench`'s step mode, and the
reference the loop is measured against in `--loop`)."""

from __future__ import annotations

import itertools
import statistics
import time

import jax

from txf.train import hardware
from txf.train.setup import RunSetup

# Host batches cycled through with --fresh_batches.
FRESH_BATCHES = 8


def window_figures(setup: RunSetup, first: int, last: int, step_time: float, loss) -> dict:
  """The figures of steps first..last (1-based) at `step_time` seconds a step."""
  tokens_per_sec = setup.tokens_per_step / step_time
  return dict(first_step=first, last_step=last, step_time=step_time,
              tokens_per_sec=tokens_per_sec, loss=float(loss),
              mfu=hardware.mfu(setup.flops_per_token, tokens_per_sec, jax.device_count(),
                               setup.peak_flops))


def format_window(figures: dict) -> str:
  mfu = figures["mfu"]
  mfu_text = f", MFU {100 * mfu:.1f}%" if mfu is not None else ""
  return (f"steps {figures['first_step']}-{figures['last_step']}: "
          f"{1e3 * figures['step_time']:.1f} ms/step, {figures['tokens_per_sec']:,.0f} tokens/s"
          f"{mfu_text}, loss {figures['loss']:.3f}")


def benchmark(setup: RunSetup, *, steps: int, window: int, fresh_batches: bool,
              sync: bool) -> list[dict]:
  """Runs `steps` training steps after a compiling one; the figures of each
  full window of `window` steps (printed as they come)."""
  count = FRESH_BATCHES if fresh_batches else 1
  host_batches = list(itertools.islice(setup.train_data, count))
  device_batch = setup.to_device(host_batches[0])
  state = setup.init()
  state, metrics = setup.train_step(state, device_batch)  # compile
  jax.block_until_ready(metrics)
  windows, times, window_start = [], [], time.perf_counter()
  for i in range(steps):
    start = time.perf_counter()
    if fresh_batches:
      device_batch = setup.to_device(host_batches[i % count])
    state, metrics = setup.train_step(state, device_batch)
    if sync:
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - start)
    if (i + 1) % window == 0:
      if sync:
        step_time = statistics.median(times[-window:])
      else:
        jax.block_until_ready(metrics)
        step_time = (time.perf_counter() - window_start) / window
        window_start = time.perf_counter()
      windows.append(window_figures(setup, i + 2 - window, i + 1, step_time, metrics["loss"]))
      print(format_window(windows[-1]))
  return windows


def peak_memory_bytes() -> int | None:
  """The first device's peak allocation so far (None where not reported, e.g. CPU)."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else stats.get("peak_bytes_in_use")


def compiled_memory(setup: RunSetup) -> dict[str, int] | None:
  """XLA's memory analysis of the compiled train step (bytes of arguments,
  outputs, aliased donations and temporaries; None where the backend gives
  none). Lowered on the setup's abstract state and batch: after the step has
  run this reuses its compilation."""
  batch = setup.to_device(next(iter(setup.eval_data)))
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                       batch)
  with setup.activation_sharding():
    analysis = setup.train_step.lower(setup.abstract_state, batch).compile().memory_analysis()
  if analysis is None:
    return None
  return {name: int(getattr(analysis, f"{name}_size_in_bytes"))
          for name in ("argument", "output", "alias", "temp", "generated_code")}
