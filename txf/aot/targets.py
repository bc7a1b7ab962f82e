"""The hardware txf can compile for without having it: TPU slices and NVIDIA GPUs.

A target is named as the cloud names it (`v5e-256`, `v4-8`, `v5p-128`,
`v6e-64`; `v5e-256x2` for two slices) or as a GPU and a count (`h100`,
`h100x8`, `h200x16`, `a100x8`). `parse_target` turns the name into a
`Target`, whose `devices()` are the devices of a topology description
(`jax.experimental.topologies`): real device objects with ids, kinds and
coordinates, on which a mesh can be laid and a program compiled, but with no
hardware behind them.

Chip counts: a v5e / v6e name counts chips (one TensorCore each, a 2-D
torus); a v4 / v5p name counts TensorCores, two per chip (megacore: a JAX
device is one chip), so `v4-8` is 4 chips. Eight GPUs share a host. A
slice is at most its generation's largest, and a target at most MAX_DEVICES
devices; several slices are laid out by txf.train.sharding.make_mesh (data
parallel across them).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

from txf.extras import install_hint

# Per chip: the HBM bytes XLA lets a program fill ("exceeds available HBM
# (15.75G)" in its refusal, libtpu 0.0.42.1, to its 0.01 GiB); the
# datasheets' 16 GiB of a v5e overstated what a step may use by 0.25 GiB.
_TPU_MEMORY = {
  generation: round(gib * 2**30)
  for generation, gib in {"v4": 30.75, "v5e": 15.75, "v5p": 95.74, "v6e": 31.25}.items()
}
# Per generation: the chips of its largest slice (Cloud TPU's documentation:
# a v4 pod, v5p's largest schedulable job, a v5e / v6e pod of 256).
_TPU_LARGEST_SLICE = {"v4": 4096, "v5e": 256, "v5p": 6144, "v6e": 256}
# Names counting TensorCores, two per chip (megacore).
_MEGACORE = ("v4", "v5p")
_GPUS_PER_HOST = 8
# Devices in all, over slices or hosts. jax's topology descriptions take any
# count (a million devices in 25 s, then a mesh and a compile that take
# longer); the largest runs published (50,944 v5e chips over 199 slices)
# stay below this.
MAX_DEVICES = 65_536


@dataclasses.dataclass(frozen=True)
class GpuSpec:
  """What XLA's GPU compiler needs of a device it cannot query (its
  `GpuTargetConfig`): the numbers an attached GPU would report."""

  description: str
  compute_capability: tuple[int, int]
  core_count: int
  memory_bytes: int
  memory_bandwidth: float
  l2_cache_bytes: int
  clock_ghz: float
  fpus_per_core: int
  shared_memory_per_core: int
  shared_memory_per_block_optin: int


# From XLA's own device descriptions (xla/tools/hlo_opt/gpu_specs: h100_sxm,
# a100_40 with the 80 GB part's memory and bandwidth); the H200 is an H100
# with 141 GB of HBM3e at 4.8 TB/s and a 60 MB L2.
GPUS = {
  "h100": GpuSpec(
    "NVIDIA H100 80GB HBM3",
    (9, 0),
    132,
    84_978_434_048,
    3.35232e12,
    50 * 2**20,
    1.98,
    128,
    233_472,
    232_448,
  ),
  "h200": GpuSpec(
    "NVIDIA H200", (9, 0), 132, 150_754_820_096, 4.8e12, 60 * 2**20, 1.98, 128, 233_472, 232_448
  ),
  "a100": GpuSpec(
    "NVIDIA A100-SXM4-80GB",
    (8, 0),
    108,
    85_899_345_920,
    2.039e12,
    40 * 2**20,
    1.41,
    64,
    167_936,
    166_912,
  ),
}

# The cuDNN and CUDA versions a GPU target is described with: those of the
# CUDA 13 jax plugin's floor (cuDNN 9.12, CUDA 13.0).
CUDNN_VERSION = (9, 12, 0)
CUDA_VERSION = (13, 0, 0)


def gpu_target_config(spec: GpuSpec) -> str:
  """The GpuTargetConfig text proto of `spec` (jax's `target_config`)."""
  major, minor = spec.compute_capability
  return "\n".join(
    [
      "gpu_device_info {",
      "  threads_per_block_limit: 1024",
      "  threads_per_warp: 32",
      "  shared_memory_per_block: 49152",
      f"  shared_memory_per_core: {spec.shared_memory_per_core}",
      "  threads_per_core_limit: 2048",
      f"  core_count: {spec.core_count}",
      f"  fpus_per_core: {spec.fpus_per_core}",
      "  block_dim_limit_x: 2147483647",
      "  block_dim_limit_y: 65535",
      "  block_dim_limit_z: 65535",
      f"  memory_bandwidth: {int(spec.memory_bandwidth)}",
      f"  l2_cache_size: {spec.l2_cache_bytes}",
      f"  clock_rate_ghz: {spec.clock_ghz}",
      f"  device_memory_size: {spec.memory_bytes}",
      f"  shared_memory_per_block_optin: {spec.shared_memory_per_block_optin}",
      f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
      "  registers_per_core_limit: 65536",
      "  registers_per_block_limit: 65536",
      "}",
      'platform_name: "CUDA"',
      "dnn_version_info {{ major: {} minor: {} patch: {} }}".format(*CUDNN_VERSION),
      "runtime_version {{ major: {} minor: {} patch: {} }}".format(*CUDA_VERSION),
      f'device_description_str: "{spec.description}"',
    ]
  )


# JAX's GPU memory pool, a fraction of the device (its default; the
# variable sets another, XLA_PYTHON_CLIENT_ALLOCATOR=platform none at all).
DEFAULT_GPU_MEMORY_FRACTION = 0.75


def gpu_memory_pool(device_bytes: int) -> int:
  """The bytes of a GPU of `device_bytes` a JAX process can allocate, as this
  environment would size its pool: XLA_PYTHON_CLIENT_MEM_FRACTION of it
  (0.75 by default), the whole with XLA_PYTHON_CLIENT_ALLOCATOR=platform.
  What txf-run's own check reads on a GPU (the allocator's bytes_limit).

  Raises:
    ValueError: naming the variable, for a fraction not in (0, 1].
  """
  if os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "").strip().lower() == "platform":
    return device_bytes
  text = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
  try:
    fraction = float(text) if text else DEFAULT_GPU_MEMORY_FRACTION
  except ValueError:
    fraction = math.nan
  if not 0 < fraction <= 1:
    raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION: must be in (0, 1], got {text!r}")
  return int(device_bytes * fraction)


