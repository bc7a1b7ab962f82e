"""The bare training step, timed (`python -m benchmarks.run step`, and the
reference the loop is measured against in the loop mode).

The jitted training step on batches of the config's training data read
before timing, inside the activation-sharding context; no checkpoints or
logging, so it isolates the compiled step. Prints, per window of steps, the
step time, tokens/s and MFU (txf.analysis flops_per_token, 6N + 12LHQT, over
the device's peak, where the peak is known). --fresh_batches sends a new
host batch to the devices every step (as training does) instead of reusing
one; --sync=false dispatches steps asynchronously and times whole windows
(as the training loop runs) instead of timing each step to completion and
taking the median. Each window records its start and end (Unix time), so
clock and power samples taken beside it line up. --torch also times the
PyTorch GPT-2 recipe (benchmarks/references/torch_gpt2.py) on the same token
batches (the one txf reuses, or with --fresh_batches the 8 it cycles through;
the recipe holds them on the device, where txf sends each from the host)
for the same number of steps and windows, in a subprocess started
before JAX takes the device; the recipe runs on one GPU, so txf's step then
runs on one device too (the first), whatever the host has. --profile_steps
profiles that many further steps of each (jax.profiler, torch.profiler) and reports device time by
kernel category (benchmarks/kernels.py).
"""

from __future__ import annotations

import itertools
import pathlib
import shutil
import statistics
import tempfile
import time

import jax
import numpy as np
from absl import flags

from benchmarks import kernels
from benchmarks.decode import GPT2_SHAPE, is_gpt2
from benchmarks.references import run_reference
from txf import hardware
from txf.commands.cli import check_output_file, define_config_flag
from txf.data import make_dataset
from txf.progress import stage
from txf.runconfig.run_config import RunConfig, parse
from txf.storage import write_file
from txf.train.run_setup import RunSetup, fit_vocabulary, setup_run

FLAGS = flags.FLAGS

# Host batches cycled through with --fresh_batches.
FRESH_BATCHES = 8


def batch_count(fresh_batches: bool) -> int:
  """How many batches the timed steps cycle through (one reused without
  --fresh_batches), txf's and the PyTorch recipe's alike."""
  return FRESH_BATCHES if fresh_batches else 1


def window_figures(
  setup: RunSetup, first: int, last: int, step_time: float, loss, wall: tuple[float, float]
) -> dict:
  """The figures of steps first..last (1-based) at `step_time` seconds a
  step; `wall` is the window's (start, end) in Unix time."""
  tokens_per_sec = setup.tokens_per_step / step_time
  return dict(
    first_step=first,
    last_step=last,
    start_time=wall[0],
    end_time=wall[1],
    step_time=step_time,
    tokens_per_sec=tokens_per_sec,
    loss=float(loss),
    # The devices the step ran on (one under --torch, as the recipe), not the host's.
    mfu=hardware.mfu(setup.flops_per_token, tokens_per_sec, setup.mesh.size, setup.peak_flops),
  )


def format_window(figures: dict) -> str:
  mfu = figures["mfu"]
  mfu_text = f", MFU {100 * mfu:.1f}%" if mfu is not None else ""
  return (
    f"steps {figures['first_step']}-{figures['last_step']}: "
    f"{1e3 * figures['step_time']:.1f} ms/step, {figures['tokens_per_sec']:,.0f} tokens/s"
    f"{mfu_text}, loss {figures['loss']:.3f}"
  )


def benchmark(
  setup: RunSetup, *, steps: int, window: int, fresh_batches: bool, sync: bool
) -> list[dict]:
  """Runs `steps` training steps after a compiling one; the figures of each
  full window of `window` steps (printed as they come)."""
  count = batch_count(fresh_batches)
  host_batches = list(itertools.islice(setup.train_data, count))
  device_batch = setup.train_to_device(host_batches[0])
  with stage("benchmark: compile and run the first train step"):
    state = setup.init()
    state, metrics = setup.train_step(state, device_batch)
    jax.block_until_ready(metrics)
  windows, times, window_start, window_wall = [], [], time.perf_counter(), time.time()
  for i in range(steps):
    start = time.perf_counter()
    if fresh_batches:
      device_batch = setup.train_to_device(host_batches[i % count])
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
      wall = (window_wall, time.time())
      window_wall = wall[1]
      windows.append(window_figures(setup, i + 2 - window, i + 1, step_time, metrics["loss"], wall))
      print(format_window(windows[-1]))
  return windows, state, host_batches


