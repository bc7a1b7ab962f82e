"""Which platform the ops are traced for: this process's backend, or the
target of an ahead-of-time compile (`compiling_for`), so that a GPU program
compiled on a machine without a GPU picks the GPU's kernels (cuDNN's flash
attention, the Pallas cross-entropy) as it would on the GPU itself.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

__all__ = ["backend", "compiling_for", "gpu_compute_capability_major"]

# (platform, compute capability major) of the device being traced for, where
# that is not this process's default backend.
_TARGET: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
  "txf_ops_target", default=None
)


@contextlib.contextmanager
def compiling_for(platform: str, compute_capability_major: int = 9) -> Iterator[None]:
  """Trace ops for another platform than this process's devices: inside,
  `backend()` is `platform` ('gpu', 'tpu', 'cpu'; a GPU of
  `compute_capability_major`), e.g. for a GPU program compiled ahead of time
  on a machine without one (txf.aot)."""
  token = _TARGET.set((platform, compute_capability_major))
  try:
    yield
  finally:
    _TARGET.reset(token)


def backend() -> str:
  """'gpu', 'tpu' or 'cpu': the platform ops are traced for."""
  target = _TARGET.get()
  return jax.default_backend() if target is None else target[0]


def gpu_compute_capability_major() -> int | None:
  """The traced-for GPU's compute capability major (9: Hopper), None where
  it cannot be read (no GPU attached and no `compiling_for`)."""
  target = _TARGET.get()
  if target is not None:
    return target[1]
  try:
    return int(str(jax.devices()[0].compute_capability).split(".")[0])
  except Exception:  # no GPU attached: CPU and TPU devices have no capability
    return None
