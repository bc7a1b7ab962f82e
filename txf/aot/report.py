"""What a run compiled for a target costs there: memory against the device's,
FLOPs and bytes, a roofline bound on the step time, collectives and (GPUs)
kernels, from the compiled programs (txf.aot.compile.CompiledRun).

Every figure is per device and per step unless its name says otherwise.
`report(run)` is a JSON-ready dict; `format_report` prints it as a table.

  memory   XLA's memory analysis: arguments (the state and the batch),
           outputs, aliased (outputs written over donated arguments, counted
           once), temporaries and generated code; total = arguments +
           outputs - aliased + temporaries + generated code, against the
           memory a run may use (`capacity_bytes`: a GPU's, the pool JAX
           takes of it, 75% by default, XLA_PYTHON_CLIENT_MEM_FRACTION;
           targets.gpu_memory_pool). A program that fits here can still
           fail on the device by what XLA does not see: the allocator's
           fragmentation, cuDNN / cuBLAS workspaces. The eval step and the decoding
           program run while the train state stays on the device: each
           counts its own buffers plus the state's bytes beyond the
           parameters it takes (the optimizer's moments, the step:
           `resident_bytes`).
  FLOPs    the model's count (txf.analysis.flops_per_token, 6N + 12LHQT per
           token, over the devices) and, where the compiler gives one, its
           cost analysis of the program (on GPUs it gives none: library calls
           have no cost model).
  roofline the least time a step can take: the model's FLOPs at the
           device's peak, or the program's bytes at its memory bandwidth,
           whichever is longer (collectives' time over the interconnect not
           included); MFU at that time is the most the step can reach.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import jax
import jax.numpy as jnp

from txf import hardware
from txf.aot import compile as compile_module, hlo
from txf.aot.compile import CompiledRun

MEMORY_FIELDS = ("argument", "output", "alias", "temp", "generated_code")


def shard_bytes(tree: Any) -> int:
  """Bytes one device holds of a tree of ShapeDtypeStructs with shardings."""
  return sum(
    math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree)
  )


def refused_memory(message: str, arguments: int) -> dict[str, int]:
  """The sizes a compiler that ran out of memory reports: the temporaries it
  needed (its message: "... required for HLO temporaries (40.95G) exceeds
  available HBM (15.75G)") and the arguments the program takes."""
  amounts = re.findall(r"\(([\d.]+)([KMGT])\)", message)
  scale = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
  temporaries = int(float(amounts[0][0]) * scale[amounts[0][1]]) if amounts else 0
  return {"argument": arguments, "output": 0, "alias": 0, "temp": temporaries, "generated_code": 0}


def memory(
  compiled: Any, capacity: int, refused: dict[str, int] | None = None, resident: int = 0
) -> dict[str, Any]:
  """Per-device memory of a compiled program against `capacity` bytes (or of
  one the compiler refused, from `refused_memory`), counting `resident`
  bytes more that other buffers hold on the device while it runs."""
  if refused is not None:
    sizes = refused
  else:
    analysis = compiled.memory_analysis()
    sizes = {
      name: int(getattr(analysis, f"{name}_size_in_bytes", 0) or 0) for name in MEMORY_FIELDS
    }
  own = sizes["argument"] + sizes["output"] - sizes["alias"] + sizes["temp"]
  total = own + sizes["generated_code"] + resident
  return {
    "arguments_bytes": sizes["argument"],
    "outputs_bytes": sizes["output"],
    "aliased_bytes": sizes["alias"],
    "temporaries_bytes": sizes["temp"],
    "generated_code_bytes": sizes["generated_code"],
    "resident_bytes": resident,
    "total_bytes": total,
    "capacity_bytes": capacity,
    "headroom_bytes": capacity - total,
    "fits": refused is None and total <= capacity,
  }


def compiler_cost(compiled: Any) -> dict[str, float] | None:
  """The compiler's FLOPs and bytes accessed for one device, or None."""
  try:
    cost = compiled.cost_analysis()
  except Exception:  # some backends raise instead of returning None
    return None
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return {"flops": float(cost["flops"]), "bytes_accessed": float(cost.get("bytes accessed", 0.0))}


def gpu_kernels(program: list[hlo.Instruction]) -> dict[str, Any]:
  """A GPU program's kernels: count, GEMMs by backend, cuDNN attention calls,
  and the bytes each region of the step moves outside GEMMs (hlo.region),
  each instruction as often as it runs (a scanned layer's once a layer)."""
  gemms: Counter = Counter()
  regions: dict[str, dict[str, float]] = {
    name: {"kernels": 0, "bytes": 0.0} for name in ("loss", "optimizer", "attention", "model")
  }
  gemm_bytes = 0.0
  for instruction in program:
    times = instruction.times  # a scanned layer's kernels run once a layer
    if instruction.is_gemm:
      target = instruction.target
      gemms["cublas" if "cublas" in target else "triton" if "triton" in target else "xla"] += times
      gemm_bytes += times * instruction.bytes
      continue
    row = regions[hlo.region(instruction.op_name)]
    row["kernels"] += times
    row["bytes"] += times * instruction.bytes
  return {
    "kernels": sum(instruction.times for instruction in program),
    "gemms": dict(gemms),
    "cudnn_attention_calls": sum(
      instruction.times for instruction in program if instruction.is_cudnn_attention
    ),
    "gemm_bytes": gemm_bytes,
    "non_gemm_bytes": sum(row["bytes"] for row in regions.values()),
    "regions": regions,
  }


def roofline(
  model_flops: float, bytes_moved: float | None, device: Any, dtype: Any, step_seconds: float | None
) -> dict[str, Any]:
  """The least step time on `device` and the MFU it allows; MFU at an
  assumed `step_seconds` too, where given (seconds, FLOP/s, bytes/s: floats
  or None where unknown; `dtype` its name)."""
  peak = hardware.peak_flops_per_device(device, dtype)
  bandwidth = hardware.memory_bandwidth_per_device(device)
  compute = model_flops / peak if peak else None
  memory_time = bytes_moved / bandwidth if bandwidth and bytes_moved is not None else None
  bound = max((t for t in (compute, memory_time) if t is not None), default=None)
  return {
    "peak_flops": peak,
    "memory_bandwidth": bandwidth,
    "compute_seconds": compute,
    "memory_seconds": memory_time,
    "dtype": str(dtype),
    "step_seconds_bound": bound,
    # Without the bytes (a program the compiler refused) the compute time
    # alone bounds nothing useful: MFU <= 100% says nothing.
    "mfu_bound": (compute / bound) if compute and bound and memory_time is not None else None,
    "assumed_step_seconds": step_seconds,
    "mfu_at_assumed": (compute / step_seconds) if compute and step_seconds else None,
  }


# What a kernel launch costs a decoding step on a GPU, whatever the kernel
# does: the one GPU measurement, gpt2_small's generate on an H100
# (2026-11-27, jax 0.11.2, docs/benchmarks.md): 861 us a token, 74 us of
# them the weights' read, over the ~290 kernels a token its program launched.
LAUNCH_SECONDS = 2.7e-6
_LAYER = re.compile(r"/(block_\d+|layers)/")


def loop_traffic(text: str) -> dict[str, float]:
  """One iteration of an optimised HLO module's busiest while loop (for a
  decoding program, one generated token): the instructions that launch
  device work and the bytes they move, in the model's layers and outside
  them (the embedding, the head, the sampler and the loop's bookkeeping).

  Bytes of a kernel are its operands' and results' (`hlo`'s docstring),
  except what it is known not to move: an operand read only through
  slices counts their bytes, one updated in place (a fusion rooted in a
  dynamic-update-slice, a custom call's aliased output) counts the update
  and not the buffer. An aliased input (a KV cache a kernel attends over
  and updates) counts whole, the most it reads. A nested loop with a known
  trip count (scanned layers) counts that many times; 0s without a loop.

  Returns:
    {"kernels", "bytes", "layer_kernels", "layer_bytes"}.
  """
  computations = hlo._split_computations(text)
  totals = {"kernels": 0.0, "bytes": 0.0, "layer_kernels": 0.0, "layer_bytes": 0.0}

  def walk(name: str, times: float, into: dict[str, float], seen: frozenset[str]) -> None:
    if name in seen or name not in computations:
      return
    ops = hlo.computation_ops(computations[name][1])
    for line in computations[name][1]:
      parsed = hlo._parse(line)
      if parsed is None:
        continue
      instruction, result, opcode, _, attributes = parsed
      op = ops[instruction]
      if opcode == "while":
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', attributes)
        for called in hlo._called(line):
          walk(called, times * (int(trips[1]) if trips else 1), into, seen | {name})
        continue
      if opcode not in hlo.LAUNCHING:
        for called in hlo._called(line):
          walk(called, times, into, seen | {name})
        continue
      operands = sum(ops[o].result_bytes for o in op.operands if o in ops)
      if opcode == "fusion":
        fused = re.search(r"calls=%?([\w.\-]+)", attributes)
        moved = hlo.fusion_bytes(computations[fused[1]][1]) if fused else operands + op.result_bytes
      elif opcode == "dynamic-update-slice":
        moved = 2 * ops[op.operands[1]].result_bytes
      else:
        moved = operands + op.result_bytes - hlo.aliased_outputs_bytes(result, attributes)
      op_name = re.search(r'op_name="([^"]*)"', attributes)
      layer = _LAYER.search(op_name[1]) if op_name else None
      into["kernels"] += times
      into["bytes"] += times * moved
      if layer:
        into["layer_kernels"] += times
        into["layer_bytes"] += times * moved

  loops = [
    hlo._called(line)
    for _, lines in computations.values()
    for line in lines
    if (parsed := hlo._parse(line)) and parsed[2] == "while"
  ]
  for loop in loops:
    found = dict.fromkeys(totals, 0.0)
    for name in loop:
      walk(name, 1.0, found, frozenset())
    if found["kernels"] > totals["kernels"]:
      totals = found
  return totals


def decode_figures(
  text: str, bandwidth: float | None, weight_bytes: float
) -> dict[str, float | None]:
  """Per generated token of a decoding program's optimised HLO text (a GPU
  program's): `loop_traffic`'s kernels and bytes, the weights' read (the
  floor: `hardware.decode_floor_seconds`) and a predicted time, each
  kernel's launch (LAUNCH_SECONDS) plus its bytes at the device's
  bandwidth (None where that is unknown)."""
  traffic = loop_traffic(text)
  floor = hardware.decode_floor_seconds(weight_bytes, bandwidth)
  return {
    "kernels_per_token": traffic["kernels"],
    "bytes_per_token": traffic["bytes"],
    "layer_kernels_per_token": traffic["layer_kernels"],
    "layer_bytes_per_token": traffic["layer_bytes"],
    "weight_bytes": weight_bytes,
    "floor_seconds": floor,
    "predicted_seconds": (
      traffic["kernels"] * LAUNCH_SECONDS + traffic["bytes"] / bandwidth if bandwidth else None
    ),
  }


def _decode_figures(run: CompiledRun, resident: int) -> dict[str, Any]:
  """The decoding program's memory per device, with `resident` bytes of the
  train state beside it, and, on a GPU, what it does per generated token
  (one iteration of its token loop, `decode_figures`)."""
  refused = run.out_of_memory.get("decode")
  params = run.setup.abstract_state.params
  figures = memory(
    run.decode,
    run.target.memory_bytes,
    refused_memory(refused, shard_bytes(params)) if refused else None,
    resident,
  )
  figures["new_tokens"] = run.decode_tokens
  per_token = dict.fromkeys(
    ("kernels_per_token", "bytes_per_token", "floor_seconds", "predicted_seconds")
  )
  if run.target.platform == "gpu" and run.decode is not None:
    # The floor reads the weights in the compute dtype, as the benchmark holds them.
    itemsize = jnp.dtype(run.setup.run.model.dtype).itemsize
    weight_bytes = sum(x.size for x in jax.tree.leaves(params)) * itemsize
    bandwidth = hardware.memory_bandwidth_per_device(run.setup.mesh.devices.flat[0])
    per_token = decode_figures(run.decode.as_text(), bandwidth, weight_bytes)
  return {**figures, **per_token}


def report(run: CompiledRun, step_seconds: float | None = None) -> dict[str, Any]:
  """Everything txf-compile reports of a compiled run (module docstring)."""
  setup, target = run.setup, run.target
  batch = compile_module.abstract_batch(setup)
  eval_batch = compile_module.abstract_batch(setup, train=False)
  arguments = {
    "train_step": shard_bytes((setup.abstract_state, batch)),
    "eval_step": shard_bytes((setup.abstract_state.params, eval_batch)),
  }
  # The loop evaluates and samples with the train state on the device; those
  # programs take its parameters, the rest of it stays beside them.
  resident = shard_bytes(setup.abstract_state) - shard_bytes(setup.abstract_state.params)
  train, evaluation = (
    memory(
      getattr(run, name),
      target.memory_bytes,
      refused_memory(run.out_of_memory[name], arguments[name])
      if name in run.out_of_memory
      else None,
      resident if name == "eval_step" else 0,
    )
    for name in ("train_step", "eval_step")
  )
  text = run.train_step.as_text() if run.train_step is not None else ""
  program = hlo.instructions(text)
  devices = setup.mesh.size
  model_flops = setup.flops_per_token * setup.tokens_per_step
  cost = compiler_cost(run.train_step) if run.train_step is not None else None
  kernels = gpu_kernels(program) if target.platform == "gpu" and program else None
  if cost and cost["bytes_accessed"]:
    bytes_moved = cost["bytes_accessed"]
  else:
    bytes_moved = kernels["non_gemm_bytes"] + kernels["gemm_bytes"] if kernels else None
  device = setup.mesh.devices.flat[0]
  decode = _decode_figures(run, resident) if run.decode_tokens else None
  return {
    "target": target.name,
    "platform": target.platform,
    "device_kind": device.device_kind,
    # A GPU's own memory, of which the capacity is JAX's pool.
    "device_memory_bytes": target.gpu.memory_bytes if target.gpu else None,
    "devices": devices,
    "mesh": dict(setup.mesh.shape),
    "fits": train["fits"] and evaluation["fits"] and (decode is None or decode["fits"]),
    "per_device": train,
    "eval_step": evaluation,
    "decode": decode,
    "tokens_per_step": setup.tokens_per_step,
    "flops": {
      "model_per_step": model_flops,
      "model_per_device": model_flops / devices,
      "compiler_per_device": cost["flops"] if cost else None,
    },
    "bytes_accessed_per_device": bytes_moved,
    "roofline": roofline(
      model_flops / devices, bytes_moved, device, setup.run.model.dtype, step_seconds
    ),
    "collectives": hlo.collectives(text) if run.train_step is not None else None,
    "gpu": kernels,
    "cudnn_attention": run.cudnn,
    # {program: the dot}: compiled again with every GEMM on cuBLAS, XLA's
    # untuned Triton config not tiling that dot (compile.compile_lowered).
    "cublas_gemms": run.cublas_gemms,
    "out_of_memory": run.out_of_memory,
    "compile_seconds": run.compile_seconds,
    "versions": {"jax": jax.__version__},
  }


def _gib(size: float) -> str:
  """Bytes in GiB, or MiB / KiB where that would read 0.00."""
  for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
    if abs(size) >= scale:
      return f"{size / scale:,.2f} {unit}"
  return f"{size / 2**10:,.1f} KiB"


def decode_line(per_token: dict[str, Any]) -> str:
  """`decode_figures` in words: kernels, bytes and the predicted time per
  generated token against the floor."""
  text = (
    f"per generated token {per_token['kernels_per_token']:.0f} kernels, "
    f"{per_token['bytes_per_token'] / 1e6:,.1f} MB"
  )
  if per_token["predicted_seconds"] is not None:
    text += (
      f", predicted {1e6 * per_token['predicted_seconds']:,.0f} us (launches at "
      f"{1e6 * LAUNCH_SECONDS:.1f} us + bytes at the datasheet bandwidth) against the "
      f"{1e6 * per_token['floor_seconds']:.1f} us floor"
    )
  return text


def _with_state(program: dict[str, Any]) -> str:
  """What a program's total counts beside its own buffers."""
  return f"with the rest of the train state, {_gib(program['resident_bytes'])}, resident"


def _pool(capacity: int, device: int | None) -> str:
  """What a GPU's capacity is: JAX's pool, a fraction of its memory."""
  if device is None:
    return ""
  if capacity == device:
    return (
      f"; a run may use all {_gib(device)} of each GPU (XLA_PYTHON_CLIENT_MEM_FRACTION=1 or "
      "XLA_PYTHON_CLIENT_ALLOCATOR=platform)"
    )
  return (
    f"; a run may use {_gib(capacity)} of each GPU's {_gib(device)} "
    f"({capacity / device:.0%}: JAX's memory pool, XLA_PYTHON_CLIENT_MEM_FRACTION)"
  )


def cublas_gemms_line(fallbacks: dict[str, str]) -> str:
  """The report's line for programs compiled with every GEMM on cuBLAS."""
  dots = "; ".join(
    f"{name.replace('_', ' ')}: {re.sub(r'^jit[(][^)]*[)]/', '', dot)}"
    for name, dot in fallbacks.items()
  )
  return (
    f"GEMMs all on cuBLAS: XLA's untuned Triton config does not tile a dot ({dots}); a GPU's "
    "autotuner takes cuBLAS for such a GEMM alone, so these programs' kernels and bytes are "
    "the all-cuBLAS ones'"
  )


def format_report(figures: dict[str, Any]) -> str:
  """The report as the lines txf-compile prints."""
  train, evaluation = figures["per_device"], figures["eval_step"]
  # A train step refused for memory has no program to read collectives or cost from.
  unknown = "unknown: the train step was not compiled"
  mesh = " x ".join(f"{name} {size}" for name, size in figures["mesh"].items())
  verdict = "FITS" if figures["fits"] else "DOES NOT FIT"
  lines = [
    f"{figures['target']}: {figures['devices']} x {figures['device_kind']}, mesh {mesh}"
    + _pool(train["capacity_bytes"], figures.get("device_memory_bytes")),
    f"{verdict}: train step {_gib(train['total_bytes'])} of {_gib(train['capacity_bytes'])} "
    f"per device ({_gib(abs(train['headroom_bytes']))} "
    f"{'free' if train['fits'] else 'over'}), eval step {_gib(evaluation['total_bytes'])} "
    f"({_with_state(evaluation)}"
    + ("" if evaluation["fits"] else f"; {_gib(-evaluation['headroom_bytes'])} over")
    + ")",
    f"  arguments {_gib(train['arguments_bytes'])}, "
    + (
      "outputs unknown (the compiler refused the train step), temporaries asked for "
      if "train_step" in figures["out_of_memory"]
      else f"outputs {_gib(train['outputs_bytes'])} ({_gib(train['aliased_bytes'])} of them "
      "over donated arguments), temporaries "
    )
    + _gib(train["temporaries_bytes"]),
    *(
      f"  the compiler refused the {name.replace('_', ' ')}: {message.splitlines()[0]}"
      for name, message in figures["out_of_memory"].items()
    ),
  ]
  flops, line = figures["flops"], figures["roofline"]
  compiler = flops["compiler_per_device"]
  if compiler:
    compiler_text = f", compiler {compiler:.3e}"
  elif figures["collectives"] is None:
    compiler_text = f" (compiler's {unknown})"
  else:
    compiler_text = " (no compiler cost model for this target)"
  lines.append(f"FLOPs per step per device: model {flops['model_per_device']:.3e}{compiler_text}")
  if line["step_seconds_bound"]:
    parts = [
      f"{name} {1e3 * line[f'{name}_seconds']:.1f} ms"
      for name in ("compute", "memory")
      if line[f"{name}_seconds"] is not None
    ]
    mfu = line["mfu_bound"]
    if line["memory_seconds"] is None:
      bound = f" (memory {unknown}: no MFU bound)"
    elif mfu:
      bound = f", so MFU <= {100 * mfu:.1f}%"
    else:
      bound = " (no peak FLOP/s for this dtype: no MFU)"
    lines.append(
      f"roofline: step >= {1e3 * line['step_seconds_bound']:.1f} ms ({', '.join(parts)}){bound}"
    )
  if line["assumed_step_seconds"] is not None:
    lines.append(
      f"at an assumed {1e3 * line['assumed_step_seconds']:.1f} ms a step: "
      + (
        f"MFU {100 * line['mfu_at_assumed']:.1f}%"
        if line["mfu_at_assumed"] is not None
        else f"no MFU (no peak FLOP/s for {line['dtype']} on a {figures['device_kind']})"
      )
    )
  collectives = figures["collectives"]
  lines.append(
    "collectives per step: "
    + (
      unknown
      if collectives is None
      else ", ".join(
        f"{kind} {row['count']} ({_gib(row['bytes'])})" for kind, row in sorted(collectives.items())
      )
      or "none"
    )
  )
  if figures["gpu"]:
    gpu = figures["gpu"]
    gemms = ", ".join(f"{count} {backend}" for backend, count in sorted(gpu["gemms"].items()))
    lines.append(
      f"kernels: {gpu['kernels']}; GEMMs {sum(gpu['gemms'].values())} ({gemms}); cuDNN "
      f"attention calls {gpu['cudnn_attention_calls']}"
      + ("" if figures["cudnn_attention"] else " (cuDNN unavailable: XLA attention)")
    )
    regions = ", ".join(
      f"{name} {row['bytes'] / 1e9:.1f} GB ({row['kernels']:.0f} kernels)"
      for name, row in gpu["regions"].items()
    )
    lines.append(
      f"bytes moved outside GEMMs: {gpu['non_gemm_bytes'] / 1e9:.1f} GB ({regions}); "
      f"GEMMs {gpu['gemm_bytes'] / 1e9:.1f} GB"
    )
  if figures.get("cublas_gemms"):
    lines.append(cublas_gemms_line(figures["cublas_gemms"]))
  decode = figures["decode"]
  if decode:
    lines.append(
      f"decode ({decode['new_tokens']} new tokens, 1 row): {_gib(decode['total_bytes'])} per "
      f"device ({_with_state(decode)}; {'fits' if decode['fits'] else 'DOES NOT FIT'})"
      + (f"; {decode_line(decode)}" if decode["kernels_per_token"] is not None else "")
    )
  seconds = figures["compile_seconds"]
  lines.append(
    f"compiled in {seconds['train_step']:.1f} s (train step) + {seconds['eval_step']:.1f} s "
    f"(eval step)" + (f" + {seconds['decode']:.1f} s (decode)" if "decode" in seconds else "")
  )
  return "\n".join(lines)
