"""Times encoder-decoder decoding with the cross-attention keys/values cached
once per source against recomputing them at every step, in one run.

  python -m benchmarks.run seq2seq_decode [--source_len=512] [--new_tokens=128] [--batch_size=4]
      [--num_beams=1] [--d_model=128] [--num_layers=2] [--num_heads=4] [--repeats=5]

Both variants decode the same random sources with the same random-init model
(`txf.models.build`, family 'encoder_decoder'), switching only
`cache_cross_attention`, without EOS (every row decodes all N tokens), two
ways:

  generate      `txf.decode.generate` (greedy, or beam search with
                --num_beams > 1): the whole loop is one XLA program. ms/token
                is the marginal cost of a token,
                (time(N tokens) - time(1 token)) / (N - 1) (median of paired
                runs), so the encoder and the once-per-source work drop out.
  step by step  greedy decoding driven from Python, one jitted decoder step
                per token (num_beams 1 only): ms/token is the loop's time / N.

Each is compiled and run once before timing; then every repeat times each
variant and length to completion in turn (so a shared machine's changing
load reaches all alike), --repeats times; figures are medians.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
from absl import flags

from txf import decode, models
from txf.decode import generation
from txf.layers.model_config import ModelConfig

FLAGS = flags.FLAGS

VARIANTS = (("cached", True), ("recomputed", False))
BOS_ID = 1


def generate_call(
  model, params, sources_BxS, cache_cross_attention: bool, *, new_tokens: int, num_beams: int
):
  """`decode.generate` of new_tokens per row: the whole loop one XLA program."""
  generate = generation.build_generate(cache_cross_attention=cache_cross_attention)
  return functools.partial(
    generate,
    model,
    params,
    encoder_tokens_BxS=sources_BxS,
    max_new_tokens=new_tokens,
    num_beams=num_beams,
    bos_id=BOS_ID,
  )


def stepwise_call(model, params, sources_BxS, cache_cross_attention: bool, *, new_tokens: int):
  """Greedy decoding driven from Python, one jitted decoder step per token (as
  step-by-step research code runs it), from a cache prepared beforehand.

  The cache comes from `decode.encode_for_decoding`; the recomputing step
  gets the encoding as an argument (as a closure constant the compiler
  could fold its projection away), the cached one reads it from the cache.
  """
  _, cache = decode.encode_for_decoding(
    model, params, sources_BxS, new_tokens, cache_cross_attention=cache_cross_attention
  )
  context = (
    (None, None)
    if cache_cross_attention
    else model.apply({"params": params}, sources_BxS, method="encode")
  )
  step = jax.jit(
    lambda params, context, tokens_Bx1, cache: decode.make_tokens_to_logits(
      model, params, *context, method="decode"
    )(tokens_Bx1, cache)
  )
  bos_Bx1 = jnp.full((sources_BxS.shape[0], 1), BOS_ID, jnp.int32)

  def decode_tokens():
    tokens_Bx1, step_cache = bos_Bx1, cache
    for _ in range(new_tokens):
      logits_BxV, step_cache = step(params, context, tokens_Bx1, step_cache)
      tokens_Bx1 = jnp.argmax(logits_BxV, axis=-1)[:, None].astype(jnp.int32)
    return tokens_Bx1

  return decode_tokens


def interleaved_seconds(calls: dict, repeats: int) -> dict[Any, list[float]]:
  """Wall times of each call run to completion, after one compiling call
  each; every repeat runs all calls in turn, so a shared machine's changing
  load reaches every variant alike."""
  for call in calls.values():
    jax.block_until_ready(call())
  seconds = {key: [] for key in calls}
  for _ in range(repeats):
    for key, call in calls.items():
      start = time.perf_counter()
      jax.block_until_ready(call())
      seconds[key].append(time.perf_counter() - start)
  return seconds


def measure(
  model, params, sources_BxS, *, new_tokens: int, num_beams: int, repeats: int
) -> dict[str, dict[str, dict[str, float]]]:
  """{loop: {variant: figures}} for cached and recomputed cross-attention
  keys/values, decoded by `generate` and step by step (greedy only)."""
  calls = {}
  for name, cached in VARIANTS:
    for n in (1, new_tokens):
      calls["generate", name, n] = generate_call(
        model, params, sources_BxS, cached, new_tokens=n, num_beams=num_beams
      )
    if num_beams == 1:
      calls["stepwise", name] = stepwise_call(
        model, params, sources_BxS, cached, new_tokens=new_tokens
      )
  seconds = interleaved_seconds(calls, repeats)
  figures = {"generate": {}, "stepwise": {}}
  for name, _ in VARIANTS:
    # The paired difference of N and 1 tokens leaves the encoder and the
    # once-per-source work out.
    differences = [
      long - short
      for short, long in zip(seconds["generate", name, 1], seconds["generate", name, new_tokens])
    ]
    figures["generate"][name] = dict(
      ms_per_token=1e3 * statistics.median(differences) / (new_tokens - 1),
      total_ms=1e3 * statistics.median(seconds["generate", name, new_tokens]),
      # Some repeat's N tokens took no longer than its 1: the timer's noise
      # is as large as the tokens' time.
      within_noise=min(differences) <= 0,
    )
    if num_beams == 1:
      figures["stepwise"][name] = dict(
        ms_per_token=1e3 * statistics.median(seconds["stepwise", name]) / new_tokens
      )
  return {loop: variants for loop, variants in figures.items() if variants}


LOOP_NAMES = {
  "generate": "generate (one XLA loop)",
  "stepwise": "step by step (a jitted call per token)",
}


NOISE_NOTE = (
  "within noise: in some repeat N tokens took no longer than 1 (more --new_tokens or --repeats)"
)


def format_table(figures: dict) -> str:
  rows = [("decoding loop", "cached ms/token", "recomputed ms/token", "speedup")]
  noisy = False
  for loop, variants in figures.items():
    cached, recomputed = (variants[name]["ms_per_token"] for name, _ in VARIANTS)
    within_noise = any(variants[name].get("within_noise") for name, _ in VARIANTS)
    noisy |= within_noise
    speedup = "within noise" if within_noise else f"{recomputed / cached:.2f}x"
    rows.append((LOOP_NAMES[loop], f"{cached:.3f}", f"{recomputed:.3f}", speedup))
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  lines = [
    "  ".join(
      cell.ljust(width) if i == 0 else cell.rjust(width)
      for i, (cell, width) in enumerate(zip(row, widths))
    )
    for row in rows
  ]
  return "\n".join(lines + ([NOISE_NOTE] if noisy else []))


def define_flags() -> None:
  flags.DEFINE_integer("source_len", 512, "Encoder tokens per source.")
  flags.DEFINE_integer("new_tokens", 128, "Decoder tokens generated per row (N).")
  flags.DEFINE_integer("batch_size", 4, "Sources decoded together.")
  flags.DEFINE_integer("num_beams", 1, "1: greedy; K > 1: beam search.")
  flags.DEFINE_integer("d_model", 128, "Model width.")
  flags.DEFINE_integer("num_layers", 2, "Layers per stack (encoder and decoder).")
  flags.DEFINE_integer("num_heads", 4, "Attention heads.")
  flags.DEFINE_integer("vocab_size", 260, "Vocabulary size.")
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
  flags.DEFINE_integer("repeats", 5, "Timed calls per variant and length.")
  for name in (
    "source_len",
    "batch_size",
    "num_beams",
    "d_model",
    "num_layers",
    "num_heads",
    "vocab_size",
    "repeats",
  ):
    flags.register_validator(name, lambda value: value >= 1, f"--{name} must be >= 1")
  flags.register_validator(
    "new_tokens",
    lambda value: value >= 2,
    "--new_tokens must be >= 2 (ms/token compares N tokens with 1)",
  )
  flags.register_multi_flags_validator(MODEL_FLAGS, check_model, "the model is refused")


# The flags model_config reads.
MODEL_FLAGS = (
  "vocab_size",
  "d_model",
  "num_heads",
  "num_layers",
  "dtype",
  "source_len",
  "new_tokens",
)


def model_config(values: dict) -> ModelConfig:
  """The encoder-decoder the flags' `values` describe (ValueError where
  ModelConfig refuses it)."""
  return ModelConfig(
    family="encoder_decoder",
    vocab_size=values["vocab_size"],
    d_model=values["d_model"],
    num_heads=values["num_heads"],
    num_layers=values["num_layers"],
    dtype=values["dtype"],
    max_len=max(values["source_len"], values["new_tokens"] + 1),
  )


def check_model(values: dict) -> bool:
  """The model's own checks (d_model a multiple of num_heads, ...) as the flags'
  one-line error, before anything is built."""
  try:
    model_config(values)
  except ValueError as error:
    raise flags.ValidationError(str(error)) from None
  return True


def main() -> dict:
  cfg = model_config({name: FLAGS[name].value for name in MODEL_FLAGS})
  model = models.build(cfg)
  init_tokens = jnp.ones((1, 8), jnp.int32)
  params = jax.jit(model.init)(jax.random.key(0), init_tokens, init_tokens)["params"]
  # Random non-special ids (0-3 are pad, bos, eos, mask), every source full length.
  sources_BxS = jax.random.randint(
    jax.random.key(1), (FLAGS.batch_size, FLAGS.source_len), 4, cfg.vocab_size
  )
  figures = measure(
    model,
    params,
    sources_BxS,
    new_tokens=FLAGS.new_tokens,
    num_beams=FLAGS.num_beams,
    repeats=FLAGS.repeats,
  )
  search = "greedy" if FLAGS.num_beams == 1 else f"beam search, {FLAGS.num_beams} beams"
  device = jax.devices()[0]
  print(
    f"encoder_decoder d_model={cfg.d_model}, {cfg.num_layers}+{cfg.num_decoder_layers} "
    f"layers, {cfg.num_heads} heads, {cfg.dtype}; batch {FLAGS.batch_size}, source "
    f"{FLAGS.source_len} tokens, {FLAGS.new_tokens} new tokens ({search}); "
    f"median of {FLAGS.repeats}"
  )
  print(format_table(figures))
  totals = ", ".join(
    f"{name} {figures['generate'][name]['total_ms']:.1f} ms" for name, _ in VARIANTS
  )
  print(f"generate, whole call for {FLAGS.new_tokens} tokens: {totals}")
  return dict(
    device=device.device_kind,
    platform=device.platform,
    model=dict(
      d_model=cfg.d_model,
      num_layers=cfg.num_layers,
      num_heads=cfg.num_heads,
      vocab_size=cfg.vocab_size,
      dtype=cfg.dtype,
    ),
    batch_size=FLAGS.batch_size,
    source_len=FLAGS.source_len,
    new_tokens=FLAGS.new_tokens,
    num_beams=FLAGS.num_beams,
    repeats=FLAGS.repeats,
    figures=figures,
  )
