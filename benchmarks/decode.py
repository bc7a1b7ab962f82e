"""KV-cache generation against transformers' GPT-2 generate()
(`python -m benchmarks.run decode`).

txf.decode.generate (greedy, one jitted call with an on-device loop) on the
config's model with random weights held in the compute dtype, at each batch
size: prompts of random ids, --new_tokens generated per row, the median of
--repeats timed calls after a compiling one. Reported per batch size: new
tokens/s (all rows), microseconds per new token (end to end: txf's loop
also feeds the prompt one position at a time, P + N - 1 iterations in all),
and the fraction of the physical floor reached: reading the weights once
per generated position (weight bytes / the device's memory bandwidth,
txf.hardware) over the time per new token. The transformers figures
(benchmarks/references/hf_gpt2_decode.py, a subprocess run before JAX starts, the same
shape and batch sizes, bf16 on a GPU) come in `hf`; each txf row gets its
ratio to them.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from absl import flags

from benchmarks.references import run_reference
from txf import decode, hardware
from txf.commands.cli import define_config_flag
from txf.runconfig.run_config import parse
from txf.textbook.report import median_seconds
from txf.train.run_setup import fit_vocabulary, setup_run

FLAGS = flags.FLAGS

GPT2_SHAPE = (
  "a pre-LN decoder with learned positions, GELU, LayerNorm, biases, tied "
  "embeddings, multi-head attention and d_ff = 4 d_model, no window"
)


def is_gpt2(model) -> bool:
  """Whether a config's model section is GPT-2's architecture (any size)."""
  return (
    model.family == "decoder"
    and model.head == "lm"
    and model.position == "learned"
    and model.activation == "gelu"
    and model.norm == "layer"
    and model.norm_placement == "pre"
    and model.use_bias
    and model.tie_embeddings
    and model.num_kv_heads in (None, model.num_heads)
    and model.head_dim in (None, model.d_model // model.num_heads)
    and model.d_ff in (None, 4 * model.d_model)
    and model.window is None
  )


def hf_arguments(config, batch_sizes, prompt_len: int, new_tokens: int, repeats: int) -> list[str]:
  """benchmarks/references/hf_gpt2_decode.py's arguments for the config's model shape."""
  model = config.model
  vocab = fit_vocabulary(parse(config), None)[0].model.vocab_size
  return [
    f"--layers={model.num_layers}",
    f"--d_model={model.d_model}",
    f"--heads={model.num_heads}",
    f"--vocab={vocab}",
    f"--max_len={model.max_len}",
    f"--batch_sizes={','.join(str(b) for b in batch_sizes)}",
    f"--prompt_len={prompt_len}",
    f"--new_tokens={new_tokens}",
    f"--repeats={repeats}",
  ]


def compare(
  config, *, batch_sizes, prompt_len: int, new_tokens: int, repeats: int, hf: dict | None
) -> dict:
  """txf's decoding figures per batch size (module docstring), with `hf`'s."""
  if hf is not None and not is_gpt2(config.model):
    print(f"transformers reference dropped: the config's model is not GPT-2 ({GPT2_SHAPE})")
    hf = None
  setup = setup_run(parse(config))
  dtype = jnp.dtype(setup.run.model.dtype)
  with setup.activation_sharding():
    params = jax.tree.map(lambda p: p.astype(dtype), setup.replica_params(setup.init().params, 0))
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    floor = hardware.decode_floor_seconds(weight_bytes, hardware.memory_bandwidth_per_device())
    hf_rows = {row["batch_size"]: row for row in (hf or {}).get("results", [])}
    rows = []
    for batch_size in batch_sizes:
      prompt_BxP = jax.random.randint(
        jax.random.key(batch_size), (batch_size, prompt_len), 1, setup.run.model.vocab_size
      )
      seconds = median_seconds(
        functools.partial(
          decode.generate, setup.model, params, prompt_BxP, max_new_tokens=new_tokens
        ),
        repeats=repeats,
      )
      per_token = seconds / new_tokens
      row = dict(
        batch_size=batch_size,
        seconds=seconds,
        tokens_per_sec=batch_size * new_tokens / seconds,
        us_per_token=1e6 * per_token,
        us_per_iteration=1e6 * seconds / (prompt_len + new_tokens - 1),
        floor_fraction=None if floor is None else floor / per_token,
      )
      if batch_size in hf_rows:
        row["hf_tokens_per_sec"] = hf_rows[batch_size]["tokens_per_sec"]
        row["ratio_to_hf"] = row["tokens_per_sec"] / row["hf_tokens_per_sec"]
      rows.append(row)
      floor_text = "" if floor is None else f", {100 * row['floor_fraction']:.1f}% of the floor"
      hf_text = f", {row['ratio_to_hf']:.1f}x transformers" if "ratio_to_hf" in row else ""
      print(
        f"txf decode batch {batch_size}: {row['tokens_per_sec']:,.0f} new tokens/s, "
        f"{row['us_per_token']:,.0f} us/token{floor_text}{hf_text}"
      )
  return dict(
    prompt_len=prompt_len,
    new_tokens=new_tokens,
    repeats=repeats,
    dtype=dtype.name,
    weight_bytes=weight_bytes,
    floor_us_per_token=None if floor is None else 1e6 * floor,
    txf=rows,
    hf=hf,
  )


def define_flags() -> None:
  define_config_flag("Config file.")
  flags.DEFINE_list("decode_batch_sizes", ["1", "32"], "Batch sizes.")
  flags.DEFINE_integer("prompt_len", 128, "Prompt length.")
  flags.DEFINE_integer("new_tokens", 512, "Tokens generated per row.")
  flags.DEFINE_integer("repeats", 3, "Timed calls (median).")
  flags.DEFINE_bool("hf", False, "Also time transformers' GPT-2 generate().")


def main() -> dict:
  config = FLAGS.config
  batch_sizes = [int(b) for b in FLAGS.decode_batch_sizes]
  hf = None
  if FLAGS.hf:
    hf = run_reference(
      "hf_gpt2_decode.py",
      hf_arguments(config, batch_sizes, FLAGS.prompt_len, FLAGS.new_tokens, FLAGS.repeats),
      needs="transformers",
    )
  return compare(
    config,
    batch_sizes=batch_sizes,
    prompt_len=FLAGS.prompt_len,
    new_tokens=FLAGS.new_tokens,
    repeats=FLAGS.repeats,
    hf=hf,
  )
