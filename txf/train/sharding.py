"""Data parallel, FSDP and tensor parallel as config changes.

One device mesh with axes ('data', 'fsdp', 'tensor') is built from
`config.parallel`. Every parameter carries logical axis names, declared by
the layer that creates it (`nn.with_logical_partitioning`, see
`txf.layers.partitioning`); `rules` map logical names to mesh axes; `jax.jit`
with `NamedSharding`s does the rest (XLA's SPMD partitioner inserts the
collectives).

  parallel.data    batch split; parameters replicated (plain data parallel)
  parallel.fsdp    batch split too, and parameters / optimizer state split
                   along 'embed' (ZeRO-3: gathered layer by layer in compute)
  parallel.tensor  heads, kv_heads, mlp and vocab split (Megatron-style)

Typical use:

  mesh = make_mesh(config.parallel)
  check_batch(config.data.batch_size, mesh)
  shardings = state_shardings(jax.eval_shape(init_state_fn, key),
                              jax.eval_shape(init_params_fn, key), mesh)
  state = jax.jit(init_state_fn, out_shardings=shardings)(key)
  batch = shard_batch(local_numpy_batch, mesh)

Anything that cannot be sharded as asked (a parameter without logical axes, a
dimension its mesh axis does not divide, a batch that does not split evenly)
raises a ValueError naming the parameter or config field before any compute.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

if TYPE_CHECKING:  # run_config imports the training modules that import this one
  from txf.runconfig.run_config import ParallelConfig

MESH_AXES = ("data", "fsdp", "tensor")
# Mesh axes a batch's leading dimension is split over.
BATCH_AXES = ("data", "fsdp")

# Logical axis -> mesh axis (or axes, or None: replicated). Same format as
# flax's `nn.logical_axis_rules`.
Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]
DEFAULT_RULES: Rules = (
  ("batch", BATCH_AXES),
  ("embed", "fsdp"),
  ("heads", "tensor"),
  ("kv_heads", "tensor"),
  ("mlp", "tensor"),
  ("vocab", "tensor"),
  ("head_dim", None),
  ("layers", None),
  ("length", None),
)

# Where to change a logical axis's size when its mesh axis does not divide it.
_AXIS_FIELDS: dict[str | None, str] = {
  "embed": "model.d_model",
  "heads": "model.num_heads",
  # A derived field names what it comes from where the config leaves it unset.
  "kv_heads": "model.num_kv_heads (model.num_heads where unset)",
  "mlp": "model.d_ff (from model.d_model where unset)",
  "vocab": "model.vocab_size",
  "head_dim": "model.head_dim (model.d_model / model.num_heads where unset)",
}


# ---------------------------------------------------------------------------
# Mesh.


def make_mesh(parallel: ParallelConfig, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A ('data', 'fsdp', 'tensor') mesh sized by `parallel.{data, fsdp, tensor}`.

  Args:
    parallel: the run's `parallel` section; `data=-1` takes all devices the
      other two axes leave.
    devices: the devices to use (default: all of them, across processes).

  Raises:
    ValueError: naming `parallel.<field>` for sizes whose product is not the
      device count (each size is checked by ParallelConfig).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = {name: getattr(parallel, name) for name in MESH_AXES}  # checked by ParallelConfig
  model_parallel = sizes["fsdp"] * sizes["tensor"]
  if sizes["data"] == -1:
    if len(devices) % model_parallel:
      raise ValueError(
        f"parallel.fsdp x parallel.tensor = {sizes['fsdp']} x {sizes['tensor']} does not "
        f"divide the {len(devices)} devices"
      )
    sizes["data"] = len(devices) // model_parallel
  if math.prod(sizes.values()) != len(devices):
    raise ValueError(
      f"parallel.data x parallel.fsdp x parallel.tensor = "
      f"{' x '.join(str(sizes[n]) for n in MESH_AXES)} = {math.prod(sizes.values())} "
      f"does not match the {len(devices)} devices (parallel.data=-1 takes the rest)"
    )
  # Auto axes: sharding is propagated by the compiler and linen's logical
  # constraints stay constraints.
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  slices = len({getattr(device, "slice_index", 0) for device in devices})
  if slices > 1:
    return Mesh(_multislice_grid(sizes, slices, devices), MESH_AXES, axis_types=axis_types)
  # jax.make_mesh orders devices for the physical topology (ICI neighbours on
  # the fastest-varying axis: 'tensor').
  return jax.make_mesh(
    tuple(sizes[n] for n in MESH_AXES), MESH_AXES, axis_types=axis_types, devices=devices
  )


def _multislice_grid(sizes: dict[str, int], slices: int, devices: list) -> np.ndarray:
  """The [data, fsdp, tensor] array of the devices of several TPU slices
  (jax.make_mesh lays out one): data parallel across the slices, over the
  data-center network, and every axis within each slice (MaxText's layout)."""
  if sizes["data"] % slices:
    raise ValueError(
      f"parallel.data = {sizes['data']} is not a multiple of the {slices} slices "
      "(data parallelism spans the slices)"
    )
  from jax.experimental import mesh_utils

  within = (sizes["data"] // slices, sizes["fsdp"], sizes["tensor"])
  return mesh_utils.create_hybrid_device_mesh(within, (slices, 1, 1), devices=devices)


# ---------------------------------------------------------------------------
# Shardings.


def _mesh_axes(rules: Rules, logical: str | None, name: str) -> tuple[str, ...]:
  """Mesh axes that logical axis `logical` is split over (empty: replicated)."""
  if logical is None:
    return ()
  table = dict(rules)
  if logical not in table:
    raise ValueError(f"{name}: logical axis {logical!r} has no entry in the sharding rules")
  target = table[logical]
  if target is None:
    return ()
  return (target,) if isinstance(target, str) else tuple(target)


def _spec(
  name: str, shape: tuple[int, ...], axes: Sequence[str | None], mesh: Mesh, rules: Rules
) -> PartitionSpec:
  """PartitionSpec for one array, checking that every split is even."""
  entries: list[str | tuple[str, ...] | None] = []
  used: set[str] = set()
  for dim, (size, logical) in enumerate(zip(shape, axes)):
    # A size-1 mesh axis splits nothing: leaving it out keeps specs readable
    # (P() is "replicated") and lets such axes repeat.
    mesh_axes = tuple(a for a in _mesh_axes(rules, logical, name) if mesh.shape[a] > 1)
    if used.intersection(mesh_axes):
      raise ValueError(
        f"{name}: mesh axes {mesh_axes} split two dimensions; the sharding "
        f"rules map two of its logical axes {tuple(axes)} to the same mesh axis"
      )
    used.update(mesh_axes)
    ways = math.prod(mesh.shape[a] for a in mesh_axes)
    if size % ways:
      fields = " x ".join(f"parallel.{a}" for a in mesh_axes)
      model_field = _AXIS_FIELDS.get(logical)
      change = f"{model_field} or {fields}" if model_field else fields
      raise ValueError(
        f"{name}: dimension {dim} ({logical!r}, size {size}) is not divisible by mesh axis "
        f"{' x '.join(mesh_axes)} (size {ways}); change {change}"
      )
    entries.append(None if not mesh_axes else mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
  return PartitionSpec(*entries)


def _path_name(path: tuple) -> str:
  """'stack/block_0/ffn/wi/kernel' from a tree path of dict keys."""
  return "/".join(str(getattr(key, "key", key)) for key in path)


def param_shardings(abstract_params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
  """NamedShardings for the parameters, from the logical axes their layers declare.

  Args:
    abstract_params: the `params` collection of `jax.eval_shape(model.init, ...)`
      (or of `model.init`), every leaf boxed (`nn.Partitioned`) with its
      logical axes.
    mesh, rules: where the logical axes go.

  Returns:
    A pytree like the unboxed parameters (`nn.meta.unbox(abstract_params)`)
    of NamedShardings.

  Raises:
    ValueError: naming the parameter, for one created without logical axes,
      axes that do not match its rank, or an uneven split.
  """

  def one(path, leaf):
    name = _path_name(path)
    if not isinstance(leaf, nn.Partitioned):
      raise ValueError(
        f"{name}: this parameter has no logical axes; create it with its "
        "initializer wrapped in nn.with_logical_partitioning (txf.layers."
        "partitioning)"
      )
    shape, axes = np.shape(leaf.value), tuple(leaf.names)
    if len(axes) != len(shape):
      raise ValueError(
        f"{name}: has {len(shape)} dimensions but its logical axes {axes} name {len(axes)}"
      )
    return NamedSharding(mesh, _spec(name, shape, axes, mesh, rules))

  return jax.tree_util.tree_map_with_path(
    one, abstract_params, is_leaf=lambda leaf: isinstance(leaf, nn.Partitioned)
  )


def state_shardings(
  abstract_state: Any, abstract_params: Any, mesh: Mesh, rules: Rules = DEFAULT_RULES
) -> Any:
  """NamedShardings for a whole TrainState (or any tree holding `.params`).

  Args:
    abstract_state: `jax.eval_shape` of the state's init; its parameters are
      plain (unboxed), as `txf.train.step.init_state` makes them.
    abstract_params: the same parameters boxed with their logical axes
      (`jax.eval_shape` of `txf.train.step.init_params`), see `param_shardings`.
    mesh, rules: where the logical axes go.

  Parameters follow the rules. Optimizer-state subtrees that mirror the
  parameters (Adam's mu and nu: same tree structure and shapes) get the
  parameters' shardings; scalars (step, counts) are replicated.

  Raises:
    ValueError: as `param_shardings`, and for a non-scalar leaf that mirrors
      no parameter (it would otherwise be silently replicated on every device).
  """
  params = nn.meta.unbox(abstract_params)
  params_def = jax.tree.structure(params)
  params_shapes = [np.shape(p) for p in jax.tree.leaves(params)]
  params_shardings = param_shardings(abstract_params, mesh, rules)

  def mirrors_params(node):
    return (
      jax.tree.structure(node) == params_def
      and [np.shape(x) for x in jax.tree.leaves(node)] == params_shapes
    )

  def one(path, node):
    if mirrors_params(node):
      return params_shardings
    if np.ndim(node) == 0:
      return replicated(mesh)
    raise ValueError(
      f"state{jax.tree_util.keystr(path)}: a {np.shape(node)} leaf that mirrors "
      "no parameter; txf.train.sharding.state_shardings cannot place it"
    )

  return jax.tree_util.tree_map_with_path(one, abstract_state, is_leaf=mirrors_params)


def replicated(mesh: Mesh) -> NamedSharding:
  """Whole copy on every device: metrics, eval sums, scalars."""
  return NamedSharding(mesh, PartitionSpec())


# ---------------------------------------------------------------------------
# Batches.


def batch_sharding(mesh: Mesh, *, replica_axis: bool = False) -> NamedSharding:
  """[B, ...] arrays split along B over 'data' x 'fsdp'; with `replica_axis`,
  [R, B, ...] arrays (each seed replica's own batch) split so, R whole."""
  spec = PartitionSpec(None, BATCH_AXES) if replica_axis else PartitionSpec(BATCH_AXES)
  return NamedSharding(mesh, spec)


def check_batch(global_batch_size: int, mesh: Mesh) -> None:
  """Raises a ValueError naming data.batch_size unless data x fsdp divides it,
  or naming parallel.tensor where processes would share batch rows
  (`shared_batch_blocks`)."""
  ways = math.prod(mesh.shape[a] for a in BATCH_AXES)
  if global_batch_size % ways:
    raise ValueError(
      f"data.batch_size: {global_batch_size} is not divisible by parallel.data x "
      f"parallel.fsdp = {mesh.shape['data']} x {mesh.shape['fsdp']} = {ways}"
    )
  shared, per_process = _shared_blocks(mesh)
  if shared:
    raise ValueError(
      f"parallel.tensor: {mesh.shape['tensor']} spans processes, so {shared} of the batch's "
      f"{ways} blocks of rows would sit on devices of several processes, each feeding rows "
      f"of its own: keep the tensor axis within one process's {per_process} devices"
    )


@functools.lru_cache(maxsize=8)
def _shared_blocks(mesh: Mesh) -> tuple[int, int]:
  """(`shared_batch_blocks` of `mesh`, devices of its first device's process),
  once per mesh: shard_batch checks every step's batch."""
  processes_DxFxT = np.vectorize(lambda device: device.process_index, otypes=[int])(mesh.devices)
  per_process = int(np.sum(processes_DxFxT == processes_DxFxT.flat[0]))
  return shared_batch_blocks(processes_DxFxT), per_process


def shared_batch_blocks(processes_DxFxT: np.ndarray) -> int:
  """How many of the batch's data x fsdp blocks of rows sit on devices of more
  than one process.

  `processes_DxFxT[d, f, t]`: the process of the mesh's device (d, f, t). Block
  d * F + f of the batch is on devices (d, f, :); txf's data pipeline gives
  every process rows of its own and `shard_batch` assembles the global batch
  from them, which holds only where no block is shared (a 'tensor' axis
  spanning processes shares every block it spans).
  """
  D, F, T = processes_DxFxT.shape
  holders_BLOCKSxT = processes_DxFxT.reshape(D * F, T)
  return int(np.sum(np.any(holders_BLOCKSxT != holders_BLOCKSxT[:, :1], axis=1)))


def shard_batch(
  local_batch: Mapping[str, np.ndarray], mesh: Mesh, *, replica_axis: bool = False
) -> dict[str, jax.Array]:
  """Global arrays from this process's rows of a batch.

  Each process passes only its own rows (its data shard, in process order);
  the global batch is their concatenation, split over 'data' x 'fsdp'. With
  `replica_axis` every field is [R, rows, ...] (txf.data.stacked): the rows
  are the second axis.
  """
  sharding = batch_sharding(mesh, replica_axis=replica_axis)
  rows = {np.shape(x)[1 if replica_axis else 0] for x in local_batch.values()}
  if len(rows) != 1:
    raise ValueError(f"shard_batch: batch fields disagree on the row count: {sorted(rows)}")
  check_batch(rows.pop() * jax.process_count(), mesh)
  return {
    key: jax.make_array_from_process_local_data(sharding, np.asarray(value))
    for key, value in local_batch.items()
  }


# ---------------------------------------------------------------------------
# Activations.


@contextlib.contextmanager
def activation_sharding(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[None]:
  """Context in which `nn.with_logical_constraint(x, ('batch', 'length', 'embed'))`
  inside traced code becomes a sharding constraint on `mesh` (outside it, a
  no-op). Trace (first call of a jitted function) inside the context.
  """
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield
