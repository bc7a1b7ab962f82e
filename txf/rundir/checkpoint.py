"""Orbax checkpointing of the train state plus a JSON dict of extras.

Each step directory holds two items:
  state   the train state's arrays (`ocp.args.StandardSave` /
          `StandardRestore`): in a single-process run packed into a few
          large ones (`txf.rundir.packed_state`), each array as it is
          otherwise (and in steps saved by txf before packing)
  extras  a JSON dict: data-iterator position, RNG info, anything small;
          and the save's own records, taken out on restore: the state's
          checksums and, for a packed state, its layout

Restoring picks the newest checkpoint that restores cleanly. A newer one
that fails (truncated or missing files, a missing item, or a corrupt
state: a flipped byte in its compressed data restores without an error, as
other values) is, once an older
step has restored, renamed to `<step>.corrupt` -- kept for inspection,
never deleted, and out of the way of the resumed run's own save at that
step -- and reported in one warning line naming the step, the reason and
where it went. Unfinished saves
(`<step>.orbax-checkpoint-tmp-*` directories) are ignored by orbax; a reader
reports and leaves them, the run that resumes (it holds the directory)
removes them.

A corrupt state is found by its checksums: each save records, in extras
(under CHECKSUMS_KEY, taken out again on restore), the sum of each leaf's
bits (wrapping at 2**32; one reduction on the devices) that a restore
computes again. Any one flipped bit or byte changes it (a corrupt
compressed block decompresses into other values: several change, and they
cancel by chance alone); damage that only reorders a leaf's values leaves
it unchanged, as a plain sum does. A state holding a NaN or
infinity, which no run saves (and `save` refuses), is corrupt too (the only
check of a step saved by txf before checksums).

Which steps are kept: the `max_to_keep` newest, and any that a keep
policy names -- each at a multiple of `keep_every`, the `keep_best` of
lowest eval_loss (a save's `metrics`; orbax's EveryNSteps and BestN
preservation policies). A run resumed from an earlier step than the newest
(`restore_step`, then `drop_after`) moves the later steps to
`<step>.dropped`, kept as the corrupt ones are.

A Checkpointer opened with `read_only=True` (to evaluate a run, perhaps one
that is still training) creates, renames and writes nothing. A step that
vanishes while it is read (the training run saved a newer one and, keeping
`max_to_keep`, deleted it) is not a corrupt step: the listing is read again
and the newest step retried, and if the steps keep changing the error says
that they were being replaced.

A failed save never costs the last good checkpoint: orbax deletes steps
beyond `max_to_keep` only after a save has committed, and `check_for_errors`
never takes a pending save's error from under it (orbax reports a
background failure once; taken by another thread, the save would look
committed and the older steps would be deleted).

A save keeps out of the training thread's way: it returns once the state
is copied off the devices (or, in a CPU device's memory, copied there: the
step that donates the state next would otherwise copy it itself, in its
dispatch), orbax's per-array Python work, which holds the interpreter lock
the training thread needs to dispatch, is done for a dozen packed arrays
instead of hundreds, and tensorstore's threads that then compress and write
it run at a lower CPU priority (nice 10) and off one of the process's
cores, so a training thread waking to dispatch a step finds a core free
(`packed_state.pack`, `_unaliased`, `_yield_to_training`;
benchmarks.run checkpoint_stall times a step dispatched during a save).

orbax logs each failure it meets with a traceback (from its own threads,
tens to hundreds of lines); every one of them also reaches the caller as
CheckpointWriteError or RestoreError, so those records are dropped
(`OrbaxErrorFilter`, installed on the logger orbax writes to). What a
failed save or restore leaves behind (the abandoned read of every other
array, each failing as it is collected, which asyncio and Python report as
never retrieved or unraisable; tensorstore calling back into orbax's closed
event loop) goes to this module's debug log, not the terminal.

Preemption: with `jax.distributed` initialised, JAX's preemption service
turns SIGTERM into a step every process agrees on, which
`Checkpointer.reached_preemption(step)` reports. A single-process run has
no such service: wrap the loop in `PreemptionGuard` so SIGTERM (and Ctrl-C,
SIGINT) sets a flag and the loop can save and return. Check both:
`if guard.requested or ckpt.reached_preemption(step): save(force=True); exit`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from txf.runconfig.run_config import TrainConfig
from txf.rundir.packed_state import STORED_AS, layout_target, pack, packable, unpack
from txf.rundir.workdir import check_writable
from txf.storage import WriteError, free_path, is_local, os_reason

logger = logging.getLogger(__name__)

STATE_ITEM = "state"
EXTRAS_ITEM = "extras"
CORRUPT_SUFFIX = ".corrupt"
# Where a resume from an earlier step (loop.run's resume_step) moves the later ones.
DROPPED_SUFFIX = ".dropped"
# Reading a run that is training: how often a restore starts over when the
# steps changed while it read, and how long it waits before each new try.
REPLACED_RETRIES = 5
REPLACED_WAIT_SECONDS = 0.5


class RestoreError(RuntimeError):
  """Checkpoints exist but none of them restores onto the given state."""


class OrbaxErrorFilter(logging.Filter):
  """Drops orbax's error records (and their tracebacks): every failure they
  report also reaches the caller, as CheckpointWriteError or RestoreError."""

  def filter(self, record: logging.LogRecord) -> bool:
    from_orbax = f"{os.sep}orbax{os.sep}" in (record.pathname or "")
    return not (from_orbax and record.levelno >= logging.ERROR)


class AbandonedOrbaxTaskFilter(logging.Filter):
  """Sends asyncio's '... exception was never retrieved' records for orbax's
  tasks and tensorstore's futures (the reads a failed restore abandoned,
  each failing as it is collected) to this module's debug log instead."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    never_retrieved = "exception was never retrieved" in record.getMessage()
    if not (never_retrieved and _from_orbax(error)):
      return True
    logger.debug("Left behind by a failed checkpoint restore:", exc_info=record.exc_info)
    return False


