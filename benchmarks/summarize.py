"""Prints the figures of benchmarks.run JSON reports (step, loop, decode) as markdown table rows
(for docs/benchmarks.md).

  python benchmarks/summarize.py gpu_results/train [more directories or files]
"""

from __future__ import annotations

import json
import pathlib
import sys


def _k(tokens_per_sec: float) -> str:
  return f"{tokens_per_sec / 1e3:,.1f}k"


def _pct(fraction: float | None) -> str:
  return "n/a" if fraction is None else f"{100 * fraction:.1f}%"


def _gib(size: int | None) -> str:
  return "n/a" if size is None else f"{size / 2**30:.1f} GiB"


def _us(seconds: float | None) -> str:
  return "n/a" if seconds is None else f"{1e6 * seconds:,.0f} µs"


def step_rows(name: str, report: dict) -> list[str]:
  compiled = report.get("compiled_memory") or {}
  if "median_step_time" not in report:  # --compile_only
    return [
      f"| {name} | txf, compiled only | {report['tokens_per_step']:,} | | | "
      f"temporaries {_gib(compiled.get('temp'))} |"
    ]
  tokens = report["tokens_per_step"] / report["median_step_time"]
  mfu = report["windows"][-1]["mfu"]
  if mfu is not None:  # the median window's MFU
    mfu *= tokens / report["windows"][-1]["tokens_per_sec"]
  rows = [
    f"| {name} | txf | {report['tokens_per_step']:,} | {_k(tokens)} | {_pct(mfu)} | "
    f"peak {_gib(report.get('peak_bytes_in_use'))}, temporaries "
    f"{_gib(compiled.get('temp'))} |"
  ]
  if "torch" in report:
    torch = report["torch"]
    rows.append(
      f"| {name} | torch {torch['torch_version']} | "
      f"{torch['batch_size'] * torch['seq_len']:,} | {_k(torch['tokens_per_sec'])} | "
      f"{_pct(torch['mfu'])} | txf / torch = {tokens / torch['tokens_per_sec']:.2f}x |"
    )
  rows += profile_rows(name, "txf", report.get("profile"))
  rows += profile_rows(name, "torch", report.get("torch", {}).get("profile"))
  return rows


def profile_rows(name: str, framework: str, profile: dict | None) -> list[str]:
  """A step profile's figures per step: span, busy, kernels, then each category."""
  if not profile:
    return []
  if "error" in profile:
    return [f"| {name} | {framework} profile | failed: {profile['error']} |"]
  rows = [
    f"| {name} | {framework} profile | {profile['span_ms_per_step']:.1f} ms/step span, device "
    f"busy {profile['busy_ms_per_step']:.1f} ms ({profile['kernels_per_step']:.0f} kernels) |"
  ]
  rows += [
    f"| {name} | {framework} {category} | {row['ms']:.2f} ms/step ({row['launches']:.0f} kernels) |"
    for category, row in profile["categories"].items()
  ]
  return rows


def loop_rows(name: str, report: dict) -> list[str]:
  rows = [f"| {name} | bare step | {_k(report['step']['tokens_per_sec'])} | 1.000 | | | |"]
  for run in report["loop"]:
    rows.append(
      f"| {name} | {run['variant']} | {_k(run['amortised_tokens_per_sec'])} | "
      f"{run['ratio_to_step']:.3f} | {_k(run['window_tokens_per_sec_min'])} | "
      f"{_k(run['window_tokens_per_sec_last'])} | {run['gc_pauses']} pauses, "
      f"{run['gc_seconds']:.2f} s ({run.get('gc_full_collections', '?')} full, "
      f"{run.get('gc_full_seconds', float('nan')):.2f} s) |"
    )
  return rows


def decode_rows(name: str, report: dict) -> list[str]:
  if "deviceless" in report:
    return deviceless_decode_rows(name, report)
  rows = []
  for row in report["txf"]:
    hf, ratio = "n/a", "n/a"
    if "hf_tokens_per_sec" in row:
      hf, ratio = f"{row['hf_tokens_per_sec']:,.0f}", f"{row['ratio_to_hf']:.1f}x"
    rows.append(
      f"| {name} | {row['batch_size']} | {row['tokens_per_sec']:,.0f} | "
      f"{row['us_per_token']:,.0f} | {_pct(row['floor_fraction'])} | {hf} | {ratio} |"
    )
  return rows


def deviceless_decode_rows(name: str, report: dict) -> list[str]:
  """A deviceless decode report's programs (compiled, not run): per generated
  token its kernels, bytes, predicted time and floor, and how the token loop
  launches (XLA's default command buffers / with loops)."""
  return [
    f"| {name} | {report['target']} {row['family']}, batch {row['batch_size']} | "
    f"{row['kernels_per_token']:.0f} kernels | {row['bytes_per_token'] / 1e6:,.0f} MB | "
    f"predicted {_us(row['predicted_seconds'])} | floor {_us(row['floor_seconds'])} | "
    f"{row['loop_launch']['default']} / {row['loop_launch']['with_loops']} |"
    for row in report["deviceless"]
  ]


def embedding_grad_rows(name: str, report: dict) -> list[str]:
  return [
    f"| {name} | {method} | {row['ms']:.3f} ms | max error {row['max_abs_error']:.3g} |"
    for method, row in report["methods"].items()
  ]


def loss_kernel_rows(name: str, report: dict) -> list[str]:
  shape = f"[{report['rows']}, {report['vocab']}] {report['dtype']}"
  return [
    f"| {name} | {shape} | {variant} | {row['ms']:.3f} ms | "
    f"gradient off XLA's by {row['max_grad_difference']:.3g} |"
    for variant, row in report["variants"].items()
  ]


ROWS = {
  "step": step_rows,
  "loop": loop_rows,
  "decode": decode_rows,
  "embedding_grad": embedding_grad_rows,
  "loss_kernel": loss_kernel_rows,
}


def main(paths: list[str]) -> None:
  files = [
    f for p in map(pathlib.Path, paths) for f in (sorted(p.glob("*.json")) if p.is_dir() else [p])
  ]
  for file in files:
    report = json.loads(file.read_text())
    if report["mode"] not in ROWS:  # its figures have no table in docs/benchmarks.md
      print(f"{file}: skipped: no table rows for mode {report['mode']!r}")
      continue
    print(
      f"{file}: {report['device_kind']}, {report['date']}, jax "
      f"{report['versions']['jax']}, XLA_FLAGS='{report['xla_flags']}'"
      + (f", command: {report['command']}" if "command" in report else "")
    )
    print("\n".join(ROWS[report["mode"]](file.stem, report)))


if __name__ == "__main__":
  main(sys.argv[1:])
