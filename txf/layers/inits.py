"""Initialisation schemes (`model.init`): how a Transformer's parameters are
first drawn, applied by the models' `init`.

  txf    each layer's own initialisers: Glorot-uniform projections
         (attention, FFN, untied logits; the fans of each flattened
         [inputs, outputs] matrix), LeCun-normal dense layers of the MLM
         and classify heads, N(0, 1) token rows (with tied logits scaled by
         1/sqrt(D) by default), N(0, 0.02) position and token-type rows,
         zero biases, unit norm scales.
  gpt2   GPT-2's (Radford et al. 2019; openai/gpt-2 model.py, with the
         residual scaling its paper describes as nanoGPT and Hugging Face's
         GPT2PreTrainedModel implement it): every projection N(0, 0.02), the
         projections that write into the residual stream (attention output,
         FFN output) N(0, 0.02 / sqrt(2 L)) for L layers per stack (an
         encoder-decoder's decoder: its num_decoder_layers), token and
         token-type rows N(0, 0.02), position rows N(0, 0.01), biases 0,
         norms 1 and 0;
         what GPT-2 has no counterpart of (a T5 bias table) keeps its own
         initialiser.

A scheme is a function (params, cfg, key) -> params over the boxed
parameters `model.init` returns (`txf` keeps them as drawn), registered in
`INITS` (txf.layers.model_config); user code adds one with
`txf.register.init` (docs/extending.md).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers.model_config import INITS, ModelConfig

# Modules whose output is added to the residual stream: GPT-2's c_proj.
RESIDUAL_OUTPUTS = ("out", "wo")
GPT2_STDDEV = 0.02
GPT2_POSITION_STDDEV = 0.01


def _gpt2_stddev(names: tuple[str, ...], cfg: ModelConfig) -> float | None:
  """The N(0, std) of a parameter by its path, or None to leave it as drawn
  (norms: 1 and 0; biases: 0; a T5 bias table)."""
  if names[-1] == "embedding" or names[-1] == "token_type_table":
    return GPT2_STDDEV
  if names[-1] == "position_table":
    return GPT2_POSITION_STDDEV
  if names[-1] == "kernel":
    if len(names) >= 2 and names[-2] in RESIDUAL_OUTPUTS:
      # The decoder of an encoder-decoder was scaled by the encoder's depth.
      layers = (cfg.num_decoder_layers if names[0] == "decoder" else None) or cfg.num_layers
      return GPT2_STDDEV / math.sqrt(2 * layers)
    return GPT2_STDDEV
  return None


def gpt2(params: Any, cfg: ModelConfig, key: jax.Array) -> Any:
  """GPT-2's initialisation of `params` (module docstring)."""

  def redraw(path, leaf):
    names = tuple(str(getattr(entry, "key", entry)) for entry in path)
    stddev = _gpt2_stddev(names, cfg)
    if stddev is None:
      return leaf
    value = nn.meta.unbox(leaf)
    leaf_key = jax.random.fold_in(key, zlib.crc32("/".join(names).encode()) % 2**31)
    drawn = stddev * jax.random.normal(leaf_key, value.shape, jnp.float32)
    drawn = drawn.astype(value.dtype)
    return leaf.replace_boxed(drawn) if isinstance(leaf, nn.meta.AxisMetadata) else drawn

  return jax.tree_util.tree_map_with_path(
    redraw, params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata)
  )


def as_drawn(params: Any, cfg: ModelConfig, key: jax.Array) -> Any:
  """txf's own initialisation: each layer's initialisers, `params` as drawn."""
  return params


INITS.register("txf", as_drawn)
INITS.register("gpt2", gpt2)


def apply_init(variables: Any, cfg: ModelConfig, rngs: Any) -> Any:
  """`variables` (what flax's init returns) with `cfg.init`'s scheme applied
  to their params; the scheme's key is derived from init's params key."""
  key = rngs["params"] if isinstance(rngs, dict) else rngs
  params = INITS[cfg.init](variables["params"], cfg, jax.random.fold_in(key, 0x5EED))
  _check_redrawn(cfg.init, variables["params"], params)
  return {**variables, "params": params}


def _check_redrawn(name: str, drawn: Any, redrawn: Any) -> None:
  """Raises ValueError naming model.init and the parameter, unless `redrawn`
  holds `drawn`'s parameters with their shapes and dtypes (a scheme that
  widened one failed in flax at the first step, after the run directory was
  written; under setup's abstract init it fails here, before)."""
  leaf = lambda x: isinstance(x, nn.meta.AxisMetadata)
  before = jax.tree_util.tree_flatten_with_path(drawn, is_leaf=leaf)[0]
  after = dict(jax.tree_util.tree_flatten_with_path(redrawn, is_leaf=leaf)[0])
  for path, value in before:
    where = jax.tree_util.keystr(path)
    if path not in after:
      raise ValueError(f"model.init: {name!r} dropped the parameter {where}")
    old, new = nn.meta.unbox(value), nn.meta.unbox(after.pop(path))
    if (jnp.shape(new), jnp.result_type(new)) != (jnp.shape(old), jnp.result_type(old)):
      raise ValueError(
        f"model.init: {name!r} made {where} {jnp.result_type(new)}{list(jnp.shape(new))}, "
        f"not the layer's {jnp.result_type(old)}{list(jnp.shape(old))}"
      )
  if after:
    added = jax.tree_util.keystr(next(iter(after)))
    raise ValueError(f"model.init: {name!r} added a parameter no layer has: {added}")
