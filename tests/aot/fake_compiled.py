"""Compiled programs with a known memory analysis, for checking txf-compile's
report without compiling: `fake_run` is a tiny rope run set up on one H100's
topology (no compile) whose train step, eval step and decoding are `Program`s
reporting sizes the caller chose.

Also a script: `python tests/aot/fake_compiled.py -- TXF_COMPILE_FLAGS...`
runs txf-compile's `main` once per fits mix (train step, eval step, decode:
fits or not) on fake programs, and prints one JSON line per mix: the mix,
the exit status, the verdict line printed and the JSON file's `fits`.
"""

from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Any

H100_MEMORY = 84_978_434_048  # txf.aot.targets.GPUS['h100'].memory_bytes, the datasheet's
# What a run may use of it: JAX's pool, 75% by default (targets.gpu_memory_pool).
H100_CAPACITY = int(H100_MEMORY * 0.75)


@dataclasses.dataclass(frozen=True)
class Buffers:
  """A program's buffers on one device, in bytes, from which XLA's memory
  analysis follows: arguments donated and written over by outputs, other
  arguments, outputs in fresh buffers, temporaries and generated code."""

  donated: int = 0
  kept_arguments: int = 0
  fresh_outputs: int = 0
  temporaries: int = 0
  code: int = 0

  def analysis(self) -> types.SimpleNamespace:
    """What `Compiled.memory_analysis()` reports of these buffers."""
    return types.SimpleNamespace(
      argument_size_in_bytes=self.donated + self.kept_arguments,
      output_size_in_bytes=self.donated + self.fresh_outputs,
      alias_size_in_bytes=self.donated,
      temp_size_in_bytes=self.temporaries,
      generated_code_size_in_bytes=self.code,
    )

  def live_bytes(self) -> int:
    """Every distinct buffer once."""
    return sum(dataclasses.astuple(self))


@dataclasses.dataclass(frozen=True)
class Program:
  """A stand-in for jax.stages.Compiled with known buffers and cost."""

  buffers: Buffers
  flops: float = 1e12
  bytes_accessed: float = 2e11

  def memory_analysis(self):
    return self.buffers.analysis()

  def cost_analysis(self):
    return {"flops": self.flops, "bytes accessed": self.bytes_accessed}

  def as_text(self) -> str:
    return ""


FITTING = Buffers(donated=2 * 2**30, kept_arguments=2**20, fresh_outputs=2**10, temporaries=2**30)
# Over an H100 by a GiB.
OVER = Buffers(donated=2**30, kept_arguments=2**20, temporaries=H100_CAPACITY - 2**20)


def setup():
  """A tiny rope run set up on one H100's topology description."""
  from conftest import tiny_config
  from txf.aot.compile import prepare_environment

  prepare_environment()
  from txf.aot.targets import parse_target
  from txf.runconfig.run_config import parse
  from txf.train.run_setup import setup_run

  return setup_run(parse(tiny_config("rope")), devices=parse_target("h100").devices())


def fake_run(run_setup: Any, train: Buffers, evaluation: Buffers, decode: Buffers | None = None):
  """A CompiledRun of `run_setup` for one H100 whose programs have these buffers."""
  from txf.aot.compile import CompiledRun
  from txf.aot.targets import parse_target

  seconds = {"train_step": 1.0, "eval_step": 1.0} | ({"decode": 1.0} if decode else {})
  return CompiledRun(
    parse_target("h100"),
    run_setup,
    Program(train),
    Program(evaluation),
    {},
    seconds,
    cudnn=True,
    decode=Program(decode) if decode else None,
    decode_tokens=8 if decode else 0,
  )


MIXES = list(itertools.product((True, False), repeat=3))  # (train, eval, decode) fits


def _run_mixes(argv: list[str]) -> None:
  """The script (module docstring)."""
  import contextlib
  import io
  import json
  import pathlib
  import sys

  import txf.aot.compile
  from txf.commands import compile as command

  command.flags.FLAGS(["txf-compile", *argv])
  json_path = pathlib.Path(command.flags.FLAGS.json)
  run_setup = setup()
  for mix in MIXES:
    train, evaluation, decode = (FITTING if fits else OVER for fits in mix)
    run = fake_run(run_setup, train, evaluation, decode)
    txf.aot.compile.compile_run = lambda *args, run=run, **kwargs: run
    json_path.unlink(missing_ok=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
      try:
        command.main(["txf-compile"])
        status = 0
      except SystemExit as exit_:
        status = exit_.code
    verdict = printed.getvalue().splitlines()[2]
    fits = json.loads(json_path.read_text())["fits"]
    print(json.dumps({"mix": mix, "status": status, "verdict": verdict, "fits": fits}))
    sys.stdout.flush()


if __name__ == "__main__":
  import sys

  _run_mixes(sys.argv[sys.argv.index("--") + 1 :])
