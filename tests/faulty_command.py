"""`python -m tests.faulty_command COMMAND TARGET NAME [ARGS...]`: runs the
command module COMMAND (`txf.commands.analyze`) with ARGS, its function
TARGET.NAME replaced by one that raises ValueError('a fault while
computing'): how a command reports a fault of txf's after its checks passed
(a traceback and exit 1, not the one line and exit 2 of a refused input)."""

import importlib
import sys


def fault(*args, **kwargs):
  raise ValueError("a fault while computing")


def assert_only_its_checks_refuse(commands, command, target, name, workdir, refused_flag, kind):
  """`command` (a txf.commands module) on the trained run in `workdir`, with
  its compute function TARGET.NAME faulting: a traceback and exit 1; with
  `refused_flag` as well, its checks' one line `<kind> error: ...` and exit 2.
  `commands`: conftest's CommandServer."""
  fault_args = ("tests.faulty_command", command, target, name, f"--workdir={workdir}")
  done = commands.run(*fault_args, timeout=300)
  assert done.returncode == 1, done.stderr[-3000:]
  assert done.stderr.rstrip().endswith("ValueError: a fault while computing")
  assert "Traceback" in done.stderr
  done = commands.run(*fault_args, refused_flag, timeout=300)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.startswith(f"{kind} error: ")


if __name__ == "__main__":
  command, target, name, *args = sys.argv[1:]
  setattr(importlib.import_module(target), name, fault)
  sys.argv = [command, *args]
  importlib.import_module(command).cli()