@dataclasses.dataclass(frozen=True)
class Target:
  """Hardware to compile for.

  Attributes:
    name: as given (`v5e-256`, `h100x8`).
    platform: 'tpu' or 'gpu'.
    chips: JAX devices in all (chips; GPUs).
    memory_bytes: each device's memory a run may use: a TPU's, a GPU's pool
      as JAX sizes it (`gpu_memory_pool`).
    slices: TPU slices (1 for GPUs).
    topology: the topology's name for jax: `v5e:16x16` (TPU), `1x1x8`
      (GPU: slices x hosts x GPUs per host).
    gpu: the GPU's description, None for TPUs.
  """

  name: str
  platform: str
  chips: int
  memory_bytes: int
  slices: int = 1
  topology: str = ""
  gpu: GpuSpec | None = None

  def devices(self) -> list:
    """The target's devices, from a topology description (no hardware).

    Raises:
      ImportError: naming the pip extra that provides the compiler (libtpu
        for TPUs, jax's CUDA plugin for GPUs).
    """
    from jax.experimental import topologies

    try:
      if self.gpu is not None:
        description = topologies.get_topology_desc(
          platform="cuda", topology=self.topology, target_config=gpu_target_config(self.gpu)
        )
      else:
        megacore = self.topology.split(":")[0] in _MEGACORE
        description = topologies.get_topology_desc(
          topology_name=self.topology,
          platform="tpu",
          chip_config_name="megacore" if megacore else "default",
          # A host holds 4 chips (2x2x1), or the one chip of a 1-chip slice.
          chips_per_host_bounds=(1, 1, 1) if self.chips == self.slices else (2, 2, 1),
          num_slices=self.slices,
        )
    except Exception as error:  # jax raises RuntimeError / XlaRuntimeError without a plugin
      if _missing_plugin(error):
        extra = "tpu" if self.platform == "tpu" else "gpu-compile"
        raise ImportError(
          f"compiling for {self.name} needs the {self.platform.upper()} compiler: "
          f"{install_hint(extra)}"
        ) from error
      raise
    return list(description.devices)


