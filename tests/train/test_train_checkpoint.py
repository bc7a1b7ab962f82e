"""Tests for txf.rundir.checkpoint: round trip, retention, corrupt fallback."""

import asyncio
import contextlib
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.rundir import checkpoint, packed_state


def make_state(offset):
  """A small train-state-like pytree; values depend on `offset`."""
  return {
    "params": {
      "dense": {
        "kernel": jnp.arange(12, dtype=jnp.float32).reshape(3, 4) + offset,
        "bias": jnp.full((4,), 0.5 + offset, jnp.bfloat16),
      },
    },
    "opt": {"count": jnp.asarray(offset, jnp.int32), "mu": jnp.arange(6, dtype=jnp.int32) * offset},
    "step": jnp.asarray(10 * offset, jnp.int32),
  }


def abstract(state):
  device = jax.devices()[0]
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=jax.sharding.SingleDeviceSharding(device)
    ),
    state,
  )


def extras_for(step):
  return {"data": {"epoch": 1, "position": 32 * step}, "rng": [0, step]}


def assert_trees_equal(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert g.dtype == w.dtype
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def save_steps(directory, steps, **kwargs):
  with checkpoint.Checkpointer(directory, **kwargs) as ckpt:
    for step in steps:
      assert ckpt.save(step, make_state(step), extras_for(step))
    ckpt.wait_until_finished()


def test_round_trip(tmp_path):
  save_steps(tmp_path, [1, 2])
  target = abstract(make_state(0))
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 2
    step, state, extras = ckpt.restore(target)
  assert step == 2
  assert_trees_equal(state, make_state(2))
  assert extras == extras_for(2)
  for leaf, spec in zip(jax.tree.leaves(state), jax.tree.leaves(target)):
    assert leaf.sharding == spec.sharding


def test_a_state_of_many_arrays_is_saved_as_a_few_and_each_step_restores_as_it_was_saved(
  tmp_path, monkeypatch
):
  """orbax's work per array holds the interpreter lock while the loop
  dispatches steps: a state is saved packed (txf.rundir.packed_state), a
  float32 leaf beside the others of its dtype. A step saved with each array
  as it is (a multi-process run's, or txf's before packing) restores too."""
  many = {f"w{i:02d}": jnp.full((i + 1, 3), i, jnp.float32) for i in range(40)}
  with checkpoint.Checkpointer(tmp_path, max_to_keep=5) as ckpt:
    with monkeypatch.context() as patch:
      patch.setattr(checkpoint, "packable", lambda state: False)
      assert ckpt.save(1, {**many, "x": make_state(1)}, extras_for(1))
    assert ckpt.save(2, {**many, "x": make_state(2)}, extras_for(2))
    ckpt.wait_until_finished()
    saved = {step: ckpt._manager.item_metadata(step)[checkpoint.STATE_ITEM] for step in (1, 2)}
  assert len(jax.tree.leaves(saved[1].tree)) == 45  # each array as it is
  assert sorted(saved[2].tree) == ["0", "1", "2"]  # float32, bfloat16, int32
  with checkpoint.Checkpointer(tmp_path, read_only=True) as reader:
    for step in (1, 2):
      state, extras = reader.restore_step(step, abstract({**many, "x": make_state(0)}))
      assert extras == extras_for(step)
      assert_trees_equal(state, {**many, "x": make_state(step)})


def test_a_packed_step_without_its_checksums_is_corrupt(tmp_path):
  """Its layout alone says which values are which leaf's: a damaged one
  (two leaves' paths swapped) would restore other weights unseen."""
  save_steps(tmp_path, [1, 2])
  metadata = tmp_path / "2" / "extras" / "metadata"
  extras = json.loads(metadata.read_text())
  assert checkpoint.LAYOUT_KEY in extras
  del extras[checkpoint.CHECKSUMS_KEY]
  metadata.write_text(json.dumps(extras))
  with checkpoint.Checkpointer(tmp_path, read_only=True) as reader:
    with pytest.raises(
      checkpoint.RestoreError, match=r"CorruptState: its extras hold the state's state_layout but"
    ):
      reader.restore_step(2, abstract(make_state(0)))
    assert reader.restore(abstract(make_state(0)))[0] == 1


def test_a_restored_state_is_donated_in_place(tmp_path):
  """The restored arrays are the run's own (not views of what orbax read):
  the train step consumes them without a copy."""
  save_steps(tmp_path, [1])
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    _, state, _ = ckpt.restore(abstract(make_state(0)))
  step = jax.jit(lambda state: jax.tree.map(lambda x: x + 1, state), donate_argnums=0)
  stepped = step(state)
  assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
  assert_trees_equal(stepped, jax.tree.map(lambda x: x + 1, make_state(1)))


def test_every_step_restores_by_its_number(tmp_path):
  save_steps(tmp_path, [1, 2, 3], max_to_keep=5)
  delete_extras_item(tmp_path / "3")
  with checkpoint.Checkpointer(tmp_path, read_only=True) as ckpt:
    assert ckpt.steps() == [1, 2, 3]
    for step in (1, 2):
      state, extras = ckpt.restore_step(step, abstract(make_state(0)))
      assert_trees_equal(state, make_state(step))
      assert extras == extras_for(step)
    with pytest.raises(checkpoint.RestoreError, match="step 3"):
      ckpt.restore_step(3, abstract(make_state(0)))
    with pytest.raises(ValueError, match="no checkpoint at step 4"):
      ckpt.restore_step(4, abstract(make_state(0)))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", "3"]  # nothing renamed


def test_relative_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  save_steps("ckpt", [3])
  with checkpoint.Checkpointer("ckpt") as ckpt:
    assert ckpt.restore(abstract(make_state(0)))[0] == 3


def test_max_to_keep(tmp_path):
  save_steps(tmp_path, [1, 2, 3, 4, 5], max_to_keep=2)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["4", "5"]


def kept_steps(directory):
  return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


@pytest.mark.parametrize("keep_every, want", [(0, [9, 10]), (4, [4, 8, 9, 10]), (10, [9, 10])])
def test_keep_every_keeps_its_multiples_beside_the_newest(tmp_path, keep_every, want):
  save_steps(tmp_path, range(1, 11), max_to_keep=2, keep_every=keep_every)
  assert kept_steps(tmp_path) == want


def save_with_losses(directory, losses, **kwargs):
  """Saves step s with eval_loss losses[s - 1] (None: saved without metrics)."""
  with checkpoint.Checkpointer(directory, **kwargs) as ckpt:
    for step, loss in enumerate(losses, start=1):
      metrics = None if loss is None else {"eval_loss": loss, "eval_accuracy": -loss}
      assert ckpt.save(step, make_state(step), extras_for(step), metrics=metrics)
    ckpt.wait_until_finished()


def test_keep_best_keeps_the_lowest_eval_losses_beside_the_newest(tmp_path):
  # Lowest: steps 2 (0.5) and 5 (0.7); the newest two are 7 and 8; step 3,
  # saved without an evaluation (a preemption's), is ranked by nothing.
  losses = [3.0, 0.5, None, 2.0, 0.7, 0.9, 4.0, 5.0]
  save_with_losses(tmp_path, losses, max_to_keep=2, keep_best=2)
  assert kept_steps(tmp_path) == [2, 5, 7, 8]
  # Ranked on disk: a later Checkpointer (a resumed run) keeps ranking them.
  with checkpoint.Checkpointer(tmp_path, max_to_keep=1, keep_best=2) as ckpt:
    assert ckpt.save(9, make_state(9), extras_for(9), metrics={"eval_loss": 0.6})
    ckpt.wait_until_finished()
  assert kept_steps(tmp_path) == [2, 9]


def test_a_nan_eval_loss_ranks_last_for_keep_best(tmp_path):
  # A NaN broke orbax's BestN sort: it deleted the best step (step 1 here).
  save_with_losses(tmp_path, [1.0, float("nan"), 2.0, 3.0], max_to_keep=1, keep_best=1)
  assert kept_steps(tmp_path) == [1, 4]
  save_with_losses(tmp_path / "two", [5.0, 1.0, float("nan"), 2.0, 3.0], max_to_keep=1, keep_best=2)
  assert kept_steps(tmp_path / "two") == [2, 4, 5]


def test_a_forced_save_at_or_before_the_latest_step_saves_nothing(tmp_path):
  # orbax keeps the most recently saved steps: step 3 saved after 4 and 5
  # (forced) deleted step 4 here, and step 5 with max_to_keep=1.
  save_steps(tmp_path, [4, 5], max_to_keep=2)
  with checkpoint.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    assert not ckpt.save(3, make_state(3), extras_for(3), force=True)
    assert not ckpt.save(5, make_state(6), extras_for(6), force=True)  # no StepAlreadyExists
    assert ckpt.save(6, make_state(6), extras_for(6), force=True)
    ckpt.wait_until_finished()
  assert kept_steps(tmp_path) == [5, 6]


def test_without_keep_best_no_metrics_are_written(tmp_path):
  save_with_losses(tmp_path, [1.0, 2.0, 3.0], max_to_keep=3)
  assert kept_steps(tmp_path) == [1, 2, 3]
  assert not any(p.name == "metrics" for p in (tmp_path / "3").iterdir())


def test_drop_after_moves_the_later_steps_aside_and_keeps_them(tmp_path):
  save_steps(tmp_path, [1, 2, 3, 4], max_to_keep=5)
  (tmp_path / "4.dropped").mkdir()  # left by an earlier resume: not overwritten
  with checkpoint.Checkpointer(tmp_path, max_to_keep=5) as ckpt:
    state, extras = ckpt.restore_step(2, abstract(make_state(0)))
    moved = ckpt.drop_after(2)
    assert [p.name for p in moved] == ["3.dropped", "4.dropped-2"]
    assert ckpt.latest_step() == 2
    assert ckpt.save(3, make_state(30), extras_for(3))
    ckpt.wait_until_finished()
  assert_trees_equal(state, make_state(2))
  assert extras == extras_for(2)
  names = sorted(p.name for p in tmp_path.iterdir())
  assert names == ["1", "2", "3", "3.dropped", "4.dropped", "4.dropped-2"]
  target = abstract(make_state(0))
  with checkpoint.Checkpointer(tmp_path, read_only=True) as ckpt:
    assert_trees_equal(ckpt.restore_step(3, target)[0], make_state(30))


def test_saved_steps_lists_a_work_directorys_checkpoints_and_writes_nothing(tmp_path):
  assert checkpoint.saved_steps(tmp_path) == []
  assert list(tmp_path.iterdir()) == []
  save_steps(checkpoint.checkpoint_directory(tmp_path), [1, 2, 3], max_to_keep=5)
  (tmp_path / "checkpoints" / "2.dropped").mkdir()
  assert checkpoint.saved_steps(tmp_path) == [1, 2, 3]


def test_save_interval_and_force(tmp_path):
  with checkpoint.Checkpointer(tmp_path, save_interval_steps=2) as ckpt:
    saved = [ckpt.save(s, make_state(s), extras_for(s)) for s in (1, 2, 3)]
    forced = ckpt.save(5, make_state(5), extras_for(5), force=True)
    ckpt.wait_until_finished()
    assert saved == [False, True, False] and forced
    assert ckpt.latest_step() == 5


def test_a_step_off_the_save_interval_copies_nothing(tmp_path, monkeypatch):
  copied, pack = [], checkpoint.pack
  monkeypatch.setattr(checkpoint, "pack", lambda state: copied.append(state) or pack(state))
  with checkpoint.Checkpointer(tmp_path, save_interval_steps=2) as ckpt:
    assert not ckpt.save(1, make_state(1), extras_for(1))
    assert copied == []
    assert ckpt.save(2, make_state(2), extras_for(2))
    assert len(copied) == 1


def test_the_state_is_donated_in_place_right_after_a_save_and_saved_as_it_was(tmp_path):
  """The train step donates the state it was saved from at once. On a CPU,
  orbax's host copy of an array is a view of its buffer, which XLA would
  first copy in the step's dispatch (seconds, for a large state, in the
  training thread) if the save held it: the save holds a copy of its own,
  so each donated array is consumed in place and the step changes nothing
  the save writes."""
  step = jax.jit(lambda state: jax.tree.map(lambda x: x + 1, state), donate_argnums=0)
  state = make_state(1)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, state, extras_for(1))
    stepped = step(state)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    ckpt.wait_until_finished()
    _, restored, _ = ckpt.restore(abstract(make_state(0)))
  assert_trees_equal(restored, make_state(1))
  assert_trees_equal(stepped, jax.tree.map(lambda x: x + 1, make_state(1)))


