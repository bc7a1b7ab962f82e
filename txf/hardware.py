"""Peak dense FLOP/s and memory bandwidth per accelerator; model FLOPs
utilisation (MFU).

Peaks are the vendors' dense tensor-core / MXU numbers (datasheets quote
2x these "with sparsity" for NVIDIA parts), per JAX device. On TPU v4, v5p
(megacore) and v5e/v6e (one TensorCore) a JAX device is one chip. Memory
bandwidths are the datasheets' HBM/GDDR figures: reading a model's weights
once takes at least weight bytes / bandwidth, the floor of a decoding step
at small batch (`decode_floor_seconds`). What a device can hold
(`memory_bytes`) bounds what a run may ask of it (`check_fits`).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

# (pattern matched against the lower-cased `device.device_kind`,
#  {dtype name: dense peak FLOP/s}). First match wins, so specific variants
# come before the generic name. float32 is not tabulated: its matmul peak
# depends on the precision setting (TF32 on NVIDIA, bf16 passes on TPU).
_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
  # NVIDIA Hopper: H100 SXM 1979 / PCIe 1513 / NVL 1671 TFLOPS sparse.
  (r".*\bh100.*pcie.*", {"bfloat16": 756.5e12, "float16": 756.5e12}),
  (r".*\bh[12]00.*nvl.*", {"bfloat16": 835.5e12, "float16": 835.5e12}),
  (r".*\b(gh200|h200|h100).*", {"bfloat16": 989.5e12, "float16": 989.5e12}),
  # NVIDIA Ampere A100 (SXM4 and PCIe): 312 TFLOPS dense.
  (r".*\ba100.*", {"bfloat16": 312e12, "float16": 312e12}),
  # NVIDIA Ada L4: 242 TFLOPS sparse.
  (r".*\bl4\b.*", {"bfloat16": 121e12, "float16": 121e12}),
  # NVIDIA Volta V100 has no bfloat16 tensor cores.
  (r".*\bv100.*pcie.*", {"float16": 112e12}),
  (r".*\bv100.*", {"float16": 125e12}),
  # Google TPUs; JAX reports v5e as 'TPU v5 lite', v5p as 'TPU v5',
  # v6e as 'TPU v6 lite'.
  (r"tpu v4", {"bfloat16": 275e12}),
  (r"tpu v5( lite|e)", {"bfloat16": 197e12}),
  (r"tpu v5p?", {"bfloat16": 459e12}),
  (r"tpu v6( lite|e)", {"bfloat16": 918e12}),
)


# (pattern as above, bytes/s). GH200 ships with 96 GB HBM3 or 144 GB HBM3e
# at different bandwidths, so it is left unknown.
_BANDWIDTHS: tuple[tuple[str, float], ...] = (
  (r".*\bh100.*pcie.*", 2.0e12),
  (r".*\bh100.*nvl.*", 3.9e12),
  (r".*\bh200.*", 4.8e12),
  (r".*\bh100.*", 3.35e12),  # SXM5 80 GB HBM3
  (r".*\ba100.*40gb.*", 1.555e12),
  (r".*\ba100.*pcie.*", 1.935e12),  # 80 GB PCIe
  (r".*\ba100.*", 2.039e12),  # 80 GB SXM4
  (r".*\bl4\b.*", 0.3e12),
  (r".*\bv100.*", 0.9e12),
  (r"tpu v4", 1.228e12),
  (r"tpu v5( lite|e)", 0.819e12),
  (r"tpu v5p?", 2.765e12),
  (r"tpu v6( lite|e)", 1.64e12),
)


def _device_kind(device: Any) -> str:
  if device is None:
    device = jax.local_devices()[0]
  return device.device_kind.lower().strip()


def _dtype_name(dtype: Any) -> str:
  try:
    return jnp.dtype(dtype).name
  except TypeError as error:
    raise ValueError(f"dtype: not a dtype: {dtype!r}") from error


def peak_flops_per_device(device: Any = None, dtype: Any = "bfloat16") -> float | None:
  """Dense peak FLOP/s of one device for matmuls in `dtype`.

  Args:
    device: a `jax.Device` (anything with `.device_kind`); default the first
      local device.
    dtype: compute dtype of the matmuls ('bfloat16', 'float16', ...).

  Returns:
    FLOP/s, or None for CPUs, unknown devices and untabulated dtypes
    (float32, or bfloat16 on a V100), where MFU is not meaningful.
  """
  name = _dtype_name(dtype)
  kind = _device_kind(device)
  for pattern, peaks in _PEAKS:
    if re.fullmatch(pattern, kind):
      return peaks.get(name)
  return None


def mfu(
  flops_per_token: float, tokens_per_second: float, num_devices: int, peak: float | None
) -> float | None:
  """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak.

  Args:
    flops_per_token: training FLOPs per token (forward + backward, e.g.
      6 * params + attention), not counting rematerialisation.
    tokens_per_second: global throughput over all devices.
    num_devices: devices that produced that throughput.
    peak: per-device peak from `peak_flops_per_device`; None gives None.
  """
  if flops_per_token < 0:
    raise ValueError(f"flops_per_token must be >= 0, got {flops_per_token}.")
  if tokens_per_second < 0:
    raise ValueError(f"tokens_per_second must be >= 0, got {tokens_per_second}.")
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}.")
  if peak is None:
    return None
  if peak <= 0:
    raise ValueError(f"peak must be positive or None, got {peak}.")
  return flops_per_token * tokens_per_second / (num_devices * peak)


def memory_bandwidth_per_device(device: Any = None) -> float | None:
  """Peak memory bandwidth of one device in bytes/s; None for CPUs and
  unknown devices. `device` as in `peak_flops_per_device`."""
  kind = _device_kind(device)
  return next(
    (bandwidth for pattern, bandwidth in _BANDWIDTHS if re.fullmatch(pattern, kind)), None
  )


def decode_floor_seconds(weight_bytes: float, bandwidth: float | None) -> float | None:
  """The least time one decoding step can take: every weight read once from
  device memory (KV-cache reads and all compute ignored); None when the
  bandwidth is unknown."""
  if weight_bytes < 0:
    raise ValueError(f"weight_bytes must be >= 0, got {weight_bytes}.")
  if bandwidth is None:
    return None
  if bandwidth <= 0:
    raise ValueError(f"bandwidth must be positive or None, got {bandwidth}.")
  return weight_bytes / bandwidth


def memory_bytes(device: Any) -> int | None:
  """Bytes of arrays `device` can hold: an accelerator's allocator limit,
  the host's physical memory for a CPU device; None where neither is known."""
  stats = device.memory_stats() if device.platform != "cpu" else None
  if stats and "bytes_limit" in stats:
    return int(stats["bytes_limit"])
  if device.platform == "cpu":
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  return None


