"""Times the training step of a config: the jitted step `run` trains with
(txf.train.setup), on batches of the config's training data read before
timing, inside the activation-sharding context; no checkpoints or logging,
so it isolates the compiled step.

  python -m experiments.bench --config=configs/gpt2_small.py --steps=400 --window=50

Prints, per window of steps, the step time, tokens/s and MFU (6N + attention
FLOPs per token over the device's peak, where the peak is known);
--json=PATH also writes these figures as JSON.

--data times the config's training data loader instead, on the host alone:
--steps batches, in tokens/s (txf.data.throughput).

--fresh_batches sends a new host batch to the devices every step (as training
does) instead of reusing one; --sync=false dispatches steps asynchronously
and times whole windows (as the training loop runs) instead of timing each
step to completion and taking the median.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time

import jax
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from txf.data.throughput import format_throughput, loader_throughput
from txf.train import hardware
from txf.train.setup import RunSetup, setup_run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 200, "Timed steps.")
_WINDOW = flags.DEFINE_integer("window", 50, "Steps per reported window.")
_FRESH = flags.DEFINE_bool("fresh_batches", False, "A new host batch every step.")
_SYNC = flags.DEFINE_bool("sync", True, "Wait for every step (median) or only per window.")
_JSON = flags.DEFINE_string("json", None, "Also write the figures to this JSON file.")
_DATA = flags.DEFINE_bool("data", False, "Time the training data loader (tokens/s on this "
                          "host, no device) instead of the step.")
flags.mark_flag_as_required("config")
flags.register_validator("window", lambda window: window >= 1, "--window must be >= 1")
flags.register_multi_flags_validator(
    ["steps", "window"], lambda values: values["steps"] >= values["window"],
    "--steps must be at least --window (a window of steps is timed as one figure)")

# Host batches cycled through with --fresh_batches.
_FRESH_BATCHES = 8


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
  count = _FRESH_BATCHES if fresh_batches else 1
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


def data_main() -> None:
  """--data: the loader's tokens/s (a sentencepiece tokenizer is trained in a
  temporary directory)."""
  with tempfile.TemporaryDirectory() as workdir:
    figures = loader_throughput(_CONFIG.value.data, batches=_STEPS.value,
                                seed=_CONFIG.value.seed, workdir=workdir)
  print(format_throughput(figures))
  if _JSON.value:
    epath.Path(_JSON.value).write_text(json.dumps(figures, indent=2) + "\n")


def main(argv) -> None:
  del argv
  if _DATA.value:
    return data_main()
  setup = setup_run(_CONFIG.value)
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"{setup.tokens_per_step} tokens/step, {setup.flops_per_token:.3g} FLOPs/token")
  with setup.activation_sharding():
    windows = benchmark(setup, steps=_STEPS.value, window=_WINDOW.value,
                        fresh_batches=_FRESH.value, sync=_SYNC.value)
  if _JSON.value:
    report = dict(config=flags.FLAGS["config"].config_filename,
                  device_kind=jax.devices()[0].device_kind, device_count=jax.device_count(),
                  tokens_per_step=setup.tokens_per_step,
                  flops_per_token=setup.flops_per_token, peak_flops=setup.peak_flops,
                  steps=_STEPS.value, window=_WINDOW.value, fresh_batches=_FRESH.value,
                  sync=_SYNC.value, windows=windows,
                  median_step_time=statistics.median(w["step_time"] for w in windows))
    epath.Path(_JSON.value).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
  app.run(main)