@contextlib.contextmanager
def held_save(ckpt):
  """Keeps each save `ckpt` starts in progress (its finalisation, which
  commits it, waits) until the block ends."""
  release, manager = threading.Event(), ckpt._manager
  finalize = manager._finalize

  def finalize_when_released(*args):
    release.wait(30)
    finalize(*args)

  manager._finalize = finalize_when_released
  try:
    yield
  finally:
    release.set()
    manager._finalize = finalize


def test_saving_is_true_from_a_save_until_it_is_committed(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert not ckpt.saving
    with held_save(ckpt):
      assert ckpt.save(1, make_state(1), extras_for(1))
      assert ckpt.saving
      ckpt.check_for_errors()  # leaves the save in progress alone
      assert ckpt.saving and not (tmp_path / "1").exists()
    ckpt.wait_until_finished()
    assert not ckpt.saving and (tmp_path / "1").is_dir()


def nice(tid):
  return os.getpriority(os.PRIO_PROCESS, tid)


def tensorstore_threads():
  """The ids of tensorstore's worker threads (named ts_...)."""
  ids = []
  for task in pathlib.Path("/proc/self/task").iterdir():
    with contextlib.suppress(OSError):
      if (task / "comm").read_text().startswith("ts_"):
        ids.append(int(task.name))
  return ids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a nice value per thread")
def test_the_threads_compressing_and_writing_a_checkpoint_yield_to_the_caller(tmp_path):
  """tensorstore's workers, which compress and write the arrays, at
  WRITER_NICE and off the lowest of the caller's cores (where it has two or
  more), those started for a save in progress too; the caller's priority
  and cores are its own."""
  caller = threading.get_native_id()
  own, own_cores = nice(caller), os.sched_getaffinity(caller)
  writer_cores = own_cores - {min(own_cores)} if len(own_cores) > 1 else own_cores
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, make_state(1), extras_for(1))
    ckpt.wait_until_finished()
    assert tensorstore_threads()  # started for the save's writes; they stay
    with held_save(ckpt):
      assert ckpt.save(2, make_state(2), extras_for(2))
      ckpt.check_for_errors()  # and lowers workers tensorstore started since
      for tid in tensorstore_threads():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
          assert nice(tid) == checkpoint.WRITER_NICE
          assert os.sched_getaffinity(tid) == writer_cores
    assert nice(caller) == own and os.sched_getaffinity(caller) == own_cores


