"""Seeds as replicas: R copies of one run, differing only in their seed,
trained inside one jitted program on the same batches (or each on its own:
`own_batches`, batches [R, B, ...], txf.data.stacked).

  seeds = (0, 1, 2)
  state_R = init_replicas(lambda key: init_state(model, opt, batch, task, key), seeds)
  step = jax.jit(make_replicated_train_step(
      lambda seed: make_train_step(model, opt, task, seed=seed), seeds,
      strategy=default_strategy(jax.default_backend())))
  state_R, metrics_R = step(state_R, batch)     # every metric has shape [R]
  state_1 = replica(state_R, 1)                 # the run of seed 1

Replica r is the single run of `seeds[r]`: its initial state comes from
`jax.random.key(seeds[r])` and its dropout keys from the same seed (the train
step folds the step number into `jax.random.key(seed)`), so replicas differ in
both their initialisation and their dropout masks, exactly as R separate runs
would. The seed reaches the step as data (a traced int32), so one program
serves every replica.

Strategies (same results up to float32 summation order):
  'vmap'  jax.vmap over the replicas: one batched program; every matmul gains
          a replica dimension.
  'map'   jax.lax.map over the replicas: a loop inside the one program, each
          iteration the single-replica step.

Measured (benchmarks/replicas.py, configs/base.py model: d_model 128,
2 layers, seq 128, batch 32; 2-core CPU shared with other jobs, ms/step and
ratio to one replica; two runs of the final script, 2026-11-23):
                     run 1              run 2
  1 replica          268 ms  1.00x      278 ms  1.00x
  3 replicas vmap    871 ms  3.24x      924 ms  3.33x
  3 replicas map     553 ms  2.06x      563 ms  2.03x
  3 sequential       771 ms  2.87x      736 ms  2.65x
(two earlier runs under heavier load: vmap 2.70x / 3.52x, map 2.19x / 3.18x.)
So on CPU vmap loses to sequential runs, as issue 13 reported (3.66x), and
lax.map wins. What the compiled HLO shows: in the single step (the body of
lax.map) only the 12 attention dots are batched dot_generals; every
dense-layer matmul and its weight gradient is a plain 2-D GEMM over
[batch * length, features]. Under vmap all 51 dots carry the replica batch
dimension (e.g. weight gradients become f32[3,128,128] batched dots); the
likely cause, not profiled further, is that XLA:CPU runs batched dots as
per-batch small matmuls, far slower than one large GEMM. Why lax.map comes
out below 3 sequential steps was not investigated (one dispatch per step
instead of R is a guess). On GPU/TPU batched matmuls are native and a small
model leaves the device mostly idle, so vmap is the default there. Measured
on one H200 (2026-11-28, configs/base.py, median of 20 steps): 1 replica 2.0
ms, 3 replicas vmap 3.1 ms (1.54x), map 4.7 ms (2.31x), 3 sequential 8.8 ms
(4.36x); docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from txf.rundir.metrics import replica_scalars
from txf.train.step import Batch, TrainState

STRATEGIES = ("vmap", "map")
TrainStep = Callable[[TrainState, Batch], tuple[TrainState, dict]]


def _seed_array(seeds: Sequence[int]) -> jax.Array:
  """[R] int32 seeds; a ValueError names `seeds` if there are none or repeats."""
  seeds = tuple(seeds)
  if not seeds:
    raise ValueError("seeds: at least one replica seed is needed, got none")
  if len(set(seeds)) != len(seeds):
    raise ValueError(f"seeds: replicas must differ in their seed, got {seeds}")
  return jnp.asarray(seeds, jnp.int32)


def init_replicas(init_fn: Callable[[jax.Array], TrainState], seeds: Sequence[int]) -> TrainState:
  """The initial states of `seeds`, stacked: every leaf gains a leading [R] axis.

  Args:
    init_fn: key -> TrainState of one run (e.g. `init_state` with its model,
      optimizer, batch and task bound).
    seeds: the replicas' seeds; replica r starts from `jax.random.key(seeds[r])`.
  """
  # One replica after another (lax.map), not vmap: vmapped, the LSTM's
  # orthogonal initialiser becomes a batched QR whose CPU kernel (jaxlib
  # 0.10) deadlocks its 2-thread pool on 2 cores. Initialisation is a sliver
  # of a run, so running it sequentially costs nothing that shows.
  return jax.lax.map(lambda seed: init_fn(jax.random.key(seed)), _seed_array(seeds))


def replica(tree_R: Any, r: int) -> Any:
  """Replica r of a stacked pytree (a state, its params): a single run's."""
  return jax.tree.map(lambda leaf_R: leaf_R[r], tree_R)


def over_replicas(
  fn: Callable[[Any, Any], Any], strategy: str, *, own_batches: bool = False
) -> Callable[[Any, Any], Any]:
  """`fn(x, batch)` of one replica -> `f(x_R, batch)` over stacked replicas.

  x_R's leaves carry a leading [R] axis; `batch` is the same for every
  replica, or with `own_batches` stacked too (replica r's is batch[r]); the
  outputs gain the [R] axis.

  Args:
    fn: the single replica's function.
    strategy: 'vmap' or 'map' (see the module docstring; `default_strategy`).
    own_batches: whether `batch`'s leaves carry the [R] axis.
  """
  if strategy not in STRATEGIES:
    raise ValueError(f"strategy: {strategy!r} is not one of {STRATEGIES}")
  if strategy == "vmap":
    return jax.vmap(fn, in_axes=(0, 0 if own_batches else None))
  if own_batches:
    return lambda x_R, batch_R: jax.lax.map(lambda xb: fn(*xb), (x_R, batch_R))
  return lambda x_R, shared: jax.lax.map(lambda x: fn(x, shared), x_R)


