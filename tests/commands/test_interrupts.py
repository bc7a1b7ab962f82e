"""Ctrl-C (SIGINT) in txf-run: in training, a save, one line and exit 130,
and a resume as exact as an uninterrupted run; anywhere else (a config
loading), one line, `interrupted`, and exit 130. No traceback either way."""

import signal
import subprocess
import sys
import time

import pytest

from conftest import (
  REPO,
  assert_same_states,
  checkpoint_steps,
  cli_command,
  cli_env,
  output_lines,
  restore_state,
  tiny_config,
)
from txf.runconfig.run_config import parse
from txf.rundir.record import read_record
from txf.train import loop

pytestmark = pytest.mark.slow  # subprocesses that train


def interrupt_when(process, log_path, text, timeout_s=300):
  """Sends `process` SIGINT once `text` is in its log; its exit status."""
  deadline = time.monotonic() + timeout_s
  try:
    while text not in log_path.read_text():
      assert process.poll() is None, log_path.read_text()[-3000:]
      assert time.monotonic() < deadline, f"no {text!r} within {timeout_s} s"
      time.sleep(0.1)
    process.send_signal(signal.SIGINT)
    return process.wait(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()


def test_ctrl_c_saves_exits_130_and_resumes_bit_for_bit(tmp_path, compilation_cache_dir):
  # A KeyboardInterrupt traceback, nothing saved since the last checkpoint.
  workdir, total = tmp_path / "run", 100_000
  config = tiny_config(steps=total, train__log_every=10, train__checkpoint_every=total)
  out, err = tmp_path / "out.txt", tmp_path / "err.txt"
  with open(out, "w") as stdout, open(err, "w") as stderr:  # files: they never fill up
    process = subprocess.Popen(
      cli_command("rope", workdir, config),
      cwd=REPO,
      stdout=stdout,
      stderr=stderr,
      env=cli_env(compilation_cache_dir),
    )
    returncode = interrupt_when(process, out, f"step 10/{total}")
  text = out.read_text()
  assert returncode == 130, text[-3000:] + err.read_text()[-3000:]
  assert err.read_text() == ""
  last = output_lines(text)[-1]
  assert last.startswith("interrupted: saved step "), text[-3000:]
  assert last.endswith("; rerun the same command to resume"), last
  saved = int(last.split("saved step ")[1].split(";")[0])
  assert 10 <= saved < total and checkpoint_steps(workdir) == [saved]
  (entry,) = read_record(workdir)  # the record says how it stopped: not a preemption
  assert entry["ended"] == "interrupted" and entry["end_step"] == saved

  # Resumed (as the same command rerun would) to saved + 2, and run straight there.
  resumed, straight = saved + 2, tmp_path / "straight"
  lines = []
  loop.run(parse(tiny_config(steps=resumed, train__log_every=10)), workdir, log=lines.append)
  assert f"resumed from step {saved}" in "\n".join(lines)
  loop.run(parse(tiny_config(steps=resumed, train__log_every=10)), straight, log=lambda line: None)
  assert_same_states(restore_state(workdir, resumed), restore_state(straight, resumed))


SLOW_CONFIG = """
import pathlib, time
from txf.configs import base

def get_config():
  pathlib.Path({marker!r}).touch()
  # Short sleeps, as a config computing in Python: a signal the kernel gives
  # the child's other (native) thread does not end the main thread's sleep,
  # and Python's handler would wait out a single long one (one CI run's
  # txf-compile case timed out so).
  for _ in range(1200):
    time.sleep(0.1)
  return base.get_config()
"""


@pytest.mark.parametrize(
  "command, flags",
  [
    ("run", ["--workdir={tmp}/run"]),
    ("compile", ["--target=v4-8"]),
    ("sweep", ["--workdir={tmp}/run"]),
  ],
)
def test_ctrl_c_while_the_config_loads_is_one_line_exit_130(tmp_path, command, flags):
  marker = tmp_path / "loading"
  config = tmp_path / "slow.py"
  config.write_text(SLOW_CONFIG.format(marker=str(marker)))
  # A Ctrl-C as from a terminal: the child starts with SIGINT's default
  # whatever this test process has (a handler set here does not survive the
  # child's exec; an ignored SIGINT would: a pytest-xdist worker has been
  # found ignoring it after earlier tests, and the child never stopped).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    process = subprocess.Popen(
      [
        sys.executable,
        "-m",
        f"experiments.{command}",
        f"--config={config}",
        *(flag.format(tmp=tmp_path) for flag in flags),
      ],
      cwd=REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
  finally:
    signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)
  try:
    deadline = time.monotonic() + 60
    while not marker.exists():
      assert process.poll() is None and time.monotonic() < deadline, process.communicate()
      time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  assert process.returncode == 130, stderr
  assert stderr == "interrupted\n" and stdout == ""
  assert not (tmp_path / "run").exists()