def _missing_plugin(error: Exception) -> bool:
  text = str(error).lower()
  return any(
    words in text
    for words in (
      "unknown backend",
      "not implemented",
      "no module named",
      "unable to initialize",
      "support not installed",  # jax 0.10: "JAX TPU support not installed; ..."
    )
  )


def _tpu_topology(generation: str, chips: int) -> str:
  """The torus of a slice of `chips` chips as the cloud lays it out: 2-D for
  v5e / v6e (1x1, 2x2, 2x4, 4x4, ... 16x16), 3-D for v4 / v5p (2x2x1, 2x2x2,
  2x2x4, 2x4x4, 4x4x4, ...): each step doubles the last of the shortest sides."""
  sides = [2, 2, 1] if generation in _MEGACORE else ([1, 1] if chips == 1 else [2, 2])
  while math.prod(sides) < chips:
    shortest = min(sides)
    last = len(sides) - 1 - sides[::-1].index(shortest)
    sides[last] *= 2
  if math.prod(sides) != chips:
    raise ValueError(f"no {generation} slice has {chips} chips ({_accepted(generation)})")
  return f"{generation}:" + "x".join(map(str, sides))


def _accepted(generation: str) -> str:
  """The slice names parse_target takes for a generation: from a 2x2(x1)
  torus, doubling, to the largest power of two within its largest slice (a
  v5e also takes one chip)."""
  per_chip = 2 if generation in _MEGACORE else 1
  largest = 2 ** int(math.log2(_TPU_LARGEST_SLICE[generation]))
  one = "" if generation in _MEGACORE else f"{generation}-1 or "
  first, last = 4 * per_chip, largest * per_chip
  return f"txf takes {one}{generation}-{first} to {generation}-{last}, doubling"


def _check_device_count(name: str, devices: int) -> None:
  """Raises ValueError, one line, for more devices than MAX_DEVICES."""
  if devices > MAX_DEVICES:
    raise ValueError(
      f"target {name!r}: {devices:,} devices; txf compiles for {MAX_DEVICES:,} at most"
    )


_TPU_NAME = re.compile(r"(v4|v5e|v5litepod|v5p|v6e)-(\d+)(?:x(\d+))?")
_GPU_NAME = re.compile(r"(" + "|".join(GPUS) + r")(?:x(\d+))?")


def parse_target(name: str) -> Target:
  """The target of a name (see the module docstring).

  Raises:
    ValueError: one line naming what is wrong with the name.
  """
  text = name.strip().lower()
  if match := _TPU_NAME.fullmatch(text):
    generation = "v5e" if match[1] == "v5litepod" else match[1]
    count, slices = int(match[2]), int(match[3] or 1)
    chips = count // 2 if generation in _MEGACORE else count
    if generation in _MEGACORE and count % 2:
      raise ValueError(f"target {name!r}: {generation} names count TensorCores, two per chip")
    if slices < 1:
      raise ValueError(f"target {name!r}: at least one slice")
    if chips > _TPU_LARGEST_SLICE[generation]:
      raise ValueError(
        f"target {name!r}: the largest {generation} slice has {_TPU_LARGEST_SLICE[generation]} "
        f"chips ({_accepted(generation)}; more: several slices, x2)"
      )
    _check_device_count(name, chips * slices)
    try:
      topology = _tpu_topology(generation, chips)
    except ValueError as error:
      raise ValueError(f"target {name!r}: {error}") from None
    return Target(name, "tpu", chips * slices, _TPU_MEMORY[generation], slices, topology)
  if match := _GPU_NAME.fullmatch(text):
    count = int(match[2] or 1)
    if count < 1 or (count > _GPUS_PER_HOST and count % _GPUS_PER_HOST):
      raise ValueError(
        f"target {name!r}: 1 to {_GPUS_PER_HOST} GPUs, or whole hosts of {_GPUS_PER_HOST}"
      )
    _check_device_count(name, count)
    hosts = max(1, count // _GPUS_PER_HOST)
    spec = GPUS[match[1]]
    topology = f"1x{hosts}x{min(count, _GPUS_PER_HOST)}"
    return Target(name, "gpu", count, gpu_memory_pool(spec.memory_bytes), 1, topology, spec)
  raise ValueError(
    f"target {name!r}: not a TPU slice (v4-8, v5e-256, v5p-128, v6e-64, ...; x2 for two "
    f"slices) or a GPU ({', '.join(GPUS)}, times a count: h100x8)"
  )