def test_restore_empty_returns_none(tmp_path):
  with checkpoint.Checkpointer(tmp_path / "new") as ckpt:
    assert ckpt.restore(abstract(make_state(0))) is None


def truncate_state_data(step_dir):
  for path in (step_dir / "state" / "d").iterdir():
    with open(path, "r+b") as f:
      f.truncate(3)


def delete_state_manifest(step_dir):
  os.remove(step_dir / "state" / "manifest.ocdbt")


def delete_extras_item(step_dir):
  shutil.rmtree(step_dir / "extras")


@pytest.mark.parametrize(
  "corrupt", [truncate_state_data, delete_state_manifest, delete_extras_item]
)
def test_corrupt_latest_falls_back_and_is_kept(tmp_path, caplog, corrupt):
  save_steps(tmp_path, [1, 2, 3])
  corrupt(tmp_path / "3")
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    step, state, extras = ckpt.restore(abstract(make_state(0)))
    assert step == 2
    assert_trees_equal(state, make_state(2))
    assert extras == extras_for(2)
    assert "step 3" in caplog.text
    # Kept for inspection, and out of the way of the resumed run's saves.
    assert (tmp_path / f"3{checkpoint.CORRUPT_SUFFIX}").is_dir()
    assert ckpt.latest_step() == 2
    assert ckpt.save(3, make_state(3), extras_for(3))
    ckpt.wait_until_finished()
    assert ckpt.restore(abstract(make_state(0)))[0] == 3


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_step_holding_a_non_finite_value_is_corrupt_as_one_that_does_not_read(
  tmp_path, caplog, bad
):
  """A flipped byte in a step's data restores without an error: the readers
  used the garbage (NaN embeddings, a NaN Adam nu whose resumed run saved NaN
  weights and let max_to_keep delete the last good step). A state holding a
  NaN or infinity is one no run saves (`save` refuses one): corrupt, as a
  step that does not read."""
  save_steps(tmp_path, [1, 2])
  state = make_state(3)
  state["params"]["dense"]["kernel"] = state["params"]["dense"]["kernel"].at[1, 2].set(bad)
  fingerprints = checkpoint._fingerprints

  def save_unchecked(ckpt, step):
    """As a step would hold it whose data was damaged after the save's check."""
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(
        checkpoint, "_fingerprints", lambda s: [(p, True, c) for p, _, c in fingerprints(s)]
      )
      assert ckpt.save(step, state, extras_for(step))
      ckpt.wait_until_finished()

  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match=r"^state leaf \['params'\]\['dense'\]\['kernel'\] holds"):
      ckpt.save(3, state, extras_for(3))
    assert ckpt.latest_step() == 2
    save_unchecked(ckpt, 3)
  with checkpoint.Checkpointer(tmp_path, read_only=True) as reader:
    with pytest.raises(checkpoint.RestoreError, match=r"non-finite values in \['params'\]"):
      reader.restore_step(3, abstract(make_state(0)))
    assert reader.restore(abstract(make_state(0)))[0] == 2
  assert "Checkpoint step 3" in caplog.text and "CorruptState: non-finite values" in caplog.text
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    step, restored, _ = ckpt.restore(abstract(make_state(0)))
  assert step == 2 and (tmp_path / f"3{checkpoint.CORRUPT_SUFFIX}").is_dir()
  assert_trees_equal(restored, make_state(2))
  # Every step non-finite: the refusal says so, not that the config differs.
  with checkpoint.Checkpointer(tmp_path / "all_bad") as ckpt:
    save_unchecked(ckpt, 1)
    with pytest.raises(checkpoint.RestoreError, match="every step's data is corrupt"):
      ckpt.restore(abstract(make_state(0)))


