"""How fast a data config's training batches arrive on one host.

`loader_throughput` times `make_dataset(spec, 'train', ...)` alone (no
model, no device): what `python -m benchmarks.run data` reports, to
compare with how fast a device trains (tokens/s per host, at the config's
data.read_workers and data.read_threads).
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from txf.data.pipeline import make_dataset
from txf.data.spec import DataSpec, text_source
from txf.data.text import TFDSSource

# GPT-2 small (configs/gpt2_small.py) trained at 474.8k tokens/s on one H100
# (docs/benchmarks.md, its last 50-step window at 841d1d9; raw output in
# docs/gpu_runs/2026-11-27-h100/): a host feeding one such GPU must deliver
# at least that.
GPT2_SMALL_H100_TOKENS_PER_SEC = 474_800


def loader_throughput(
  spec: DataSpec, *, batches: int, seed: int = 0, workdir: str | os.PathLike | None = None
) -> dict[str, Any]:
  """Times `batches` training batches after a first, untimed one (which opens
  the split and starts the read threads and worker processes).

  Returns:
    {'tokens_per_sec': input tokens (rows x seq_len, as the training loop
     counts them) per second; 'tokens_per_cpu_sec': per second of this
     process's CPU time (all its threads, not the workers'): on a busy
     machine, what it would deliver with a core of its own when it reads
     itself (read_workers=0), and its packing's limit when workers read;
     'batches', 'seconds', 'cpu_seconds', 'tokens_per_batch', 'read_threads',
     'read_workers' (a TFDS stream's, the fields' values; None for data this
     process makes or reads itself), 'description'}.
  """
  # data.read_threads and data.read_workers read a TFDS stream only.
  streamed = isinstance(text_source(spec.name), TFDSSource)
  dataset = make_dataset(spec, "train", seed=seed, workdir=workdir)
  with contextlib.closing(dataset):
    tokens_per_batch = next(dataset)["inputs"].size
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(batches):
      next(dataset)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu
  tokens = batches * tokens_per_batch
  return dict(
    tokens_per_sec=tokens / seconds,
    tokens_per_cpu_sec=tokens / cpu_seconds,
    batches=batches,
    seconds=seconds,
    cpu_seconds=cpu_seconds,
    tokens_per_batch=tokens_per_batch,
    read_threads=spec.read_threads if streamed else None,
    read_workers=(spec.read_workers or 0) if streamed else None,
    description=dataset.description,
  )


def format_throughput(figures: dict[str, Any]) -> str:
  """Tokens/s with the loader's threads and workers, and how many GPT-2-small
  H100s that feeds."""
  readers = (
    "made in this process"
    if figures["read_workers"] is None
    else f"with {figures['read_workers']} worker processes and {figures['read_threads']} "
    "read threads"
  )
  return (
    f"data: {figures['description']}\n"
    f"{figures['tokens_per_sec']:,.0f} tokens/s per host {readers} "
    f"({figures['batches']} batches of {figures['tokens_per_batch']} tokens in "
    f"{figures['seconds']:.2f} s); {figures['tokens_per_cpu_sec']:,.0f} tokens per "
    f"CPU-second of this process (workers not counted)\n"
    f"{figures['tokens_per_sec'] / GPT2_SMALL_H100_TOKENS_PER_SEC:.2f}x the "
    f"{GPT2_SMALL_H100_TOKENS_PER_SEC:,} tokens/s GPT-2 small trained at on one H100 "
    "(docs/benchmarks.md)"
  )
