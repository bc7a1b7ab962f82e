"""Path patching: which head of layer l the next layer reads, through its own layers.

Wang et al. 2022; Goldowsky-Dill et al. 2023. A clean prompt (a random
block repeated, `txf.analysis.head_scores.repeated_random_tokens`) and a corrupted
one (two independent random blocks: no repeat, `corrupted_tokens`) run
through the model. For a head h1 of layer l and one path:

  'q', 'k', 'v'  layer l + 1's query (key, value) projection reads
                 LN(x + d) instead of LN(x), where x is the clean residual
                 stream entering layer l + 1 and d = (z' - z) W_O^h1 the
                 difference between h1's output on the corrupted prompt (z')
                 and on the clean one (z): the direct path from h1 into that
                 input only (not through layer l's FFN, and not into the
                 other two projections);
  'all'          h1's output is z' everywhere downstream (activation
                 patching): every path, the FFN's included.

The effect on a head h2 of layer l + 1 (`path_patching`) is its induction
score on the clean prompt minus that score with the patch. A V-path patch
leaves attention patterns as they are (its effect on them is 0 by
construction), so `txf.analysis.circuits.analyze_circuits` patches the
key, query and every path only (`PATTERN_PATHS`).

Unlike the weight-based `txf.analysis.composition` scores, this runs the
model's norms, RoPE, FFNs and softmax. It needs a Pre-LN decoder with
unscanned layers (the modules it intercepts are each layer's own).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from txf.analysis.attention import attention_maps, maps_by_kind
from txf.analysis.head_scores import induction_score
from txf.checks import int_at_least
from txf.layers.norm import stream_sum

PATHS = ("q", "k", "v", "all")
# The paths that can move an attention pattern: the value path cannot
# (tests/analysis/test_circuits.py checks that it does not).
PATTERN_PATHS = ("k", "q", "all")
# The single-input path of each of MultiHeadAttention.project's inputs (query, key, value).
_INPUT_PATHS = ("q", "k", "v")


def corrupted_tokens(rng: np.random.Generator, clean_BxT: Any, ids: Any) -> np.ndarray:
  """int32 `[B, T]`: each row two blocks of distinct `ids`, drawn independently
  of each other and of `clean_BxT` (same shape, no repeated block: an
  induction head has nothing to find). T must be even."""
  batch, length = np.shape(clean_BxT)
  if length % 2:
    raise ValueError(f"clean_BxT must have an even length (two blocks), got {length}")
  pool_N = np.unique(np.asarray(ids))
  if pool_N.size < length // 2:
    raise ValueError(f"ids: {pool_N.size} distinct ids cannot fill a block of {length // 2}")
  rows = [
    np.concatenate([rng.choice(pool_N, length // 2, replace=False) for _ in range(2)])
    for _ in range(batch)
  ]
  return np.stack(rows).astype(np.int32)


def path_selector(path: str) -> np.ndarray:
  """bool `[len(PATHS)]`, True at `path`: `patched_attention_fn`'s path argument."""
  if path not in PATHS:
    raise ValueError(f"path: {path!r} is not one of {list(PATHS)}")
  return np.asarray([name == path for name in PATHS])


def _check_patchable(model: nn.Module, source_layer: int) -> int:
  """The target layer (source + 1) of an unscanned Pre-LN decoder; ValueError otherwise."""
  cfg = getattr(model, "cfg", None)
  if cfg is None or cfg.family != "decoder":
    raise ValueError("path patching needs a txf decoder (model.family='decoder')")
  if cfg.norm_placement != "pre":
    raise ValueError(
      "path patching patches the input of a Pre-LN attention's norm; "
      f"model.norm_placement is {cfg.norm_placement!r}"
    )
  if cfg.scan_layers:
    raise ValueError("path patching needs each layer's own modules (model.scan_layers=False)")
  source_layer = int_at_least(source_layer, "source_layer", 0)
  if source_layer + 1 >= cfg.num_layers:
    raise ValueError(
      f"source_layer: {source_layer} has no next layer in a {cfg.num_layers}-layer model"
    )
  return source_layer + 1


