"""GPU kernel time by category, from a profile of a few training steps.

Both frameworks' profiles are reduced to the same raw form, a table of
kernel name -> [launches, total device ns] plus the profiled wall time and
the time the device was busy (the union of its kernels' intervals), so the
categories can be refined later from the committed reports without a GPU:

  jax    `trace_kernels(directory)`: the newest jax.profiler trace in it (XPlane)
  torch  benchmarks/references/torch_gpt2.py --profile_steps (torch.profiler)

`by_category` sorts kernel names into the categories the step is discussed in
(GEMM, attention, reduction, elementwise, scatter/gather, copy, other) by the
names the two code generators give their kernels:

  XLA:GPU     fusions are named after their root and kind (`loop_add_fusion`,
              `input_reduce_fusion`, `input_scatter_fusion`, `gemm_fusion_dot`
              for Triton GEMMs), library calls after the library's kernel
              (cuBLAS `sm90_xmma_gemm_*` / `nvjet_*`, cuDNN `cudnn_*sdpa*`),
              Pallas kernels after their name (txf's loss on one GPU:
              `cross_entropy_statistics_and_gradient`, a reduction)
  Inductor    `triton_poi_*` (pointwise), `triton_red_*` / `triton_per_*`
              (reductions); eager ops by their ATen kernel names
"""

from __future__ import annotations

import pathlib
import re

# First match wins: attention before GEMM (flash kernels run GEMMs inside),
# scatter before reduction (XLA's scatter fusions are not reductions).
CATEGORIES: tuple[tuple[str, re.Pattern], ...] = (
  ("attention", re.compile(r"fmha|sdpa|flash|cudnn|attention", re.I)),
  ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|cublas|matmul|wgmma|(^|_)dot(_|$)", re.I)),
  ("scatter/gather", re.compile(r"scatter|gather|index_put|embedding|dynamic_update", re.I)),
  (
    "reduction",
    re.compile(r"reduc|triton_red|triton_per|softmax|norm|cross_entropy|(^|_)sum(_|$)", re.I),
  ),
  ("copy", re.compile(r"memcpy|memset|copy|transpose|concatenate|pad", re.I)),
  (
    "elementwise",
    re.compile(r"loop_|triton_poi|elementwise|vectorized|fusion|adam|foreach|multi_tensor", re.I),
  ),
)


def category(kernel: str) -> str:
  """The category of a kernel by its name ('other' when no pattern matches)."""
  return next((name for name, pattern in CATEGORIES if pattern.search(kernel)), "other")


def by_category(kernels: dict[str, list[int]]) -> dict[str, dict[str, float]]:
  """{category: {"launches", "ms"}} from {kernel name: [launches, total ns]}."""
  totals: dict[str, dict[str, float]] = {}
  for kernel, (launches, nanoseconds) in kernels.items():
    row = totals.setdefault(category(kernel), {"launches": 0, "ms": 0.0})
    row["launches"] += launches
    row["ms"] += nanoseconds / 1e6
  return dict(sorted(totals.items(), key=lambda item: -item[1]["ms"]))


def busy_ns(intervals: list[tuple[int, int]]) -> int:
  """The length of the union of [start, end) intervals (ns): the time at
  least one kernel ran, however many streams overlapped."""
  total, reach = 0, None
  for start, end in sorted(intervals):
    if reach is None or start > reach:
      total += end - start
      reach = end
    elif end > reach:
      total += end - reach
      reach = end
  return total


def profile_summary(
  kernels: dict[str, list[int]], intervals: list[tuple[int, int]], steps: int
) -> dict:
  """Figures per step of `steps` profiled steps, from the raw table {kernel
  name: [launches, total ns]} and the kernels' [start, end) intervals (ns):
  the span from the first kernel's start to the last one's end, the time the
  device was busy, kernels, and each category's launches and milliseconds.
  The raw table is kept, the intervals are not."""
  span = max(end for _, end in intervals) - min(start for start, _ in intervals)
  return dict(
    steps=steps,
    kernels_per_step=sum(launches for launches, _ in kernels.values()) / steps,
    device_ms_per_step=sum(ns for _, ns in kernels.values()) / 1e6 / steps,
    busy_ms_per_step=busy_ns(intervals) / 1e6 / steps,
    span_ms_per_step=span / 1e6 / steps,
    categories={
      name: {"launches": row["launches"] / steps, "ms": row["ms"] / steps}
      for name, row in by_category(kernels).items()
    },
    kernels=kernels,
  )


def trace_kernels(directory: str, steps: int) -> dict:
  """The kernels of the newest jax.profiler trace under `directory`: every
  event on a GPU plane's stream lines (the derived 'XLA Ops' / 'Steps' lines
  repeat them and are skipped)."""
  from jax.profiler import ProfileData  # jax >= 0.4.36

  traces = sorted(pathlib.Path(directory).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
  if not traces:
    raise FileNotFoundError(f"no *.xplane.pb under {directory}")
  kernels: dict[str, list[int]] = {}
  intervals = []
  for plane in ProfileData.from_file(str(traces[-1])).planes:
    if not plane.name.startswith("/device:GPU"):
      continue
    for line in plane.lines:
      if not line.name.startswith("Stream"):
        continue
      for event in line.events:
        start, duration = int(event.start_ns), int(event.duration_ns)
        row = kernels.setdefault(event.name, [0, 0])
        row[0] += 1
        row[1] += duration
        intervals.append((start, start + duration))
  if not intervals:
    raise ValueError(f"no GPU kernels in {traces[-1]}")
  return profile_summary(kernels, intervals, steps)


def format_summary(name: str, summary: dict) -> str:
  """A few lines: per step, wall span, device busy, kernels, and each category."""
  lines = [
    f"{name}: {summary['span_ms_per_step']:.1f} ms/step profiled, device busy "
    f"{summary['busy_ms_per_step']:.1f} ms, {summary['kernels_per_step']:.0f} kernels"
  ]
  for category_name, row in summary["categories"].items():
    lines.append(f"  {category_name:15s} {row['ms']:7.2f} ms/step, {row['launches']:5.0f} kernels")
  return "\n".join(lines)
