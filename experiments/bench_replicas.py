"""Times R seed replicas of a config's train step against one replica and
against R sequential single steps (txf.train.replicas); prints ms/step and
the ratio to one replica.

  python -m experiments.bench_replicas --config=configs/base.py --replicas=3 --steps=20

Each variant is compiled and run once before timing; every step is timed to
completion on the same batch, and the median is reported. "R sequential" runs
each replica's own jitted single step in turn (R dispatches per step), as R
separate runs would.
"""

from __future__ import annotations

import statistics
import time

import jax
from absl import app, flags
from ml_collections import config_flags

from txf.train.replicas import STRATEGIES, init_replicas, make_replicated_train_step
from txf.train.setup import setup_run
from txf.train.step import init_state, make_train_step

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file.", lock_config=True)
_REPLICAS = flags.DEFINE_integer("replicas", 3, "Seed replicas.")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed steps per variant.")
flags.mark_flag_as_required("config")


def median_ms(step, state, batch, steps: int) -> float:
  """Median wall time (ms) of `step`, after one compiling call."""
  state, _ = jax.block_until_ready(step(state, batch))
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    state, _ = jax.block_until_ready(step(state, batch))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def main(argv):
  del argv
  config = _CONFIG.value
  setup = setup_run(config)
  batch = next(iter(setup.train_data))
  init_fn = lambda key: init_state(setup.model, setup.optimizer, batch, setup.task, key)
  step_for_seed = lambda seed: make_train_step(
      setup.model, setup.optimizer, setup.task, seed=seed,
      grad_accum_steps=config.train.grad_accum_steps,
      label_smoothing=config.train.label_smoothing, z_loss=config.train.z_loss)
  seeds = tuple(config.seed + r for r in range(_REPLICAS.value))
  single = jax.jit(step_for_seed(config.seed))

  figures = {"1 replica": median_ms(single, init_fn(jax.random.key(config.seed)), batch,
                                    _STEPS.value)}
  for strategy in STRATEGIES:
    step = jax.jit(make_replicated_train_step(step_for_seed, seeds, strategy=strategy))
    figures[f"{len(seeds)} replicas {strategy}"] = median_ms(
        step, init_replicas(init_fn, seeds), batch, _STEPS.value)
  # R runs one after another: each replica's own jitted single step in turn.
  singles = [jax.jit(step_for_seed(seed)) for seed in seeds]
  def sequential(states, batch):
    # Wait for each: R runs one after another never overlap on the devices.
    return tuple(zip(*(jax.block_until_ready(one(state, batch))
                       for one, state in zip(singles, states))))
  figures[f"{len(seeds)} sequential"] = median_ms(
      sequential, tuple(init_fn(jax.random.key(seed)) for seed in seeds), batch, _STEPS.value)

  print(f"backend {jax.default_backend()}, {jax.device_count()} device(s), "
        f"median of {_STEPS.value} steps")
  for name, ms in figures.items():
    print(f"  {name:20s} {ms:8.1f} ms/step  {ms / figures['1 replica']:5.2f}x")


if __name__ == "__main__":
  app.run(main)
