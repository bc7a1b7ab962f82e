"""Reading and writing a Hugging Face model directory's tensors.

Weights are read from `model.safetensors`, a sharded
`model.safetensors.index.json`, or (only when torch happens to be installed)
`pytorch_model.bin`. Safetensors files are read with the `safetensors`
package's numpy API; bfloat16 tensors, which numpy cannot represent, through
its flax API. Every floating tensor comes back as float32 numpy (txf keeps
parameters in float32). Nothing here needs torch or TensorFlow.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save

from txf import storage
from txf.interop.rules import CheckpointError

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PYTORCH_BIN = "pytorch_model.bin"
CONFIG = "config.json"


def read_json(path: epath.Path, kind: type = dict) -> Any:
  """A JSON file holding a `kind` (an object, or a list); CheckpointError
  names a missing or broken one (`txf.storage.read_json`'s line)."""
  try:
    value = storage.read_json(path)
  except ValueError as error:
    raise CheckpointError(str(error)) from None
  if value is None:
    raise CheckpointError(f"{path}: no such file")
  if not isinstance(value, kind):
    expected = "a JSON object" if kind is dict else f"a JSON {kind.__name__}"
    raise CheckpointError(f"{path}: expected {expected}, got {type(value).__name__}")
  return value


def file_inside(directory: epath.Path, name: Any, where: str) -> epath.Path:
  """`directory / name`, where `name` comes from a file of the checkpoint
  (`where` names it and its key): it must be a relative path that stays inside
  `directory`, so a downloaded checkpoint cannot make txf read files outside
  it. The check is on the path's text, not on symlinks' targets (the Hugging
  Face cache links each file to a blob elsewhere)."""
  if not isinstance(name, str):
    raise CheckpointError(f"{where}: {name!r} is not a path")
  normalized = posixpath.normpath(name)
  if posixpath.isabs(name) or normalized == ".." or normalized.startswith("../"):
    raise CheckpointError(f"{where}: {name!r} is outside the checkpoint directory {directory}")
  return directory / normalized


def _as_float32(array: np.ndarray) -> np.ndarray:
  return array.astype(np.float32) if np.issubdtype(array.dtype, np.floating) else array


def _read_safetensors(path: epath.Path) -> dict[str, np.ndarray]:
  tensors, bfloat16 = {}, []
  try:
    with safe_open(os.fspath(path), framework="numpy") as file:
      for name in file.keys():
        if file.get_slice(name).get_dtype() == "BF16":
          bfloat16.append(name)
        else:
          tensors[name] = _as_float32(file.get_tensor(name))
    if bfloat16:
      with safe_open(os.fspath(path), framework="flax") as file:
        tensors.update({name: np.asarray(file.get_tensor(name), np.float32) for name in bfloat16})
  except (OSError, SafetensorError) as error:
    raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None
  return tensors


def _read_pytorch_bin(path: epath.Path) -> dict[str, np.ndarray]:
  try:
    import torch
  except ImportError:
    raise CheckpointError(
      f"{path}: reading pytorch_model.bin needs torch; convert the "
      "checkpoint to model.safetensors or install torch"
    ) from None
  try:
    state = torch.load(os.fspath(path), map_location="cpu", weights_only=True)
  except Exception as error:  # torch's error depends on where the bytes broke
    raise CheckpointError(f"{path}: not a readable pytorch_model.bin ({error})") from None
  return {
    name: _as_float32(tensor.float().numpy() if tensor.is_floating_point() else tensor.numpy())
    for name, tensor in state.items()
  }


def read_tensors(directory: epath.Path) -> dict[str, np.ndarray]:
  """{name: float32 array} of the weights in a HF model directory."""
  if (directory / SAFETENSORS).exists():
    return _read_safetensors(directory / SAFETENSORS)
  if (directory / SAFETENSORS_INDEX).exists():
    where = f"{directory / SAFETENSORS_INDEX}: weight_map"
    weight_map = read_json(directory / SAFETENSORS_INDEX).get("weight_map") or {}
    if not isinstance(weight_map, dict):
      raise CheckpointError(f"{where}: expected a JSON object, got {type(weight_map).__name__}")
    # Every shard is checked before any is read.
    shards = [file_inside(directory, shard, where) for shard in set(weight_map.values())]
    if not shards:
      raise CheckpointError(f"{where}: names no files")
    tensors = {}
    for shard in sorted(shards, key=str):
      tensors.update(_read_safetensors(shard))
    return tensors
  if (directory / PYTORCH_BIN).exists():
    return _read_pytorch_bin(directory / PYTORCH_BIN)
  raise CheckpointError(
    f"{directory}: no weights ({SAFETENSORS}, {SAFETENSORS_INDEX} or {PYTORCH_BIN})"
  )


def safetensors_bytes(tensors: Mapping[str, np.ndarray]) -> bytes:
  """A safetensors file that `transformers` loads (format 'pt'), as bytes for
  the caller to write whole."""
  return save(
    {name: np.ascontiguousarray(value) for name, value in tensors.items()},
    metadata={"format": "pt"},
  )