def _from_orbax(error: BaseException | None) -> bool:
  """Whether `error` was raised in orbax's code (a frame of its traceback is)
  or by tensorstore (its message carries the spec tensorstore appends)."""
  if error is None:
    return False
  if SPEC_MARKERS[0] in str(error):
    return True
  frame = error.__traceback__
  while frame is not None:
    if f"{os.sep}orbax{os.sep}" in frame.tb_frame.f_code.co_filename:
      return True
    frame = frame.tb_next
  return False


def _install_filter(logger_name: str, kind: type[logging.Filter]) -> None:
  """Adds a `kind` filter to the logger `logger_name` unless it has one."""
  target = logging.getLogger(logger_name)
  if not any(isinstance(f, kind) for f in target.filters):
    target.addFilter(kind())


def _quiet_orbax_errors() -> None:
  """Installs OrbaxErrorFilter on the logger orbax writes to (absl's),
  AbandonedOrbaxTaskFilter on asyncio's, and `_logging_orbax_leftovers` as
  sys.unraisablehook, once."""
  _install_filter("absl", OrbaxErrorFilter)
  _install_filter("asyncio", AbandonedOrbaxTaskFilter)
  if not getattr(sys.unraisablehook, "logs_orbax_leftovers", False):
    sys.unraisablehook = _logging_orbax_leftovers(sys.unraisablehook)


def _is_orbax_leftover(unraisable: Any) -> bool:
  """Whether an unraisable error (sys.unraisablehook's argument) is one a
  failed checkpoint save or restore leaves behind: an error raised in
  orbax's code or by tensorstore that nobody took (when one array fails to
  read, orbax raises its error and abandons the reads of the others, which
  fail too), or tensorstore completing a write or read on orbax's event
  loop after the failure closed it ('Event loop is closed', from a C++
  thread)."""
  if _from_orbax(unraisable.exc_value):
    return True
  last = unraisable.exc_traceback
  while last is not None and last.tb_next is not None:
    last = last.tb_next
  return (
    unraisable.exc_type is RuntimeError
    and str(unraisable.exc_value) == "Event loop is closed"
    and last is not None
    and "asyncio" in last.tb_frame.f_code.co_filename
  )


def _logging_orbax_leftovers(unraisablehook):
  """`unraisablehook`, except that orbax's leftovers (`_is_orbax_leftover`)
  go to this module's debug log, not to stderr: dozens of tracebacks, each
  with kilobytes of TensorStore spec, after the failure's own report
  (RestoreError, CheckpointWriteError, a step set aside) has said it all."""

  def hook(unraisable):
    if not _is_orbax_leftover(unraisable):
      unraisablehook(unraisable)
      return
    error = (unraisable.exc_type, unraisable.exc_value, unraisable.exc_traceback)
    logger.debug("Left behind by a failed checkpoint save or restore:", exc_info=error)

  hook.logs_orbax_leftovers = True
  return hook


class CheckpointWriteError(WriteError):
  """A checkpoint could not be written (read-only or full disk, a file in the
  way, ...). Checkpoints finalised before it are intact: a failed save
  deletes no older step.

  After a failed asynchronous save, orbax's background threads wait forever
  for a commit that never comes and would keep the interpreter from exiting:
  a program that gets this error should report it and end with `os._exit`
  (as experiments/run.py does).
  """


def _positive_int(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}.")
  return value


def _as_directory(directory: str | os.PathLike) -> epath.Path:
  """Orbax needs absolute paths; a URL (gs://...) is one already, and
  `absolute()` would make it a local path."""
  directory = epath.Path(directory)
  return directory.absolute() if is_local(directory) else directory


# The evaluation metric `keep_best` ranks checkpoints by (lowest kept).
BEST_METRIC = "eval_loss"


def _best_metric(metrics: dict[str, float]) -> float:
  """A checkpoint's rank for keep_best (lower is better); one saved without
  an evaluation (a preemption's) or with a NaN one ranks last (a NaN broke
  BestN's sort: the best step was deleted)."""
  value = float(metrics.get(BEST_METRIC, float("inf")))
  return float("inf") if math.isnan(value) else value


def _preservation_policy(max_to_keep: int, keep_every: int, keep_best: int):
  """Keep a checkpoint that any of these keeps: the `max_to_keep` newest,
  each at a multiple of `keep_every` (0: none), the `keep_best` of lowest
  BEST_METRIC (0: none)."""
  policies = ocp.checkpoint_managers
  keep = [policies.LatestN(n=max_to_keep)]
  if keep_every:
    keep.append(policies.EveryNSteps(interval_steps=keep_every))
  if keep_best:
    keep.append(
      policies.BestN(
        get_metric_fn=_best_metric,
        reverse=True,  # sorted highest first, the last n kept: the lowest
        n=keep_best,
        keep_checkpoints_without_metrics=False,
      )
    )
  return policies.AnyPreservationPolicy(keep)


def _check_abstract_state(abstract_state: Any) -> None:
  leaves = jax.tree.leaves(abstract_state)
  if not leaves:
    raise ValueError("abstract_state has no leaves.")
  for leaf in leaves:
    if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
      raise ValueError(
        "abstract_state leaves must be jax.ShapeDtypeStruct "
        f"(or arrays), got {type(leaf).__name__}."
      )


