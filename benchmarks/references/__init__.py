"""The implementations txf is timed against, each a script with its own
argparse flags and a --json report, run in a subprocess (so it imports torch
or transformers, and has the device, before JAX does)."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile

REFERENCES = pathlib.Path(__file__).resolve().parent


def run_reference(
  script: str, args: list[str], needs: str, python: str | None = None
) -> dict | None:
  """Runs benchmarks/references/<script> in a subprocess with --json; its
  figures, or None (with the reason printed) when `needs` is not installed
  or it fails. `python`: the interpreter to run it with (one whose
  environment has `needs`, e.g. a virtual environment of its own); None:
  this one."""
  if python is None and importlib.util.find_spec(needs) is None:
    print(f"{script}: skipped ({needs} is not installed)")
    return None
  with tempfile.TemporaryDirectory() as directory:
    report = pathlib.Path(directory) / "report.json"
    done = subprocess.run(
      [python or sys.executable, str(REFERENCES / script), *args, f"--json={report}"],
      capture_output=True,
      text=True,
      check=False,
    )
    print(done.stdout, end="")
    if done.returncode:
      print(f"{script}: failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
      return None
    return json.loads(report.read_text())
