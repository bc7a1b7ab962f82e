"""The quadratic cost of attention (textbook item 4).

Self-attention over T tokens computes a [T, T] score matrix: 4 * H * T^2 * Dh
FLOPs (q.k^T and the weighted sum of v, 2 FLOPs per multiply-add), so time
grows as T^2 whatever the implementation. Memory depends on the
implementation: the materialised path (txf.ops.dot_product_attention,
implementation='xla') holds the [H, T, T] scores and weights, so its memory
grows as T^2 too; the chunked path (implementation='chunked', an online
softmax over blocks of keys) holds [H, T, chunk] at a time, so its memory
grows as T.

Measured here, on the default JAX device, for one sequence of H heads:
  time:   median wall time of the jitted forward pass over `repeats` calls
          (compiled and run once before timing);
  memory: XLA's compiled memory analysis of that program
          (`jax.jit(f).lower(...).compile().memory_analysis()`): the bytes of
          temporary buffers XLA allocates for the intermediates, i.e. the
          peak working memory beyond the inputs and the output. It is what
          the compiler plans, not a process's resident set, and it does not
          depend on the machine's load.
and the exponent p of time, memory ~ T^p fitted on log-log axes over the
lengths >= `fit_from`. The FLOP ratio of T = 32,768 to T = 2,048 is given
in closed form, by XLA's cost analysis of the compiled materialised program
(compiled, never run), and for a whole GPT-2-small-shaped model
(txf.analysis.flops_per_token).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from txf import ops
from txf.analysis.counts import flops_per_token
from txf.analysis.plots import line_plot
from txf.progress import Progress
from txf.textbook.param_counts import ARCHITECTURES
from txf.textbook.report import figure_path, loglog_slope, markdown_table, median_seconds

NAME = "quadratic"
IMPLEMENTATIONS = ("xla", "chunked")
LABELS = {"xla": "materialised (xla)", "chunked": "chunked (online softmax)"}
FULL: dict[str, Any] = dict(
  lengths=(128, 256, 512, 1024, 2048, 4096, 8192),
  num_heads=2,
  head_dim=64,
  chunk_size=512,
  repeats=3,
  fit_from=1024,
)
QUICK: dict[str, Any] = dict(
  lengths=(256, 512, 1024), num_heads=1, head_dim=16, chunk_size=64, repeats=2, fit_from=128
)
FLOP_LENGTHS = (2048, 32768)
# GPT-2 small as item 6 counts it, for the model-level FLOP ratio.
GPT2_SMALL = ARCHITECTURES["gpt2"][1]


def attention_flops(length: int, num_heads: int, head_dim: int) -> int:
  """Forward matmul FLOPs of bidirectional self-attention: 4 * H * T^2 * Dh."""
  return 4 * num_heads * length * length * head_dim


def _attention_fn(implementation: str, chunk_size: int):
  extra = dict(chunk_size=chunk_size) if implementation == "chunked" else {}
  return jax.jit(
    lambda q, k, v: ops.dot_product_attention(q, k, v, implementation=implementation, **extra)
  )


def _compiled(implementation: str, length: int, num_heads: int, head_dim: int, chunk_size: int):
  shape = jax.ShapeDtypeStruct((1, length, num_heads, head_dim), jnp.float32)
  return _attention_fn(implementation, chunk_size).lower(shape, shape, shape).compile()


def flop_ratios(num_heads: int, head_dim: int, chunk_size: int) -> dict[str, float]:
  """FLOPs at T = 32,768 over T = 2,048: closed form, XLA's count, GPT-2 small."""
  short, long = FLOP_LENGTHS
  xla_flops = [
    _compiled("xla", length, num_heads, head_dim, chunk_size).cost_analysis()["flops"]
    for length in FLOP_LENGTHS
  ]
  per_sequence = [length * flops_per_token(GPT2_SMALL, length) for length in FLOP_LENGTHS]
  return {
    "closed_form": attention_flops(long, num_heads, head_dim)
    / attention_flops(short, num_heads, head_dim),
    "xla_cost_analysis": float(xla_flops[1] / xla_flops[0]),
    "gpt2_small_training_per_sequence": float(per_sequence[1] / per_sequence[0]),
  }


