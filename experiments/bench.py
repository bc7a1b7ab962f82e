"""Benchmarks of a config, each a mode of one command (built by the same
setup as `run`, so they time what trains):

  python -m experiments.bench --config=configs/gpt2_small.py --steps=400 --window=50
  python -m experiments.bench --config=configs/gpt2_small.py --torch
  python -m experiments.bench --config=configs/gpt2_small.py --loop --steps=600 --window=50
  python -m experiments.bench --config=configs/gpt2_small.py --decode --hf
  python -m experiments.bench --config=configs/gpt2_small.py --data --steps=100

Step (default): the jitted training step on batches of the config's training
data read before timing, inside the activation-sharding context; no
checkpoints or logging, so it isolates the compiled step. Prints, per
window of steps, the step time, tokens/s and MFU (txf.analysis
flops_per_token, 6N + 12LHQT, over the device's peak, where the peak is
known); --json=PATH also writes these figures as JSON. --fresh_batches
sends a new host batch to the devices every step (as training does) instead
of reusing one; --sync=false dispatches steps asynchronously and times whole
windows (as the training loop runs) instead of timing each step to
completion and taking the median. --torch also times the PyTorch GPT-2
recipe (benchmarks/torch_gpt2.py) on the same token batches, in a
subprocess started before JAX takes the device.

Loop (--loop): the real training loop (txf.train.loop.run) against the bare
step, in one process; see experiments/bench_loop.py for the variants.

Decode (--decode): KV-cache generation tokens/s (txf.decode.generate) at
--decode_batch_sizes, prompt --prompt_len, --new_tokens new tokens, with the
fraction of the physical floor (weight bytes / memory bandwidth); --hf adds
Hugging Face transformers GPT-2 generate() at the same shape (subprocess,
skipped when transformers is absent). See experiments/bench_decode.py.

Data (--data): the config's training data loader alone, on the host (no
device): --steps batches, in tokens/s (txf.data.throughput).

Every report holds the date, device and software versions
(txf.train.hardware.environment).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile

import jax
import numpy as np
from absl import flags, logging
from etils import epath
from ml_collections import config_flags

from experiments import bench_decode, bench_loop
from experiments.bench_step import (FRESH_BATCHES, benchmark, compiled_memory,
                                    peak_memory_bytes)
from experiments.cli import fail, run_command
from txf.data import make_dataset
from txf.data.throughput import format_throughput, loader_throughput
from txf.train import hardware
from txf.train.setup import setup_run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_STEPS = flags.DEFINE_integer("steps", 200, "Timed steps (--loop: train.steps of each run).")
_WINDOW = flags.DEFINE_integer("window", 50, "Steps per reported window (--loop: log_every).")
_FRESH = flags.DEFINE_bool("fresh_batches", False, "A new host batch every step.")
_SYNC = flags.DEFINE_bool("sync", True, "Wait for every step (median) or only per window.")
_JSON = flags.DEFINE_string("json", None, "Also write the figures to this JSON file.")
_COMPILE_ONLY = flags.DEFINE_bool("compile_only", False, "Step mode: compile the step and "
                                   "report XLA's memory analysis of it, without running.")
_TORCH = flags.DEFINE_bool("torch", False, "Also time benchmarks/torch_gpt2.py (step mode).")
_TORCH_STEPS = flags.DEFINE_integer("torch_steps", 50, "Timed steps of the PyTorch recipe.")
_TORCH_COMPILE = flags.DEFINE_bool("torch_compile", True, "torch.compile the PyTorch model.")
_LOOP = flags.DEFINE_bool("loop", False, "Time the training loop against the bare step.")
_VARIANTS = flags.DEFINE_list("loop_variants", list(bench_loop.VARIANTS),
                              f"--loop runs, from {', '.join(bench_loop.VARIANTS)}.")
_PROFILE_DIR = flags.DEFINE_string("profile_dir", None, "--loop: write a jax.profiler trace "
                                   "of --profile_steps of the 'full' run here.")
_PROFILE_STEPS = flags.DEFINE_list("profile_steps", ["300", "305"],
                                   "--loop: first and last step of the trace.")
_DECODE = flags.DEFINE_bool("decode", False, "Time KV-cache generation.")
_DECODE_BATCHES = flags.DEFINE_list("decode_batch_sizes", ["1", "32"], "--decode batch sizes.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 128, "--decode prompt length.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 512, "--decode tokens generated per row.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "--decode timed calls (median).")
_DATA = flags.DEFINE_bool("data", False, "Time the training data loader (tokens/s on this "
                          "host, no device).")
_HF = flags.DEFINE_bool("hf", False, "--decode: also time transformers' GPT-2 generate().")
flags.mark_flag_as_required("config")
flags.register_validator("window", lambda window: window >= 1, "--window must be >= 1")
flags.register_multi_flags_validator(
    ["steps", "window"], lambda values: values["steps"] >= values["window"],
    "--steps must be at least --window (a window of steps is timed as one figure)")
flags.register_multi_flags_validator(
    ["loop", "decode"], lambda values: not (values["loop"] and values["decode"]),
    "--loop and --decode are separate modes: run one at a time")
flags.register_validator(
    "loop_variants", lambda names: set(names) <= set(bench_loop.VARIANTS),
    f"--loop_variants must come from {', '.join(bench_loop.VARIANTS)}")

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def run_reference(script: str, args: list[str], needs: str) -> dict | None:
  """Runs benchmarks/<script> in a subprocess with --json; its figures, or
  None (with the reason printed) when `needs` is not installed or it fails."""
  if importlib.util.find_spec(needs) is None:
    print(f"{script}: skipped ({needs} is not installed)")
    return None
  with tempfile.TemporaryDirectory() as directory:
    report = pathlib.Path(directory) / "report.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args, f"--json={report}"],
                          capture_output=True, text=True, check=False)
    print(done.stdout, end="")
    if done.returncode:
      print(f"{script}: failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
      return None
    return json.loads(report.read_text())


def torch_reference(config, *, steps: int, compile_model: bool) -> dict | None:
  """The PyTorch recipe at the config's model shape and batch, on the config's
  own training batches (None where it does not apply or torch is absent);
  run before JAX initialises its backend."""
  model = config.model
  if not bench_decode.is_gpt2(model):
    print("torch reference: skipped (it is GPT-2: " + bench_decode.GPT2_SHAPE + ")")
    return None
  data = make_dataset(config.data, "train", seed=config.seed)
  batches = [next(data) for _ in range(FRESH_BATCHES)]
  windows_NxBxT1 = np.stack([np.concatenate([b["inputs"], b["targets"][:, -1:]], axis=1)
                             for b in batches])
  with tempfile.TemporaryDirectory() as directory:
    tokens = pathlib.Path(directory) / "tokens.npy"
    np.save(tokens, windows_NxBxT1)
    return run_reference(
        "torch_gpt2.py",
        [f"--tokens={tokens}", f"--layers={model.num_layers}", f"--d_model={model.d_model}",
         f"--heads={model.num_heads}", f"--vocab={model.vocab_size or data.vocab_size}",
         f"--steps={steps}"] + ([] if compile_model else ["--no_compile"]),
        needs="torch")


def step_mode(config) -> dict:
  torch = (torch_reference(config, steps=_TORCH_STEPS.value, compile_model=_TORCH_COMPILE.value)
           if _TORCH.value else None)
  setup = setup_run(config)
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}, "
        f"{setup.tokens_per_step} tokens/step, {setup.flops_per_token:.3g} FLOPs/token")
  report = dict(tokens_per_step=setup.tokens_per_step, flops_per_token=setup.flops_per_token,
                peak_flops=setup.peak_flops)
  if not _COMPILE_ONLY.value:
    with setup.activation_sharding():
      windows = benchmark(setup, steps=_STEPS.value, window=_WINDOW.value,
                          fresh_batches=_FRESH.value, sync=_SYNC.value)
    report.update(steps=_STEPS.value, window=_WINDOW.value, fresh_batches=_FRESH.value,
                  sync=_SYNC.value, windows=windows,
                  median_step_time=statistics.median(w["step_time"] for w in windows),
                  peak_bytes_in_use=peak_memory_bytes())
  report["compiled_memory"] = compiled_memory(setup)
  print("compiled step memory (bytes): " + ", ".join(
      f"{name} {size:,}" for name, size in (report["compiled_memory"] or {}).items()))
  if torch is not None:
    torch["mfu"] = hardware.mfu(setup.flops_per_token, torch["tokens_per_sec"],
                                jax.device_count(), setup.peak_flops)
    median_tokens = setup.tokens_per_step / report["median_step_time"]
    print(f"txf / torch tokens/s: {median_tokens / torch['tokens_per_sec']:.2f}x")
    report["torch"] = torch
  return report


def loop_mode(config) -> dict:
  first, last = (int(step) for step in _PROFILE_STEPS.value)
  profile = (_PROFILE_DIR.value, first, last) if _PROFILE_DIR.value else None
  return bench_loop.compare(config, steps=_STEPS.value, window=_WINDOW.value,
                            variants=_VARIANTS.value, profile=profile)


def decode_mode(config) -> dict:
  batch_sizes = [int(b) for b in _DECODE_BATCHES.value]
  hf = None
  if _HF.value:
    hf = run_reference("hf_gpt2_decode.py",
                       bench_decode.hf_arguments(config, batch_sizes, _PROMPT_LEN.value,
                                                 _NEW_TOKENS.value, _REPEATS.value),
                       needs="transformers")
  return bench_decode.compare(config, batch_sizes=batch_sizes, prompt_len=_PROMPT_LEN.value,
                              new_tokens=_NEW_TOKENS.value, repeats=_REPEATS.value, hf=hf)


def data_mode(config) -> dict:
  """--data: the loader's tokens/s (a sentencepiece tokenizer is trained in a
  temporary directory)."""
  with tempfile.TemporaryDirectory() as workdir:
    figures = loader_throughput(config.data, batches=_STEPS.value, seed=config.seed,
                                workdir=workdir)
  print(format_throughput(figures))
  return figures


def main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  config = _CONFIG.value
  modes = {"loop": _LOOP.value, "decode": _DECODE.value, "data": _DATA.value}
  chosen = [name for name, on in modes.items() if on]
  if len(chosen) > 1:
    fail("flag", f"choose one of --{', --'.join(chosen)}")
  mode = chosen[0] if chosen else "step"
  report = {"loop": loop_mode, "decode": decode_mode, "data": data_mode,
            "step": step_mode}[mode](config)
  report = dict(config=flags.FLAGS["config"].config_filename, mode=mode,
                **hardware.environment(), **report)
  if _JSON.value:
    epath.Path(_JSON.value).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
  run_command(main)