def make_replicated_train_step(
  step_for_seed: Callable[[jax.Array], TrainStep],
  seeds: Sequence[int],
  *,
  strategy: str,
  own_batches: bool = False,
) -> TrainStep:
  """Returns `step(state_R, batch) -> (state_R, metrics_R)` (not yet jitted).

  Every replica takes the same batch, or with `own_batches` its own (the
  batch's leaves [R, B, ...]); metrics_R holds each metric per replica ([R]).

  Args:
    step_for_seed: seed -> the single run's train step (e.g.
      `lambda seed: make_train_step(model, opt, task, seed=seed)`); it is
      called with a traced int32 seed.
    seeds: the replicas' seeds, in the order of init_replicas.
    strategy: 'vmap' or 'map' (see the module docstring; `default_strategy`).
    own_batches: whether the batch carries a leading [R] axis, replica r's batch[r].
  """
  seeds_R = _seed_array(seeds)
  one = over_replicas(
    lambda state_and_seed, batch: step_for_seed(state_and_seed[1])(state_and_seed[0], batch),
    strategy,
    own_batches=own_batches,
  )
  return lambda state_R, batch: one((state_R, seeds_R), batch)


def stacked_shardings(shardings: Any) -> Any:
  """The shardings of a stacked state from a single state's: the [R] axis
  is not split (every device holds its share of each replica)."""
  return jax.tree.map(lambda s: NamedSharding(s.mesh, PartitionSpec(None, *s.spec)), shardings)


def default_strategy(backend: str) -> str:
  """The faster strategy on `backend` ('cpu', 'gpu', 'tpu'): 'map' on CPU,
  where it measured about 2.0x one replica for 3 against vmap's 3.3x
  (module docstring); 'vmap' on accelerators."""
  return "map" if backend == "cpu" else "vmap"


# The run-level view: the one place that branches on a run's replica count.


class RunPrograms(NamedTuple):
  """A run's programs over its seeds, not yet jitted (`for_seeds`)."""

  init: Callable[[Any], TrainState]  # pretrained params (or None) -> the state
  train_step: TrainStep
  eval_step: Callable[[Any, Batch], Any]
  state_sharding: Any


def for_seeds(
  seeds: Sequence[int],
  *,
  start: Callable[[jax.Array, Any], TrainState],
  step_for_seed: Callable[[Any], TrainStep],
  eval_step: Callable[[Any, Batch], Any],
  state_sharding: Any,
  backend: str | None = None,
  own_batches: bool = False,
) -> RunPrograms:
  """A run of `seeds`: one seed's programs as they are; for R > 1 stacked over
  a leading [R] axis (init_replicas, make_replicated_train_step and
  over_replicas with the backend's default_strategy, stacked_shardings).

  Args:
    seeds: the replicas' seeds (`txf.runconfig.run_config.replica_seeds`).
    start: (key, pretrained params or None) -> one run's initial state.
    step_for_seed: seed -> one run's train step.
    eval_step: one run's (params, batch) -> sums.
    state_sharding: one run's state shardings.
    backend: the platform the programs run on ('cpu', 'gpu', 'tpu'), which
      picks the replicas' strategy; default this process's backend.
    own_batches: R > 1 only: each replica trains on its own batch (train
      batches [R, B, ...]); evaluation batches stay shared.
  """
  if len(seeds) == 1:
    (seed,) = seeds
    return RunPrograms(
      lambda params: start(jax.random.key(seed), params),
      step_for_seed(seed),
      eval_step,
      state_sharding,
    )
  strategy = default_strategy(backend or jax.default_backend())
  return RunPrograms(
    lambda params: init_replicas(lambda key: start(key, params), seeds),
    make_replicated_train_step(step_for_seed, seeds, strategy=strategy, own_batches=own_batches),
    over_replicas(eval_step, strategy),
    stacked_shardings(state_sharding),
  )


def replica_of(tree: Any, r: int, count: int) -> Any:
  """Replica r of a run of `count` replicas' pytree (its params, its state):
  the tree itself for a single run."""
  if not 0 <= r < count:
    raise ValueError(f"replica: {r} is not one of the run's {count} replicas")
  return tree if count == 1 else replica(tree, r)


def scalars(values: Mapping[str, Any], count: int) -> dict[str, float]:
  """A step's or an evaluation's values as metrics rows hold them: floats for
  a single run; for `count` > 1 each [R] value as its replicas' 'name/r',
  their mean 'name' and std 'name_std' (txf.rundir.metrics.replica_scalars)."""
  if count == 1:
    return {name: float(value) for name, value in values.items()}
  return replica_scalars(values)


def metric_names(name: str, count: int) -> list[str]:
  """The row keys holding each replica's `name` in a run of `count` replicas."""
  return [f"{name}/{r}" for r in range(count)] if count > 1 else [name]


def describe(seeds: Sequence[int]) -> str:
  """A log line's note of the replicas ('' for a single run)."""
  return f"{len(seeds)} replicas, seeds {tuple(seeds)}" if len(seeds) > 1 else ""
