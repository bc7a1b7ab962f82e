"""Starting JAX's multi-controller runtime (`jax.distributed`) when asked to.

Every process of a multi-host run executes the same program; JAX connects
them. `initialize` must run before anything touches a JAX device.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import jax
import numpy as np
from etils import epath
from jax.experimental import multihost_utils

from txf.progress import say
from txf.runconfig.run_config import ConfigError, RunConfig, to_json
from txf.rundir.workdir import WorkdirError
from txf.storage import write_file

# jax.distributed's own default: hosts of a large job may start minutes apart.
JOIN_TIMEOUT_S = 300


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
    host, _, port = coordinator_address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 2**16:
      raise ValueError(
        f"--coordinator_address: {coordinator_address!r} is not HOST:PORT (e.g. host0:1234)"
      )
    # Until every process has joined, jax says nothing, then aborts (its
    # timeout): the line says what the silence is.
    say(
      f"process {process_id} of {num_processes}: waiting up to {JOIN_TIMEOUT_S} s for every "
      f"process to join at {coordinator_address}"
    )
    jax.distributed.initialize(
      coordinator_address, num_processes, process_id, initialization_timeout=JOIN_TIMEOUT_S
    )
    return True
  if cluster_detected(environ):
    say(f"waiting up to {JOIN_TIMEOUT_S} s for every process of the cluster's job to join")
    jax.distributed.initialize(initialization_timeout=JOIN_TIMEOUT_S)
    return True
  return False


def _allgathered(value: Any) -> list[Any]:
  """Every process's JSON `value`, in process order (a collective: every
  process calls it)."""
  payload = np.frombuffer(json.dumps(value, sort_keys=True).encode(), np.uint8)
  lengths = np.asarray(multihost_utils.process_allgather(np.array([len(payload)])))
  padded = np.zeros(int(lengths.max()), np.uint8)
  padded[: len(payload)] = payload
  rows = np.asarray(multihost_utils.process_allgather(padded))
  return [json.loads(row[:length].tobytes()) for row, length in zip(rows, lengths.ravel())]


def _first_difference(ours: Any, theirs: Any, path: str = "") -> tuple[str, Any, Any] | None:
  """(dotted path, ours, theirs) of the first leaf where two JSON values
  differ, None where they are equal."""
  if isinstance(ours, dict) and isinstance(theirs, dict):
    for key in sorted(set(ours) | set(theirs)):
      found = _first_difference(ours.get(key), theirs.get(key), f"{path}{key}.")
      if found:
        return found
    return None
  return None if ours == theirs else (path.rstrip("."), ours, theirs)


def check_processes_agree(run: RunConfig, resume_step: int | None, workdir: epath.Path) -> None:
  """That every process of a multi-process run was started with the same
  `run` and --resume_step, and sees one work directory: process 0 writes a
  file there that every other must read (a host-local path on each host is
  not one directory). A collective: every process calls it, before any
  compute; nothing for one process (not even the config's JSON). Without
  it, processes given another learning rate or seed trained one model with
  both and exited 0, and processes writing apart hung at the first
  checkpoint.

  Raises:
    ConfigError: on every process, naming the first setting where a
      process's differs from process 0's.
    WorkdirError: on every process, naming a process that does not see
      process 0's file.
  """
  if jax.process_count() == 1:
    return
  everyone = _allgathered({**to_json(run), "--resume_step": resume_step})
  for index, theirs in enumerate(everyone[1:], 1):
    found = _first_difference(everyone[0], theirs)
    if found:
      name, ours, other = found
      raise ConfigError(
        f"{name}: process {index} was started with {other!r}, process 0 with {ours!r}: "
        "start every process of a run with the same config and flags"
      )
  chief = jax.process_index() == 0
  created = chief and not workdir.exists()
  probe = workdir / f".txf-processes-{_allgathered(uuid.uuid4().hex)[0]}"
  if chief:
    write_file(probe, "")
  multihost_utils.sync_global_devices("txf: the work directory's probe is written")
  seen = _allgathered(probe.exists())
  multihost_utils.sync_global_devices("txf: the work directory's probe is read")
  if chief:
    probe.unlink()
    if created and not all(seen):  # a refused run leaves nothing behind
      workdir.rmdir()
  if not all(seen):
    raise WorkdirError(
      f"{workdir}: process {seen.index(False)} does not see the files process 0 writes there: "
      "the processes of a run need one shared directory (a path on each host's own disk is not)"
    )


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
  states = _allgathered(state)
  return states[0] if all(s == states[0] for s in states) else {"processes": states}
