"""Ahead-of-time compilation for hardware this machine does not have.

  from txf.aot import compile_run, parse_target, prepare_environment, report
  prepare_environment()                      # before jax starts a backend
  run = compile_run(config, parse_target("v5e-256"))
  figures = report(run)                      # memory, FLOPs, roofline, collectives, kernels

The `txf-compile` command (txf.commands.compile) is this, printed:

  targets.py   hardware by name (TPU slices, GPUs x count) and its topology devices
  compile.py   a run's train and eval steps compiled on them, nothing allocated
  report.py    what the compiled programs need and cost per device
  hlo.py       the optimised HLO text read: kernels, bytes, collectives, regions
"""

from txf.aot.compile import CompiledRun, compile_run, prepare_environment
from txf.aot.report import format_report, report
from txf.aot.targets import Target, parse_target

__all__ = [
  "CompiledRun",
  "Target",
  "compile_run",
  "format_report",
  "parse_target",
  "prepare_environment",
  "report",
]
