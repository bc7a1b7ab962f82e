"""The training data path alone, without a model (`python -m benchmarks.run data`):

  python -m benchmarks.run data --config=configs/gpt2_small.py --steps=400

Two figures of --steps training batches each, after an untimed first batch:
the loader on this host (txf.data.throughput: tokens/s at the config's
data.read_workers and data.read_threads; for gpt2_small's data, against
the fixed speed a past H100 run trained at, not measured here), then the
same batches also sent to the devices
(txf.train.sharding.shard_batch over the config's mesh, each transfer
waited for), as the training loop feeds its step. A sentencepiece tokenizer
is trained in a temporary directory.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from typing import Any

import jax
from absl import flags

from txf.commands.cli import define_config_flag
from txf.data import make_dataset
from txf.data.throughput import format_throughput, loader_throughput
from txf.runconfig.run_config import RunConfig, parse
from txf.train import sharding

FLAGS = flags.FLAGS


def device_throughput(run: RunConfig, *, batches: int, workdir: str) -> dict[str, Any]:
  """Times `batches` training batches read and sharded onto the run's mesh:
  {'tokens_per_sec', 'ms_per_batch', 'seconds', 'batches', 'devices'}."""
  mesh = sharding.make_mesh(run.parallel)
  dataset = make_dataset(run.data, "train", seed=run.data_seed, workdir=workdir)
  with contextlib.closing(dataset):
    tokens_per_batch = next(dataset)["inputs"].size
    start = time.perf_counter()
    for _ in range(batches):
      jax.block_until_ready(sharding.shard_batch(next(dataset), mesh))
    seconds = time.perf_counter() - start
  return dict(
    tokens_per_sec=batches * tokens_per_batch / seconds,
    ms_per_batch=1e3 * seconds / batches,
    seconds=seconds,
    batches=batches,
    devices=mesh.size,
  )


def define_flags() -> None:
  define_config_flag("Config file.")
  flags.DEFINE_integer("steps", 200, "Timed batches.", lower_bound=1)


def main() -> dict:
  run = parse(FLAGS.config)
  with tempfile.TemporaryDirectory() as workdir:
    figures = loader_throughput(run.data, batches=FLAGS.steps, seed=run.data_seed, workdir=workdir)
    print(format_throughput(figures))
    figures["to_device"] = device_throughput(run, batches=FLAGS.steps, workdir=workdir)
  to_device = figures["to_device"]
  print(
    f"read and sent to {to_device['devices']} device(s): "
    f"{to_device['tokens_per_sec']:,.0f} tokens/s, {to_device['ms_per_batch']:.2f} ms "
    "per batch"
  )
  return figures