def compute(
  lengths: Sequence[int],
  num_heads: int,
  head_dim: int,
  chunk_size: int,
  repeats: int,
  fit_from: int,
  seed: int = 0,
) -> dict[str, Any]:
  """Forward time and compiled temporary memory per length and implementation.

  Returns:
    {"lengths", "num_heads", "head_dim", "chunk_size", "fit_from", "device",
     "flops": closed-form attention FLOPs per length,
     "<impl>_seconds", "<impl>_temp_bytes": per length, for impl in
       IMPLEMENTATIONS,
     "<impl>_time_exponent", "<impl>_memory_exponent": fitted over lengths
       >= fit_from,
     "max_abs_difference": largest |xla - chunked| output difference at the
       longest length,
     "flop_ratio": `flop_ratios(...)`}.
  """
  lengths = list(lengths)
  fitted = [i for i, length in enumerate(lengths) if length >= fit_from]
  if len(fitted) < 2:
    raise ValueError(f"fit_from={fit_from} leaves fewer than 2 of the lengths {lengths}")
  rng = np.random.default_rng(seed)
  result: dict[str, Any] = dict(
    lengths=lengths,
    num_heads=num_heads,
    head_dim=head_dim,
    chunk_size=chunk_size,
    fit_from=fit_from,
    device=jax.devices()[0].device_kind,
    flops=[attention_flops(length, num_heads, head_dim) for length in lengths],
  )
  for implementation in IMPLEMENTATIONS:
    result[f"{implementation}_seconds"], result[f"{implementation}_temp_bytes"] = [], []
  outputs = {}
  timed = len(lengths) * len(IMPLEMENTATIONS)
  with Progress(
    "quadratic: compile and time attention", total=timed, unit="programs", bar=False
  ) as progress:
    for length in lengths:
      q, k, v = (
        jnp.asarray(rng.standard_normal((1, length, num_heads, head_dim)), jnp.float32)
        for _ in range(3)
      )
      for implementation in IMPLEMENTATIONS:
        compiled = _compiled(implementation, length, num_heads, head_dim, chunk_size)
        result[f"{implementation}_temp_bytes"].append(
          int(compiled.memory_analysis().temp_size_in_bytes)
        )
        run = lambda: compiled(q, k, v)  # noqa: B023 (median_seconds calls it at once)
        result[f"{implementation}_seconds"].append(median_seconds(run, repeats=repeats))
        if length == lengths[-1]:
          outputs[implementation] = np.asarray(compiled(q, k, v))
        progress.advance()
  for implementation in IMPLEMENTATIONS:
    for quantity, key in (("time", "seconds"), ("memory", "temp_bytes")):
      values = result[f"{implementation}_{key}"]
      result[f"{implementation}_{quantity}_exponent"] = loglog_slope(
        [lengths[i] for i in fitted], [values[i] for i in fitted]
      )
  result["max_abs_difference"] = float(np.max(np.abs(outputs["xla"] - outputs["chunked"])))
  result["flop_ratio"] = flop_ratios(num_heads, head_dim, chunk_size)
  return result


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Time and memory vs length on log-log axes, with the fitted exponents; the PNG paths."""
  lengths = np.asarray(result["lengths"], np.float64)
  shape = f"1 sequence, {result['num_heads']} heads x {result['head_dim']} dims"
  time_series = {
    f"{LABELS[impl]}: T^{result[f'{impl}_time_exponent']:.2f}": (
      lengths,
      np.asarray(result[f"{impl}_seconds"]) * 1e3,
    )
    for impl in IMPLEMENTATIONS
  }
  memory_series = {
    f"{LABELS[impl]}: T^{result[f'{impl}_memory_exponent']:.2f}": (
      lengths,
      np.asarray(result[f"{impl}_temp_bytes"]) / 2**20,
    )
    for impl in IMPLEMENTATIONS
  }
  xlabel = f"sequence length T (tokens); {shape}"
  paths = [
    line_plot(
      time_series,
      figure_path(out_dir, NAME, "time"),
      f"Attention forward time ({result['device']})",
      xlabel,
      "forward time (ms)",
      logx=True,
      logy=True,
    ),
    line_plot(
      memory_series,
      figure_path(out_dir, NAME, "memory"),
      "Attention working memory (XLA temporary buffers)",
      xlabel,
      "XLA temporary memory (MiB)",
      logx=True,
      logy=True,
    ),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  header = [
    "T",
    "attention GFLOP",
    *(f"{LABELS[i]} ms" for i in IMPLEMENTATIONS),
    *(f"{LABELS[i]} MiB" for i in IMPLEMENTATIONS),
  ]
  rows = [
    [
      length,
      result["flops"][n] / 1e9,
      *(result[f"{i}_seconds"][n] * 1e3 for i in IMPLEMENTATIONS),
      *(result[f"{i}_temp_bytes"][n] / 2**20 for i in IMPLEMENTATIONS),
    ]
    for n, length in enumerate(result["lengths"])
  ]
  fits = "; ".join(
    f"{LABELS[i]}: time T^{result[f'{i}_time_exponent']:.2f}, memory "
    f"T^{result[f'{i}_memory_exponent']:.2f}"
    for i in IMPLEMENTATIONS
  )
  ratio = result["flop_ratio"]
  return (
    f"Device: {result['device']}; one sequence, {result['num_heads']} heads of "
    f"{result['head_dim']} dims, float32, chunk {result['chunk_size']} keys. Memory: XLA's "
    "compiled temporary buffers. Time: median of the jitted forward.\n\n"
    + markdown_table(header, rows)
    + f"\nFitted over T >= {result['fit_from']}: {fits}. Largest |xla - chunked| output "
    f"difference at T = {result['lengths'][-1]}: {result['max_abs_difference']:.2g}.\n\n"
    f"FLOPs at T = {FLOP_LENGTHS[1]:,} over T = {FLOP_LENGTHS[0]:,}: "
    f"{ratio['closed_form']:.0f}x for attention ((32768 / 2048)^2); XLA's cost analysis "
    f"of the compiled materialised program: {ratio['xla_cost_analysis']:.1f}x; training "
    f"FLOPs per sequence of a GPT-2-small-shaped model: "
    f"{ratio['gpt2_small_training_per_sequence']:.1f}x (16x from its weights, the rest "
    "from attention).\n"
  )


def run(out_dir: str | os.PathLike, *, quick: bool = False) -> dict[str, Any]:
  """Measures, plots and reports item 4 at full (or toy, `quick`) size."""
  result = compute(**(QUICK if quick else FULL))
  return {**result, "figures": plot(result, out_dir), "text": report(result)}