def make_large_state(offset):
  """Arrays too large and too random for ocdbt to inline them in its index:
  each has its own range of a data file (ocdbt.process_0/d)."""
  keys = jax.random.split(jax.random.key(offset), 2)
  return {
    "a": jax.random.normal(keys[0], (512, 512)),
    "b": jax.random.normal(keys[1], (256, 512)),
  }


def save_large_steps(directory, steps):
  with checkpoint.Checkpointer(directory) as ckpt:
    for step in steps:
      assert ckpt.save(step, make_large_state(step), extras_for(step))
    ckpt.wait_until_finished()


def truncate_array_data(step_dir):
  """Cuts the files holding a step's array values to 3 bytes; its index and
  metadata stay whole, so every array's read starts and fails."""
  for path in (step_dir / "state" / "ocdbt.process_0" / "d").iterdir():
    with open(path, "r+b") as f:
      f.truncate(3)


@pytest.fixture
def unraisables(monkeypatch):
  """What reaches sys.unraisablehook (beneath txf's own) while a test runs."""
  caught = []
  monkeypatch.setattr(sys, "unraisablehook", caught.append)
  return caught


def test_a_step_whose_arrays_do_not_read_is_one_warning_line(tmp_path, caplog):
  # Two warnings, each a dozen lines of TensorStore spec.
  save_large_steps(tmp_path, [1, 2])
  truncate_array_data(tmp_path / "2")
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.restore(abstract(make_large_state(0)))[0] == 1
  warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
  assert len(warnings) == 1, [r.getMessage() for r in warnings]
  line = warnings[0].getMessage()
  assert "\n" not in line and "TensorStore" not in line, line
  assert line.startswith("Checkpoint step 2 does not restore (ValueError: OUT_OF_RANGE"), line
  assert f"moved to {tmp_path / '2.corrupt'}" in line and "resuming from step 1" in line, line


