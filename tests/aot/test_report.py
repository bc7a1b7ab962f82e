"""txf-compile's report on programs whose memory analysis is known
(fake_compiled): the memory arithmetic with donated buffers and generated
code, and the verdict, exit status and JSON `fits` in every mix of programs
that fit and do not."""

import json
import os
import subprocess
import sys
import types

import jax
import pytest
from fake_compiled import FITTING, H100_CAPACITY, MIXES, OVER, Buffers, fake_run, setup

from conftest import REPO
from txf.aot.compile import loop_launch
from txf.aot.report import (
  LAUNCH_SECONDS,
  decode_figures,
  format_report,
  loop_traffic,
  report,
  roofline,
)


@pytest.fixture(scope="module")
def run_setup():
  return setup()


def optimizer_bytes(run_setup) -> int:
  """The train state's bytes besides its parameters, on the one device."""
  state = run_setup.abstract_state
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) - sum(
    x.size * x.dtype.itemsize for x in jax.tree.leaves(state.params)
  )


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
  # The eval step's buffers and the train state's beyond its parameters.
  assert figures["eval_step"]["total_bytes"] == evaluation.live_bytes() + optimizer_bytes(run_setup)
  assert figures["fits"] is True
  lines = format_report(figures).splitlines()
  # 14 GiB + 25 MiB = 14.02 GiB of JAX's pool, 75% of 79.14 GiB (84,978,434,048
  # bytes): 59.36 GiB, 45.33 free (it compared with the whole GPU, 65.12 free,
  # so a run of 60 to 79 GiB 'fit' and ran out of memory).
  assert lines[0].endswith(
    "; a run may use 59.36 GiB of each GPU's 79.14 GiB (75%: JAX's memory pool, "
    "XLA_PYTHON_CLIENT_MEM_FRACTION)"
  )
  assert lines[1].startswith("FITS: train step 14.02 GiB of 59.36 GiB per device (45.33 GiB free)")
  assert lines[1].endswith(
    f"eval step 1.50 GiB (with the rest of the train state, "
    f"{optimizer_bytes(run_setup) / 2**10:.1f} KiB, resident)"
  )
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


def test_evaluating_and_decoding_fit_only_beside_the_train_state(run_setup):
  """The loop evaluates and samples with the whole train state on the
  device: a program that fits alone by less than the optimizer's state
  does not fit."""
  fits_alone = Buffers(temporaries=H100_CAPACITY - optimizer_bytes(run_setup) + 1)
  figures = report(fake_run(run_setup, FITTING, fits_alone, fits_alone))
  assert optimizer_bytes(run_setup) > 1
  for program in ("eval_step", "decode"):
    assert figures[program]["resident_bytes"] == optimizer_bytes(run_setup)
    assert figures[program]["headroom_bytes"] == -1 and not figures[program]["fits"]
  assert figures["fits"] is False


def test_an_assumed_step_time_without_a_peak_says_why_there_is_no_mfu(run_setup):
  from txf import hardware

  figures = report(fake_run(run_setup, FITTING, FITTING), step_seconds=0.01)
  device = run_setup.mesh.devices.flat[0]
  assert run_setup.run.model.dtype == "float32"
  assert hardware.peak_flops_per_device(device, "float32") is None
  assert (
    f"at an assumed 10.0 ms a step: no MFU (no peak FLOP/s for float32 on a {device.device_kind})"
    in format_report(figures).splitlines()
  )


TRAIN_STEP_REFUSED = """
import dataclasses, sys
sys.path[:0] = ["tests", "tests/aot"]
import txf.aot.compile
from fake_compiled import FITTING, fake_run, setup
from txf.commands.compile import cli

refused = "RESOURCE_EXHAUSTED: Ran out of memory: 40.95G of HLO temporaries (40.95G) exceeds 16G"
run = dataclasses.replace(
  fake_run(setup(), FITTING, FITTING), train_step=None, out_of_memory={"train_step": refused}
)
txf.aot.compile.compile_run = lambda *args, **kwargs: run
sys.argv[0] = "txf-compile"
cli()
"""


def test_a_roofline_without_the_bytes_bounds_no_mfu():
  """A train step the compiler refused has no bytes: its compute time alone
  gave 'MFU <= 100.0%', a bound that says nothing."""
  v5e = types.SimpleNamespace(device_kind="TPU v5 lite", platform="tpu")
  known = roofline(2e13, 1e10, v5e, "bfloat16", None)
  assert known["mfu_bound"] == pytest.approx(known["compute_seconds"] / known["step_seconds_bound"])
  assert 0 < known["mfu_bound"] <= 1
  unknown = roofline(2e13, None, v5e, "bfloat16", None)
  assert unknown["memory_seconds"] is None and unknown["mfu_bound"] is None
  assert unknown["step_seconds_bound"] == unknown["compute_seconds"] > 0


