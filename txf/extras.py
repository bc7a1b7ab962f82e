"""What txf's optional extras install, for the messages that ask for one.

`pip install 'txf[wandb]'` works only where pip can find txf itself; txf
installed from a checkout or a wheel is not found that way (or another
package named txf is). So a message names the packages the extra holds,
which pip installs whatever way txf came:

  install_hint("wandb")   # "pip install 'wandb>=0.19' (txf's wandb extra)"

`EXTRAS` lists them as pyproject.toml's [project.optional-dependencies] does
(tests/test_package.py holds the two equal).
"""

from __future__ import annotations

import shlex

# extra -> its requirements, as pyproject.toml lists them.
EXTRAS: dict[str, tuple[str, ...]] = {
  "gcs": ("gcsfs>=2024.2", "google-cloud-storage>=2.14"),
  "wandb": ("wandb>=0.19",),
  "tpu": ("jax[tpu]",),
  "gpu-compile": ("jax[cuda13-local]", "nvidia-cuda-nvcc>=13"),
}


def install_hint(extra: str) -> str:
  """The pip command that installs the packages of txf's `extra`, and its name."""
  return f"pip install {' '.join(map(shlex.quote, EXTRAS[extra]))} (txf's {extra} extra)"
