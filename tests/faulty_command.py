"""`python -m tests.faulty_command COMMAND TARGET NAME [ARGS...]`: runs the
command module COMMAND (`txf.commands.analyze`) with ARGS, its function
TARGET.NAME replaced by one that raises ValueError('a fault while
computing'): how a command reports a fault of txf's after its checks passed
(a traceback and exit 1, not the one line and exit 2 of a refused input)."""

import importlib
import sys


def fault(*args, **kwargs):
  raise ValueError("a fault while computing")


if __name__ == "__main__":
  command, target, name, *args = sys.argv[1:]
  setattr(importlib.import_module(target), name, fault)
  sys.argv = [command, *args]
  importlib.import_module(command).cli()
