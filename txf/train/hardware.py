"""Peak dense FLOP/s per accelerator and model FLOPs utilisation (MFU).

Peaks are the vendors' dense tensor-core / MXU numbers (datasheets quote
2x these "with sparsity" for NVIDIA parts), per JAX device. On TPU v4, v5p
(megacore) and v5e/v6e (one TensorCore) a JAX device is one chip.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp

# (pattern matched against the lower-cased `device.device_kind`,
#  {dtype name: dense peak FLOP/s}). First match wins, so specific variants
# come before the generic name. float32 is not tabulated: its matmul peak
# depends on the precision setting (TF32 on NVIDIA, bf16 passes on TPU).
_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    # NVIDIA Hopper: H100 SXM 1979 / PCIe 1513 / NVL 1671 TFLOPS sparse.
    (r'.*\bh100.*pcie.*', {'bfloat16': 756.5e12, 'float16': 756.5e12}),
    (r'.*\bh[12]00.*nvl.*', {'bfloat16': 835.5e12, 'float16': 835.5e12}),
    (r'.*\b(gh200|h200|h100).*', {'bfloat16': 989.5e12, 'float16': 989.5e12}),
    # NVIDIA Ampere A100 (SXM4 and PCIe): 312 TFLOPS dense.
    (r'.*\ba100.*', {'bfloat16': 312e12, 'float16': 312e12}),
    # NVIDIA Ada L4: 242 TFLOPS sparse.
    (r'.*\bl4\b.*', {'bfloat16': 121e12, 'float16': 121e12}),
    # NVIDIA Volta V100 has no bfloat16 tensor cores.
    (r'.*\bv100.*pcie.*', {'float16': 112e12}),
    (r'.*\bv100.*', {'float16': 125e12}),
    # Google TPUs; JAX reports v5e as 'TPU v5 lite', v5p as 'TPU v5',
    # v6e as 'TPU v6 lite'.
    (r'tpu v4', {'bfloat16': 275e12}),
    (r'tpu v5( lite|e)', {'bfloat16': 197e12}),
    (r'tpu v5p?', {'bfloat16': 459e12}),
    (r'tpu v6( lite|e)', {'bfloat16': 918e12}),
)


def _dtype_name(dtype: Any) -> str:
  try:
    return jnp.dtype(dtype).name
  except TypeError as error:
    raise ValueError(f'dtype: not a dtype: {dtype!r}') from error


def peak_flops_per_device(device: Any = None,
                          dtype: Any = 'bfloat16') -> float | None:
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
  if device is None:
    device = jax.local_devices()[0]
  kind = device.device_kind.lower().strip()
  for pattern, peaks in _PEAKS:
    if re.fullmatch(pattern, kind):
      return peaks.get(name)
  return None


def mfu(flops_per_token: float, tokens_per_second: float, num_devices: int,
        peak: float | None) -> float | None:
  """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak.

  Args:
    flops_per_token: training FLOPs per token (forward + backward, e.g.
      6 * params + attention), not counting rematerialisation.
    tokens_per_second: global throughput over all devices.
    num_devices: devices that produced that throughput.
    peak: per-device peak from `peak_flops_per_device`; None gives None.
  """
  if flops_per_token < 0:
    raise ValueError(f'flops_per_token must be >= 0, got {flops_per_token}.')
  if tokens_per_second < 0:
    raise ValueError(
        f'tokens_per_second must be >= 0, got {tokens_per_second}.')
  if num_devices < 1:
    raise ValueError(f'num_devices must be >= 1, got {num_devices}.')
  if peak is None:
    return None
  if peak <= 0:
    raise ValueError(f'peak must be positive or None, got {peak}.')
  return flops_per_token * tokens_per_second / (num_devices * peak)
