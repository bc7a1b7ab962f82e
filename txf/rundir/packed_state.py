"""A train state's many arrays as a few large ones, for its checkpoint.

orbax's save does Python work for every array it writes (its sharding file,
a tensorstore open, its metadata), in threads of its own that take the
interpreter lock one array at a time; a training thread dispatching steps
meanwhile waits for the lock's hand-over between them. For a state of
gpt2_small's size in as many arrays (1.49 GB in 591: benchmarks.run
checkpoint_stall --leaves=591), that put the p99 of a step's dispatch
during a save at 6.6-7.1 ms on a CPU, 1.4-2.0 ms without one
(docs/benchmarks.md, "Fewer, larger arrays in a checkpoint"). Packed, that
state is 13 arrays (gpt2_small's own, 15), and the p99 during a save
1.9-3.4 ms.

`pack` concatenates the leaves of each dtype and sharding, in the state's
order and each flattened, into arrays of about PACKED_BYTES (a larger leaf
is one of its own); `layout` (JSON) lists each packed array's dtype and its
leaves' paths and shapes, and is saved beside them. `unpack` cuts them back
into the leaves of the state a run asks for, onto its shardings, and refuses
in one line a state whose leaves differ from those saved. A restore so
holds the whole packed state in host memory at once (orbax's own restore of
a state saved as it is read a leaf at a time). A packed array of a dtype
tensorstore cannot write (STORED_AS: uint2, uint4, float8_e4m3) holds its
bits as a dtype of the same width it can; a group of zero-size leaves only
has no array (orbax refuses to write an empty one).

Only a state whose every leaf is whole on each of its devices is packed
(`packable`: one process; each leaf on one device, or replicated, as a
data-parallel run's are); a state sharded across devices (FSDP, tensor
parallelism, or a multi-process run's) is saved as it is, as is one holding
a leaf that is not a numeric array (a PRNG key).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

# About how large a packed array is: a few per core for tensorstore's
# compression and reading, and few enough that orbax's work per array is
# small (gpt2_small's 1.49 GB train state: 15 arrays, its embedding table
# and that table's two Adam moments one each).
PACKED_BYTES = 128 * 2**20

# Dtypes whose arrays orbax's tensorstore cannot write -> the dtype of the
# same width whose bits a packed array of them is stored as.
STORED_AS = {"uint2": "int2", "uint4": "int4", "float8_e4m3": "uint8"}

# One packed array's description in `layout`: its dtype's name and, for each
# leaf in it in order, [path (jax.tree_util.keystr), shape].
Layout = list[dict[str, Any]]


def packable(state: Any) -> bool:
  """Whether `state` is saved packed: in a single-process run, every leaf a
  numpy array, or a jax array on one device or replicated over several, of
  a numeric or boolean dtype."""
  if jax.process_count() > 1:
    return False
  leaves = jax.tree.leaves(state)
  return bool(leaves) and all(
    isinstance(leaf, jax.Array | np.ndarray)
    and (jnp.issubdtype(leaf.dtype, jnp.number) or leaf.dtype == np.bool_)
    and _whole_on_each_device(leaf)
    for leaf in leaves
  )


def _whole_on_each_device(leaf: Any) -> bool:
  sharding = _sharding(leaf)
  return sharding is None or sharding.is_fully_replicated


def _sharding(leaf: Any) -> jax.sharding.Sharding | None:
  return getattr(leaf, "sharding", None)


def _groups(state: Any) -> list[tuple[str, list[tuple[str, Any]]]]:
  """[(dtype name, [(path, leaf), ...]), ...]: the leaves of each dtype and
  sharding (one concatenation's inputs share both) in the state's order, a
  group closed where the next leaf would take it past PACKED_BYTES."""
  groups: list[tuple[str, list[tuple[str, Any]]]] = []
  open_group: dict[tuple, int] = {}  # (dtype name, sharding) -> index in groups
  filled: list[int] = []  # bytes in each group
  for path, leaf in jax.tree_util.tree_leaves_with_path(state):
    dtype = np.dtype(leaf.dtype).name
    kind = (dtype, _sharding(leaf))
    index = open_group.get(kind)
    if index is None or filled[index] + leaf.nbytes > PACKED_BYTES:
      index = open_group[kind] = len(groups)
      groups.append((dtype, []))
      filled.append(0)
    groups[index][1].append((jax.tree_util.keystr(path), leaf))
    filled[index] += leaf.nbytes
  return groups


def pack(state: Any) -> tuple[dict[str, jax.Array | np.ndarray], Layout]:
  """(arrays, layout): `state`'s leaves copied into arrays named "0", "1",
  ... (1-D, one dtype each, or its STORED_AS) in host memory, as `layout`
  describes (the name of a group of zero-size leaves only is left out).
  Each is one concatenation on the devices; they share no memory with the
  state, which may be donated at once."""
  arrays: dict[str, jax.Array | np.ndarray] = {}
  layout: Layout = []
  for dtype, members in _groups(state):
    leaves = [leaf for _, leaf in members]
    if any(np.size(leaf) for leaf in leaves):
      arrays[str(len(layout))] = _to_host(_concatenated(leaves, _stored(dtype)))
    layout.append(
      {"dtype": dtype, "leaves": [[path, list(np.shape(leaf))] for path, leaf in members]}
    )
  return arrays, layout


def _stored(dtype: str) -> np.dtype:
  """The dtype a packed array of leaves of `dtype` (its name) is written as."""
  return jnp.dtype(STORED_AS.get(dtype, dtype))


@functools.partial(jax.jit, static_argnames="stored")
def _concatenated(leaves: list[jax.Array], stored: jnp.dtype) -> jax.Array:
  """`leaves` flattened, one after the other, in a new buffer on the
  devices, their bits as `stored` (a dtype of their width)."""
  return jax.lax.bitcast_convert_type(
    jnp.concatenate([leaf.reshape(-1) for leaf in leaves]), stored
  )


def _to_host(packed: jax.Array) -> jax.Array | np.ndarray:
  """`packed` in host memory, read back before the next is made: left on an
  accelerator, the packed arrays would all sit in its memory (a second
  state) until orbax read them. A jax array on a CPU device (as the packed
  arrays of a state there already are) is read by orbax without a copy; a
  numpy array, where jax has no CPU backend, it copies once more."""
  if all(device.platform == "cpu" for device in packed.devices()):
    return packed
  try:
    host = jax.devices("cpu")[0]
  except RuntimeError:  # JAX_PLATFORMS names no cpu
    return np.asarray(packed)
  return jax.block_until_ready(jax.device_put(packed, host))


def layout_target(layout: Layout) -> dict[str, np.ndarray]:
  """What orbax restores the packed arrays onto: host arrays of their sizes
  and stored dtypes (allocated as they are written)."""
  sizes = [sum(math.prod(shape) for _, shape in array["leaves"]) for array in layout]
  return {
    str(index): np.empty(size, _stored(array["dtype"]))
    for index, (array, size) in enumerate(zip(layout, sizes))
    if size
  }


def unpack(arrays: dict[str, np.ndarray], layout: Layout, abstract_state: Any) -> Any:
  """The state `layout` describes, cut out of the packed `arrays`, in
  `abstract_state`'s structure and onto each of its leaves' shardings (the
  default device where a leaf has none).

  Raises:
    ValueError: one line naming the first leaf that one of the two states
      holds and the other does not, or whose shape or dtype differ.
  """
  saved = {}  # path -> (shape, dtype name, packed array's name, offset in it)
  for index, array in enumerate(layout):
    offset = 0
    for path, shape in array["leaves"]:
      saved[path] = (tuple(shape), array["dtype"], str(index), offset)
      offset += math.prod(shape)
  asked = {
    jax.tree_util.keystr(key): leaf
    for key, leaf in jax.tree_util.tree_leaves_with_path(abstract_state)
  }
  unmatched = sorted(set(saved) ^ set(asked))
  if unmatched:
    holder, other = ("saved", "asked for") if unmatched[0] in saved else ("asked for", "saved")
    raise ValueError(f"the state {holder} holds {unmatched[0]}, the one {other} does not")
  leaves = []
  for path, leaf in asked.items():
    shape, dtype, name, offset = saved[path]
    if (shape, dtype) != (tuple(leaf.shape), np.dtype(leaf.dtype).name):
      raise ValueError(
        f"the state saved holds {path} as {dtype}{list(shape)}, the one asked for as "
        f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"
      )
    size = math.prod(shape)
    value = np.empty(size, leaf.dtype) if not size else arrays[name][offset : offset + size]
    leaves.append(_on_devices(value.view(leaf.dtype).reshape(shape), leaf))
  return jax.tree.unflatten(jax.tree.structure(abstract_state), leaves)


def _on_devices(value_X: np.ndarray, leaf: Any) -> jax.Array:
  """`value_X` on `leaf`'s sharding, each device given its own part."""
  sharding = _sharding(leaf)
  if sharding is None:
    return jax.device_put(value_X)
  return jax.make_array_from_callback(value_X.shape, sharding, lambda index: value_X[index])
