"""Starting JAX's multi-controller runtime (`jax.distributed`) when asked to.

Every process of a multi-host run executes the same program; JAX connects
them. `initialize` must run before anything touches a JAX device.
"""

from __future__ import annotations

import os

import jax


def cluster_detected(environ=os.environ) -> bool:
  """True inside a multi-process job that `jax.distributed.initialize()` can
  configure by itself: SLURM or Open MPI with more than one task, or a Cloud
  TPU slice with more than one worker host."""
  def more_than_one(name: str) -> bool:
    return environ.get(name, "1").isdigit() and int(environ.get(name, "1")) > 1
  return (more_than_one("SLURM_NTASKS") or more_than_one("OMPI_COMM_WORLD_SIZE")
          or "," in environ.get("TPU_WORKER_HOSTNAMES", ""))


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, environ=os.environ) -> bool:
  """Initialises jax.distributed for a multi-process run; returns whether it did.

  With an explicit coordinator ("host:port"), process count and id, uses
  them (any cluster, or several processes on one machine, which then use
  CPU collectives). Otherwise initialises from the environment when
  `cluster_detected`, and does nothing for a single process.
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(value is not None for value in explicit):
    if any(value is None for value in explicit):
      raise ValueError("--coordinator_address, --num_processes and --process_id go together: "
                       f"got {coordinator_address!r}, {num_processes!r}, {process_id!r}")
    if not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id: {process_id} is not in [0, {num_processes})")
    jax.distributed.initialize(coordinator_address, num_processes, process_id)
    return True
  if cluster_detected(environ):
    jax.distributed.initialize()
    return True
  return False
