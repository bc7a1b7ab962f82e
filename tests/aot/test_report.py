"""txf-compile's report on programs whose memory analysis is known
(fake_compiled): the memory arithmetic with donated buffers and generated
code, and the verdict, exit status and JSON `fits` in every mix of programs
that fit and do not."""

import json
import os
import subprocess
import sys

import pytest
from fake_compiled import FITTING, H100_CAPACITY, MIXES, OVER, Buffers, fake_run, setup

from conftest import REPO
from txf.aot.report import format_report, report


@pytest.fixture(scope="module")
def run_setup():
  return setup()


def test_memory_counts_each_buffer_once_against_the_device(run_setup):
  """Outputs written over donated arguments are counted once; generated code
  counts. The sizes are a known inventory of buffers, not the formula."""
  train = Buffers(
    donated=3 * 2**30, kept_arguments=5 * 2**20, fresh_outputs=7 * 2**20,
    temporaries=11 * 2**30, code=13 * 2**20,
  )  # fmt: skip
  evaluation = Buffers(kept_arguments=2**30, fresh_outputs=2**10, temporaries=2**29, code=2**20)
  figures = report(fake_run(run_setup, train, evaluation))
  memory = figures["per_device"]
  expected_total = 3 * 2**30 + 5 * 2**20 + 7 * 2**20 + 11 * 2**30 + 13 * 2**20
  assert memory["total_bytes"] == expected_total == train.live_bytes()
  assert memory["aliased_bytes"] == 3 * 2**30
  assert memory["arguments_bytes"] == 3 * 2**30 + 5 * 2**20
  assert memory["outputs_bytes"] == 3 * 2**30 + 7 * 2**20
  assert memory["generated_code_bytes"] == 13 * 2**20
  assert memory["capacity_bytes"] == H100_CAPACITY
  assert memory["headroom_bytes"] == H100_CAPACITY - expected_total
  assert figures["eval_step"]["total_bytes"] == 2**30 + 2**10 + 2**29 + 2**20
  assert figures["fits"] is True
  lines = format_report(figures).splitlines()
  # 14 GiB + 25 MiB = 14.02 GiB of 79.14 GiB (84,978,434,048 bytes), 65.12 free.
  assert lines[1].startswith("FITS: train step 14.02 GiB of 79.14 GiB per device (65.12 GiB free)")
  assert lines[1].endswith("eval step 1.50 GiB")
  assert lines[2] == (
    "  arguments 3.00 GiB, outputs 3.01 GiB (3.00 GiB of them over donated arguments), "
    "temporaries 11.00 GiB"
  )


def test_a_program_over_the_device_is_reported_over_by_its_excess(run_setup):
  figures = report(fake_run(run_setup, OVER, FITTING))
  excess = OVER.live_bytes() - H100_CAPACITY  # a GiB
  assert figures["per_device"]["headroom_bytes"] == -excess == -(2**30)
  assert "(1.00 GiB over)" in format_report(figures).splitlines()[1]


@pytest.mark.parametrize("mix", MIXES, ids=lambda mix: "-".join(map(str, mix)))
def test_the_verdict_says_fits_only_where_every_program_fits(run_setup, mix):
  train, evaluation, decode = (FITTING if fits else OVER for fits in mix)
  figures = report(fake_run(run_setup, train, evaluation, decode))
  assert figures["fits"] is all(mix)
  assert [figures[key]["fits"] for key in ("per_device", "eval_step", "decode")] == list(mix)
  lines = format_report(figures).splitlines()
  assert lines[1].startswith("FITS:" if all(mix) else "DOES NOT FIT:")
  # Each program that does not fit is named so, with its excess.
  assert ("eval step" in lines[1] and "over)" in lines[1].split("eval step")[1]) is not mix[1]
  (decode_line,) = [line for line in lines if line.startswith("decode")]
  assert ("DOES NOT FIT" in decode_line) is not mix[2]


@pytest.mark.slow  # a subprocess
def test_the_command_exits_1_prints_does_not_fit_and_writes_fits_false_together(tmp_path):
  """txf-compile's own main on each mix (fake_compiled's script): exit
  status, printed verdict and the JSON's `fits` agree."""
  flags = ["--config=rope", "--target=h100", f"--json={tmp_path / 'r.json'}"]
  done = subprocess.run(
    [sys.executable, "tests/aot/fake_compiled.py", "--", *flags],
    cwd=REPO,
    env=dict(os.environ, PYTHONPATH=f"{REPO / 'tests'}:{REPO / 'tests' / 'aot'}"),
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert done.returncode == 0, done.stderr[-2000:]
  rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
  assert [tuple(row["mix"]) for row in rows] == MIXES
  for row in rows:
    fits = all(row["mix"])
    assert row["status"] == (0 if fits else 1), row
    assert row["verdict"].startswith("FITS:" if fits else "DOES NOT FIT:"), row
    assert row["fits"] is fits, row