def profile(setup: RunSetup, state, host_batches: list, steps: int, directory: str | None) -> dict:
  """`steps` more training steps from `state` (donated) under jax.profiler,
  in `directory` (kept) or a temporary one; their kernels by category
  (benchmarks/kernels.py)."""
  trace_dir = directory or tempfile.mkdtemp(prefix="txf_profile_")
  try:
    with jax.profiler.trace(trace_dir):
      for i in range(steps):
        batch = setup.train_to_device(host_batches[i % len(host_batches)])
        state, metrics = setup.train_step(state, batch)
      jax.block_until_ready(metrics)
    return kernels.trace_kernels(trace_dir, steps)
  finally:
    if directory is None:
      shutil.rmtree(trace_dir, ignore_errors=True)


def peak_memory_bytes() -> int | None:
  """The first device's peak allocation so far (None where not reported, e.g. CPU)."""
  stats = jax.local_devices()[0].memory_stats()
  return None if not stats else stats.get("peak_bytes_in_use")


def compiled_memory(
  setup: RunSetup, state=None, text_path: str | None = None
) -> dict[str, int] | None:
  """XLA's memory analysis of the compiled train step (bytes of arguments,
  outputs, aliased donations and temporaries; None where the backend gives
  none), and its HLO text written to `text_path` if given. Lowered on a
  training batch and `state` (default: the abstract state): lowered on the
  state the timed steps ran with, the persistent compilation cache (gpu.sh
  turns it on) answers with their executable instead of compiling again."""
  batch = setup.train_to_device(next(iter(setup.train_data)))
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), batch)
  with setup.activation_sharding():
    state = setup.abstract_state if state is None else state
    compiled = setup.train_step.lower(state, batch).compile()
  if text_path:
    write_file(text_path, compiled.as_text())
  analysis = compiled.memory_analysis()
  if analysis is None:
    return None
  return {
    name: int(getattr(analysis, f"{name}_size_in_bytes"))
    for name in ("argument", "output", "alias", "temp", "generated_code")
  }


def define_steps_and_window(steps_help: str, window_help: str) -> None:
  """--config, --steps and --window (a whole number of windows), of the step
  and loop modes."""
  define_config_flag("Config file.")
  flags.DEFINE_integer("steps", 200, steps_help)
  flags.DEFINE_integer("window", 50, window_help)
  flags.register_validator("window", lambda window: window >= 1, "--window must be >= 1")
  flags.register_multi_flags_validator(
    ["steps", "window"],
    lambda values: values["steps"] >= values["window"],
    "--steps must be at least --window (a window of steps is timed as one figure)",
  )


def define_flags() -> None:
  define_steps_and_window("Timed steps.", "Steps per reported window.")
  flags.DEFINE_bool("fresh_batches", False, "A new host batch every step.")
  flags.DEFINE_bool("sync", True, "Wait for every step (median) or only per window.")
  flags.DEFINE_bool(
    "compile_only",
    False,
    "Compile the step and report XLA's memory analysis of it, without running.",
  )
  flags.DEFINE_bool("torch", False, "Also time benchmarks/references/torch_gpt2.py.")
  flags.DEFINE_integer("torch_steps", None, "Timed steps of the PyTorch recipe (default --steps).")
  flags.DEFINE_integer(
    "profile_steps",
    0,
    "Profile this many steps after the timed ones (kernel time by category).",
    lower_bound=0,
  )
  flags.DEFINE_string("profile_dir", None, "Keep the jax.profiler trace here.")
  flags.DEFINE_string(
    "compiled_text", None, "Write the compiled train step's HLO text here (kernels, fusions)."
  )
  flags.DEFINE_bool("torch_compile", True, "torch.compile the PyTorch model.")