def make_int_state(offset):
  """Random int32 values: stored as they are (zstd cannot shrink them), so a
  flipped bit of the data file changes one value, which stays valid."""
  key = jax.random.key(offset)
  return {"a": jax.random.randint(key, (512, 512), -(2**31), 2**31 - 1, dtype=jnp.int32)}


def flip_a_value_bit(step_dir, offset):
  """Flips one bit of the file holding a step's array values, at `offset`
  (a fraction of its length)."""
  data_files = (step_dir / "state" / "ocdbt.process_0" / "d").iterdir()
  largest = max(data_files, key=lambda path: path.stat().st_size)
  data = bytearray(largest.read_bytes())
  data[int(len(data) * offset)] ^= 0x10
  largest.write_bytes(bytes(data))


@pytest.mark.parametrize("offset", [0.3, 0.7])
def test_a_flipped_bit_in_a_steps_data_is_found_by_its_checksum(tmp_path, caplog, offset):
  # It restored as another valid value (in float data, a weight of 3.9, as
  # 11 of 12 random flips of a compressed file did): readers evaluated,
  # exported and resumed from it without a word.
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    for step in (1, 2):
      assert ckpt.save(step, make_int_state(step), extras_for(step))
    ckpt.wait_until_finished()
  flip_a_value_bit(tmp_path / "2", offset)
  with checkpoint.Checkpointer(tmp_path, read_only=True) as reader:
    with pytest.raises(
      checkpoint.RestoreError, match=r"\['a'\] differs from the checksum recorded"
    ):
      reader.restore_step(2, abstract(make_int_state(0)))
    step, state, extras = reader.restore(abstract(make_int_state(0)))
  assert step == 1 and extras == extras_for(1)
  assert_trees_equal(state, make_int_state(1))
  assert "Checkpoint step 2" in caplog.text and "CorruptState" in caplog.text


def test_checksums_change_with_any_flipped_bit_of_every_dtype():
  """Each leaf's checksum is the wrapping sum of its bits (against numpy's
  sum of the same bits) and changes with any one flipped bit."""
  rng = np.random.default_rng(0)
  leaves = {
    "f32": rng.normal(size=(5, 3)).astype(np.float32),
    "bf16": rng.normal(size=7).astype(jnp.bfloat16),
    "i32": rng.integers(-9, 9, size=4).astype(np.int32),
    "u8": rng.integers(0, 255, size=6).astype(np.uint8),
    "bool": np.array([True, False, True]),
  }
  sums = checkpoint.state_checksums(jax.tree.map(jnp.asarray, leaves))
  for name, leaf in leaves.items():
    width = leaf.dtype.itemsize
    want = int(leaf.view(f"u{width}").astype(np.uint64).sum() % 2**32)
    assert sums[f"['{name}']"] == want, name
    for bit in (0, 8 * width - 1) if name != "bool" else (0,):
      flipped = leaf.copy().ravel()
      flipped.view(f"u{width}")[-1] ^= 1 << bit
      assert checkpoint.state_checksums({name: jnp.asarray(flipped)})[f"['{name}']"] != want
  key = jax.random.key(3)
  assert checkpoint.state_checksums({"key": key}) == checkpoint.state_checksums(
    {"key": jax.random.key_data(key)}
  )


