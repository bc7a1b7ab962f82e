"""Starting JAX's multi-controller runtime (`jax.distributed`) when asked to.

Every process of a multi-host run executes the same program; JAX connects
them. `initialize` must run before anything touches a JAX device.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils


def cluster_detected(environ=os.environ) -> bool:
  """True inside a multi-process job that `jax.distributed.initialize()` can
  configure by itself: SLURM or Open MPI with more than one task, or a Cloud
  TPU slice with more than one worker host."""

  def more_than_one(name: str) -> bool:
    return environ.get(name, "1").isdigit() and int(environ.get(name, "1")) > 1

  return (
    more_than_one("SLURM_NTASKS")
    or more_than_one("OMPI_COMM_WORLD_SIZE")
    or "," in environ.get("TPU_WORKER_HOSTNAMES", "")
  )


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  environ=os.environ,
) -> bool:
  """Initialises jax.distributed for a multi-process run; returns whether it did.

  With an explicit coordinator ("host:port"), process count and id, uses
  them (any cluster, or several processes on one machine, which then use
  CPU collectives). Otherwise initialises from the environment when
  `cluster_detected`, and does nothing for a single process.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(value is not None for value in explicit):
    if coordinator_address is None or num_processes is None or process_id is None:
      raise ValueError(
        "--coordinator_address, --num_processes and --process_id go together: "
        f"got {coordinator_address!r}, {num_processes!r}, {process_id!r}"
      )
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id: {process_id} is not in [0, {num_processes})")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return True
  if cluster_detected(environ):
    jax.distributed.initialize()
    return True
  return False


def gather_data_states(state: dict[str, Any]) -> dict[str, Any]:
  """The data position a checkpoint saves, from this process's `state`.

  Checkpoints hold one JSON data position, written by process 0. Where every
  process has the same (a batch is a function of the step) that is the
  position; where processes differ (each streams its own shard:
  txf.data.packed) it is {'processes': [each process's state]}. A collective:
  every process calls it at the same step. One process: `state` itself.
  """
  if jax.process_count() == 1:
    return state
  payload = np.frombuffer(json.dumps(state, sort_keys=True).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([len(payload)])))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: len(payload)] = payload
  rows = np.asarray(multihost_utils.process_allgather(padded))
  states = [json.loads(row[:length].tobytes()) for row, length in zip(rows, lengths.ravel())]
  return states[0] if all(s == states[0] for s in states) else {"processes": states}