def bytes_per_device(tree: Any) -> int:
  """Bytes the most loaded device holds of a tree of arrays or
  jax.ShapeDtypeStructs: a leaf with a sharding counts its shard, one
  without it whole."""
  total = 0
  for leaf in jax.tree.leaves(tree):
    sharding = getattr(leaf, "sharding", None)
    shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
    total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
  return total


def check_fits(field: str, what: str, nbytes: int, device: Any) -> None:
  """Refuses a run that needs more of `device`'s memory than it has
  (`memory_bytes`), before any compute: `nbytes` is a lower bound of what it
  needs (e.g. its parameters, without activations), so only a size far past
  the device is refused here and a run that fits is never.

  Raises:
    ValueError: starting with `field`, naming `what` and both sizes.
  """
  limit = memory_bytes(device)
  if limit is not None and nbytes > limit:
    raise ValueError(
      f"{field}: {what} need {nbytes / 2**30:,.1f} GiB on one device, more than "
      f"the {limit / 2**30:,.1f} GiB its {device.device_kind} holds"
    )


BENCHMARK_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy")


def environment(packages: Sequence[str] = BENCHMARK_PACKAGES) -> dict[str, Any]:
  """What a benchmark figure (or a run) was measured on: date, device, the
  versions of `packages` (None where one is not installed) and XLA flags."""
  versions: dict[str, str | None] = {}
  for package in packages:
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  device = jax.local_devices()[0]
  return dict(
    date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    backend=jax.default_backend(),
    device_kind=device.device_kind,
    device_count=jax.device_count(),
    process_count=jax.process_count(),
    python=platform.python_version(),
    versions=versions,
    xla_flags=os.environ.get("XLA_FLAGS", ""),
  )