def test_checksums_of_eight_byte_and_complex_leaves_and_of_no_leaves():
  # A float64 or int64 leaf (x64) failed the save with a KeyError.
  x_f64 = np.array([1.5, -2.0, 3.25])
  x_c64 = np.array([1 + 2j, -3j], np.complex64)
  with jax.enable_x64(True):
    sums = checkpoint.state_checksums({"f64": jnp.asarray(x_f64), "c64": jnp.asarray(x_c64)})
  assert sums["['f64']"] == int(x_f64.view(np.uint32).astype(np.uint64).sum() % 2**32)
  parts = np.concatenate([x_c64.real, x_c64.imag])  # float32 each
  assert sums["['c64']"] == int(parts.view(np.uint32).astype(np.uint64).sum() % 2**32)
  assert checkpoint.state_checksums({}) == {}


def test_four_bit_leaves_are_summed_saved_and_restored(tmp_path):
  # A 4-bit leaf (a quantised weight) failed every save: its bits were cast
  # to uint8, which bitcast_convert_type refuses for a 4-bit dtype.
  values = np.array([-8, -1, 0, 7, 3], np.int8)  # int4's ends and between
  leaf_int4 = jnp.asarray(values, jnp.int4)
  want = int((values.astype(np.int64) % 16).sum())  # two's complement in 4 bits
  assert checkpoint.state_checksums({"w": leaf_int4}) == {"['w']": want}
  flipped = jnp.asarray(values ^ np.array([0, 0, 0, 0, 1], np.int8), jnp.int4)
  assert checkpoint.state_checksums({"w": flipped}) != {"['w']": want}
  # Packed, and (beside a PRNG key) saved as it is.
  for state in ({"w": leaf_int4}, {"w": leaf_int4, "key": jax.random.key(1)}):
    directory = tmp_path / str(len(state))
    with checkpoint.Checkpointer(directory) as writer:
      assert writer.save(1, state, {}, force=True)
      writer.wait_until_finished()
    with checkpoint.Checkpointer(directory, read_only=True) as reader:
      step, restored, _ = reader.restore(abstract(state))
    assert step == 1 and restored["w"].dtype == jnp.int4
    np.testing.assert_array_equal(np.asarray(restored["w"], np.int8), values)


@pytest.mark.parametrize("name", ["uint4", "uint2", "float8_e4m3"])
def test_leaves_of_dtypes_tensorstore_cannot_write_are_saved_packed_as_their_bits(tmp_path, name):
  # orbax failed each in its background writer ('Unsupported data type'),
  # leaving an unfinished step behind.
  dtype = jnp.dtype(name)
  bits = np.random.default_rng(0).integers(0, 2 ** (8 * dtype.itemsize), 11, dtype=np.uint8)
  bits &= (1 << jax.dtypes.itemsize_bits(dtype)) - 1  # every value of the width, none wider
  leaf = jnp.asarray(bits.view(dtype))
  state = {"w": leaf, "f": jnp.ones(2)}
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, state, {}, force=True)
    ckpt.wait_until_finished()
    _, restored, _ = ckpt.restore(abstract(state))
  assert restored["w"].dtype == dtype
  assert as_bytes(restored["w"]) == as_bytes(leaf)
  # Saved as it is (a PRNG key is not packed), refused before anything is written.
  with checkpoint.Checkpointer(tmp_path / "as_is") as ckpt:
    with pytest.raises(ValueError, match=rf"^state leaf \['w'\]: {name} cannot be written"):
      ckpt.save(1, {**state, "key": jax.random.key(0)}, {}, force=True)
  assert not (tmp_path / "as_is" / "1").exists()


@pytest.mark.parametrize("key", [False, True], ids=["packed", "as_it_is"])
def test_a_state_of_another_dtype_or_shape_is_named_not_called_corrupt(tmp_path, key):
  """Saved as it is (a PRNG key is not packed, nor is a sharded state),
  orbax cast a float32 leaf to the bfloat16 asked for, and its checksum
  then called every step corrupt ('restore the directory from a copy')."""
  extra = {"key": jax.random.key(0)} if key else {}
  with checkpoint.Checkpointer(tmp_path / "run") as ckpt:
    for step in (1, 2):
      assert ckpt.save(step, {**make_state(step), **extra}, extras_for(step))
    ckpt.wait_until_finished()
  for change, was, asked in (
    (lambda x: x.astype(jnp.bfloat16), "float32[3, 4]", "bfloat16[3, 4]"),
    (lambda x: x[:2], "float32[3, 4]", "float32[2, 4]"),
  ):
    target = abstract({**make_state(0), **extra})
    kernel = target["params"]["dense"]["kernel"]
    target["params"]["dense"]["kernel"] = abstract(change(jnp.zeros(kernel.shape, kernel.dtype)))
    with checkpoint.Checkpointer(tmp_path / "run", read_only=True) as reader:
      with pytest.raises(checkpoint.RestoreError) as refused:
        reader.restore(target)
    message = str(refused.value)
    assert f"['params']['dense']['kernel'] as {was}, the one asked for as {asked}" in message
    assert "config probably differs" in message and "corrupt" not in message
  assert kept_steps(tmp_path / "run") == [1, 2]