@pytest.mark.slow  # a subprocess
def test_a_train_step_refused_for_memory_is_reported_with_hlo_asked_for(tmp_path):
  """--hlo with no train step to write: the DOES NOT FIT report, its JSON,
  exit 1, and what only the compiled step tells said to be unknown."""
  done = subprocess.run(
    [sys.executable, "-c", TRAIN_STEP_REFUSED, "--config=rope", "--target=h100",
     f"--json={tmp_path / 'r.json'}", f"--hlo={tmp_path / 'step.hlo'}"],
    cwd=REPO, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 1, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert lines[2].startswith("DOES NOT FIT: train step 40.95 GiB")
  assert json.loads((tmp_path / "r.json").read_text())["fits"] is False
  assert not (tmp_path / "step.hlo").exists()
  assert f"hlo: {tmp_path / 'step.hlo'} not written: the compiler refused the train step" in lines
  assert "collectives per step: unknown: the train step was not compiled" in lines
  (flops,) = [line for line in lines if line.startswith("FLOPs")]
  assert flops.endswith("(compiler's unknown: the train step was not compiled)")
  # They read 'outputs 0.0 KiB' and 'so MFU <= 100.0%': figures it does not have.
  assert lines[3].endswith(
    ", outputs unknown (the compiler refused the train step), temporaries asked for 40.95 GiB"
  )


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


# A decoding program's shape in small: a token loop whose body updates a
# cache in place, reads one row of a table, calls a kernel that updates its
# second operand in place, and runs a nested loop of 3 known iterations.
# STATE / TYPES stand for the loop state's type (with and without layouts).
LOOP_HLO = """\
HloModule decoding

%fused_update (param_0: bf16[1,8,4], param_1: s32[], param_2: bf16[1,1,4]) -> bf16[1,8,4] {
  %param_0 = bf16[1,8,4]{2,1,0} parameter(0)
  %param_2 = bf16[1,1,4]{2,1,0} parameter(2)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  ROOT %update = bf16[1,8,4]{2,1,0} dynamic-update-slice(%param_0, %param_2, %zero, %param_1, %zero)
}

%fused_row (param_0: f32[100,16], param_1: s32[]) -> f32[1,16] {
  %param_0 = f32[100,16]{1,0} parameter(0)
  %param_1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %bitcast = f32[100,16]{1,0} bitcast(%param_0)
  ROOT %row = f32[1,16]{1,0} dynamic-slice(%bitcast, %param_1, %zero), dynamic_slice_sizes={1,16}
}

%fused_add (param_0: f32[16], param_1: f32[16]) -> f32[16] {
  %param_0 = f32[16]{0} parameter(0)
  %param_1 = f32[16]{0} parameter(1)
  ROOT %add = f32[16]{0} add(%param_0, %param_1)
}

%fused_less (param_0: s32[]) -> pred[] {
  %param_0 = s32[] parameter(0)
  %ten = s32[] constant(10)
  ROOT %less = pred[] compare(%param_0, %ten), direction=LT
}

%inner_body (p: (s32[], f32[16])) -> (s32[], f32[16]) {
  %p = (s32[], f32[16]{0}) parameter(0)
  %j = s32[] get-tuple-element(%p), index=0
  %x = f32[16]{0} get-tuple-element(%p), index=1
  %y = f32[16]{0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  ROOT %out = (s32[], f32[16]{0}) tuple(%j, %y)
}

%inner_condition (p: (s32[], f32[16])) -> pred[] {
  %p = (s32[], f32[16]{0}) parameter(0)
  %j = s32[] get-tuple-element(%p), index=0
  ROOT %less = pred[] fusion(%j), kind=kLoop, calls=%fused_less
}

%body (state: TYPES) -> TYPES {
  %state = STATE parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  %cache = bf16[1,8,4]{2,1,0} get-tuple-element(%state), index=1
  %table = f32[100,16]{1,0} get-tuple-element(%state), index=2
  %new = bf16[1,1,4]{2,1,0} get-tuple-element(%state), index=3
  %q = f32[1,4]{1,0} get-tuple-element(%state), index=4
  %x = f32[16]{0} get-tuple-element(%state), index=5
  %i.copy = s32[] copy(%i)
  %updated = bf16[1,8,4]{2,1,0} fusion(%cache, %i.copy, %new), kind=kLoop, calls=%fused_update, \
metadata={op_name="while/body/stack/block_0/update"}
  %row = f32[1,16]{1,0} fusion(%table, %i.copy), kind=kLoop, calls=%fused_row
  %kernel = (f32[1,4]{1,0}, bf16[1,8,4]{2,1,0}) custom-call(%q, %updated), \
custom_call_target="__gpu$xla.gpu.triton", output_to_operand_aliasing={{1}: (1, {})}
  %inner = (s32[], f32[16]{0}) tuple(%i.copy, %x)
  %loop = (s32[], f32[16]{0}) while(%inner), condition=%inner_condition, body=%inner_body, \
backend_config={"known_trip_count":{"n":"3"}}
  ROOT %next = STATE tuple(%i, %updated, %table, %new, %q, %x)
}

%condition (state: TYPES) -> pred[] {
  %state = STATE parameter(0)
  %i = s32[] get-tuple-element(%state), index=0
  ROOT %less = pred[] fusion(%i), kind=kLoop, calls=%fused_less
}

ENTRY %main (start: TYPES) -> TYPES {
  %start = STATE parameter(0)
  ROOT %tokens = STATE while(%start), condition=%condition, body=%body
}
""".replace(
  "STATE",
  "(s32[], bf16[1,8,4]{2,1,0}, f32[100,16]{1,0}, bf16[1,1,4]{2,1,0}, f32[1,4]{1,0}, f32[16]{0})",
).replace("TYPES", "(s32[], bf16[1,8,4], f32[100,16], bf16[1,1,4], f32[1,4], f32[16])")


def test_a_tokens_kernels_and_bytes_count_what_moves():
  """Per iteration: the copy (4 + 4 bytes); the cache's update in place
  (the 8-byte update read and written and the 4-byte index, not the 64-byte
  cache); one 64-byte row of the 6,400-byte table (with the index and the
  row out); the kernel's two operands (16 + 64: the cache it reads) and its
  one output not written in place (16); the nested loop's add and condition
  3 times (192 and 5 bytes each); the loop's condition (5). The update is a
  layer's."""
  traffic = loop_traffic(LOOP_HLO)
  assert traffic == dict(
    kernels=11,
    bytes=8 + 20 + (64 + 4 + 64) + (80 + 16) + 3 * (192 + 5) + 5,
    layer_kernels=1,
    layer_bytes=20,
  )
  figures = decode_figures(LOOP_HLO, bandwidth=1e9, weight_bytes=500.0)
  assert figures["floor_seconds"] == 5e-7
  assert figures["predicted_seconds"] == pytest.approx(11 * LAUNCH_SECONDS + traffic["bytes"] / 1e9)
  assert decode_figures(LOOP_HLO, bandwidth=None, weight_bytes=500.0)["predicted_seconds"] is None
  assert loop_traffic("")["kernels"] == 0


# XLA's thunk sequences (thunk_sequence_after_thunk_passes.txt) of a token
# loop: in a command buffer whole, its body one, or neither.
LOOP_IN_A_GRAPH = """\
000: kCommandBuffer [source | sink]
    001: kCustomKernel [source       | next=002 (1)] loop_pad_fusion
    043: kWhile        [prev=042 (1) | sink         ]
    condition:
        044: kCustomKernel [source | sink] wrapped_not
      body:
        045: kCopy         [source       | next=046 (1)  ] kCopy
"""
GRAPH_PER_ITERATION = """\
000: kCommandBuffer [source       | next=043 (1)]
    001: kCustomKernel [source       | next=002 (1)] loop_pad_fusion
043: kWhile         [prev=000 (1) | sink        ]
condition:
    044: kCustomKernel [source | sink] wrapped_not
  body:
    000: kCommandBuffer [source | sink]
        045: kCopy         [source       | next=046 (1)  ] kCopy
"""
# A condition without a kernel of its own: XLA writes "No thunks." and the
# body's heading on one line.
GRAPH_PER_ITERATION_NO_CONDITION = """\
000: kCommandBuffer [source       | next=044 (1)]
    001: kCustomKernel [source       | next=002 (1)] loop_pad_fusion
044: kWhile         [prev=000 (1) | sink        ]
condition:
    No thunks.  body:
    000: kCommandBuffer [source | sink]
        045: kCopy         [source       | next=046 (1)] kCopy
"""
KERNEL_BY_KERNEL = """\
001: kCustomKernel [source       | next=002 (1)] loop_pad_fusion
043: kWhile         [prev=000 (1) | sink        ]
condition:
    044: kCustomKernel [source | sink] wrapped_not
  body:
    045: kCopy         [source       | next=046 (1)  ] kCopy
"""


@pytest.mark.parametrize(
  "thunks,launch",
  [
    (LOOP_IN_A_GRAPH, "one graph"),
    (GRAPH_PER_ITERATION, "a graph per iteration"),
    (GRAPH_PER_ITERATION_NO_CONDITION, "a graph per iteration"),
    (KERNEL_BY_KERNEL, "kernel by kernel"),
  ],
)
def test_how_the_token_loop_is_launched(thunks, launch):
  assert loop_launch(thunks) == launch
