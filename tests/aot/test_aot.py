"""Compiling for hardware this machine does not have (txf.aot, txf-compile):
target names against the clouds' slice shapes, the HLO reader against a
hand-counted module, and tiny runs compiled for a TPU slice and an H100
with figures that follow from the config (fsdp divides the state, a batch
too large does not fit, one cuDNN call per attention layer and direction).

The compiles need txf's compile extras (libtpu; jax's CUDA plugin and
ptxas); a test whose compiler is not installed is skipped, naming it.
"""

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec

from conftest import REPO, tiny_config
from txf.aot import hlo
from txf.aot.compile import (
  abstract_batch,
  compile_run,
  prepare_environment,
  untrained_tokenizer,
)
from txf.aot.report import _pool, format_report, gpu_kernels, loop_traffic, report
from txf.aot.targets import GPUS, MAX_DEVICES, gpu_memory_pool, parse_target
from txf.runconfig import optim
from txf.runconfig.run_config import ConfigError, parse
from txf.train.run_setup import setup_run

prepare_environment()

HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
HAS_CUDA_PLUGIN = (  # find_spec of a submodule imports its package, which may be absent
  importlib.util.find_spec("jax_plugins") is not None
  and importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
)
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu not installed (txf[tpu])")
needs_cuda_plugin = pytest.mark.skipif(
  not HAS_CUDA_PLUGIN, reason="jax's CUDA plugin not installed (txf[gpu-compile])"
)


# ---------------------------------------------------------------------------
# Targets.


@pytest.mark.parametrize(
  "name,chips,topology",
  [
    ("v5e-1", 1, "v5e:1x1"),  # the ends of v5e's range
    ("v5e-8", 8, "v5e:2x4"),
    ("v5e-256", 256, "v5e:16x16"),
    ("v5litepod-16", 16, "v5e:4x4"),
    ("v4-8", 4, "v4:2x2x1"),  # TensorCores: 2 per chip
    ("v4-32", 16, "v4:2x2x4"),
    ("v4-128", 64, "v4:4x4x4"),
    ("v5p-256", 128, "v5p:4x4x8"),
    ("v6e-64", 64, "v6e:8x8"),
    ("h100", 1, "1x1x1"),
    ("h100x8", 8, "1x1x8"),
    ("h200x16", 16, "1x2x8"),  # two hosts
  ],
)
def test_target_names_give_the_clouds_slices(name, chips, topology):
  target = parse_target(name)
  assert (target.chips, target.topology) == (chips, topology)


def test_two_slices_double_the_chips_not_the_slice():
  one, two = parse_target("v5e-256"), parse_target("v5e-256x2")
  assert (two.chips, two.slices, two.topology) == (512, 2, one.topology)


@pytest.mark.parametrize("name", ["v5e-256", "v6e-256", "v4-8192", "v5e-256x256", "h100x65536"])
def test_the_largest_targets_are_accepted(name):
  assert parse_target(name).chips <= MAX_DEVICES


@pytest.mark.parametrize("name", ["v5e-2", "v4-12", "v5p-12288", "v6e-96"])
def test_a_slice_the_layout_cannot_make_names_the_range_taken(name):
  """The range the message states is what parse_target takes: its ends
  parse, a doubling past the end does not."""
  with pytest.raises(ValueError) as error:
    parse_target(name)
  first, *_, last = re.search(r"txf takes (.*), doubling\)$", str(error.value))[1].split()
  generation, count = last.rsplit("-", 1)
  assert parse_target(first) and parse_target(last)
  with pytest.raises(ValueError):
    parse_target(f"{generation}-{2 * int(count)}")


@pytest.mark.parametrize(
  "name,message",
  [
    ("v5e-3", "no v5e slice has 3 chips"),
    ("v5e-512", "the largest v5e slice has 256 chips"),  # the smallest refused, each bound
    ("v6e-512", "the largest v6e slice has 256 chips"),
    ("v4-16384", "the largest v4 slice has 4096 chips"),
    # v5p's largest (6,144 chips) is no doubling of 2x2x1: the range txf
    # takes is said too, as v5p-12288's refusal says it (they disagreed).
    ("v5p-16384", r"6144 chips \(txf takes v5p-8 to v5p-8192, doubling; more: several slices"),
    ("v5e-256x257", "65,792 devices; txf compiles for 65,536 at most"),
    ("h100x65544", "65,544 devices"),
    ("v5e-16x100000", "1,600,000 devices"),  # once a minute's wait and an AssertionError
    ("h100x1000000", "1,000,000 devices"),
    ("v4-7", "two per chip"),
    ("v4-2", "no v4 slice has 1 chips"),
    ("h100x12", "whole hosts of 8"),
    ("h100x0", "1 to 8 GPUs"),
    ("tpu-v9", "not a TPU slice"),
  ],
)
def test_a_bad_target_is_one_line_naming_it(name, message):
  with pytest.raises(ValueError, match=message) as error:
    parse_target(name)
  assert name in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
  "environment, expected",
  [
    ({}, 3 * 2**30),  # JAX's default, 75%
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": "1"}, 4 * 2**30),  # the range's top
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".5"}, 2 * 2**30),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, 4 * 2**30),  # no pool
  ],
)
def test_a_gpus_capacity_is_the_pool_jax_takes_of_it(monkeypatch, environment, expected):
  """A run of 61.7 GiB 'fit' an H100's 79.14 GiB while JAX lets a process
  allocate 75% of it, 59.36 GiB: txf-run on that GPU would run out."""
  for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR"):
    monkeypatch.delenv(name, raising=False)
  for name, value in environment.items():
    monkeypatch.setenv(name, value)
  assert gpu_memory_pool(4 * 2**30) == expected
  pool = _pool(expected, 4 * 2**30)  # the report's first line says which
  assert pool.startswith("; a run may use all 4.00 GiB") == (expected == 4 * 2**30), pool
  assert parse_target("h100").memory_bytes == gpu_memory_pool(GPUS["h100"].memory_bytes)
  assert parse_target("v5e-8").memory_bytes == 15.75 * 2**30  # a TPU's is what XLA allows