def as_bytes(leaf):
  return np.asarray(leaf).tobytes()


def test_a_numpy_64_bit_leaf_is_refused_without_x64_and_saved_exactly_with_it(tmp_path):
  # Without x64 jax summed and packed it as int32: 2**40 + 7 came back as 7.
  state = {"w": jnp.ones(2), "n": np.array([2**40 + 7, 3], np.int64)}
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match=r"^state leaf \['n'\]: a numpy int64 array is saved"):
      ckpt.save(1, state, {}, force=True)
  assert not (tmp_path / "1").exists()
  with jax.enable_x64(True), checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, state, {}, force=True)
    ckpt.wait_until_finished()
    _, restored, _ = ckpt.restore(abstract(state))
    assert np.asarray(restored["n"]).tolist() == [2**40 + 7, 3]


def test_zero_size_leaves_are_saved_wherever_they_fall(tmp_path, monkeypatch):
  # A group of zero-size leaves only (alone of their dtype, or after a leaf
  # over the packed size) made an empty packed array, which orbax refuses.
  monkeypatch.setattr(packed_state, "PACKED_BYTES", 64)
  state = {
    "a_big": jnp.arange(32, dtype=jnp.float32),  # 128 bytes: a group of its own
    "b_empty": jnp.zeros((0, 8), jnp.float32),
    "c": jnp.arange(3, dtype=jnp.int32),
    "d_empty": jnp.zeros((0,), jnp.bfloat16),  # the only bfloat16 leaf
  }
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(1, state, {}, force=True)
    ckpt.wait_until_finished()
    _, restored, _ = ckpt.restore(abstract(state))
  assert_trees_equal(restored, state)


RESTORE_LARGE_STATE = """
import jax, logging, sys
sys.path.insert(0, {tests!r})
from test_train_checkpoint import abstract, make_large_state
from txf.rundir import checkpoint
logging.basicConfig(format="%(message)s", force=True)
with checkpoint.Checkpointer({directory!r}) as ckpt:
  print(ckpt.restore(abstract(make_large_state(0)))[0])
"""


@pytest.mark.slow  # a process of its own: what it prints until it exits
def test_a_step_whose_arrays_do_not_read_prints_one_line_until_exit(tmp_path):
  # Each array's abandoned read was printed as 'Exception ignored in:
  # <coroutine ...>' with kilobytes of TensorStore spec (58 of them for a
  # small model's checkpoint), when collected.
  save_large_steps(tmp_path, [1, 2])
  truncate_array_data(tmp_path / "2")
  script = RESTORE_LARGE_STATE.format(
    tests=str(pathlib.Path(__file__).parent), directory=str(tmp_path)
  )
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and done.stdout == "1\n", done.stderr[-3000:]
  lines = done.stderr.splitlines()
  assert len(lines) == 1 and lines[0].startswith("Checkpoint step 2 does not restore"), done.stderr[
    -3000:
  ]


def test_every_step_unreadable_is_an_error_of_one_line_per_step(tmp_path, caplog):
  save_large_steps(tmp_path, [1, 2])
  for step in ("1", "2"):
    truncate_array_data(tmp_path / step)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.RestoreError) as raised:
      ckpt.restore(abstract(make_large_state(0)))
  steps = [line for line in str(raised.value).splitlines() if line.startswith("  step ")]
  assert [line.split(":")[0] for line in steps] == ["  step 2", "  step 1"]
  assert all("Requested byte range" in line and "TensorStore" not in line for line in steps)
  # The error says it all: nothing is logged before it.
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


class _RaisesWhenCollected:
  """Calls `action` in __del__, where what it raises is unraisable."""

  def __init__(self, action):
    self.action = action

  def __del__(self):
    self.action()


def test_a_failed_saves_closed_event_loop_callbacks_are_dropped_and_nothing_else(
  tmp_path, unraisables
):
  # What tensorstore's threads report as unraisable after a failed checkpoint
  # save (a full disk) closed orbax's event loop.
  checkpoint.Checkpointer(tmp_path)  # installs the hook
  loop = asyncio.new_event_loop()
  loop.close()
  _RaisesWhenCollected(lambda: loop.call_soon_threadsafe(print))
  _RaisesWhenCollected(lambda: 1 / 0)
  assert [u.exc_type for u in unraisables] == [ZeroDivisionError]