CHECKSUMS_KEY = "state_checksums"
# Where extras record how the state's arrays were packed (packed_state.Layout);
# a step without it (a state that is not packable, or saved by txf before
# packing) holds each array as it is.
LAYOUT_KEY = "state_layout"


class CorruptState(ValueError):
  """A restored state is not the one saved: it holds a NaN or infinity,
  which no run saves (a non-finite loss or gradient stops it first), or its
  bits differ from the checksums recorded at save time."""


def _as_unsigned(leaf_X: jax.Array) -> jax.Array:
  """`leaf_X`'s bits as uint32: each value of 2 to 32 bits widened (a 4-bit
  one, int4, too), each 8-byte one (x64) as its two halves, a complex one as
  its parts'."""
  if jnp.issubdtype(leaf_X.dtype, jax.dtypes.prng_key):
    leaf_X = jax.random.key_data(leaf_X)
  if jnp.issubdtype(leaf_X.dtype, jnp.complexfloating):
    return jnp.stack([_as_unsigned(leaf_X.real), _as_unsigned(leaf_X.imag)])
  if leaf_X.dtype == jnp.bool_:
    return leaf_X.astype(jnp.uint32)
  bits = jax.dtypes.itemsize_bits(leaf_X.dtype)
  unsigned = {2: jnp.uint2, 4: jnp.uint4, 8: jnp.uint8, 16: jnp.uint16}.get(bits, jnp.uint32)
  return jax.lax.bitcast_convert_type(leaf_X, unsigned).astype(jnp.uint32)