def torch_reference(
  run: RunConfig,
  *,
  steps: int,
  window: int,
  fresh_batches: bool,
  profile_steps: int,
  compile_model: bool,
) -> dict | None:
  """The PyTorch recipe at the run's model shape and batch, on the run's
  own training batches, as many as txf's step cycles through (None where it
  does not apply or torch is absent); run before JAX initialises its backend."""
  model = run.model
  if not is_gpt2(model):
    print("torch reference: skipped (it is GPT-2: " + GPT2_SHAPE + ")")
    return None
  data = make_dataset(run.data, "train", seed=run.data_seed)
  batches = [next(data) for _ in range(batch_count(fresh_batches))]
  windows_NxBxT1 = np.stack(
    [np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1) for b in batches]
  )
  with tempfile.TemporaryDirectory() as directory:
    tokens = pathlib.Path(directory) / "tokens.npy"
    np.save(tokens, windows_NxBxT1)
    return run_reference(
      "torch_gpt2.py",
      [
        f"--tokens={tokens}",
        f"--layers={model.num_layers}",
        f"--d_model={model.d_model}",
        f"--heads={model.num_heads}",
        f"--vocab={model.vocab_size}",
        f"--steps={steps}",
        f"--window={window}",
        f"--profile_steps={profile_steps}",
      ]
      + ([] if compile_model else ["--no_compile"]),
      needs="torch",
    )


def profile_or_error(summarize) -> dict:
  """summarize()'s profile summary, printed; a profiler that fails (no GPU
  plane, CUPTI refused) costs the profile, not the figures already taken."""
  try:
    summary = summarize()
  except Exception as error:  # noqa: BLE001 - any profiler failure is reported, not raised
    print(f"profile: failed: {type(error).__name__}: {error}")
    return {"error": f"{type(error).__name__}: {error}"}
  print(kernels.format_summary("profile", summary))
  return summary


def main() -> dict:
  # Before anything is measured: the text is written after the timed steps.
  check_output_file("compiled_text", FLAGS.compiled_text)
  # A config the step rejects fails before the PyTorch run, its vocabulary's checks too.
  run, _ = fit_vocabulary(parse(FLAGS.config), None)
  torch = (
    torch_reference(
      run,
      steps=FLAGS.torch_steps or FLAGS.steps,
      window=FLAGS.window,
      fresh_batches=FLAGS.fresh_batches,
      profile_steps=FLAGS.profile_steps,
      compile_model=FLAGS.torch_compile,
    )
    if FLAGS.torch
    else None
  )
  # The PyTorch recipe trains on one GPU: compared with it, txf's step does too.
  setup = setup_run(run, devices=jax.devices()[:1] if torch is not None else None)
  print(
    f"step on {setup.mesh.size} device(s), "
    f"{setup.tokens_per_step} tokens/step, {setup.flops_per_token:.3g} FLOPs/token"
  )
  report = dict(
    tokens_per_step=setup.tokens_per_step,
    flops_per_token=setup.flops_per_token,
    peak_flops=setup.peak_flops,
  )
  state = None
  if not FLAGS.compile_only:
    with setup.activation_sharding():
      windows, trained, host_batches = benchmark(
        setup,
        steps=FLAGS.steps,
        window=FLAGS.window,
        fresh_batches=FLAGS.fresh_batches,
        sync=FLAGS.sync,
      )
      state = jax.tree.map(  # the shapes and shardings the steps ran with (profiling donates them)
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), trained
      )
      if FLAGS.profile_steps:
        report["profile"] = profile_or_error(
          lambda: profile(setup, trained, host_batches, FLAGS.profile_steps, FLAGS.profile_dir)
        )
    report.update(
      steps=FLAGS.steps,
      window=FLAGS.window,
      fresh_batches=FLAGS.fresh_batches,
      sync=FLAGS.sync,
      windows=windows,
      median_step_time=statistics.median(w["step_time"] for w in windows),
      peak_bytes_in_use=peak_memory_bytes(),
    )
  report["compiled_memory"] = compiled_memory(setup, state, FLAGS.compiled_text)
  print(
    "compiled step memory (bytes): "
    + ", ".join(f"{name} {size:,}" for name, size in (report["compiled_memory"] or {}).items())
  )
  if torch is not None:
    if torch.get("profile"):
      raw = torch.pop("profile")
      torch["profile"] = profile_or_error(
        lambda: kernels.profile_summary(raw["kernels"], raw["intervals"], raw["steps"])
      )
    torch["mfu"] = hardware.mfu(setup.flops_per_token, torch["tokens_per_sec"], 1, setup.peak_flops)
    median_tokens = setup.tokens_per_step / report["median_step_time"]
    print(
      f"txf / torch tokens/s, one {jax.devices()[0].device_kind} each: "
      f"{median_tokens / torch['tokens_per_sec']:.2f}x"
    )
    report["torch"] = torch
  return report
