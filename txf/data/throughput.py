"""How fast a data config's training batches arrive on one host.

`loader_throughput` times `make_dataset(spec, 'train', ...)` alone (no
model, no device): what `python -m benchmarks.run data` reports, to
compare with how fast a device trains (tokens/s per host, at the config's
data.read_workers and data.read_threads). For gpt2_small's data it also
gives the one training speed kept for comparison, a fixed figure from a
past GPU run (`GPT2_SMALL_H100`), not one measured beside it.
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
# `source`): a host feeding one such GPU must deliver at least that.
GPT2_SMALL_H100_TOKENS_PER_SEC = 474_800
GPT2_SMALL_H100 = dict(
  tokens_per_sec=GPT2_SMALL_H100_TOKENS_PER_SEC,
  config="configs/gpt2_small.py",
  device="one H100",
  date="2026-11-27",
  commit="841d1d9",
  source="docs/gpu_runs/2026-11-27-h100-b/change/step_after.json",
)
# What that run's batches were (configs/gpt2_small.py's data section): the
# figure is a reference for this data only. The corpus cap is left out: it
# sets how much text the split holds, not the batches the GPU trained on.
GPT2_SMALL_DATA = dict(name="pystdlib", task="lm", tokenizer="bytes", seq_len=1024, batch_size=32)


def reference_for(spec: DataSpec) -> dict[str, Any] | None:
  """The fixed training speed kept for data `spec` (`GPT2_SMALL_H100` for
  gpt2_small's data), or None: no other data has one."""
  matches = all(getattr(spec, field) == value for field, value in GPT2_SMALL_DATA.items())
  return dict(GPT2_SMALL_H100) if matches else None


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
     process makes or reads itself), 'description', 'reference'
     (`reference_for`: a past run's figure, not measured here)}.
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
    reference=reference_for(spec),
  )


def format_throughput(figures: dict[str, Any]) -> str:
  """Tokens/s with the loader's threads and workers, and against the fixed
  reference of its data, labelled as such, or that there is none."""
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
    f"CPU-second of this process (workers not counted)\n{format_reference(figures)}"
  )


def format_reference(figures: dict[str, Any]) -> str:
  """The loader's speed against its data's fixed reference, said to be one."""
  reference = figures["reference"]
  if reference is None:
    return (
      "no reference training speed for this data (the one kept, GPT-2 small on one H100, is "
      f"for {GPT2_SMALL_H100['config']}'s data)"
    )
  return (
    f"{figures['tokens_per_sec'] / reference['tokens_per_sec']:.2f}x a fixed reference from a "
    f"past GPU run, not measured in this run: {reference['config']} trained at "
    f"{reference['tokens_per_sec']:,} tokens/s on {reference['device']} on {reference['date']} "
    f"(commit {reference['commit']}, {reference['source']})"
  )
