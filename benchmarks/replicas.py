"""Times R seed replicas against one replica and against R sequential
single runs (txf.train.replicas); prints each figure and its ratio to one
replica.

  python -m benchmarks.run replicas --config=configs/base.py --replicas=3 --steps=20
  python -m benchmarks.run replicas --config=configs/base.py --replicas=3 --runs \
      --config.train.steps=100

Steps (default): each variant is compiled and run once before timing; every
step is timed to completion on the same batch, and the median is reported,
for both strategies ('vmap', 'map'). "R sequential" runs each replica's own
jitted single step in turn (R dispatches per step), as R separate runs would.

Whole runs (--runs): the wall time of txf.train.loop.run, compilation, data,
evaluations and checkpoints included, in fresh temporary work directories:
one run, one run of R replicas (the backend's default strategy), and R
single runs of seeds seed .. seed + R - 1 one after another (on the
replicated run's batches: data.seed = seed). Each run is timed in a Python
process of its own (multiprocessing's 'spawn'), with the persistent
compilation cache off, so every run compiles, traces and builds its data as a
first run does: timed in one process, the runs after the first reused what
it had compiled (three identical runs read 1.00x, 0.52x, 0.52x). This
process holds its backend's device memory, so the runs allocate theirs as
they need it (XLA_PYTHON_CLIENT_PREALLOCATE=false), all alike.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import statistics
import tempfile
import time

import jax
from absl import flags

from txf.commands.cli import define_config_flag
from txf.runconfig.run_config import parse, replica_seeds
from txf.train import loop
from txf.train.replicas import (
  STRATEGIES,
  default_strategy,
  init_replicas,
  make_replicated_train_step,
)
from txf.train.run_setup import setup_run, train_step_for_seed
from txf.train.step import init_state

FLAGS = flags.FLAGS


def define_flags() -> None:
  define_config_flag("Config file.")
  flags.DEFINE_integer("replicas", 3, "Seed replicas.", lower_bound=1)
  flags.DEFINE_integer("steps", 20, "Timed steps per variant.")
  flags.DEFINE_bool(
    "runs", False, "Time whole runs (train.steps of the config) instead of single steps."
  )


def median_ms(step, state, batch, steps: int) -> float:
  """Median wall time (ms) of `step`, after one compiling call."""
  state, _ = jax.block_until_ready(step(state, batch))
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, _ = jax.block_until_ready(step(state, batch))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def in_fresh_process(function, *args):
  """function(*args) in a new Python process ('spawn': nothing this process
  or an earlier call compiled, traced or loaded is there)."""
  with multiprocessing.get_context("spawn").Pool(1) as pool:
    return pool.apply(function, args)


def run_seconds(config, replicas: int, seed: int) -> float:
  """Wall time of one loop.run of `config` with `replicas` from `seed`, in a
  fresh temporary work directory, without the persistent compilation cache
  (time_runs calls it in a process of its own: it compiles as a first run)."""
  jax.config.update("jax_enable_compilation_cache", False)
  config = config.copy_and_resolve_references()
  config.seed, config.replicas, config.data.seed = seed, replicas, config.seed
  with tempfile.TemporaryDirectory() as workdir:
    start = time.perf_counter()
    loop.run(parse(config), workdir, log=lambda line: None)
    return time.perf_counter() - start


def time_runs(config, replicas: int) -> dict[str, float]:
  """Seconds of each way to train `replicas` seeds (module docstring), each
  run in a process of its own."""
  # This process's backend holds its preallocated device memory; the spawned
  # runs inherit the environment.
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  run = functools.partial(in_fresh_process, run_seconds, config)
  seeds = replica_seeds(config.seed, replicas)
  figures = {
    "1 run": run(1, config.seed),
    f"1 run of {replicas} replicas ({default_strategy(jax.default_backend())})": run(
      replicas, config.seed
    ),
    f"{replicas} sequential runs": sum(run(1, seed) for seed in seeds),
  }
  print(f"whole runs of {config.train.steps} steps")
  for name, seconds in figures.items():
    print(f"  {name:32s} {seconds:8.1f} s  {seconds / figures['1 run']:5.2f}x")
  return figures


def time_steps(config, replicas: int, steps: int) -> dict[str, float]:
  """Median ms per training step of each way to train `replicas` seeds
  (module docstring)."""
  run = parse(config)
  setup = setup_run(run)
  batch = next(iter(setup.train_data))
  init_fn = lambda key: init_state(setup.model, run.optimizer, batch, setup.task, key)
  # jax.jit without shardings: every step here runs on one device, unsharded.
  step_for_seed = functools.partial(
    train_step_for_seed, run.train, run.model.dtype, setup.model, run.optimizer, setup.task, False
  )
  seeds = replica_seeds(run.seed, replicas)
  single = jax.jit(step_for_seed(run.seed))

  figures = {"1 replica": median_ms(single, init_fn(jax.random.key(run.seed)), batch, steps)}
  for strategy in STRATEGIES:
    step = jax.jit(make_replicated_train_step(step_for_seed, seeds, strategy=strategy))
    figures[f"{len(seeds)} replicas {strategy}"] = median_ms(
      step, init_replicas(init_fn, seeds), batch, steps
    )
  # R runs one after another: each replica's own jitted single step in turn.
  singles = [jax.jit(step_for_seed(seed)) for seed in seeds]

  def sequential(states, batch):
    # Wait for each: R runs one after another never overlap on the devices.
    return tuple(
      zip(*(jax.block_until_ready(one(state, batch)) for one, state in zip(singles, states)))
    )

  figures[f"{len(seeds)} sequential"] = median_ms(
    sequential, tuple(init_fn(jax.random.key(seed)) for seed in seeds), batch, steps
  )

  print(f"median of {steps} steps")
  for name, ms in figures.items():
    print(f"  {name:20s} {ms:8.1f} ms/step  {ms / figures['1 replica']:5.2f}x")
  return figures


def main() -> dict:
  config, replicas = FLAGS.config, FLAGS.replicas
  if FLAGS.runs:
    return dict(
      replicas=replicas, steps=config.train.steps, run_seconds=time_runs(config, replicas)
    )
  return dict(
    replicas=replicas, steps=FLAGS.steps, ms_per_step=time_steps(config, replicas, FLAGS.steps)
  )
