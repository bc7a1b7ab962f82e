"""What the KV cache buys (textbook item 5): time per generated token with and
without it, as the sequence grows.

Greedy generation of T tokens from a one-token prompt with a decoder
(random weights: the time does not depend on them), three ways:

  no cache   step t runs the whole model over the t tokens so far (padded up
             to a multiple of `bucket`, so one program serves `bucket`
             lengths) and keeps the logits of the last real one: per token
             O(t) weight matmuls and O(t^2) attention, total O(T^2) + O(T^3).
  KV cache   step t feeds one token through txf.decode's cache
             (decode.make_tokens_to_logits on decode.init_cache): per token
             O(1) weight matmuls plus attention over the cache, total O(T)
             + O(T^2) (txf's cache has T slots from the start, masked beyond
             t, so each step attends over all T).
  generate   txf.decode.generate: the same cached steps in one on-device
             loop (no Python between tokens), timed end to end.

The first two run one compiled step per token from Python and time each
step (wall time until its token is on the host, so both pay the same
dispatch overhead), generating the longest T once: the per-token curves are
measured, not inferred, and the total for a shorter T is the sum of its
first T steps (for the cache loop that is a cache of the longest T's slots;
generate's cache has T). Every program is compiled and called once before timing. All three
must produce the same tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from txf import decode, models
from txf.analysis.plots import line_plot
from txf.layers.model_config import ModelConfig
from txf.progress import Progress
from txf.textbook.report import figure_path, loglog_slope, markdown_table, median_seconds

NAME = "kv_cache"
FULL: dict[str, Any] = dict(
  lengths=(128, 256, 512, 1024), d_model=128, num_heads=4, num_layers=2, bucket=64, repeats=3
)
QUICK: dict[str, Any] = dict(
  lengths=(64, 128), d_model=128, num_heads=2, num_layers=1, bucket=64, repeats=1
)
_VOCAB = 260
_PROMPT_TOKEN = 1


def model_config(d_model: int, num_heads: int, num_layers: int, max_len: int) -> ModelConfig:
  """The decoder timed: byte vocabulary, RoPE, d_ff = 4 d_model."""
  return ModelConfig(
    family="decoder",
    vocab_size=_VOCAB,
    d_model=d_model,
    num_heads=num_heads,
    num_layers=num_layers,
    max_len=max_len,
    position="rope",
  )


def _uncached_step(model, params, length: int):
  """The compiled (params, tokens [1, length], last) -> greedy next token after
  position `last`: the whole model over the prefix, no cache."""
  next_token = jax.jit(
    lambda params, tokens_1xL, last: jnp.argmax(
      model.apply({"params": params}, tokens_1xL)[0, last]
    )
  )
  return next_token.lower(
    params, jax.ShapeDtypeStruct((1, length), jnp.int32), jax.ShapeDtypeStruct((), jnp.int32)
  ).compile()


def _cached_step(model, params, cache):
  """The compiled (params, token [1, 1], cache) -> (greedy next token, cache),
  one token through txf.decode's KV cache; the cache is donated."""

  def next_token(params, token_1x1, cache):
    logits_1xV, cache = decode.make_tokens_to_logits(model, params)(token_1x1, cache)
    return jnp.argmax(logits_1xV[0]), cache

  return (
    jax.jit(next_token, donate_argnums=2)
    .lower(params, jax.ShapeDtypeStruct((1, 1), jnp.int32), cache)
    .compile()
  )


def _flops(compiled) -> float:
  return float(compiled.cost_analysis()["flops"])


