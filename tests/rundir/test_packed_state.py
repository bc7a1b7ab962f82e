"""Tests for txf.rundir.packed_state: a state's arrays packed into a few and cut back."""

import os
import pathlib
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf.rundir import packed_state


def make_state():
  """Leaves of four dtypes, interleaved, with a scalar and an empty one."""
  rng = np.random.default_rng(0)
  return {
    "a": jnp.asarray(rng.standard_normal((3, 4), dtype=np.float32)),
    "b": jnp.asarray(rng.integers(-9, 9, (5,), dtype=np.int32)),
    "c": jnp.asarray(rng.standard_normal((2, 2, 2)), jnp.bfloat16),
    "d": jnp.asarray(rng.standard_normal((7,), dtype=np.float32)),
    "e": jnp.asarray(True),
    "f": jnp.zeros((0, 3), jnp.float32),
    "g": jnp.asarray(rng.standard_normal((6,), dtype=np.float32)),
  }


def abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)


def as_bits(leaf):
  """A leaf's bytes, for an exact comparison of every dtype."""
  return np.asarray(leaf).tobytes()


def test_pack_groups_each_dtypes_leaves_in_order_and_unpack_restores_them_bitwise():
  state = make_state()
  arrays, layout = packed_state.pack(state)
  assert [array["dtype"] for array in layout] == ["float32", "int32", "bfloat16", "bool"]
  assert layout[0]["leaves"] == [
    ["['a']", [3, 4]],
    ["['d']", [7]],
    ["['f']", [0, 3]],
    ["['g']", [6]],
  ]
  # Each packed array is its leaves' values one after the other.
  want = np.concatenate([np.asarray(state[k]).ravel() for k in "adfg"])
  np.testing.assert_array_equal(arrays["0"], want)
  assert arrays["2"].dtype == jnp.bfloat16 and arrays["3"].dtype == np.bool_
  restored = packed_state.unpack(arrays, layout, abstract(state))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  for key in state:
    assert restored[key].dtype == state[key].dtype and restored[key].shape == state[key].shape
    assert as_bits(restored[key]) == as_bits(state[key]), key


@pytest.mark.parametrize(
  "limit, groups",
  [
    # 48 + 28 + 0 + 24 bytes of float32: a limit of exactly 100 keeps them
    # together, one byte less closes the group before 'g'.
    (100, [["a", "d", "f", "g"], ["b"], ["c"], ["e"]]),
    (99, [["a", "d", "f"], ["b"], ["c"], ["e"], ["g"]]),
    # Under any leaf's size: each leaf an array of its own.
    (1, [["a"], ["b"], ["c"], ["d"], ["e"], ["f"], ["g"]]),
  ],
)
def test_a_packed_array_is_closed_where_the_next_leaf_would_pass_the_limit(
  monkeypatch, limit, groups
):
  monkeypatch.setattr(packed_state, "PACKED_BYTES", limit)
  state = make_state()
  arrays, layout = packed_state.pack(state)
  assert [[path[2] for path, _ in array["leaves"]] for array in layout] == groups
  # A group of zero-size leaves only ('f' alone) has no array: orbax refuses an empty one.
  assert sorted(arrays, key=int) == [str(i) for i, g in enumerate(groups) if g != ["f"]]
  restored = packed_state.unpack(arrays, layout, abstract(state))
  assert all(as_bits(restored[key]) == as_bits(state[key]) for key in state)


def test_the_packed_arrays_share_no_memory_with_the_state():
  """The train step donates the state right after a save: its buffers must
  have no other reader (on a CPU a host array may view a device buffer)."""
  # 'c' alone in its packed array, already flat: jit could pass it through.
  state = {"a": jnp.arange(8.0), "b": jnp.arange(3.0), "c": jnp.arange(4, dtype=jnp.int32)}
  arrays, _ = packed_state.pack(state)
  for leaf in state.values():
    assert not any(np.shares_memory(np.asarray(leaf), array) for array in arrays.values())
  donated = jax.jit(lambda s: jax.tree.map(lambda x: x * 2, s), donate_argnums=0)(state)
  assert all(leaf.is_deleted() for leaf in state.values())
  np.testing.assert_array_equal(arrays["0"], np.r_[np.arange(8.0), np.arange(3.0)])
  np.testing.assert_array_equal(arrays["1"], np.arange(4))
  np.testing.assert_array_equal(donated["a"], 2 * np.arange(8.0))


class OnAnAccelerator:
  """A packed array as `_to_host` sees one made on an accelerator."""

  def __init__(self, packed):
    self.packed = packed

  def devices(self):
    return [types.SimpleNamespace(platform="gpu")]

  def __array__(self, dtype=None, copy=None):
    return np.asarray(self.packed)