def test_an_unfinished_save_is_left_to_a_reader_and_removed_by_the_run(tmp_path, caplog):
  """A read-only restore (an evaluation, perhaps of a run saving it now)
  leaves it; the run that resumes holds the directory, so no save of it is
  in flight: it was left forever (orbax removes one only when its step is
  saved again) and every later command warned of it."""
  save_steps(tmp_path, [1])
  unfinished = tmp_path / "2.orbax-checkpoint-tmp-1700000000"
  (unfinished / "state").mkdir(parents=True)
  with checkpoint.Checkpointer(tmp_path, read_only=True) as ckpt:
    assert ckpt.restore(abstract(make_state(0)))[0] == 1
  assert f"Ignoring unfinished checkpoint save {unfinished}" in caplog.text
  assert unfinished.is_dir()
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.restore(abstract(make_state(0)))[0] == 1
  assert f"Removed unfinished checkpoint save {unfinished}" in caplog.text
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]


def test_all_corrupt_raises_and_renames_nothing(tmp_path):
  save_steps(tmp_path, [1, 2])
  for step in ("1", "2"):
    truncate_state_data(tmp_path / step)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.RestoreError, match=r"(?s)step 2.*step 1"):
      ckpt.restore(abstract(make_state(0)))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_mismatched_state_raises_and_renames_nothing(tmp_path):
  save_steps(tmp_path, [1])
  wrong = make_state(0)
  wrong["params"]["dense"]["kernel"] = jnp.zeros((5, 4), jnp.float32)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(
      checkpoint.RestoreError,
      match=r"step 1: ValueError: the state saved holds \['params'\]\['dense'\]\['kernel'\] "
      r"as float32\[3, 4\], the one asked for as float32\[5, 4\]",
    ):
      ckpt.restore(abstract(wrong))
  assert [p.name for p in tmp_path.iterdir()] == ["1"]


@pytest.mark.parametrize(
  "kwargs, name",
  [
    (dict(max_to_keep=0), "max_to_keep"),
    (dict(save_interval_steps=-1), "save_interval_steps"),
  ],
)
def test_bad_constructor_arguments(tmp_path, kwargs, name):
  with pytest.raises(ValueError, match=name):
    checkpoint.Checkpointer(tmp_path, **kwargs)


def test_bad_save_and_restore_arguments(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match="extras"):
      ckpt.save(1, make_state(1), {"rng": jnp.ones(2)})
    with pytest.raises(ValueError, match="extras"):
      ckpt.save(1, make_state(1), [1, 2])
    for key in (checkpoint.CHECKSUMS_KEY, checkpoint.LAYOUT_KEY):
      with pytest.raises(ValueError, match=f"extras may not hold '{key}'"):
        ckpt.save(1, make_state(1), {key: {}})
    with pytest.raises(ValueError, match="abstract_state"):
      ckpt.restore({"x": "not an array"})
    ckpt.wait_until_finished()
    assert ckpt.latest_step() is None


@pytest.fixture
def sentinel_sigterm_handler():
  """Installs a recognisable SIGTERM handler; restores the original after."""

  def sentinel(signum, frame):
    raise AssertionError("SIGTERM reached the previous handler")

  original = signal.signal(signal.SIGTERM, sentinel)
  yield sentinel
  signal.signal(signal.SIGTERM, original)


def test_preemption_guard_sets_flag_and_restores_handler(sentinel_sigterm_handler):
  with checkpoint.PreemptionGuard() as guard:
    assert guard.installed and not guard.requested
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while not guard.requested and time.monotonic() < deadline:
      time.sleep(0.01)
    assert guard.requested
  assert not guard.installed
  assert signal.getsignal(signal.SIGTERM) is sentinel_sigterm_handler


def test_preemption_guard_leaves_multiprocess_runs_sigterm_to_jax(
  sentinel_sigterm_handler, monkeypatch
):
  """SIGTERM stays jax.distributed's; a Ctrl-C is reported to it as a
  SIGTERM of this process (so every process stops at one step), not
  `requested` (which would stop this process alone)."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  sent = []
  monkeypatch.setattr(checkpoint.os, "kill", lambda pid, signum: sent.append((pid, signum)))
  before = signal.getsignal(signal.SIGINT)
  with checkpoint.PreemptionGuard() as guard:
    assert signal.getsignal(signal.SIGTERM) is sentinel_sigterm_handler
    signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
    assert sent == [(os.getpid(), signal.SIGTERM)]
    assert guard.interrupted and not guard.requested and guard.reason == "interrupted"
    assert signal.getsignal(signal.SIGINT) is before  # a second Ctrl-C stops at once
  assert signal.getsignal(signal.SIGINT) is before


def test_reached_preemption_is_false_without_distributed(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.reached_preemption(1) is False