def patched_attention_fn(model: nn.Module, source_layer: int = 0) -> Callable[..., jax.Array]:
  """A jit-able (params, clean_BxT, corrupt_BxT, heads_H, path_P) -> float
  `[B, H, T, T]`: layer source_layer + 1's attention weights on the clean
  tokens, with the heads of `source_layer` where heads_H is 1 patched from
  the corrupted run along the path where path_P (`path_selector`) is True.
  heads_H all 0: the model's own weights. Every path is one program.

  Raises:
    ValueError: `model` is not an unscanned Pre-LN decoder with a layer
      after `source_layer`.
  """
  target_layer = _check_patchable(model, source_layer)
  source_out = ("stack", f"block_{source_layer}", "self_attention", "out")
  target_norm = ("stack", f"block_{target_layer}", "self_attention_norm")
  target_attention = ("stack", f"block_{target_layer}", "self_attention")
  everywhere = PATHS.index("all")

  def maps(
    params: Any, clean_BxT: jax.Array, corrupt_BxT: jax.Array, heads_H: jax.Array, path_P: jax.Array
  ) -> jax.Array:
    captured: dict[str, Any] = {}

    def capture(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
      if context.method_name == "__call__" and context.module.path == source_out:
        captured["corrupt_z"] = args[0]  # [B, T, H, Dh]
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(capture):
      model.apply({"params": params}, corrupt_BxT)

    def patch(next_fun: Callable, args: tuple, kwargs: dict, context: Any) -> Any:
      where = context.module.path
      if where == target_attention and context.method_name == "project":
        # (query, key, value) inputs, each the clean or the patched one by path.
        return next_fun(
          *(
            jnp.where(path_P[PATHS.index(path)], captured["patched"], captured["normed"])
            for path in _INPUT_PATHS
          )
        )
      if context.method_name != "__call__":
        return next_fun(*args, **kwargs)
      if where == source_out:
        z = args[0]
        mix = heads_H.astype(z.dtype)[:, None]
        patched_z = z * (1 - mix) + captured["corrupt_z"] * mix
        # A module runs once per apply: the clean and patched rows go through
        # it as one batch, split after.
        both = next_fun(jnp.concatenate([z, patched_z]), *args[1:], **kwargs)
        clean_out, patched_out = jnp.split(both, 2)
        captured["delta"] = patched_out - clean_out
        return jnp.where(path_P[everywhere], patched_out, clean_out)
      if where == target_norm:
        # The stream entering the target layer: the norm's input with the
        # source layer's handed-over output added (txf.layers.block.Pending).
        # Under 'all' it holds the patch already, and no projection adds it.
        x = (
          args[0]
          if kwargs.get("add") is None
          else stream_sum(args[0], kwargs["add"], kwargs.get("add_bias"))
        )
        both = next_fun(jnp.concatenate([x, x + captured["delta"]]))
        captured["normed"], captured["patched"] = jnp.split(both, 2)
        return (x, captured["normed"]) if kwargs.get("residual") else captured["normed"]
      return next_fun(*args, **kwargs)

    with nn.intercept_methods(patch):
      layers = maps_by_kind(attention_maps(model, params, clean_BxT))["self"]
    return layers[target_layer]

  return maps


@functools.lru_cache(maxsize=8)
def _compiled(model: nn.Module, source_layer: int) -> Callable[..., jax.Array]:
  """`patched_attention_fn`, jitted once per model and layer (compiled per shape)."""
  return jax.jit(patched_attention_fn(model, source_layer))


def path_patching(
  model: nn.Module,
  params: Any,
  clean_BxT: Any,
  corrupt_BxT: Any,
  period: int,
  *,
  source_layer: int = 0,
  paths: Sequence[str] = PATHS,
) -> dict[str, Any]:
  """The effect of each head of `source_layer` on the next layer's induction scores.

  See the module docstring for the paths. Every head of the source layer
  is patched alone.

  Args:
    model: a txf decoder, Pre-LN, unscanned (`txf.models.build`).
    params: its parameters (one replica's).
    clean_BxT: int `[B, T]` tokens repeating with period `period`
      (`repeated_random_tokens`).
    corrupt_BxT: int `[B, T]` tokens without that repeat (`corrupted_tokens`).
    period: the clean tokens' period, for `induction_score`.
    source_layer: l; the heads of layer l + 1 are measured.
    paths: some of `PATHS`.

  Returns:
    {"clean": float64 `[H]` induction scores of layer l + 1 on the clean
     tokens, "corrupted_source": `[H]` the same with every head of layer l
     patched on every path (how far the scores can fall), and per path
     {path: float64 `[H_source, H_target]`}: clean score minus the score with
     that source head patched (positive: the head's clean output raises the
     target's induction score).}
  """
  unknown = sorted(set(paths) - set(PATHS))
  if unknown or not paths:
    raise ValueError(f"paths: {unknown or list(paths)} are not some of {list(PATHS)}")
  clean = jnp.asarray(clean_BxT, jnp.int32)
  corrupt = jnp.asarray(corrupt_BxT, jnp.int32)
  if clean.shape != corrupt.shape or clean.ndim != 2:
    raise ValueError(
      f"clean_BxT and corrupt_BxT must be int [B, T] of one shape, got {clean.shape} "
      f"and {corrupt.shape}"
    )
  maps_fn = _compiled(model, source_layer)
  num_heads = model.cfg.num_heads

  def scores_H(heads_H: np.ndarray, path: str) -> np.ndarray:
    weights_BxHxTxT = maps_fn(params, clean, corrupt, heads_H, path_selector(path))
    return induction_score(np.asarray(weights_BxHxTxT), period)

  clean_H = scores_H(np.zeros(num_heads, np.float32), "all")
  result: dict[str, Any] = {
    "clean": clean_H,
    "corrupted_source": scores_H(np.ones(num_heads, np.float32), "all"),
  }
  for path in paths:
    result[path] = np.stack(
      [
        clean_H - scores_H(np.eye(num_heads, dtype=np.float32)[head], path)
        for head in range(num_heads)
      ]
    )
  return result
