"""Reading a Hugging Face `config.json` into ModelConfig fields, and back.

Shared by the families (bert.py, gpt2.py, llama.py, gpt_neox.py, t5.py;
the decoders' rotary keys: decoder.py): a value txf cannot represent stops
the conversion with a CheckpointError naming the key, and an export refuses
a ModelConfig field the architecture cannot represent, naming the field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from txf import checks
from txf.interop.rules import CheckpointError
from txf.layers.model_config import ModelConfig

_MISSING = object()
# HF activation names of GELU's tanh form; "gelu" is the exact (erf) one.
GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def get(hf: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
  """hf[key]; without a default a missing (or null) key is a CheckpointError.

  The value must have the default's kind (no default: an integer): a string,
  an integer in [0, 2^31), or a finite number >= 0 -- what every key read here
  holds; anything else is a CheckpointError naming the key.
  """
  value = hf.get(key)
  if value is None:
    if default is _MISSING:
      raise CheckpointError(f"config.json: missing {key!r}")
    return default
  kind = int if default is _MISSING else type(default)
  try:
    if kind is int:
      return checks.int_at_least(value, key, 0, checks.INT32_MAX)
    if kind is float:
      return checks.finite_at_least(value, key, 0.0)
  except ValueError as error:
    raise CheckpointError(f"config.json: {error}") from None
  if not isinstance(value, kind):
    raise CheckpointError(f"config.json: {key}: must be a {kind.__name__}, got {value!r}")
  return value


def token_id(hf: Mapping[str, Any], key: str) -> int | None:
  """A special token's id (`pad_token_id`, `eos_token_id`, ...): None where
  the config names none (missing, null, or a negative id: older configs'
  -1); of a list (Llama 3 ends at any of several), the first, said in a
  warning: txf's decoding stops at one.

  Raises:
    CheckpointError: naming the key, for a value that is no token id.
  """
  value = hf.get(key)
  if isinstance(value, list) and value:
    logging.warning("config.json: %s lists %s: txf stops at the first", key, value)
    value = value[0]
  if isinstance(value, int) and not isinstance(value, bool) and value < 0:
    return None
  return None if value is None else get({key: value}, key)


def expect(hf: Mapping[str, Any], key: str, supported: tuple, default: Any) -> Any:
  """hf[key] (default when absent), which must be one of `supported`."""
  value = hf.get(key, default)
  if value not in supported:
    raise CheckpointError(
      f"config.json: {key}={value!r} is not supported by txf "
      f"(supported: {', '.join(map(repr, supported))})"
    )
  return value


def activation_fields(name: str, key: str) -> dict[str, Any]:
  """ModelConfig fields of HF activation `name` (read from config key `key`)."""
  if name == "relu":
    return dict(activation="relu")
  if name == "gelu":
    return dict(activation="gelu", gelu_approximate=False)
  if name in GELU_TANH:
    return dict(activation="gelu", gelu_approximate=True)
  raise CheckpointError(
    f"config.json: {key}={name!r} is not supported by txf (supported: "
    f"'relu', 'gelu', {', '.join(map(repr, GELU_TANH))})"
  )


def hf_activation(cfg: ModelConfig) -> str:
  """The HF name of cfg's (ungated) activation."""
  if cfg.activation == "relu":
    return "relu"
  return "gelu_new" if cfg.gelu_approximate else "gelu"


def require(
  cfg: ModelConfig, architecture: str, *refused_too: tuple[str, str], **required: Any
) -> None:
  """Refuses cfg's fields whose values `architecture` cannot represent, every
  one of them in one CheckpointError ('model.position: 'rope' cannot be
  written as GPT2LMHeadModel (needs 'learned')', then '; model.norm: ...'
  for each other field).

  Each keyword is a field and its required value, or a tuple of allowed
  values; each of `refused_too` a refusal its caller found that no set of
  values says (a range, two fields together): ('model.FIELD: VALUE',
  '(needs ...)').
  """
  refused = []
  for field, allowed in required.items():
    allowed = allowed if isinstance(allowed, tuple) else (allowed,)
    value = getattr(cfg, field)
    if value not in allowed:
      refused.append((f"model.{field}: {value!r}", f"(needs {' or '.join(map(repr, allowed))})"))
  refused += refused_too
  if refused:
    (first, needs), *others = refused
    raise CheckpointError(
      f"{first} cannot be written as {architecture} {needs}"
      + "".join(f"; {field} {needs}" for field, needs in others)
    )


def plain_attention(cfg: ModelConfig) -> dict[str, Any]:
  """`require`'s keywords for multi-head attention with one key/value head
  per query head, no window, the stacks' blocks as separate parameters,
  softmax weights (what every HF family here has)."""
  return dict(num_kv_heads=cfg.num_heads, window=None, scan_layers=False, attention="softmax")