@pytest.mark.parametrize("cpu_backend", [True, False])
def test_on_an_accelerator_each_packed_array_is_read_back_to_the_host_as_it_is_made(
  monkeypatch, cpu_backend
):
  """So that the device holds one packed array at a time, not a second
  state: onto jax's CPU device where it has one (orbax reads a jax array
  there without a copy), else into a numpy array."""
  device_put, made = jax.device_put, []

  def onto_host(array, device):
    assert device.platform == "cpu"
    return device_put(array.packed, device)

  def devices(kind=None):
    if kind == "cpu" and not cpu_backend:
      raise RuntimeError("Unknown backend cpu")
    return jax.local_devices()

  concatenated = packed_state._concatenated
  monkeypatch.setattr(
    packed_state,
    "_concatenated",
    lambda leaves, stored: made.append(1) or OnAnAccelerator(concatenated(leaves, stored)),
  )
  monkeypatch.setattr(jax, "device_put", onto_host)
  monkeypatch.setattr(jax, "devices", devices)
  state = make_state()
  arrays, layout = packed_state.pack(state)
  monkeypatch.undo()
  kind = jax.Array if cpu_backend else np.ndarray
  assert len(made) == 4 and all(isinstance(array, kind) for array in arrays.values())
  restored = packed_state.unpack(arrays, layout, abstract(state))
  assert all(as_bits(restored[key]) == as_bits(state[key]) for key in state)


def test_unpack_puts_each_leaf_on_its_sharding():
  device = jax.devices()[-1]
  state = {"a": jnp.arange(4.0), "b": jnp.ones((2, 2), jnp.int32)}
  arrays, layout = packed_state.pack(state)
  sharding = jax.sharding.SingleDeviceSharding(device)
  target = {"a": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=sharding), "b": state["b"]}
  restored = packed_state.unpack(arrays, layout, target)
  assert restored["a"].sharding == sharding
  assert restored["b"].sharding == state["b"].sharding


@pytest.mark.parametrize(
  "change, message",
  [
    (
      lambda s: s.update(a=jnp.zeros((4, 3), jnp.float32)),
      r"^the state saved holds \['a'\] as float32\[3, 4\], the one asked for as float32\[4, 3\]$",
    ),
    (
      lambda s: s.update(b=jnp.zeros((5,), jnp.float32)),
      r"^the state saved holds \['b'\] as int32\[5\], the one asked for as float32\[5\]$",
    ),
    (lambda s: s.pop("d"), r"^the state saved holds \['d'\], the one asked for does not$"),
    (
      lambda s: s.update(h=jnp.zeros(2)),
      r"^the state asked for holds \['h'\], the one saved does not$",
    ),
  ],
)
def test_unpack_refuses_a_state_unlike_the_one_saved_naming_the_leaf(change, message):
  state = make_state()
  arrays, layout = packed_state.pack(state)
  other = dict(state)
  change(other)
  with pytest.raises(ValueError, match=message):
    packed_state.unpack(arrays, layout, abstract(other))


def test_layout_target_has_each_packed_arrays_size_and_dtype():
  arrays, layout = packed_state.pack(make_state())
  target = packed_state.layout_target(layout)
  assert {k: (v.shape, v.dtype) for k, v in target.items()} == {
    k: (v.shape, v.dtype) for k, v in arrays.items()
  }


@pytest.mark.parametrize(
  "state, packable",
  [
    (make_state(), True),
    ({"a": np.ones(3, np.float32), "b": np.arange(2)}, True),  # numpy's
    ({"key": jax.random.key(0), "a": jnp.ones(2)}, False),  # a typed PRNG key
    ({"n": 3, "a": jnp.ones(2)}, False),  # not an array
    ({"s": np.array(["x"]), "a": jnp.ones(2)}, False),  # not numeric
    ({}, False),
  ],
)
def test_which_states_are_packed(state, packable):
  assert packed_state.packable(state) is packable


def test_a_multi_process_runs_state_is_not_packed(monkeypatch):
  """Each process holds its own shards of the state, not every leaf whole."""
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  assert not packed_state.packable(make_state())


MESH_SCRIPT = """
import os, tempfile
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from txf.rundir import checkpoint, packed_state

for axis_type in (AxisType.Auto, AxisType.Explicit):
  mesh = jax.make_mesh((2, 2), ("data", "model"), axis_types=(axis_type,) * 2)
  replicated = {
    "w": NamedSharding(mesh, P()),
    "b": NamedSharding(mesh, P(None)),
    "s": jax.sharding.SingleDeviceSharding(jax.devices()[2]),
  }
  sharded = {**replicated, "w": NamedSharding(mesh, P("data", "model"))}
  for shardings, packed in ((replicated, True), (sharded, False)):
    values = {"w": jnp.arange(64.0).reshape(8, 8), "b": jnp.arange(4), "s": jnp.asarray(3.0)}
    state = {k: jax.device_put(v, shardings[k]) for k, v in values.items()}
    assert packed_state.packable(state) is packed, (axis_type, shardings)
    with checkpoint.Checkpointer(tempfile.mkdtemp()) as ckpt:
      assert ckpt.save(1, state, {})
      ckpt.wait_until_finished()
      target = {
        k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in state.items()
      }
      _, restored, _ = ckpt.restore(target)
    for k, v in values.items():
      assert restored[k].sharding == shardings[k], (k, restored[k].sharding)
      np.testing.assert_array_equal(restored[k], v)
print("restored")
"""


@pytest.mark.slow  # a process of its own, with four CPU devices
def test_a_state_on_a_mesh_is_packed_when_replicated_and_restores_onto_its_shardings(tmp_path):
  """Leaves replicated over a 2x2 mesh (and one on a single device) are
  packed, one sharded over it is saved as it is; both restore onto the
  mesh, under jax's automatic and explicit sharding modes."""
  env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2])}
  result = subprocess.run(
    [sys.executable, "-c", MESH_SCRIPT], env=env, capture_output=True, text=True, timeout=300
  )
  assert result.returncode == 0 and "restored" in result.stdout, result.stderr[-3000:]