@pytest.mark.slow  # four compiles
@needs_libtpu
@pytest.mark.parametrize("name", ["v4-8", "v5e-1", "v5p-8", "v6e-1"])
def test_a_tpus_capacity_is_the_hbm_xla_lets_a_program_use(name):
  """What XLA's refusal of a program too large says it has, to its 0.01
  GiB: a v5e's datasheet 16 GiB made 'over' and 'free' 0.25 GiB off."""
  from jax.sharding import SingleDeviceSharding

  target = parse_target(name)
  device = SingleDeviceSharding(target.devices()[0])
  double = jax.jit(lambda x: x * 2 + 1, out_shardings=device)
  too_large = jax.ShapeDtypeStruct((target.memory_bytes // 2,), "float32", sharding=device)
  with pytest.raises(Exception, match=r"exceeds available HBM") as error:
    double.lower(too_large).compile()
  available = float(re.search(r"available HBM \(([\d.]+)G\)", str(error.value))[1])
  assert target.memory_bytes / 2**30 == pytest.approx(available, abs=0.005)


@pytest.mark.parametrize("fraction", ["0", "1.5", "nan", "most"])
def test_a_memory_fraction_outside_the_range_is_one_line(monkeypatch, fraction):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", fraction)
  with pytest.raises(ValueError, match=r"^XLA_PYTHON_CLIENT_MEM_FRACTION: must be in \(0, 1\]"):
    parse_target("h100")


@pytest.mark.parametrize("name,extra", [("v5e-4", "tpu"), ("h100", "gpu-compile")])
def test_a_missing_compiler_names_the_extra_to_install(monkeypatch, name, extra):
  from jax.experimental import topologies

  from txf.extras import install_hint

  def unknown_backend(**kwargs):
    raise RuntimeError("Unknown backend: 'tpu' requested, but no platforms that are instances")

  monkeypatch.setattr(topologies, "get_topology_desc", unknown_backend)
  with pytest.raises(ImportError, match=re.escape(install_hint(extra))):
    parse_target(name).devices()


# ---------------------------------------------------------------------------
# The HLO reader, on a module written out by hand.

MODULE = """\
HloModule jit_step, entry_computation_layout={(f32[4,8]{1,0})->f32[4,8]{1,0}}

%fused_add (p0: f32[4,8], p1: f32[4,8]) -> f32[4,8] {
  %p0 = f32[4,8]{1,0} parameter(0)
  %p1 = f32[4,8]{1,0} parameter(1)
  ROOT %add.9 = f32[4,8]{1,0} add(%p0, %p1)
}

%all-reduce-scatter.3 (q0: f32[4,8]) -> f32[1,8] {
  %q0 = f32[4,8]{1,0} parameter(0)
  %inner = f32[4,8]{1,0} all-reduce(%q0), to_apply=%fused_add
  ROOT %part = f32[1,8]{1,0} slice(%inner), slice={[0:1], [0:8]}
}

%body (t: (s32[], bf16[8,16])) -> (s32[], bf16[8,16]) {
  %t = (s32[], bf16[8,16]{1,0}) parameter(0)
  %w = bf16[8,16]{1,0} get-tuple-element(%t), index=1
  %ag = bf16[32,16]{1,0} all-gather(%w), dimensions={0}
  ROOT %r = (s32[], bf16[8,16]{1,0}) tuple(%i, %w)
}

ENTRY %main (a: f32[4,8], b: bf16[8,16]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %b = bf16[8,16]{1,0} parameter(1)
  %loop_add_fusion = f32[4,8]{1,0} fusion(%a, %a), kind=kLoop, calls=%fused_add, \
metadata={op_name="jit(step)/transpose(jvp(Decoder))/Decoder._forward/stack/block_0/self_attention/add"}
  %gemm = (bf16[4,16]{1,0}, s8[1024]{0}) custom-call(%loop_add_fusion, %b), \
custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(step)/jvp(Decoder)/dense/dot"}
  %fmha = (bf16[4,16]{1,0}, u8[0]{0}) custom-call(%b), custom_call_target="__cudnn$fmhaSoftmax", \
metadata={op_name="jit(step)/jvp(Decoder)/Decoder._forward/stack/block_0/self_attention/attend"}
  %loss_fusion = f32[4]{0} fusion(%a), kind=kInput, calls=%fused_add, \
metadata={op_name="jit(step)/transpose(jvp())/reduce_sum"}
  %ars = f32[4,8]{1,0} all-reduce-start(%loop_add_fusion), to_apply=%fused_add
  %ard = f32[4,8]{1,0} all-reduce-done(%ars)
  %update = f32[4,8]{1,0} fusion(%ard, %a), kind=kLoop, calls=%fused_add, \
metadata={op_name="jit(step)/mul"}
  %rs = f32[1,8]{1,0} fusion(%ard), kind=kCustom, calls=%all-reduce-scatter.3
  %rss = ((f32[4,8]{1,0}), f32[1,8]{1,0}) reduce-scatter-start(%ard), dimensions={0}
  %rsd = f32[1,8]{1,0} reduce-scatter-done(%rss)
  %a2as = ((f32[4,8]{1,0}), f32[4,8]{1,0}) all-to-all-start(%a), dimensions={0}
  %a2ad = f32[4,8]{1,0} all-to-all-done(%a2as)
  %loop = (s32[], bf16[8,16]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %out = f32[4,8]{1,0} copy(%update)
}
"""


def test_hlo_reader_counts_the_device_work_and_its_bytes():
  program = {i.name: i for i in hlo.instructions(MODULE)}
  # The fusion's own add, parameters, tuples, the -done half: no device work.
  assert list(program) == [
    "ag", "loop_add_fusion", "gemm", "fmha", "loss_fusion", "ars", "update", "rs", "rss", "a2as",
    "out",
  ]  # fmt: skip
  assert program["loop_add_fusion"].bytes == 4 * 8 * 4 * 3  # two operands and the result
  assert program["gemm"].result_bytes == 4 * 16 * 2 + 1024
  assert program["gemm"].operand_bytes == 4 * 8 * 4 + 8 * 16 * 2
  # What a custom call moves: its buffers whole (counted as 0, a GEMM passed).
  gemm = program["gemm"]
  assert gemm.bytes == gemm.result_bytes + gemm.operand_bytes > 0
  assert program["gemm"].is_gemm and not program["fmha"].is_gemm
  assert program["fmha"].is_cudnn_attention
  assert program["loop_add_fusion"].target == "kLoop"
  # The collectives: the gather's full buffer, the all-reduce's operand.
  assert hlo.collectives(MODULE) == {
    "all-gather": {"count": 1, "bytes": 32 * 16 * 2},
    "all-reduce": {"count": 1, "bytes": 4 * 8 * 4},
    # TPU's (a fusion, whose computation's own all-reduce is not counted
    # again as one) and a GPU's (a start whose result holds its operand):
    # each counts the buffer it reduces.
    "reduce-scatter": {"count": 2, "bytes": 2 * 4 * 8 * 4},
    "all-to-all": {"count": 1, "bytes": 4 * 8 * 4},
  }


# A decoding program's shape: a token loop whose body launches two fusions,
# a branch (each side one fusion), a reduction (its combiner is no kernel),
# and whose condition launches one; a second, smaller loop.
LOOPS = """\
HloModule jit_generate

%fused (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %neg = f32[4]{0} negate(%p0)
}

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

%left (x: f32[4]) -> f32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %l = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused
}

%right (y: f32[4]) -> f32[4] {
  %y = f32[4]{0} parameter(0)
  ROOT %r = f32[4]{0} fusion(%y), kind=kLoop, calls=%fused
}

%token_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  %v = f32[4]{0} get-tuple-element(%t), index=1
  %f1 = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused
  %f2 = (f32[4]{0}, f32[4]{0}) fusion(%f1), kind=kInput, calls=%fused
  %c = f32[4]{0} conditional(%p, %v, %v), branch_computations={%left, %right}
  %z = f32[] constant(0)
  %s = f32[] reduce(%c, %z), dimensions={0}, to_apply=%sum
  ROOT %o = (s32[], f32[4]{0}) tuple(%i, %c)
}

%token_cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %lt = pred[] fusion(%t), kind=kLoop, calls=%fused
}

%small_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]{0}) parameter(0)
  ROOT %g = (s32[], f32[4]{0}) fusion(%t), kind=kLoop, calls=%fused
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %prefill = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused
  %tokens = (s32[], f32[4]{0}) while(%t0), condition=%token_cond, body=%token_body
  %other = (s32[], f32[4]{0}) while(%t1), condition=%token_cond, body=%small_body
  ROOT %out = f32[4]{0} copy(%prefill)
}
"""


# A scanned stack's shape: a layer loop of known trip count 3 whose body
# runs a fusion and writes one layer's slice of a stacked buffer in place.
SCANNED = """\
HloModule jit_step

%fused (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %neg = f32[4]{0} negate(%p0)
}

%write (stack: f32[3,4], row: f32[1,4], i: s32[]) -> f32[3,4] {
  %stack = f32[3,4]{1,0} parameter(0)
  %row = f32[1,4]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = f32[3,4]{1,0} dynamic-update-slice(%stack, %row, %i, %z)
}

%layer_body (t: (s32[], f32[3,4])) -> (s32[], f32[3,4]) {
  %t = (s32[], f32[3,4]{1,0}) parameter(0)
  %x = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused, metadata={op_name="jit(step)/jvp(M)/mul"}
  %saved = f32[3,4]{1,0} fusion(%s, %r, %i), kind=kLoop, calls=%write
  %ag = f32[8]{0} all-gather(%x), dimensions={0}
  ROOT %o = (s32[], f32[3,4]{1,0}) tuple(%i, %saved)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %layers = (s32[], f32[3,4]{1,0}) while(%t0), condition=%layer_cond, body=%layer_body, \
backend_config={"known_trip_count":{"n":"3"}}
  ROOT %out = f32[4]{0} copy(%a)
}
"""


def test_a_known_loops_instructions_count_once_per_iteration():
  """A scanned stack's kernels counted once, not once per layer (gpt2_small
  scanned: 188 kernels a step of its 1,321), and a layer's write into the
  stacked buffer counted the whole buffer each time."""
  program = {i.name: i for i in hlo.instructions(SCANNED)}
  assert {name: i.times for name, i in program.items()} == {"x": 3, "saved": 3, "ag": 3, "out": 1}
  assert program["x"].bytes == 2 * 4 * 4  # its operand and result whole
  # The row read and written and the index read, not the stack (48 bytes).
  assert program["saved"].bytes == 2 * 1 * 4 * 4 + 4
  kernels = gpu_kernels(list(program.values()))
  assert kernels["kernels"] == 3 + 3 + 3 + 1
  assert kernels["non_gemm_bytes"] == 3 * (32 + 36 + program["ag"].bytes) + 2 * 4 * 4
  assert hlo.collectives(SCANNED) == {"all-gather": {"count": 3, "bytes": 3 * 8 * 4}}
  unknown = SCANNED.replace('backend_config={"known_trip_count":{"n":"3"}}', "")
  assert {i.name: i.times for i in hlo.instructions(unknown)}["x"] == 1  # counted once


def test_loop_kernels_counts_one_iteration_of_the_busiest_loop():
  # Body: 2 fusions + 2 branch fusions + the reduce; condition: 1.
  assert hlo.loop_kernels(LOOPS) == 6
  assert hlo.loop_kernels(MODULE) == 1  # its loop's all-gather (no condition defined)
  assert hlo.loop_kernels(MODULE.replace("while(", "call(")) == 0


# Loops in loops: an outer loop of known trip count 2 around a middle one of
# 3 around an inner one of 5, each level with a kernel outside GEMMs; the
# inner body runs two GEMMs (a cuBLAS call with its workspace, a Triton GEMM
# fusion) and an all-gather, and its condition one kernel; the entry one
# GEMM and one kernel. The outer two loops' conditions are not written out;
# STATE / TYPES stand for the loops' state's type (with and without layouts).
OUTER, MIDDLE, INNER = 2, 3, 5
NESTED = (
  """\
HloModule jit_step

%fused (p0: f32[4]) -> f32[4] {
  %p0 = f32[4]{0} parameter(0)
  ROOT %neg = f32[4]{0} negate(%p0)
}

%fused_less (p0: s32[]) -> pred[] {
  %p0 = s32[] parameter(0)
  %five = s32[] constant(5)
  ROOT %lt = pred[] compare(%p0, %five), direction=LT
}

%triton_gemm (x: bf16[16,32], w: bf16[32,64]) -> bf16[16,64] {
  %x = bf16[16,32]{1,0} parameter(0)
  %w = bf16[32,64]{1,0} parameter(1)
  ROOT %dot = bf16[16,64]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%inner_body (t: TYPES) -> TYPES {
  %t = STATE parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = bf16[16,32]{1,0} get-tuple-element(%t), index=1
  %w = bf16[32,64]{1,0} get-tuple-element(%t), index=2
  %v = f32[4]{0} get-tuple-element(%t), index=3
  %cublas = (bf16[16,64]{1,0}, s8[4096]{0}) custom-call(%x, %w), custom_call_target="__cublas$gemm"
  %triton = bf16[16,64]{1,0} fusion(%x, %w), kind=kCustom, calls=%triton_gemm, \
backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %inner_neg = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused
  %ag = f32[8]{0} all-gather(%inner_neg), dimensions={0}
  ROOT %o = STATE tuple(%i, %x, %w, %inner_neg)
}

%inner_cond (t: TYPES) -> pred[] {
  %t = STATE parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %inner_lt = pred[] fusion(%i), kind=kLoop, calls=%fused_less
}

%middle_body (t: TYPES) -> TYPES {
  %t = STATE parameter(0)
  %v = f32[4]{0} get-tuple-element(%t), index=3
  %middle_neg = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused
  ROOT %inner = STATE while(%t), condition=%inner_cond, body=%inner_body, \
backend_config={"known_trip_count":{"n":"INNER"}}
}

%outer_body (t: TYPES) -> TYPES {
  %t = STATE parameter(0)
  %v = f32[4]{0} get-tuple-element(%t), index=3
  %outer_neg = f32[4]{0} fusion(%v), kind=kLoop, calls=%fused
  ROOT %middle = STATE while(%t), condition=%middle_cond, body=%middle_body, \
backend_config={"known_trip_count":{"n":"MIDDLE"}}
}

ENTRY %main (a: bf16[16,32], b: bf16[32,64], c: f32[4]) -> bf16[16,64] {
  %a = bf16[16,32]{1,0} parameter(0)
  %b = bf16[32,64]{1,0} parameter(1)
  %c = f32[4]{0} parameter(2)
  %entry_neg = f32[4]{0} fusion(%c), kind=kLoop, calls=%fused
  %z = s32[] constant(0)
  %t0 = STATE tuple(%z, %a, %b, %entry_neg)
  %outer = STATE while(%t0), condition=%outer_cond, body=%outer_body, \
backend_config={"known_trip_count":{"n":"OUTER"}}
  ROOT %entry_gemm = (bf16[16,64]{1,0}, s8[4096]{0}) custom-call(%a, %b), \
custom_call_target="__cublas$lt$matmul"
}
""".replace("STATE", "(s32[], bf16[16,32]{1,0}, bf16[32,64]{1,0}, f32[4]{0})")
  .replace("TYPES", "(s32[], bf16[16,32], bf16[32,64], f32[4])")
  .replace("INNER", str(INNER))
  .replace("MIDDLE", str(MIDDLE))
  .replace("OUTER", str(OUTER))
)


def test_gemms_and_their_bytes_count_once_per_iteration_of_their_loops():
  """gpu_kernels weighs a GEMM inside loops by how often it runs, as it
  does the kernels outside GEMMs: its count by backend and its bytes (a
  cuBLAS call's buffers whole with its workspace, a Triton GEMM fusion's
  operands and result) OUTER * MIDDLE * INNER times, the entry's once."""
  program = hlo.instructions(NESTED)
  deepest = OUTER * MIDDLE * INNER
  x, w, out = 16 * 32 * 2, 32 * 64 * 2, 16 * 64 * 2
  cublas, triton = x + w + out + 4096, x + w + out
  assert {i.name: i.bytes for i in program if i.is_gemm} == {
    "cublas": cublas,
    "triton": triton,
    "entry_gemm": cublas,
  }
  kernels = gpu_kernels(program)
  assert kernels["gemms"] == {"cublas": deepest + 1, "triton": deepest}
  assert kernels["gemm_bytes"] == deepest * (cublas + triton) + cublas


def test_nested_loops_multiply_their_trip_counts_into_every_figure():
  """An instruction inside loops inside loops runs the product of their
  trip counts (the inner loop's times the outer ones', not its own alone),
  its loop's body and condition alike; the kernels outside GEMMs, their
  bytes and the all-gather weigh so; loop_traffic's one iteration of the
  outermost loop runs the middle loop's body MIDDLE times and the inner
  loop's MIDDLE * INNER (one iteration of a loop, each loop inside it
  weighed by its trip count)."""
  program = {i.name: i for i in hlo.instructions(NESTED)}
  deepest = OUTER * MIDDLE * INNER
  assert {name: i.times for name, i in program.items()} == {
    "cublas": deepest, "triton": deepest, "inner_neg": deepest, "ag": deepest,
    "inner_lt": deepest, "middle_neg": OUTER * MIDDLE, "outer_neg": OUTER, "entry_neg": 1,
    "entry_gemm": 1,
  }  # fmt: skip
  neg, less, gathered = 2 * 4 * 4, 4 + 1, 4 * 4 + 8 * 4  # operands and results whole
  kernels = gpu_kernels(list(program.values()))
  assert kernels["kernels"] == 5 * deepest + OUTER * MIDDLE + OUTER + 2
  assert kernels["non_gemm_bytes"] == (
    deepest * (neg + gathered + less) + OUTER * MIDDLE * neg + OUTER * neg + neg
  )
  assert hlo.collectives(NESTED) == {"all-gather": {"count": deepest, "bytes": deepest * 8 * 4}}
  gemms = program["cublas"].bytes + program["triton"].bytes
  assert loop_traffic(NESTED) == dict(
    kernels=1 + MIDDLE * (1 + INNER * 5),
    bytes=neg + MIDDLE * (neg + INNER * (gemms + neg + gathered + less)),
    layer_kernels=0,
    layer_bytes=0,
  )


# Fusions that gather rows: 8 rows of a 1,000-row table; 8 and 4 rows of it
# by two gathers, one through a bitcast; 8 rows of it beside a sum that
# reads it whole; 2,000 rows of a 16-row table (more than it holds).
ROWS, TABLE, WIDTH = 8, 1000, 64
GATHERS = """\
HloModule jit_step

%fused_rows (table: f32[1000,64], ids: s32[8,1]) -> f32[8,64] {
  %table = f32[1000,64]{1,0} parameter(0)
  %ids = s32[8,1]{1,0} parameter(1)
  ROOT %rows = f32[8,64]{1,0} gather(%table, %ids), offset_dims={1}, collapsed_slice_dims={0}, \
start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
}

%fused_two (table: f32[1000,64], ids: s32[8,1], more: s32[4,1]) -> (f32[8,64], f32[4,64]) {
  %table = f32[1000,64]{1,0} parameter(0)
  %ids = s32[8,1]{1,0} parameter(1)
  %more = s32[4,1]{1,0} parameter(2)
  %view = f32[1000,64]{1,0} bitcast(%table)
  %a = f32[8,64]{1,0} gather(%table, %ids), offset_dims={1}, collapsed_slice_dims={0}, \
start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  %b = f32[4,64]{1,0} gather(%view, %more), offset_dims={1}, collapsed_slice_dims={0}, \
start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  ROOT %both = (f32[8,64]{1,0}, f32[4,64]{1,0}) tuple(%a, %b)
}

%fused_rows_and_sum (table: f32[1000,64], ids: s32[8,1]) -> (f32[8,64], f32[1000,64]) {
  %table = f32[1000,64]{1,0} parameter(0)
  %ids = s32[8,1]{1,0} parameter(1)
  %rows = f32[8,64]{1,0} gather(%table, %ids), offset_dims={1}, collapsed_slice_dims={0}, \
start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
  %twice = f32[1000,64]{1,0} add(%table, %table)
  ROOT %out = (f32[8,64]{1,0}, f32[1000,64]{1,0}) tuple(%rows, %twice)
}

%fused_many (small: f32[16,64], ids: s32[2000,1]) -> f32[2000,64] {
  %small = f32[16,64]{1,0} parameter(0)
  %ids = s32[2000,1]{1,0} parameter(1)
  ROOT %many = f32[2000,64]{1,0} gather(%small, %ids), offset_dims={1}, collapsed_slice_dims={0}, \
start_index_map={0}, index_vector_dim=1, slice_sizes={1,64}
}

ENTRY %main (table: f32[1000,64], ids: s32[8,1], more: s32[4,1], small: f32[16,64], \
many_ids: s32[2000,1]) -> f32[8,64] {
  %table = f32[1000,64]{1,0} parameter(0)
  %ids = s32[8,1]{1,0} parameter(1)
  %more = s32[4,1]{1,0} parameter(2)
  %small = f32[16,64]{1,0} parameter(3)
  %many_ids = s32[2000,1]{1,0} parameter(4)
  %two = (f32[8,64]{1,0}, f32[4,64]{1,0}) fusion(%table, %ids, %more), kind=kLoop, calls=%fused_two
  %rows_and_sum = (f32[8,64]{1,0}, f32[1000,64]{1,0}) fusion(%table, %ids), kind=kLoop, \
calls=%fused_rows_and_sum
  %many = f32[2000,64]{1,0} fusion(%small, %many_ids), kind=kLoop, calls=%fused_many
  ROOT %rows = f32[8,64]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_rows
}
"""


def test_a_fusion_that_gathers_from_an_operand_reads_the_rows_it_gathers():
  """A fusion that reads an operand only through gathers (through a bitcast
  too) counts the gathered rows of it, not the whole table, and at most the
  table (a gather of more rows than it holds); read whole besides, it
  counts whole. The indices are read whole, the results written whole."""
  program = {i.name: i for i in hlo.instructions(GATHERS)}
  row, table, ids = WIDTH * 4, TABLE * WIDTH * 4, ROWS * 4
  assert program["rows"].operand_bytes == table + ids  # the buffers whole
  assert program["rows"].bytes == 2 * ROWS * row + ids  # the rows read and written
  assert program["two"].bytes == 2 * (ROWS + 4) * row + ids + 4 * 4
  assert program["rows_and_sum"].bytes == table + ids + ROWS * row + table
  small = 16 * WIDTH * 4
  assert program["many"].bytes == small + 2000 * 4 + 2000 * row


# A loss's shape: the label's logit of each of 16 rows gathered from bf16
# logits by s32 labels (the gathered part smaller than the labels), and a
# flag read from a pred buffer at an s32 index.
LABELS = """\
HloModule jit_step

%fused_pick (logits: bf16[16,1000], labels: s32[16,2]) -> bf16[16] {
  %logits = bf16[16,1000]{1,0} parameter(0)
  %labels = s32[16,2]{1,0} parameter(1)
  ROOT %picked = bf16[16]{0} gather(%logits, %labels), offset_dims={}, \
collapsed_slice_dims={0,1}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,1}
}

%fused_flag (flags: pred[100], i: s32[]) -> pred[1] {
  %flags = pred[100]{0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %flag = pred[1]{0} dynamic-slice(%flags, %i), dynamic_slice_sizes={1}
}

ENTRY %main (logits: bf16[16,1000], labels: s32[16,2], flags: pred[100], i: s32[]) -> bf16[16] {
  %logits = bf16[16,1000]{1,0} parameter(0)
  %labels = s32[16,2]{1,0} parameter(1)
  %flags = pred[100]{0} parameter(2)
  %i = s32[] parameter(3)
  %flag = pred[1]{0} fusion(%flags, %i), kind=kLoop, calls=%fused_flag
  ROOT %picked = bf16[16]{0} fusion(%logits, %labels), kind=kLoop, calls=%fused_pick
}
"""


def test_a_gathers_indices_are_read_whole_even_where_they_outweigh_what_it_gathers():
  """Only the operand a gather or dynamic-slice slices counts the slice; its
  indices it reads whole, where they are more bytes than the slice too (16
  bf16 logits gathered by 16 pairs of s32 indices: 32 bytes gathered, 128 of
  indices; a pred read at an s32 index)."""
  program = {i.name: i for i in hlo.instructions(LABELS)}
  assert program["picked"].bytes == 16 * 2 + 16 * 2 * 4 + 16 * 2  # gathered, indices, result
  assert program["flag"].bytes == 1 + 4 + 1


@pytest.mark.parametrize(
  "op_name,region",
  [
    ("jit(train_step)/mul", "optimizer"),
    ("jit(train_step)/jit(_where)/select_n", "optimizer"),
    ("jit(train_step)/transpose(jvp())/reduce_sum", "loss"),
    ("jit(train_step)/jvp(Decoder)/Decoder._forward/head/dot_general", "loss"),
    ("jit(train_step)/transpose(jvp(jit(take_along_axis)))/scatter-add", "loss"),
    ("jit(train_step)/jvp(vmap(cross_entropy_statistics_and_gradient))/pallas_call", "loss"),
    ("jit(train_step)/jvp(Decoder)/Decoder._forward/stack/block_3/self_attention/x", "attention"),
    ("jit(train_step)/jvp(Decoder)/Decoder._forward/stack/block_0/cross_attention/x", "attention"),
    ("jit(train_step)/jvp(Decoder)/Decoder._forward/stack/block_0/self_attention_norm/x", "model"),
    ("jit(train_step)/transpose(jvp(Decoder))/Decoder._forward/stack/block_0/ffn/wo", "model"),
  ],
)
def test_each_op_falls_in_its_region_of_the_step(op_name, region):
  assert hlo.region(op_name) == region


# ---------------------------------------------------------------------------
# Tiny runs compiled for targets.


def argument_bytes(run):
  """Per-device argument bytes of a compiled train step, less its share of the batch."""
  batch = next(iter(run.setup.train_data))
  batch_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in batch.values())
  figures = report(run)
  return figures["per_device"]["arguments_bytes"] - batch_bytes / figures["devices"]


DECODE_TOKENS = 8
# One layer: each GPU compile costs ~10 s on 2 cores, a quarter more with two.
LAYERS = 1


@pytest.fixture(scope="module")
def h100x4_runs():
  """A 1-layer bf16 run compiled for 4 H100s, data-parallel (with its
  decoding of DECODE_TOKENS tokens) and FSDP."""
  config = tiny_config(
    "rope", model__d_model=128, model__num_layers=LAYERS, model__dtype="bfloat16"
  )
  runs = {"data": compile_run(parse(config), parse_target("h100x4"), decode_tokens=DECODE_TOKENS)}
  config.parallel.fsdp = 4
  runs["fsdp"] = compile_run(parse(config), parse_target("h100x4"))
  return runs


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_fsdp_divides_the_state_each_gpu_holds(h100x4_runs):
  # On GPUs arrays are not padded to tiles (TPUs pad a [32, 64] shard to 128 lanes).
  state = sum(
    math.prod(x.shape) * x.dtype.itemsize
    for x in jax.tree.leaves(h100x4_runs["data"].setup.abstract_state)
  )
  assert argument_bytes(h100x4_runs["data"]) == pytest.approx(state, rel=0.01)
  assert argument_bytes(h100x4_runs["fsdp"]) == pytest.approx(state / 4, rel=0.01)


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_every_collective_of_a_gpu_fsdp_step_is_counted_and_launches(h100x4_runs):
  """A GPU runs its collectives as -start/-done pairs: each start is one
  collective of its kind and one launch (the report once missed FSDP's
  reduce-scatters and all-to-alls). Counted here from the text's opcodes."""
  run = h100x4_runs["fsdp"]
  text = run.train_step.as_text()
  kinds = "all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute"
  found = re.findall(rf"^\s*(?:ROOT )?%([\w.\-]+) = .*? ({kinds})(?:-start)?\(", text, re.M)
  expected: dict[str, int] = {}
  for _, kind in found:
    expected[kind] = expected.get(kind, 0) + 1
  assert "reduce-scatter" in expected  # FSDP's gradients
  figures = report(run)
  assert {kind: row["count"] for kind, row in figures["collectives"].items()} == expected
  launched = {instruction.name for instruction in hlo.instructions(text)}
  assert {name for name, _ in found} <= launched


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_the_gradient_norm_concatenates_the_leaves_only_where_each_gpu_holds_them_whole(
  h100x4_runs,
):
  """A concatenation of FSDP-sharded leaves is gathered whole onto each
  device (a 1.3B model's step stopped fitting a v5e chip, 17.7 GiB of
  temporaries for 10.7): under FSDP the norm is reduced leaf by leaf."""
  sizes = [
    math.prod(x.shape) for x in jax.tree.leaves(h100x4_runs["data"].setup.abstract_state.params)
  ]
  concatenated = f"f32[{sum(n for n in sizes if n < optim.CONCATENATED_BELOW)}]"
  assert concatenated in h100x4_runs["data"].train_step.as_text()
  assert concatenated not in h100x4_runs["fsdp"].train_step.as_text()


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_one_gpu_writes_the_loss_gradient_once_from_the_bf16_logits(h100x4_runs):
  """On one GPU the loss is one Pallas kernel over the head's bf16 logits,
  and no other kernel outside GEMMs produces a [B*T, V] array: no float32
  copy of the logits and no rescaling of them (`scale_logits`, on in this
  config) forward, no scaling of their gradient by the loss's cotangent
  backward (the step's weights carry 1 / tokens, so the cotangent is
  jax.grad's 1.0, which XLA drops). With seed replicas, so under vmap. On
  several GPUs (the h100x4 programs) the XLA path runs instead."""
  config = tiny_config(
    "rope", model__d_model=128, model__num_layers=LAYERS, model__dtype="bfloat16"
  )
  config.replicas = 2
  run = compile_run(parse(config), parse_target("h100"))
  assert run.setup.model.cfg.scale_logits
  text = run.train_step.as_text()
  vocab = run.setup.model.cfg.vocab_size
  replicas = config.replicas  # sharing one batch, [B, T]
  batch, length = abstract_batch(run.setup)["targets"].shape
  # The norms are Triton calls of their own (txf.ops.norms): the loss's by name.
  (kernel,) = [
    line
    for line in text.splitlines()
    if '"__gpu$xla.gpu.triton"' in line and "cross_entropy_statistics_and_gradient" in line
  ]
  assert f"bf16[{replicas},{batch * length},{vocab}]" in kernel
  assert hlo.region(re.search(r'op_name="([^"]+)"', kernel)[1]) == "loss"
  assert "__gpu$xla.gpu.triton" not in h100x4_runs["data"].train_step.as_text()
  logits_shape = rf"\[{replicas},(?:{batch * length}|{batch},{length}),{vocab}\]"
  wide = re.compile(rf"= \w+{logits_shape}\S* fusion\(.*kind=k(?:Loop|Input)")
  # A split-K GEMM's own reduction (tiny shapes get one) is the GEMM's work.
  passes = [line for line in text.splitlines() if wide.search(line) and "dot_general" not in line]
  assert not passes


def _heads_to_rows(length):
  """[B, H, D, T] heads (T = length) to [B * T, H * D] rows, times a [H * D, 128]
  kernel, lowered on one H100: the shape of attention's out projection."""
  import jax.numpy as jnp  # noqa: PLC0415

  on_device = jax.sharding.SingleDeviceSharding(parse_target("h100").devices()[0])
  x = jax.ShapeDtypeStruct((32, 4, 32, length), jnp.float32, sharding=on_device)
  w = jax.ShapeDtypeStruct((128, 128), jnp.float32, sharding=on_device)
  rows = lambda x, w: jnp.transpose(x, (0, 3, 1, 2)).reshape(32 * length, 128) @ w
  return jax.jit(rows).lower(x, w)


@needs_cuda_plugin
def test_a_gemm_xlas_untuned_triton_config_cannot_tile_compiles_on_cublas_and_names_it():
  """Deviceless, XLA gives a Triton GEMM its search space's first config (16
  rows a block) uncompiled; rows folding T = 24 positions cannot be tiled by
  it, and the compile failed (seq2seq's out projection). The program compiles
  again with every GEMM on cuBLAS, naming the dot; T = 32 tiles and stays on
  Triton."""
  from txf.aot.compile import compile_lowered  # noqa: PLC0415

  target = parse_target("h100")
  compiled, dot = compile_lowered(_heads_to_rows(24), target)
  assert dot is not None and dot.endswith("dot_general")
  gemms = lambda compiled: gpu_kernels(hlo.instructions(compiled.as_text()))["gemms"]
  assert gemms(compiled) == {"cublas": 1}
  compiled, dot = compile_lowered(_heads_to_rows(32), target)
  assert dot is None and gemms(compiled) == {"triton": 1}


@pytest.mark.slow  # compiles (about 25 s)
@needs_cuda_plugin
def test_a_seq2seq_run_compiles_for_one_gpu_and_says_its_gemms_are_on_cublas():
  """seq2seq's 24 positions: both steps fall back to cuBLAS GEMMs, and the
  report says so in one line."""
  run = compile_run(parse(tiny_config("seq2seq")), parse_target("h100"))
  assert set(run.cublas_gemms) == {"train_step", "eval_step"}
  assert all(dot.endswith("out/dot_general") for dot in run.cublas_gemms.values())
  figures = report(run)
  assert figures["cublas_gemms"] == run.cublas_gemms
  assert set(figures["gpu"]["gemms"]) == {"cublas"}
  (line,) = [line for line in format_report(figures).splitlines() if "GEMMs all on cuBLAS" in line]
  assert "train step: " in line and "eval step: " in line


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_the_chunked_loss_compiles_for_one_gpu_under_seed_replicas():
  """The fused chunked loss takes the LM head as its matrix
  (`LMHead.scaled_kernel`). It used to take the head's product with a
  [D, D] identity, whose gradient under 3 replicas of the byte vocabulary
  XLA could not tile for a GPU GEMM (bf16[780, 128]): the compile failed."""
  config = tiny_config(
    "rope", model__d_model=128, model__num_layers=LAYERS, model__dtype="bfloat16"
  )
  config.replicas = 3
  config.train.loss_chunk_len = 16
  run = compile_run(parse(config), parse_target("h100"))
  assert run.setup.model.cfg.vocab_size == 260
  # The loss is the fused chunked one: a loop over the 2 chunks of 16 positions.
  assert "while(" in run.train_step.as_text()


@pytest.mark.slow  # compiles
@needs_libtpu
def test_a_tpu_slice_gathers_and_scatters_under_fsdp_and_all_reduces_without():
  config = tiny_config("rope", model__d_model=128)
  data = report(compile_run(parse(config), parse_target("v5e-4")))
  config.parallel.fsdp = 4
  fsdp_run = compile_run(parse(config), parse_target("v5e-4"))
  fsdp = report(fsdp_run)
  assert data["mesh"] == {"data": 4, "fsdp": 1, "tensor": 1}
  assert fsdp["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1}
  assert "all-reduce" in data["collectives"] and "all-gather" not in data["collectives"]
  assert {"all-gather", "reduce-scatter"} <= set(fsdp["collectives"])
  assert fsdp["device_kind"] == "TPU v5 lite" and fsdp["devices"] == 4 and fsdp["fits"]
  # The compiler counts the step's FLOPs on TPUs; within a factor of the model's count.
  compiler, model = fsdp["flops"]["compiler_per_device"], fsdp["flops"]["model_per_device"]
  assert 0.5 < compiler / model < 2
  # q, k and v are one GEMM over their kernels stacked; each kernel is
  # gathered before the stack, since XLA gathered the stacked kernel anew for
  # each of its uses (decoder_1b on a v5e-16: 22.3 against 14.9 GiB a step).
  d, heads, head_dim = fsdp_run.setup.abstract_state.params["stack"]["block_0"]["self_attention"][
    "query"
  ]["kernel"].shape
  gathered = re.findall(r"= (.*?) all-gather(?:-start)?\(", fsdp_run.train_step.as_text())
  assert any(f"[{d},{heads},{head_dim}]" in shape for shape in gathered)
  assert not any(f"[{d},3,{heads},{head_dim}]" in shape for shape in gathered)


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_an_h100_program_has_cudnn_attention_and_its_regions(h100x4_runs):
  run = h100x4_runs["data"]
  assert run.cudnn
  figures = report(run, step_seconds=1e-3)
  gpu = figures["gpu"]
  # Forward and backward, each layer.
  assert gpu["cudnn_attention_calls"] == 2 * LAYERS
  assert sum(gpu["gemms"].values()) > 0 and gpu["kernels"] > sum(gpu["gemms"].values())
  assert all(row["kernels"] > 0 and row["bytes"] > 0 for row in gpu["regions"].values())
  assert gpu["non_gemm_bytes"] == pytest.approx(sum(r["bytes"] for r in gpu["regions"].values()))
  line = figures["roofline"]
  assert line["peak_flops"] == 989.5e12
  model_flops = figures["flops"]["model_per_device"]
  assert line["mfu_at_assumed"] == pytest.approx(model_flops / 989.5e12 / 1e-3)
  assert line["step_seconds_bound"] == max(line["compute_seconds"], line["memory_seconds"])
  # The GPU entry's kernel table is the compiled program's own.
  text = run.train_step.as_text()
  assert text.count('custom_call_target="__cudnn$fmha') == gpu["cudnn_attention_calls"]


@pytest.mark.slow  # compiles
@needs_cuda_plugin
def test_decoding_compiles_with_its_memory_and_kernels_per_token(h100x4_runs):
  run = h100x4_runs["data"]
  decode = report(run)["decode"]
  assert decode["new_tokens"] == DECODE_TOKENS and decode["fits"]
  # Its arguments: the parameters (replicated on each GPU), the int32 prompt,
  # the sampling key (two uint32) and the float32 temperature.
  params = sum(
    math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(run.setup.abstract_state.params)
  )
  prompt = 4 * len(run.setup.train_data.tokenizer.encode(run.setup.run.eval.sample_prompt))
  assert decode["arguments_bytes"] == params + prompt + 2 * 4 + 4
  # Each token runs each layer's q/k/v, output and two FFN projections and
  # the head: at least LAYERS * 4 + 1 GEMMs, and fewer kernels than the whole
  # program (which also runs the prompt).
  assert LAYERS * 4 + 1 <= decode["kernels_per_token"] < len(hlo.instructions(run.decode.as_text()))
  assert h100x4_runs["fsdp"].decode is None  # not asked for


@needs_libtpu
def test_a_batch_that_does_not_split_over_the_slice_is_a_config_error():
  with pytest.raises(ConfigError, match=r"^data\.batch_size: 6 is not divisible by .* = 4$"):
    compile_run(parse(tiny_config("rope", data__batch_size=6)), parse_target("v5e-4"))


@needs_libtpu
def test_replicas_with_their_own_batches_lower_with_a_replica_axis_on_the_train_batch_only():
  """data.seed_per_replica: the train step takes [R, B, T] batches split along
  B (R whole), the eval step the shared [B, T] ones; both lower (traced for
  the slice, not compiled)."""
  config = tiny_config("rope", data__seed_per_replica=True)
  config.replicas = 2
  setup = setup_run(parse(config), devices=parse_target("v5e-4").devices())
  train, evaluation = abstract_batch(setup), abstract_batch(setup, train=False)
  rows, length = config.data.batch_size, config.data.seq_len
  assert {x.shape for x in train.values()} == {(2, rows, length)}
  assert {x.shape for x in evaluation.values()} == {(rows, length)}
  assert {x.sharding.spec for x in train.values()} == {PartitionSpec(None, ("data", "fsdp"))}
  with setup.activation_sharding():
    setup.train_step.lower(setup.abstract_state, train)
    setup.eval_step.lower(setup.abstract_state.params, evaluation)


@needs_libtpu
def test_several_slices_are_data_parallel_across_slices_and_the_rest_within_each():
  """MaxText's layout: the data axis spans the slices (the data-center
  network), fsdp and tensor stay within a slice (jax.make_mesh refused
  several slices)."""
  config = tiny_config("rope", parallel__fsdp=2)
  setup = setup_run(parse(config), devices=parse_target("v5e-4x2").devices())
  assert dict(setup.mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
  slices = [[device.slice_index for device in row.flat] for row in setup.mesh.devices]
  assert slices == [[0, 0], [0, 0], [1, 1], [1, 1]]


@needs_libtpu
def test_a_data_axis_that_does_not_span_the_slices_is_a_config_error():
  config = tiny_config("rope", parallel__fsdp=8)
  with pytest.raises(ConfigError, match=r"^parallel.data = 1 is not a multiple of the 2 slices"):
    setup_run(parse(config), devices=parse_target("v5e-4x2").devices())


@pytest.mark.slow  # compiles
@needs_libtpu
def test_two_slices_compile_with_the_gradients_reduced_across_them():
  figures = report(
    compile_run(parse(tiny_config("rope", model__d_model=128)), parse_target("v5e-4x2"))
  )
  assert figures["devices"] == 8 and figures["mesh"]["data"] == 8 and figures["fits"]
  assert "all-reduce" in figures["collectives"]


@needs_libtpu
def test_a_sentencepiece_run_compiles_at_its_vocabulary_size_training_nothing(tmp_path):
  """txf-compile has no work directory to train the tokenizer into: the
  programs see the vocabulary only through its size, data.sp_vocab_size."""
  config = tiny_config("rope", data__tokenizer="sentencepiece", data__sp_vocab_size=1000)
  compiled = untrained_tokenizer(parse(config))
  assert config.data.tokenizer == "sentencepiece"  # the caller's config is left as it was
  setup = setup_run(compiled, devices=parse_target("v5e-4").devices())
  assert setup.model.cfg.vocab_size == 1000
  shapes = {x.shape for x in jax.tree.leaves(setup.abstract_state.params)}
  assert (1000, config.model.d_model) in shapes  # the embedding
  # model.vocab_size, where set, is kept.
  config.model.vocab_size = 1024
  assert untrained_tokenizer(parse(config)).model.vocab_size == 1024
  # Started from a sentencepiece run (pretrained:RUN): the bytes tokenizer
  # was refused as not the one the run recorded ("the tokenizer's contents
  # (sha256 None) differ"), where txf-run trains it.
  source = tmp_path / "sentencepiece_run"
  source.mkdir()
  (source / "run_record.json").write_text(json.dumps([{"tokenizer": {"sha256": "ab" * 32}}]))
  config.train.init_from = str(source)
  compiled = untrained_tokenizer(parse(config))
  assert compiled.train.init_from is None
  assert setup_run(compiled, devices=parse_target("v5e-4").devices()).model.cfg.vocab_size == 1024


@needs_cuda_plugin
def test_decoding_is_compiled_for_language_models_only():
  with pytest.raises(ConfigError, match="decode_tokens: decoding compiles for a language model"):
    compile_run(parse(tiny_config("encoder_mlm")), parse_target("h100"), decode_tokens=4)


@needs_cuda_plugin
def test_decode_tokens_beyond_the_position_table_are_a_config_error_before_any_compile(
  monkeypatch,
):
  """generate's own check of its cache against the learned table, found by
  lowering the sampler before the train step compiles."""
  import txf.aot.compile
  from txf.decode import cache_length

  def stage(name):  # each program's compile starts one
    raise AssertionError(name)

  monkeypatch.setattr(txf.aot.compile, "stage", stage)
  run = parse(tiny_config("learned", model__max_len=32))
  setup = setup_run(run, devices=parse_target("h100").devices())
  prompt = len(setup.train_data.tokenizer.encode(run.eval.sample_prompt))
  assert cache_length(prompt, 40) > 32 >= cache_length(prompt, 4)
  with pytest.raises(ConfigError, match=r"^decode_tokens: model\.max_len: .* longer than"):
    compile_run(run, parse_target("h100"), decode_tokens=40)
  # Within the table: on to the train step's compile, which `stage` stops.
  with pytest.raises(txf.aot.compile.CompileError, match="compile: the train step for h100$"):
    compile_run(run, parse_target("h100"), decode_tokens=4)


# ---------------------------------------------------------------------------
# The command.


def compile_command(commands, *flags):
  # XLA's own optimisation level: the suite's level 0 (conftest) makes the
  # TPU compiler take twice as long over the large program below.
  return commands.run(
    "experiments.compile", "--config=rope", *flags, env=dict(XLA_FLAGS=""), timeout=600
  )


# The time txf.progress stamps its lines with.
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "
TINY = [
  "--config.model.d_model=32",
  "--config.model.num_heads=2",
  "--config.model.num_layers=1",
  "--config.data.seq_len=32",
  "--config.data.batch_size=8",
  "--config.data.max_corpus_bytes=200000",
]


@pytest.mark.slow  # subprocesses
@pytest.mark.parametrize(
  "flags,message",
  [
    (["--target=v9-8"], "target error: target 'v9-8': not a TPU slice"),
    (["--target=v5e-4", "--config.parallel.fsdp=3"], "config error: parallel.fsdp"),
    (["--target=h100", "--step_seconds=0"], "flag error: step_seconds: must be a finite number"),
    # It printed 'at an assumed inf ms a step'.
    (["--target=h100", "--step_seconds=inf"], "flag error: step_seconds: must be a finite number"),
    (["--target=h100", "--decode_tokens=-1"], "flag error: decode_tokens: must be >= 0"),
    (["--target=h100", "--json=/no/such/dir/r.json"], "flag error: json: /no/such/dir/r.json"),
    # A pipe (or a device: --json=/dev/full was renamed over, the device
    # became a JSON file and the command exited 0).
    (["--target=h100", "--hlo=FIFO"], "flag error: hlo: FIFO: not a regular file"),
    (["--target=v5e-16x100000"], "target error: target 'v5e-16x100000': 1,600,000 devices"),
  ],
)
def test_bad_input_is_one_line_exit_2(flags, message, commands, tmp_path):
  fifo = tmp_path / "fifo"
  os.mkfifo(fifo)
  flags = [flag.replace("FIFO", str(fifo)) for flag in flags]
  message = message.replace("FIFO", str(fifo))
  done = compile_command(commands, *TINY, *flags)
  assert done.returncode == 2, done.stderr[-2000:]
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith(message), line


COMPILER_FAILS = """
import sys
import jax.stages
from txf.commands.compile import cli

def compile(self, *args, **kwargs):
  raise RuntimeError("INTERNAL: Couldn't find output tile sizes\\n  %dot.69 = bf16[780,128] dot")

jax.stages.Lowered.compile = compile
sys.argv[0] = "txf-compile"
cli()
"""


@pytest.mark.slow  # a subprocess
@needs_cuda_plugin
def test_a_program_the_compiler_refuses_is_one_line_exit_1(tmp_path):
  """Not a traceback: the program, the target and XLA's first line (how a
  fused loss that had no GPU tiling under seed replicas used to end)."""
  done = subprocess.run(
    [sys.executable, "-c", COMPILER_FAILS, "--config=rope", *TINY, "--target=h100",
     f"--json={tmp_path / 'r.json'}"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=""), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 1, done.stderr[-2000:]
  # The compile it was in says so as it starts (txf.progress; no "done" line).
  started, line = done.stderr.strip().splitlines()
  assert re.fullmatch(STAMP + r"compile: the train step for h100 \.\.\.", started)
  assert line == (
    "compile error: the train step does not compile for h100: "
    "INTERNAL: Couldn't find output tile sizes"
  )
  assert not (tmp_path / "r.json").exists()


HLO_UNWRITABLE = """
import sys
import txf.storage
from txf.commands.compile import cli

write_file = txf.storage.write_file

def failing(path, *args, **kwargs):  # the disk full when the HLO is written
  if str(path).endswith(".hlo"):
    raise txf.storage.WriteError(f"{path}: No space left on device")
  return write_file(path, *args, **kwargs)

txf.storage.write_file = failing
sys.argv[0] = "txf-compile"
cli()
"""


@pytest.mark.slow  # a subprocess
@needs_cuda_plugin
def test_an_output_file_that_cannot_be_written_after_the_compile_loses_no_figure(tmp_path):
  """The HLO was written first and its failure exited at once: neither the
  report nor --json (whose path was fine) came out of the compile."""
  hlo, report = tmp_path / "step.hlo", tmp_path / "r.json"
  done = subprocess.run(
    [sys.executable, "-c", HLO_UNWRITABLE, "--config=rope", *TINY, "--target=h100",
     f"--hlo={hlo}", f"--json={report}"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=""), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 1, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1] == f"write error: {hlo}: No space left on device"
  assert "kernels: " in done.stdout and json.loads(report.read_text())["fits"]
  assert not hlo.exists()


IN_READ_ONLY = """
import sys
sys.path.insert(0, "tests")
from full_disk import read_only
from txf.commands.compile import cli

sys.argv[0] = "txf-compile"
with read_only(sys.argv.pop(1)):
  cli()
"""


@pytest.mark.slow  # a subprocess
def test_a_json_path_in_a_read_only_directory_is_refused_before_the_compile(tmp_path):
  done = subprocess.run(
    [sys.executable, "-c", IN_READ_ONLY, str(tmp_path), "--config=rope", *TINY, "--target=h100",
     f"--json={tmp_path / 'r.json'}"],
    cwd=REPO, env=dict(os.environ, XLA_FLAGS=""), capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 2, done.stderr[-2000:]
  (line,) = done.stderr.strip().splitlines()
  assert line.startswith(f"flag error: json: {tmp_path / 'r.json'}: {tmp_path}: not a writable")
  assert done.stdout == ""  # before the config line, which the compile follows


@pytest.mark.slow  # subprocesses
@needs_libtpu
def test_the_command_reports_fits_in_json_and_exits_0_or_1(tmp_path, commands):
  fits = compile_command(commands, *TINY, "--target=v5e-4", f"--json={tmp_path / 'fits.json'}")
  assert fits.returncode == 0, fits.stderr[-2000:]
  # Each program's compile says when it starts and how long it took (stderr).
  stages = [line for line in fits.stderr.splitlines() if re.match(STAMP + "compile: ", line)]
  assert [re.sub(STAMP, "", line).split(": done")[0] for line in stages] == [
    "compile: the train step for v5e-4 ...",
    "compile: the train step for v5e-4",
    "compile: the eval step for v5e-4 ...",
    "compile: the eval step for v5e-4",
  ]
  lines = fits.stdout.splitlines()
  assert lines[0] == f"config: {REPO / 'txf' / 'configs' / 'rope.py'}"
  assert lines[2].startswith("FITS: train step")
  figures = json.loads((tmp_path / "fits.json").read_text())
  assert figures["fits"] is True and figures["target"] == "v5e-4"
  keys = {"arguments_bytes", "temporaries_bytes", "total_bytes", "capacity_bytes"}
  assert keys <= set(figures["per_device"])
  # 192 rows of 1024 tokens through 32 heads: the attention weights alone are
  # 24 GiB (float32), on a 16 GiB v5e chip. The eval step does not fit
  # either, which the compiler finds at once (a program that nearly fits, it
  # spends seconds rematerialising).
  big = ["--config.model.num_heads=32", "--config.model.head_dim=8"]
  big += ["--config.data.seq_len=1024", "--config.model.max_len=1024"]
  big += ["--config.data.batch_size=192"]
  over = compile_command(
    commands, *TINY, *big, "--target=v5e-1", f"--json={tmp_path / 'over.json'}"
  )
  assert over.returncode == 1, over.stderr[-2000:]
  assert over.stdout.splitlines()[2].startswith("DOES NOT FIT")
  figures = json.loads((tmp_path / "over.json").read_text())
  train = figures["per_device"]
  assert figures["fits"] is False
  assert train["total_bytes"] > train["capacity_bytes"] == 15.75 * 2**30
  assert train["headroom_bytes"] == train["capacity_bytes"] - train["total_bytes"] < 0


@pytest.mark.slow  # three decoding compiles for an H100: about 15 s on 2 cores
@needs_cuda_plugin
def test_sampling_options_change_the_token_loop_and_top_p_after_top_k_sorts_nothing():
  """compile_generate's sampling arguments reach generate's program: top_k
  and top_p each add kernels to every token's loop, top_p alone sorts the
  vocabulary (GPT-2's) every token, and top_p after top_k reads the top-k's
  logits, already sorted, so fewer kernels a token than top_p alone."""
  from txf import models
  from txf.aot.compile import compile_generate
  from txf.layers.model_config import ModelConfig

  cfg = ModelConfig(
    vocab_size=50304, d_model=128, num_heads=2, num_layers=1, max_len=64, dtype="bfloat16"
  )
  model = models.build(cfg)
  params = jax.eval_shape(model.init, jax.random.key(0), jax.numpy.ones((1, 4), "int32"))
  target = parse_target("h100")

  def token_loop(**options):
    """(kernels a token, sorts in the program)."""
    sampling = dict(rng=jax.random.key(0), temperature=0.8, **options)
    compiled, _ = compile_generate(
      model, params["params"], target, batch_size=1, prompt_len=4, new_tokens=4, sampling=sampling
    )
    text = compiled.as_text()
    sorts = [i for i in hlo.instructions(text) if i.op_name.split("/")[-1] == "sort"]
    return hlo.loop_kernels(text), len(sorts)

  temperature, top_p, both = token_loop(), token_loop(top_p=0.9), token_loop(top_k=50, top_p=0.9)
  assert temperature[0] < both[0] < top_p[0]
  assert temperature[1] == 0 and top_p[1] > 0 and both[1] == 0
