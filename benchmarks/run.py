"""Every benchmark of txf, each a mode of one command:

  python -m benchmarks.run step --config=configs/gpt2_small.py --steps=400 --window=50
  python -m benchmarks.run step --config=configs/gpt2_small.py --torch
  python -m benchmarks.run loop --config=configs/gpt2_small.py --steps=600 --window=50
  python -m benchmarks.run decode --config=configs/gpt2_small.py --hf
  python -m benchmarks.run data --config=configs/gpt2_small.py --steps=100
  python -m benchmarks.run replicas --config=configs/base.py --replicas=3 --steps=20
  python -m benchmarks.run seq2seq_decode --source_len=512 --new_tokens=128
  python -m benchmarks.run loss_kernel --config=configs/gpt2_small.py
  python -m benchmarks.run checkpoint_stall --state_mb=1490 --leaves=64
  python -m benchmarks.run MODE --help     # the mode's own flags

A mode is a module of this package, benchmarks/<mode>.py, with its flags
(`define_flags`) and its measurement (`main`, which prints its figures and
returns them); modes share flag names with different meanings and defaults
(--steps, --new_tokens, ...), so only the chosen mode's flags are defined.
Every mode first prints its command line and the devices it has (kind and
count); --json=PATH writes the figures with the mode, the command line, the
config file, the date, device and software versions (txf.hardware.environment).
"""

from __future__ import annotations

import functools
import importlib
import json
import shlex
import sys
from types import ModuleType

import jax
from absl import flags, logging

from txf import hardware
from txf.commands import cli
from txf.commands.cli import fail, run_command
from txf.storage import write_file

MODES = (
  "step",
  "loop",
  "decode",
  "data",
  "replicas",
  "seq2seq_decode",
  "embedding_grad",
  "loss_kernel",
  "checkpoint_stall",
)


def mode_module(argv: list[str]) -> tuple[str, ModuleType]:
  """The mode argv[1] names and its module; --help before a mode prints this
  command's docstring, a missing or unknown mode is a one-line error, exit 2."""
  usage = f"usage: python -m benchmarks.run {{{'|'.join(MODES)}}} [flags]"
  if len(argv) >= 2 and argv[1] in ("-h", "--help", "--helpfull"):
    print(f"{usage}\n\n{__doc__}")
    sys.exit(0)
  if len(argv) < 2 or argv[1] not in MODES:
    fail("flag", (f"unknown mode {argv[1]!r}" if len(argv) >= 2 else "missing mode") + f"; {usage}")
  return argv[1], importlib.import_module(f"benchmarks.{argv[1]}")


def report(mode: str, command: str, figures: dict) -> dict:
  """The figures of `mode` with the command that measured them and what
  they were measured on."""
  config = {"config": flags.FLAGS["config"].config_filename} if "config" in flags.FLAGS else {}
  return dict(command=command, **config, mode=mode, **hardware.environment(), **figures)


def header(command: str) -> str:
  """The command line and the devices this process has: a figure printed
  under it names what measured it and where."""
  devices = jax.devices()
  return (
    f"command: {command}\n"
    f"device: {devices[0].device_kind} x{len(devices)} ({jax.default_backend()})"
  )


def run_mode(mode: str, module: ModuleType, command: str, argv: list[str]) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  # Before the mode measures anything: a run of minutes was lost to a
  # missing directory at its end.
  cli.check_output_file("json", flags.FLAGS.json)
  print(header(command))
  # A config the run rejects: one line, exit 2, as txf-run; a report that
  # cannot be written (a full disk): one line, exit 1, the file as it was.
  with cli.run_errors():
    figures = module.main()
    if flags.FLAGS.json:
      text = json.dumps(report(mode, command, figures), indent=2) + "\n"
      write_file(flags.FLAGS.json, text)


def main() -> None:
  # The command line as typed (absl consumes sys.argv below).
  command = shlex.join(["python", "-m", "benchmarks.run", *sys.argv[1:]])
  mode, module = mode_module(sys.argv)
  module.define_flags()
  flags.DEFINE_string("json", None, "Also write the figures to this JSON file.")
  flags.adopt_module_key_flags(cli)
  del sys.argv[1]  # the mode: absl parses the flags after it
  measure = functools.partial(run_mode, mode, module, command)
  # run_command's --help prints the docstring and key flags of the module its
  # main comes from: the mode's (a bare partial's is functools').
  measure.__module__ = module.__name__
  run_command(measure)


if __name__ == "__main__":
  main()