@jax.jit
def _fingerprint(leaf_X: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Whether every value of `leaf_X` is finite, and the sum of its bits as
  `_as_unsigned` reads them (uint32, wrapping). Compiled once per shape and
  dtype: a model's leaves share a few."""
  finite = jnp.isfinite(leaf_X).all() if jnp.issubdtype(leaf_X.dtype, jnp.inexact) else True
  return jnp.asarray(finite), _as_unsigned(leaf_X).sum(dtype=jnp.uint32)


def _fingerprints(state: Any) -> list[tuple[str, bool, int]]:
  """(path, finite, checksum) of each leaf of `state`: one reduction each
  on the devices, each finished before the next starts. On a multi-process
  mesh each is a cross-process reduction, and reductions in flight together,
  independent of each other, may run in a different order on each process,
  each waiting for the other's (two-process saves hung so); what waiting
  costs a save: docs/benchmarks.md, "The checksums a save records"."""
  fingerprints = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    finite, checksum = jax.device_get(_fingerprint(leaf))
    fingerprints.append((jax.tree_util.keystr(path), bool(finite), int(checksum)))
  return fingerprints


def state_checksums(state: Any) -> dict[str, int]:
  """{leaf path: the sum of its bits} of `state` (see `_fingerprint`)."""
  return {path: checksum for path, _, checksum in _fingerprints(state)}


def _check_state(state: Any, checksums: dict[str, int] | None) -> None:
  """Raises CorruptState naming the first leaf of `state` that holds a
  non-finite value or whose checksum differs from `checksums` (None: saved
  without them, by txf before checksums)."""
  for path, finite, checksum in _fingerprints(state):
    if not finite:
      raise CorruptState(f"non-finite values in {path}")
    if checksums is not None and checksums.get(path, checksum) != checksum:
      raise CorruptState(f"{path} differs from the checksum recorded when it was saved")


def _check_extras(extras: Any) -> None:
  """Fails now rather than in orbax's background writer."""
  if not isinstance(extras, dict):
    raise ValueError(f"extras must be a dict, got {type(extras).__name__}.")
  for key in (CHECKSUMS_KEY, LAYOUT_KEY):
    if key in extras:
      raise ValueError(f"extras may not hold {key!r}: the save records the state's there.")
  try:
    json.dumps(extras)
  except (TypeError, ValueError) as error:
    raise ValueError(f"extras must be JSON-serialisable: {error}") from error


def _check_leaves(state: Any, packed: bool) -> None:
  """Fails now, naming the leaf, where a save would write other values than
  the state's or fail in orbax's background writer (`packed`: the state is
  saved packed).

  Raises:
    ValueError: a numpy leaf of a 64-bit dtype without jax_enable_x64 (jax
      would sum and pack it truncated to 32 bits: wrong values on disk), or,
      saved as it is, a leaf of a dtype tensorstore cannot write
      (packed_state.STORED_AS: packed, its bits are stored as another's).
  """
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    name = getattr(getattr(leaf, "dtype", None), "name", None)
    if isinstance(leaf, np.ndarray) and jax.dtypes.canonicalize_dtype(leaf.dtype) != leaf.dtype:
      raise ValueError(
        f"state leaf {jax.tree_util.keystr(path)}: a numpy {name} array is saved "
        "truncated to 32 bits unless jax_enable_x64 is set; cast it or enable x64"
      )
    if not packed and name in STORED_AS:
      raise ValueError(
        f"state leaf {jax.tree_util.keystr(path)}: {name} cannot be written by "
        "orbax's tensorstore in a state saved as it is (sharded or multi-process)"
      )


def _path_names(path: tuple) -> tuple[str, ...]:
  """A leaf's path as its keys' names (jax's simple rendering of each: a
  dataclass field, a dict key, an index), as orbax's metadata tree and the
  state's pytree both spell them."""
  return tuple(jax.tree_util.keystr((key,), simple=True) for key in path)


def _check_saved_arrays(metadata: Any, abstract_state: Any) -> None:
  """Refuses an `abstract_state` leaf whose shape or dtype differ from the
  array saved at its path (orbax's `metadata` tree of a state saved as it
  is): orbax casts it without a word, and the step's checksums then call it
  corrupt. A PRNG key (saved as its uint32 data) and a path the metadata
  lacks (orbax's own restore names it) are left to orbax.

  Raises:
    ValueError: one line naming the first such leaf, as `unpack` does.
  """
  saved = {_path_names(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(metadata)}
  for path, leaf in jax.tree_util.tree_leaves_with_path(abstract_state):
    array = saved.get(_path_names(path))
    if array is None or jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      continue
    was = (np.dtype(array.dtype).name, list(array.shape))
    asked = (np.dtype(leaf.dtype).name, list(leaf.shape))
    if was != asked:
      raise ValueError(
        f"the state saved holds {jax.tree_util.keystr(path)} as {was[0]}{was[1]}, the one "
        f"asked for as {asked[0]}{asked[1]}"
      )


class Checkpointer:
  """Saves and restores (state, extras) under `directory`, one dir per step.

  Every process calls every method (orbax coordinates the processes).
  Usable as a context manager (closes on exit, waiting for pending saves).

  Args:
    directory: root of the step directories (created if missing, unless
      `read_only`).
    max_to_keep: how many of the newest checkpoints to keep.
    save_interval_steps: `save` writes only at multiples of this, at a
      preemption step, or when forced.
    keep_every: also keep every checkpoint at a multiple of this step (0: none).
    keep_best: also keep this many checkpoints of lowest `BEST_METRIC`, among
      those saved with it (`save`'s `metrics`; 0: none).
    read_only: only restore: nothing under `directory` (nor the directory
      itself) is created, renamed or written, and `save` raises.
  """

  def __init__(
    self,
    directory: str | os.PathLike,
    *,
    max_to_keep: int = 3,
    save_interval_steps: int = 1,
    keep_every: int = 0,
    keep_best: int = 0,
    read_only: bool = False,
  ):
    _positive_int("max_to_keep", max_to_keep)
    _positive_int("save_interval_steps", save_interval_steps)
    _quiet_orbax_errors()
    policies = ocp.checkpoint_managers
    options = ocp.CheckpointManagerOptions(
      save_decision_policy=policies.AnySavePolicy(
        [
          policies.FixedIntervalPolicy(save_interval_steps),
          policies.PreemptionCheckpointingPolicy(),
        ]
      ),
      preservation_policy=_preservation_policy(max_to_keep, keep_every, keep_best),
      # orbax writes a save's metrics only where it ranks by them.
      best_fn=_best_metric if keep_best else None,
      best_mode="min",
      # orbax's own read_only option warns at every opening; without
      # `create` and without saves it writes nothing either.
      create=not read_only,
    )
    directory = _as_directory(directory)
    self._read_only = read_only
    self._ranks_by_metrics = bool(keep_best)
    self._unchecked_save = False  # a save started whose outcome check_for_errors has not seen
    # Fail before training, not at the first save steps later: a WorkdirError,
    # as for the work directory itself (one line, exit 2).
    if not read_only:
      check_writable(directory)
    self._opened = _local_stat(directory)
    # The handlers named, not left to each call's args, so that a step's
    # item_metadata is read (orbax warns and gives None for an unnamed one).
    handlers = {
      STATE_ITEM: ocp.StandardCheckpointHandler(),
      EXTRAS_ITEM: ocp.JsonCheckpointHandler(),
    }
    self._manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)

  def _writing(self, action):
    """Runs `action()`, turning any failure of a save into CheckpointWriteError."""
    try:
      return action()
    except CheckpointWriteError:
      raise
    except Exception as error:
      # orbax forgot the steps the failed save was to replace: what is on
      # disk (they are, still) is what latest_step must report.
      with contextlib.suppress(Exception):
        self._manager.reload()
      message = f"writing a checkpoint under {self.directory} failed: {_describe(error)}"
      problem = _directory_problem(self.directory, self._opened)
      raise CheckpointWriteError(
        message if problem is None else f"{message}; the directory now: {problem}"
      ) from error

  @property
  def directory(self) -> epath.Path:
    return self._manager.directory

  def save(
    self,
    step: int,
    state: Any,
    extras: dict[str, Any],
    *,
    force: bool = False,
    metrics: dict[str, float] | None = None,
  ) -> bool:
    """Starts an asynchronous save of `state` and `extras` at `step`, with
    the evaluation `metrics` at `step` (None: none ran there) that `keep_best`
    ranks it by.

    Returns once the arrays are copied off the devices (arrays in host
    memory, a CPU device's: copied there, see `_unaliased`), so the caller
    may donate or overwrite `state` right away; the files are written in the
    background (see `wait_until_finished`).

    Returns:
      Whether a save was started: False off the save interval (unless
      `force`) and for steps not after the latest checkpoint (forced too).

    Raises:
      ValueError: `extras` is not a JSON-serialisable dict (or holds
        CHECKSUMS_KEY), `step` < 0, a leaf cannot be saved as it is
        (`_check_leaves`) or holds a NaN or infinity (which a restore takes
        for damage: CorruptState).
      CheckpointWriteError: this save, or an earlier asynchronous one, failed.
    """
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    if self._read_only:
      raise CheckpointWriteError(f"{self.directory} was opened read-only (for restoring)")
    _check_extras(extras)
    packed = packable(state)
    _check_leaves(state, packed)
    # Decided here, as orbax's save would, so that no copy is made for a
    # step that is not saved. Forced too, never at or before the latest
    # step: orbax keeps the most recently saved steps, so an older step
    # saved last would cost newer ones.
    latest = self._manager.latest_step()
    if (latest is not None and step <= latest) or not (force or self._manager.should_save(step)):
      return False
    fingerprints = _fingerprints(state)
    for path, finite, _ in fingerprints:
      if not finite:  # a restore would take the step for a damaged one
        raise ValueError(f"state leaf {path} holds a NaN or infinity: not saved")
    self._unchecked_save = True
    extras = {**extras, CHECKSUMS_KEY: {path: checksum for path, _, checksum in fingerprints}}
    if packed:
      saved, extras[LAYOUT_KEY] = pack(state)
    else:
      saved = _unaliased(state)
    args = ocp.args.Composite(
      **{STATE_ITEM: ocp.args.StandardSave(saved), EXTRAS_ITEM: ocp.args.JsonSave(extras)}
    )
    if self._ranks_by_metrics and metrics is None:
      # orbax warns of every save without them when it ranks: the steps saved
      # off an evaluation (a preemption's) are left unranked on purpose.
      metrics = {}
    started = self._writing(
      lambda: self._manager.save(step, args=args, force=True, metrics=metrics)
    )
    if started:
      _yield_to_training()
    return started

  @property
  def saving(self) -> bool:
    """Whether a save has started and is not yet finished (written,
    committed and older steps pruned). Cheap; it waits for nothing."""
    return self._manager.is_saving_in_progress()

  def wait_until_finished(self) -> None:
    """Blocks until pending saves are on disk (and old ones pruned).

    Raises:
      CheckpointWriteError: a pending save failed.
    """
    self._writing(self._manager.wait_until_finished)
    self.check_for_errors()

  def check_for_errors(self) -> None:
    """Raises CheckpointWriteError if a finished asynchronous save failed.

    Cheap (no waiting): call it at log steps so a failed write stops the run
    soon after it happens rather than at the next save. A save still in
    progress is left alone: orbax reports a background failure only once, and
    its save thread must be the one to see it -- taken from under it here,
    the failed save would look committed and orbax would delete the older
    steps (with max_to_keep=1, the last good checkpoint). Once the save has
    finished, its error (if any) is raised here.
    """
    if not self._unchecked_save:
      return
    # Workers tensorstore started for the save since (see _yield_to_training).
    _yield_to_training()
    if self._manager.is_saving_in_progress():
      return
    # Returns at once: the save has finished; raises its error. (Called only
    # once per save: orbax adds each call's time to its "waiting for the
    # previous save" figure, and warns when that passes a second.)
    self._unchecked_save = False
    self._writing(self._manager.wait_until_finished)

  def latest_step(self) -> int | None:
    """The newest finalised step in the directory, or None."""
    return self._manager.latest_step()

  def reached_preemption(self, step: int) -> bool:
    """True at the step all processes agreed to stop at after a SIGTERM.

    Needs `jax.distributed.initialize` (JAX's preemption service); always
    False otherwise -- use `PreemptionGuard` there. It is a sync point:
    call it at every step on every process.
    """
    return self._manager.reached_preemption(step)

  def restore(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
    """Restores the newest checkpoint that restores cleanly.

    When the steps change while they are read (a run training in the same
    directory saved a newer step and deleted the one being read), the
    listing is read again and the newest step tried again, up to
    REPLACED_RETRIES times.

    Args:
      abstract_state: pytree of `jax.ShapeDtypeStruct` (with shardings to
        restore onto a mesh) matching the saved state.

    Returns:
      (step, state, extras), or None if there are no checkpoints.

    Raises:
      ValueError: `abstract_state` has no array-like leaves.
      RestoreError: checkpoints exist but none restores (each step's error is
        listed; nothing is renamed), or they kept being replaced while read.
    """
    _check_abstract_state(abstract_state)
    if not self.directory.exists():
      return None
    self._report_unfinished_saves()
    replaced: list[int] = []
    for attempt in range(REPLACED_RETRIES):
      if attempt:
        time.sleep(REPLACED_WAIT_SECONDS)
      outcome = self._restore_newest(abstract_state)
      if outcome is None or isinstance(outcome, tuple):
        return outcome
      replaced.append(outcome)
    read = ", ".join(str(step) for step in replaced if step >= 0) or "the listing"
    raise RestoreError(
      f"the checkpoints in {self.directory} changed while they were read, "
      f"{REPLACED_RETRIES} times (read: {read}): a run is probably training there and "
      "replacing them (with train.max_to_keep=1 it deletes each step as it saves the "
      "next); try again once it has saved or stopped"
    )

  def steps(self) -> list[int]:
    """The finalised steps on disk now, oldest first (e.g. to analyse each)."""
    return self._steps()[::-1]

  def restore_step(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """(state, extras) of the checkpoint at `step` exactly (see `restore`'s
    arguments); no other step is tried and nothing is renamed.

    Raises:
      ValueError: there is no finalised checkpoint at `step`.
      RestoreError: it does not restore (the error names it).
    """
    _check_abstract_state(abstract_state)
    if not self.directory.exists() or step not in self._steps():
      raise ValueError(f"no checkpoint at step {step} in {self.directory}")
    self._report_unfinished_saves()
    try:
      return self._restored(step, abstract_state)
    except Exception as error:
      raise RestoreError(
        f"checkpoint step {step} in {self.directory} does not restore: {_describe(error)}"
      ) from error

  def _restored(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """(state, extras) of `step`, the state (packed or not: the extras say)
    onto `abstract_state` and checked against the checksums the extras hold
    (both taken out of them)."""
    extras = dict(self._read(step, EXTRAS_ITEM, ocp.args.JsonRestore()))
    layout, checksums = extras.pop(LAYOUT_KEY, None), extras.pop(CHECKSUMS_KEY, None)
    if layout is None:
      _check_saved_arrays(self._manager.item_metadata(step)[STATE_ITEM], abstract_state)
      state = self._read(step, STATE_ITEM, ocp.args.StandardRestore(abstract_state))
    elif checksums is None:
      # Every packed save records them; without, a damaged layout would hand
      # one leaf's values to another unseen.
      raise CorruptState(f"its extras hold the state's {LAYOUT_KEY} but no {CHECKSUMS_KEY}")
    else:
      packed = self._read(step, STATE_ITEM, ocp.args.StandardRestore(layout_target(layout)))
      state = unpack(packed, layout, abstract_state)
    _check_state(state, checksums)
    return state, extras

  def _read(self, step: int, item: str, args: ocp.args.CheckpointArgs) -> Any:
    """One item of `step`, read as `args` say."""
    return self._manager.restore(step, args=ocp.args.Composite(**{item: args}))[item]

  def _steps(self) -> list[int]:
    """The finalised steps on disk now, newest first."""
    self._manager.reload()
    return sorted(self._manager.all_steps(), reverse=True)

  def _restore_newest(self, abstract_state: Any) -> tuple[int, Any, dict] | int | None:
    """One pass over the steps, newest first: (step, state, extras) of the
    first that restores, None if there are none, or the step being read when
    the steps changed (the caller tries again).

    Raises:
      RestoreError: every step fails, and none changed while being read.
    """
    try:
      steps = self._steps()
    except OSError:  # a step vanished while the listing read it
      return -1
    failures: list[tuple[int, Exception]] = []
    for step in steps:
      try:
        state, extras = self._restored(step, abstract_state)
      except Exception as error:
        # Any failure (missing file, bad bytes, missing item) makes this
        # step unusable; which exception depends on the file that broke --
        # unless the steps changed meanwhile: then it was being replaced.
        if self._replaced(steps):
          logger.warning(
            "Checkpoint step %d in %s changed while it was read (a run "
            "training there replaced it); reading the steps again.",
            step,
            self.directory,
          )
          return step
        # Said once it is known what becomes of it (_set_aside, or RestoreError).
        logger.debug("Checkpoint step %d does not restore:", step, exc_info=error)
        failures.append((step, error))
        continue
      self._set_aside(failures, restored_step=step)
      return step, state, extras
    if failures:
      details = "\n".join(f"  step {s}: {_describe(e)}" for s, e in failures)
      cause = (
        "every step's data is corrupt (restore the "
        "directory from a copy, or move it away to start afresh)"
        if all(isinstance(error, CorruptState) for _, error in failures)
        else "if every step fails the same way, the config probably differs from the one "
        "that wrote them (model or optimizer shapes); otherwise move the directory away to "
        "start afresh"
      )
      raise RestoreError(
        f"No checkpoint in {self.directory} restores onto the given state:\n"
        f"{details}\nThey are left in place; {cause}."
      ) from failures[0][1]
    return None

  def _replaced(self, steps: list[int]) -> bool:
    """Whether the finalised steps on disk are no longer `steps`."""
    try:
      return self._steps() != steps
    except OSError:
      return True

  def _report_unfinished_saves(self) -> None:
    """Says which saves were never finalised; the run that resumes (a
    writable Checkpointer: process 0 holds the work directory's lock, so no
    run is saving there) removes them: orbax would only when it saves that
    step again, and every later command warned of one at a step never saved
    again."""
    removes = not self._read_only and is_local(self.directory) and jax.process_index() == 0
    for tmp in ocp.path.step.all_temporary_paths(self.directory):
      if removes:
        shutil.rmtree(tmp.get(), ignore_errors=True)
        logger.warning(
          "Removed unfinished checkpoint save %s (not finalised: the job stopped or "
          "failed mid-save).",
          tmp.get(),
        )
      else:
        logger.warning(
          "Ignoring unfinished checkpoint save %s (not finalised: the job stopped "
          "or failed mid-save, or a run training there is saving it); it is left "
          "in place.",
          tmp.get(),
        )

  def _set_aside(self, failures: list[tuple[int, Exception]], *, restored_step: int) -> None:
    """Says, in one line per step, that each of `failures`' steps (newer than
    `restored_step`) does not restore and why, and renames it out of the way
    (unless read-only).

    Without the rename the manager would still report them as the latest
    step and refuse the resumed run's saves up to that step.
    """
    if not failures:
      return
    if self._read_only:
      for step, error in failures:
        logger.warning(
          "Checkpoint step %d in %s does not restore (%s); restored step %d, the newest that does.",
          step,
          self.directory,
          _describe(error),
          restored_step,
        )
      return
    moved = self._move_aside([step for step, _ in failures], CORRUPT_SUFFIX)
    for (step, error), target in zip(failures, moved, strict=True):
      if target is not None:
        logger.warning(
          "Checkpoint step %d does not restore (%s): moved to %s (kept for inspection); "
          "resuming from step %d.",
          step,
          _describe(error),
          target,
          restored_step,
        )

  def drop_after(self, step: int) -> list[epath.Path]:
    """Moves every finalised step after `step` to `<step>.dropped` (kept,
    never deleted; out of the way of the saves of a run resumed from
    `step`), returning where each went (empty on processes other than 0)."""
    if self._read_only:
      raise CheckpointWriteError(f"{self.directory} was opened read-only (for restoring)")
    later = [saved for saved in self.steps() if saved > step]
    return [target for target in self._move_aside(later, DROPPED_SUFFIX) if target is not None]

  def _move_aside(self, steps: list[int], suffix: str) -> list[epath.Path | None]:
    """Renames each of `steps` to `<step><suffix>` (or `-2`, `-3`, ... where
    that exists) on process 0, the others waiting for it; where each went
    (None on the other processes)."""
    moved: list[epath.Path | None] = [None] * len(steps)
    if ocp.multihost.process_index() == 0:
      for i, step in enumerate(steps):
        source = self.directory / str(step)
        moved[i] = free_path(source.parent / f"{source.name}{suffix}")
        source.rename(moved[i])
    ocp.multihost.sync_global_processes(f"txf_checkpoint_move_aside{suffix}")
    self._manager.reload()
    return moved

  def close(self) -> None:
    """Waits for pending saves and releases the manager's resources."""
    self._writing(self._manager.close)

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _unaliased(state: Any) -> Any:
  """`state` with each array in a CPU device's memory replaced by a copy.

  orbax's "device-to-host copy" of such an array is `np.asarray`, a view of
  the array's own buffer, which its writer threads read for seconds after
  `save` returned. A step that donates the array meanwhile (the train step
  donates the state) cannot overwrite a buffer something else still views:
  XLA copies it first, inside the step's dispatch, in the training thread
  (2.6-3.0 s for gpt2_small's 1.49 GB train state while the save wrote, on
  2 CPU cores; 0.7-4.8 s in benchmarks.run checkpoint_stall). Copied here,
  before orbax starts writing, the copy is the save call's (0.25-1.6 s
  there, mostly faulting in its fresh pages), and the buffers the step
  donates have no other reader. Arrays on an accelerator need no copy:
  orbax copies them into host memory before `save` returns.
  """

  def unaliased(leaf):
    if isinstance(leaf, jax.Array) and any(d.platform == "cpu" for d in leaf.devices()):
      return leaf.copy()
    return leaf

  return jax.tree.map(unaliased, state)


# The nice value of tensorstore's worker threads, which compress and write a
# checkpoint's arrays (Linux): low enough that a thread of the training run
# waking to dispatch a step takes a core from them at once (see
# _yield_to_training).
WRITER_NICE = 10


def _yield_to_training() -> None:
  """Lowers tensorstore's worker threads to WRITER_NICE and keeps them off
  one of the cores the process may use (`_writer_cores`). Linux only (where
  a thread has its own nice value and affinity), and best effort: a thread
  that has ended, or a value that may not be set, is left.

  At the training thread's priority, the workers (zstd over every array, as
  many as there are cores) held the cores it woke to: on 2 CPU cores a
  step's dispatch waited in the run queue for up to a few ms, p99 10.2 and
  10.6 ms during a save against 5.7 and 7.4 ms with the workers at nice 10
  (benchmarks.run checkpoint_stall, the same machine and load). A lower
  priority alone still leaves the waking thread queued behind a worker now
  and then (p99 3.0-4.2 ms on the idle 2-core machine); with one core kept
  free of workers the scheduler moves it there at once (p99 1.6-1.7 ms, the
  save 5 -> 7 s: half the cores write there, 15 of 16 on a GPU host). Only
  the workers are lowered: orbax's own threads hold the interpreter lock now
  and then, which a thread of low priority would keep while it waits for a
  core, and on a loaded machine a 1.5 MB save took 2.0-5.6 s with them at
  nice 19 too, 0.6-1.3 s with the workers alone at 19, 0.3 s at 10 (0.1-0.2
  s at the training's priority). tensorstore starts workers as a save needs
  them, from a thread of its own, so `save` and `check_for_errors` lower
  those started since. A nice value cannot be raised back without
  privileges, so they keep it, for restores too; on cores the training
  leaves idle, a save runs as fast as before, less the one core.
  """
  if not sys.platform.startswith("linux"):
    return
  cores = _writer_cores()
  for tid in _tensorstore_threads():
    try:
      if os.getpriority(os.PRIO_PROCESS, tid) < WRITER_NICE:
        os.setpriority(os.PRIO_PROCESS, tid, WRITER_NICE)
      if cores is not None and os.sched_getaffinity(tid) != cores:
        os.sched_setaffinity(tid, cores)
    except OSError:
      continue


def _writer_cores() -> set[int] | None:
  """The cores tensorstore's workers may use: the process's, less its lowest,
  which is kept for the training thread; None with a single core."""
  try:
    allowed = os.sched_getaffinity(0)
  except OSError:
    return None
  if len(allowed) < 2:
    return None
  return allowed - {min(allowed)}


def _tensorstore_threads() -> set[int]:
  """The ids of tensorstore's worker threads (named ts_...; Linux)."""
  ids: set[int] = set()
  try:
    tasks = os.listdir("/proc/self/task")
  except OSError:
    return ids
  for task in tasks:
    try:
      with open(f"/proc/self/task/{task}/comm") as comm:
        if comm.read().startswith("ts_"):
          ids.add(int(task))
    except OSError:
      continue
  return ids


# Where tensorstore's and orbax's messages go on with kilobytes of spec.
SPEC_MARKERS = (" [tensorstore_spec=", " See full TensorStore details:")


def _describe(error: BaseException, limit: int = 400) -> str:
  """One line: the type and message of the error `error` was raised from (at
  the root of its `raise ... from` chain: orbax wraps tensorstore's error,
  which names the file and the OS's reason), without the spec tensorstore
  or orbax append; a long message keeps its start and its end (where the
  OS's reason usually is: `_directory_problem` says it where it is not)."""
  while error.__cause__ is not None:
    error = error.__cause__
  message = str(error)
  for marker in SPEC_MARKERS:
    message = message.split(marker)[0]
  text = " ".join(f"{type(error).__name__}: {message}".split())
  if len(text) <= limit:
    return text
  return f"{text[: limit // 2]} ... {text[-limit // 2 :]}"


def _local_stat(directory: epath.Path) -> os.stat_result | None:
  """os.stat of the local `directory`; None where it is remote or missing (a
  read-only Checkpointer of a path not made yet)."""
  if not is_local(directory):
    return None
  try:
    return os.stat(directory)
  except OSError:
    return None


def _directory_problem(directory: epath.Path, opened: os.stat_result | None) -> str | None:
  """What is wrong with the local `directory` now: the OS's reason it cannot
  be listed ("Not a directory", "No such file or directory", "Permission
  denied"), or that it is no longer the directory `opened` was the os.stat of
  (moved away, and made again by the save); None where nothing is, or it is
  remote.

  A save in progress as its directory went names a file under the save's
  temporary directory and may carry no OS reason at all (tensorstore's
  NOT_FOUND reading back a file it wrote, orbax's "No ArrayMetadata found").
  """
  if not is_local(directory):
    return None
  try:
    os.listdir(directory)
    now = os.stat(directory)
  except OSError as error:
    return os_reason(error)
  if opened is not None and not os.path.samestat(opened, now):
    return "not the directory the run opened (that one was moved or removed)"
  return None


class StoppedBeforeTraining(BaseException):
  """A SIGTERM or Ctrl-C arrived while a PreemptionGuard stopped at once
  (`PreemptionGuard.stop_at_once`): the work it interrupted had nothing to
  save. A BaseException, as KeyboardInterrupt, so that no `except Exception`
  of the interrupted work takes it for a failure of its own."""


class PreemptionGuard:
  """Context manager: SIGTERM (a preemption) and SIGINT (Ctrl-C) set
  `requested` instead of stopping the process, so the loop can save and
  return; `interrupted` tells the two apart (txf-run exits 0 after a
  preemption, 130 after a Ctrl-C). After the first Ctrl-C, a second one
  stops at once (KeyboardInterrupt, Python's default), for a user who will
  not wait for the step and the save to finish. Between `stop_at_once` and
  `defer` (a run setting up: nothing to save yet) the first one stops at
  once too, raising StoppedBeforeTraining: a preemption's grace period is
  shorter than a large model's setup.

  In a multi-process run (`jax.process_count() > 1`) every process must
  stop at one step: JAX's preemption service owns SIGTERM there, agrees on
  that step once any process is sent one, and `Checkpointer.reached_preemption`
  reports it; the guard takes only SIGINT, which it reports to that service
  as a SIGTERM of its process (and `interrupted`, not `requested`, which
  would stop this process alone). The previous handlers are restored on
  exit. Enter it from the main thread (Python only delivers signals there).
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self._requested = threading.Event()
    self._previous: dict[int, Any] = {}
    self.interrupted = False  # a SIGINT, not only a SIGTERM, arrived
    self.installed = False
    self._at_once = False

  @property
  def requested(self) -> bool:
    """Whether SIGTERM or SIGINT arrived while the guard was installed."""
    return self._requested.is_set()

  @property
  def reason(self) -> str:
    """What stopped the run, for its last line: 'interrupted' (Ctrl-C) or 'preempted'."""
    return "interrupted" if self.interrupted else "preempted"

  def _handle(self, signum, frame) -> None:
    del frame
    if signum == signal.SIGINT:
      self.interrupted = True
      signal.signal(signal.SIGINT, self._restorable(signal.SIGINT))
    self._requested.set()
    if self._at_once:
      self._at_once = False
      raise StoppedBeforeTraining(self.reason)

  def stop_at_once(self) -> None:
    """Until `defer`, a signal raises StoppedBeforeTraining where the main
    thread is (for work with nothing to save, that writes nothing it could
    leave half-written); one that arrived already raises it here."""
    if self.requested:
      raise StoppedBeforeTraining(self.reason)
    self._at_once = True

  def defer(self) -> None:
    """From here on a signal waits for the loop (sets `requested`)."""
    self._at_once = False

  def _restorable(self, signum: int) -> Any:
    """The handler `signum` had before; None (not set from Python) as the
    default, the closest Python can restore."""
    previous = self._previous[signum]
    return signal.SIG_DFL if previous is None else previous

  def _handle_across_processes(self, signum, frame) -> None:
    del signum, frame
    self.interrupted = True
    signal.signal(signal.SIGINT, self._restorable(signal.SIGINT))
    os.kill(os.getpid(), signal.SIGTERM)  # to JAX's preemption service

  def __enter__(self) -> PreemptionGuard:
    if jax.process_count() == 1:
      self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
    else:
      self._previous = {signal.SIGINT: signal.signal(signal.SIGINT, self._handle_across_processes)}
    self.installed = True
    return self

  def __exit__(self, *exc_info) -> None:
    if self.installed:
      for signum in self._previous:
        signal.signal(signum, self._restorable(signum))
      self.installed = False


def make_checkpointer(
  train: TrainConfig, workdir: str | os.PathLike, *, read_only: bool = False
) -> Checkpointer:
  """The run's checkpoints: workdir/checkpoints, kept and spaced as its
  `train` section says; `read_only` to restore one without creating or
  writing anything."""
  return Checkpointer(
    checkpoint_directory(workdir),
    max_to_keep=train.max_to_keep,
    save_interval_steps=train.checkpoint_every,
    keep_every=train.keep_every,
    keep_best=train.keep_best,
    read_only=read_only,
  )


def checkpoint_directory(workdir: str | os.PathLike) -> epath.Path:
  """Where a run in `workdir` keeps its checkpoints."""
  return epath.Path(workdir) / "checkpoints"


def saved_steps(workdir: str | os.PathLike) -> list[int]:
  """The finalised checkpoint steps of the run in `workdir`, oldest first
  ([] for none), read without writing anything."""
  directory = checkpoint_directory(workdir)
  if not directory.exists():
    return []
  with Checkpointer(directory, read_only=True) as checkpointer:
    return checkpointer.steps()