def uncached_steps(model, params, length: int, bucket: int) -> tuple[list[int], list[float], float]:
  """Greedy tokens, per-step seconds and XLA's FLOPs of the longest step,
  recomputing the whole prefix each step."""
  padded = -(-length // bucket) * bucket
  steps = {size: _uncached_step(model, params, size) for size in range(bucket, padded + 1, bucket)}
  tokens = np.zeros((1, padded), np.int32)
  tokens[0, 0] = _PROMPT_TOKEN
  # Each program's first call (its compile) is not its steady cost.
  with Progress("kv_cache: compile the uncached steps", total=len(steps), unit="programs") as done:
    for size, step in steps.items():
      step(params, tokens[:, :size], np.int32(0)).block_until_ready()
      done.advance()
  generated, seconds = [], []
  with Progress(
    "kv_cache: uncached generation", total=length, unit="tokens", bar=False
  ) as progress:
    for t in range(1, length + 1):
      size = -(-t // bucket) * bucket
      start = time.perf_counter()
      token = int(steps[size](params, tokens[:, :size], np.int32(t - 1)))
      seconds.append(time.perf_counter() - start)
      generated.append(token)
      if t < padded:
        tokens[0, t] = token
      progress.advance()
  return generated, seconds, _flops(steps[padded])


def cached_steps(model, params, length: int) -> tuple[list[int], list[float], float]:
  """Greedy tokens, per-step seconds and XLA's FLOPs of one step, one token per
  step through a KV cache of `length` slots."""
  cache = decode.init_cache(model, 1, length)
  step = _cached_step(model, params, cache)
  # Its first call untimed, on a cache of its own (the step donates it).
  warm = step(
    params, jnp.full((1, 1), _PROMPT_TOKEN, jnp.int32), decode.init_cache(model, 1, length)
  )
  jax.block_until_ready(warm)  # not into the first timed step
  token, tokens, seconds = _PROMPT_TOKEN, [], []
  with Progress("kv_cache: cached generation", total=length, unit="tokens", bar=False) as progress:
    for _ in range(length):
      start = time.perf_counter()
      token_device, cache = step(params, jnp.full((1, 1), token, jnp.int32), cache)
      token = int(token_device)
      seconds.append(time.perf_counter() - start)
      tokens.append(token)
      progress.advance()
  return tokens, seconds, _flops(step)


def compute(
  lengths: Sequence[int],
  d_model: int,
  num_heads: int,
  num_layers: int,
  bucket: int,
  repeats: int,
  seed: int = 0,
) -> dict[str, Any]:
  """Per-step and total generation times with and without the KV cache.

  Both step-by-step loops generate the longest T once (the cache has that
  many slots); the total for a shorter T is the sum of its first T steps.

  Returns:
    {"lengths", "model": the decoder's shape, "device",
     "uncached_step_seconds" [max T] and "cached_step_seconds" [max T]: each
       step's time at the longest T (step t predicts token t + 1),
     "uncached_total_seconds", "cached_total_seconds": per T, the sum of the
       first T steps; "generate_seconds": per T, decode.generate end to end
       (median of `repeats`, cache of T slots), "speedup": uncached / cached
       totals per T,
     "uncached_per_token_at_longest", "cached_per_token_at_longest": median
       step time over the last `bucket` steps of the longest T,
     "uncached_exponent", "cached_exponent", "generate_exponent": fitted
       total ~ T^p, "same_tokens": whether all three produced the same
       tokens at every T, "step_flops": {"uncached", "cached"}, XLA's FLOP
       count of the longest step of each loop}.
  """
  lengths = sorted(lengths)
  longest = lengths[-1]
  model = models.build(model_config(d_model, num_heads, num_layers, longest))
  params = jax.jit(model.init)(jax.random.key(seed), jnp.ones((1, 8), jnp.int32))["params"]
  prompt_1x1 = jnp.full((1, 1), _PROMPT_TOKEN, jnp.int32)

  uncached_tokens, uncached_seconds, uncached_flops = uncached_steps(model, params, longest, bucket)
  cached_tokens, cached_seconds, cached_flops = cached_steps(model, params, longest)
  result: dict[str, Any] = {
    "lengths": lengths,
    "device": jax.devices()[0].device_kind,
    "bucket": bucket,
    "model": dict(d_model=d_model, num_heads=num_heads, num_layers=num_layers, vocab_size=_VOCAB),
    "uncached_step_seconds": uncached_seconds,
    "cached_step_seconds": cached_seconds,
    "step_flops": {"uncached": uncached_flops, "cached": cached_flops},
  }
  for name, seconds in (("uncached", uncached_seconds), ("cached", cached_seconds)):
    cumulative = np.cumsum(seconds)
    result[f"{name}_total_seconds"] = [float(cumulative[length - 1]) for length in lengths]
  result["generate_seconds"], same_tokens = [], cached_tokens == uncached_tokens
  for length in lengths:
    generate = lambda length=length: decode.generate(
      model, params, prompt_1x1, max_new_tokens=length
    )
    same_tokens &= np.asarray(generate())[0, 1:].tolist() == cached_tokens[:length]
    result["generate_seconds"].append(median_seconds(generate, repeats=repeats))
  result["same_tokens"] = bool(same_tokens)
  result["speedup"] = [
    u / c for u, c in zip(result["uncached_total_seconds"], result["cached_total_seconds"])
  ]
  last = slice(longest - bucket, longest)
  result["uncached_per_token_at_longest"] = float(np.median(uncached_seconds[last]))
  result["cached_per_token_at_longest"] = float(np.median(cached_seconds[last]))
  for name in ("uncached", "cached"):
    result[f"{name}_exponent"] = loglog_slope(lengths, result[f"{name}_total_seconds"])
  result["generate_exponent"] = loglog_slope(lengths, result["generate_seconds"])
  return result


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Per-token time vs position and total time vs length; the PNG paths."""
  positions = np.arange(1, len(result["uncached_step_seconds"]) + 1)
  lengths = np.asarray(result["lengths"], np.float64)
  shape = "decoder d={d_model}, {num_layers} layers, {num_heads} heads".format(**result["model"])
  paths = [
    line_plot(
      {
        "no cache (recompute the prefix)": (
          positions,
          np.asarray(result["uncached_step_seconds"]) * 1e3,
        ),
        "KV cache": (positions, np.asarray(result["cached_step_seconds"]) * 1e3),
      },
      figure_path(out_dir, NAME, "per_token"),
      f"Time per generated token ({result['device']}; {shape})",
      "position of the generated token (tokens)",
      "time for this token (ms)",
      logy=True,
    ),
    line_plot(
      {
        f"no cache: T^{result['uncached_exponent']:.2f}": (
          lengths,
          result["uncached_total_seconds"],
        ),
        f"KV cache, step by step: T^{result['cached_exponent']:.2f}": (
          lengths,
          result["cached_total_seconds"],
        ),
        f"KV cache, decode.generate: T^{result['generate_exponent']:.2f}": (
          lengths,
          result["generate_seconds"],
        ),
      },
      figure_path(out_dir, NAME, "total"),
      f"Time to generate T tokens ({result['device']}; {shape})",
      "generated tokens T",
      "total time (s)",
      logx=True,
      logy=True,
    ),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  header = [
    "T",
    "no cache (s)",
    "KV cache, per step (s)",
    "decode.generate (s)",
    "speedup (no cache / KV cache)",
  ]
  rows = [
    [
      length,
      result["uncached_total_seconds"][n],
      result["cached_total_seconds"][n],
      result["generate_seconds"][n],
      result["speedup"][n],
    ]
    for n, length in enumerate(result["lengths"])
  ]
  model = result["model"]
  return (
    f"Device: {result['device']}; greedy decoding with a random-weight decoder "
    f"(d_model {model['d_model']}, {model['num_layers']} layers, {model['num_heads']} "
    f"heads, byte vocabulary), one-token prompt.\n\n"
    + markdown_table(header, rows)
    + f"\nFitted total ~ T^p: no cache p = {result['uncached_exponent']:.2f}, KV cache "
    f"p = {result['cached_exponent']:.2f}, decode.generate p = "
    f"{result['generate_exponent']:.2f}. Per token at T = {result['lengths'][-1]} "
    f"(median of the last {result['bucket']} steps): no cache "
    f"{result['uncached_per_token_at_longest'] * 1e3:.2f} ms, KV cache "
    f"{result['cached_per_token_at_longest'] * 1e3:.2f} ms; XLA's FLOP count of that "
    f"step: no cache {result['step_flops']['uncached']:.3g}, KV cache "
    f"{result['step_flops']['cached']:.3g}. Same tokens from all three: "
    f"{result['same_tokens']}.\n"
  )


def run(out_dir: str | os.PathLike, *, quick: bool = False) -> dict[str, Any]:
  """Measures, plots and reports item 5 at full (or toy, `quick`) size."""
  result = compute(**(QUICK if quick else FULL))
  return {**result, "figures": plot(result, out_dir), "text": report(result)}
