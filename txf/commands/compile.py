"""Compile a run for hardware this machine does not have: does it fit, and what does it cost there?

  txf-compile --config=gpt2_small --target=h100
  txf-compile --config=decoder_1b --target=v5e-256 --json=report.json
  txf-compile --config=rope --target=v4-8 --config.parallel.fsdp=4
  txf-compile --config=gpt2_small --target=h100 --decode_tokens=512
  python -m experiments.compile --config=rope --target=v4-8 [flags]   # in a checkout

Prints the config file it loaded first, then builds the run exactly as txf-
run would (the same config, overrides and checks), but on the devices of the
target's topology description, and compiles its train step and eval step
ahead of time on this CPU: no TPU or GPU needed. Targets: TPU slices by
their cloud names, each generation up to its largest slice (v4-8 ... v4-8192,
v5e-1 ... v5e-256, v5p-8 ... v5p-8192, v6e-1 ... v6e-256; v5e-256x2 for two
slices, data parallel across them) and GPUs with a count (h100, h200, a100;
h100x8, h100x16 for two hosts), 65,536 devices at most. A sentencepiece run
compiles at data.sp_vocab_size ids, training no tokenizer. It prints, per
device: the memory the train step and
the eval step need against the device's (FITS / DOES NOT FIT, by how much),
the step's FLOPs (the model's; the compiler's where it counts them), a
roofline bound on the step time and the MFU it allows (`--step_seconds`
gives the MFU at an assumed step time), the collectives per step (count and
bytes), and for GPUs the kernels per step, GEMMs by backend, cuDNN attention
calls and the bytes each region of the step moves outside GEMMs (loss,
optimizer, attention, the rest); docs/scaling.md says how to read it.
`--decode_tokens=N` also compiles the sampler the run's evaluations use, for
N tokens (one row, after eval.sample_prompt) and prints its memory and, for GPUs, the
kernels it launches per generated token (what bounds decoding's speed at
batch 1, where each kernel is tiny).
`--json=PATH` writes the same figures (keys `fits` and `per_device`:
`arguments_bytes`, `temporaries_bytes`, `total_bytes`, `capacity_bytes`,
...). `--hlo=PATH` writes the compiled train step's HLO text (nothing, and
a line saying so, where the compiler refused the step for memory). Each is
written whole or not at all; a directory that cannot take it is found
before the compile.

Needs the target's compiler: for TPUs libtpu, `pip install 'jax[tpu]'` (txf's
tpu extra); for GPUs jax's CUDA plugin and ptxas, `pip install
'jax[cuda13-local]' 'nvidia-cuda-nvcc>=13'` (txf's gpu-compile extra).

Exit status: 0 when every program fits; 1 when one does not (the report says by
how much) or the target's compiler fails on one (one line, `compile error:
the train step does not compile for h100: ...`, XLA's first line; no
report) or an output cannot be written (a full disk); 2 with one line for a
bad target, a missing compiler, a config error (including a mesh that does
not divide the target's devices or a batch that does not split over it), an
output path whose directory is missing or not writable.
"""

from __future__ import annotations

import json
import math
import sys

from absl import flags, logging

from txf.commands.cli import (
  check_output_file,
  command_started,
  define_config_flag,
  fail,
  loaded_config_file,
  require_config_kind,
  run_command,
  run_errors,
)

_CONFIG = define_config_flag("Run config (file.py[:arg], or a shipped config's name).")
_TARGET = flags.DEFINE_string(
  "target", None, "Hardware: a TPU slice (v5e-256, v4-8, v5p-128) or GPUs (h100, h100x8).",
  required=True,
)  # fmt: skip
_JSON = flags.DEFINE_string("json", None, "Also write the report here as JSON.")
_HLO = flags.DEFINE_string("hlo", None, "Write the compiled train step's HLO text here.")
_STEP_SECONDS = flags.DEFINE_float(
  "step_seconds", None, "An assumed step time: report the MFU it would give."
)
_DECODE_TOKENS = flags.DEFINE_integer(
  "decode_tokens", 0, "> 0: also compile decoding this many tokens (language models)."
)


def _write(path: str, text: str) -> str | None:
  """Writes `path` whole or not at all; returns why it could not (a full
  disk), or None."""
  from txf.storage import WriteError, write_file

  try:
    write_file(path, text)
  except WriteError as error:
    return str(error)
  return None


def main(argv) -> None:
  # After flag parsing: fast --help; before jax starts a backend.
  from txf.aot.compile import CompileError, compile_run, prepare_environment

  prepare_environment()
  from txf.aot.report import format_report, report
  from txf.aot.targets import parse_target
  from txf.runconfig.run_config import parse

  logging.set_verbosity(logging.WARNING)
  require_config_kind("run")
  if _STEP_SECONDS.value is not None and not 0 < _STEP_SECONDS.value < math.inf:
    fail("flag", f"step_seconds: must be a finite number > 0, got {_STEP_SECONDS.value}")
  if _DECODE_TOKENS.value < 0:
    fail("flag", f"decode_tokens: must be >= 0, got {_DECODE_TOKENS.value}")
  check_output_file(_JSON.name, _JSON.value)
  check_output_file(_HLO.name, _HLO.value)
  try:
    target = parse_target(_TARGET.value)
    devices = target.devices()
  except (ValueError, ImportError) as error:
    fail("target", error)
  command_started()  # a Ctrl-C in the compiles is KeyboardInterrupt: --json/--hlo stay whole
  print(f"config: {loaded_config_file()}", flush=True)
  with run_errors():
    try:
      run = parse(_CONFIG.value)
      compiled = compile_run(run, target, devices, decode_tokens=_DECODE_TOKENS.value)
    except CompileError as error:  # the answer "it does not run there", as DOES NOT FIT
      fail("compile", error, status=1)
  figures = report(compiled, _STEP_SECONDS.value)
  # The report first, each file then on its own: a file that cannot be
  # written (a full disk after a five-minute compile) loses no figure.
  print(format_report(figures), flush=True)
  outputs = [(_JSON.value, json.dumps(figures, indent=2) + "\n")] if _JSON.value else []
  if _HLO.value and compiled.train_step is not None:
    outputs.append((_HLO.value, compiled.train_step.as_text()))
  errors = [error for path, text in outputs if (error := _write(path, text)) is not None]
  if _HLO.value and compiled.train_step is None:  # refused for memory: there is no program
    print(f"hlo: {_HLO.value} not written: the compiler refused the train step")
  for error in errors:
    print(f"write error: {error}", file=sys.stderr)
  if errors or not figures["fits"]:
    raise SystemExit(1)


def cli() -> None:
  """The `txf-compile` console script and `python -m experiments.compile`."""
  run_command(main, starts_jax=False)  # prepare_environment picks the platforms


if __name__ == "__main__":
  cli()
