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
ratio to them. The reference saves its random-weight model with its prompts
and tokens (`--hf_python` runs it with another Python, one with torch and
transformers), and txf then decodes that model (txf.interop) from the same
prompts and says whether its greedy tokens are the reference's: a check of
the harness, that both decode the same model.

  python -m benchmarks.run decode --config=configs/gpt2_small.py --deviceless=h100 \
      [--source_len=512]

compiles the benchmark's programs for a GPU this machine does not have
(txf.aot) instead of running them: per batch size, generate's program with
the weights in the compute dtype, and per generated token its kernels, the
bytes they move and a predicted time against the weight-read floor
(txf.aot.report.decode_figures); how XLA launches the token loop with its
default command buffers and with the loop among them (a CUDA driver of
13.0 declared, txf.aot.compile.with_driver); with --source_len, the same
for an encoder-decoder of the config's sizes decoding sources that long.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from benchmarks.references import run_reference
from txf import decode, hardware, models
from txf.commands.cli import define_config_flag, fail
from txf.runconfig.run_config import RunConfig, parse
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


def hf_arguments(
  run: RunConfig, batch_sizes, prompt_len: int, new_tokens: int, repeats: int
) -> list[str]:
  """benchmarks/references/hf_gpt2_decode.py's arguments for the run's model shape."""
  model = run.model
  vocab = fit_vocabulary(run, None)[0].model.vocab_size
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


def _reference_model(model_dir: str, dtype, mesh):
  """The transformers reference's saved model as txf's (txf.interop), its
  weights in `dtype`, whole on each device of `mesh`."""
  from txf.interop import load_pretrained  # noqa: PLC0415 (only with --hf)

  pretrained = load_pretrained(model_dir)
  model = models.build(dataclasses.replace(pretrained.config, dtype=dtype.name))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return model, jax.device_put(
    jax.tree.map(lambda p: jnp.asarray(p, dtype), pretrained.params), whole
  )


def _first_difference(got, want) -> str | None:
  """Where two token arrays [B, T] first differ ('row r, column c'), or None."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return f"shapes {got.shape} and {want.shape}"
  rows, columns = np.nonzero(got != want)
  return f"row {rows[0]}, column {columns[0]}" if len(rows) else None


def compare(
  run: RunConfig, *, batch_sizes, prompt_len: int, new_tokens: int, repeats: int, hf: dict | None
) -> dict:
  """txf's decoding figures per batch size (module docstring), with `hf`'s;
  where the reference saved its model, txf decodes that model from its
  prompts and each row says whether the tokens are the reference's."""
  if hf is not None and not is_gpt2(run.model):
    print(f"transformers reference dropped: the config's model is not GPT-2 ({GPT2_SHAPE})")
    hf = None
  setup = setup_run(run)
  dtype = jnp.dtype(setup.run.model.dtype)
  hf_rows = {row["batch_size"]: row for row in (hf or {}).get("results", [])}
  # Read before the activations' sharding rules apply: interop traces the
  # model's shapes without them.
  reference = None
  if hf and hf.get("model_dir"):
    reference = _reference_model(hf["model_dir"], dtype, setup.mesh)
  with setup.activation_sharding():
    if reference is not None:
      model, params = reference
    else:
      model = setup.model
      params = jax.tree.map(lambda p: p.astype(dtype), setup.replica_params(setup.init().params, 0))
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    floor = hardware.decode_floor_seconds(weight_bytes, hardware.memory_bandwidth_per_device())
    rows = []
    for batch_size in batch_sizes:
      hf_row = hf_rows.get(batch_size, {})
      if "tokens" in hf_row:
        prompt_BxP = jnp.asarray(np.asarray(hf_row["tokens"])[:, :prompt_len], jnp.int32)
      else:
        prompt_BxP = jax.random.randint(
          jax.random.key(batch_size), (batch_size, prompt_len), 1, setup.run.model.vocab_size
        )
      run = functools.partial(decode.generate, model, params, prompt_BxP, max_new_tokens=new_tokens)
      seconds = median_seconds(run, repeats=repeats)
      per_token = seconds / new_tokens
      row = dict(
        batch_size=batch_size,
        seconds=seconds,
        tokens_per_sec=batch_size * new_tokens / seconds,
        us_per_token=1e6 * per_token,
        us_per_iteration=1e6 * seconds / (prompt_len + new_tokens - 1),
        floor_fraction=None if floor is None else floor / per_token,
      )
      hf_text = ""
      if hf_row:
        row["hf_tokens_per_sec"] = hf_row["tokens_per_sec"]
        row["ratio_to_hf"] = row["tokens_per_sec"] / row["hf_tokens_per_sec"]
        hf_text = f", {row['ratio_to_hf']:.1f}x transformers"
      if "tokens" in hf_row:
        row["first_difference_from_hf"] = _first_difference(run(), hf_row["tokens"])
        row["same_tokens_as_hf"] = row["first_difference_from_hf"] is None
        hf_text += (
          ", the same greedy tokens"
          if row["same_tokens_as_hf"]
          else f", tokens differ from transformers' first at {row['first_difference_from_hf']}"
        )
      rows.append(row)
      floor_text = "" if floor is None else f", {100 * row['floor_fraction']:.1f}% of the floor"
      # A step generates a token for each row: per token of one row, per step.
      unit = "us/token" if batch_size == 1 else f"us/step of {batch_size} tokens"
      print(
        f"txf decode batch {batch_size}: {row['tokens_per_sec']:,.0f} new tokens/s, "
        f"{row['us_per_token']:,.0f} {unit}{floor_text}{hf_text}"
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


def _abstract_model(model_config, dtype):
  """A model and its parameters' shapes, held in the compute dtype."""
  model = models.build(model_config)
  tokens = jnp.ones((1, 4), jnp.int32)
  inputs = (tokens, tokens) if model_config.family == "encoder_decoder" else (tokens,)
  params = jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"]
  return model, jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, dtype), params)


def _loop_launches(model, params, target, shapes: dict) -> dict[str, str]:
  """How XLA launches the program's token loop (txf.aot.compile.loop_launch)
  with its default command buffers and with loops among them, for a GPU
  whose CUDA driver can run loops in a graph."""
  from txf.aot import compile as aot  # noqa: PLC0415 (after prepare_environment)

  devices = aot.with_driver(target)

  def launch(options: dict) -> str:
    return aot.command_buffer_launch(
      lambda extra: aot.compile_generate(
        model, params, target, devices, **shapes, compiler_options={**options, **extra}
      )
    )

  return {"default": launch({}), "with_loops": launch(aot.COMMAND_BUFFERS_WITH_LOOPS)}


def gpu_target(name: str):
  """The GPU `name` names (txf.aot.targets.parse_target): the token loop's
  launches are CUDA command buffers (`_loop_launches`), so a TPU is refused.

  Raises:
    ValueError: one line naming the target and why it is refused.
  """
  from txf.aot.targets import GPUS, parse_target  # noqa: PLC0415 (after prepare_environment)

  gpus = f"{', '.join(GPUS)}, times a count: h100x8"
  try:
    target = parse_target(name)
  except ValueError:
    if name.strip().lower().startswith(tuple(GPUS)):
      raise  # a GPU's name with a count it refuses says why itself
    raise ValueError(f"target {name!r}: not a GPU ({gpus})") from None
  if target.platform != "gpu":
    raise ValueError(f"target {name!r}: a TPU; the decode benchmark compiles for GPUs ({gpus})")
  return target


def deviceless(
  run: RunConfig, target, devices, *, batch_sizes, prompt_len: int, new_tokens: int, source_len: int
) -> dict:
  """The benchmark's programs compiled for `target`, a GPU, and its
  `devices` (module docstring)."""
  from txf.aot import compile as aot  # noqa: PLC0415 (after prepare_environment)
  from txf.aot.report import decode_figures, decode_line  # noqa: PLC0415

  run = fit_vocabulary(run, None)[0]
  dtype = jnp.dtype(run.model.dtype)
  programs = [("decoder", run.model, dict(prompt_len=prompt_len))]
  if source_len:
    seq2seq = dataclasses.replace(
      run.model, family="encoder_decoder", max_len=max(run.model.max_len, source_len)
    )
    programs.append(("encoder_decoder", seq2seq, dict(prompt_len=1, source_len=source_len)))
  bandwidth = hardware.memory_bandwidth_per_device(devices[0])
  rows = []
  for family, model_config, lengths in programs:
    model, params = _abstract_model(model_config, dtype)
    # The weights the token loop reads: an encoder's run once, before it.
    read = {name: tree for name, tree in params.items() if name != "encoder"}
    weight_bytes = sum(p.size * p.dtype.itemsize for p in jax.tree.leaves(read))
    # The token loop runs the decoder's layers (an encoder's run once before it).
    layers = model_config.num_layers
    if family == "encoder_decoder":
      layers = model_config.num_decoder_layers or layers
    for batch_size in batch_sizes:
      shapes = dict(batch_size=batch_size, new_tokens=new_tokens, **lengths)
      compiled, seconds = aot.compile_generate(model, params, target, devices, **shapes)
      figures = decode_figures(compiled.as_text(), bandwidth, weight_bytes)
      launch = _loop_launches(model, params, target, shapes)
      rows.append(
        dict(family=family, **shapes, compile_seconds=seconds, **figures, loop_launch=launch)
      )
      print(
        f"deviceless {target.name}, {family} batch {batch_size}: {decode_line(figures)}; "
        f"{(figures['layer_kernels_per_token'] or 0) / layers:.1f} kernels a layer; the token loop "
        f"{launch['default']} (XLA's default command buffers), {launch['with_loops']} (with "
        f"loops, CUDA driver {aot.DRIVER_VERSION}); compiled in {seconds:.1f} s"
      )
  return dict(target=target.name, dtype=dtype.name, deviceless=rows)


def define_flags() -> None:
  define_config_flag("Config file.")
  flags.DEFINE_list("decode_batch_sizes", ["1", "32"], "Batch sizes.")
  flags.DEFINE_integer("prompt_len", 128, "Prompt length.")
  flags.DEFINE_integer("new_tokens", 512, "Tokens generated per row.")
  flags.DEFINE_integer("repeats", 3, "Timed calls (median).")
  flags.DEFINE_bool("hf", False, "Also time transformers' GPT-2 generate().")
  flags.DEFINE_string(
    "hf_python", None, "--hf: the Python that runs transformers (default: this one)."
  )
  flags.DEFINE_string(
    "deviceless", None, "Compile for this GPU (h100, ...) instead of running (no GPU needed)."
  )
  flags.DEFINE_integer(
    "source_len", 0, "--deviceless: also an encoder-decoder decoding sources this long."
  )
  if any(arg.startswith("--deviceless") for arg in sys.argv):
    # Compiling for a GPU this machine lacks: jax's backends start as
    # txf-compile starts them, and the command starts them before main.
    from txf.aot.compile import prepare_environment  # noqa: PLC0415

    prepare_environment()


def _checked_sizes() -> list[int]:
  """--decode_batch_sizes as ints, each of the size flags checked before any
  compile or timed call: one line, exit 2 (they were tracebacks from
  generate, some after other sizes had compiled)."""
  from txf import checks  # noqa: PLC0415

  try:
    sizes = [_positive_int(text, "decode_batch_sizes") for text in FLAGS.decode_batch_sizes]
    for name in ("prompt_len", "new_tokens", "repeats"):
      checks.int_at_least(FLAGS[name].value, name, 1)
    checks.int_at_least(FLAGS.source_len, "source_len", 0)
  except ValueError as error:
    fail("flag", error)
  return sizes


def _positive_int(text: str, name: str) -> int:
  """`text`, a list flag's item, as an int >= 1 (ValueError naming `name`)."""
  from txf import checks  # noqa: PLC0415

  try:
    value: object = int(text)
  except ValueError:
    value = text  # int_at_least names it as given
  return checks.int_at_least(value, name, 1)


def _checked_run(config) -> RunConfig:
  """The config, parsed once, whose model decodes --prompt_len + --new_tokens
  positions, before any compile: else one line, exit 2."""
  from txf.decode.cache import check_cache_length  # noqa: PLC0415
  from txf.layers.embedding import check_position_table  # noqa: PLC0415
  from txf.layers.model_config import FAMILIES  # noqa: PLC0415

  try:
    run = parse(config)
    model = run.model
    if not FAMILIES[model.family].generative:
      raise ValueError(f"model.family: {model.family!r} cannot generate (the benchmark decodes)")
    length = check_cache_length("new_tokens", FLAGS.prompt_len, FLAGS.new_tokens)
    check_position_table(model.position, model.max_len, length, "a decoding cache")
  except ValueError as error:
    fail("config", error)
  return run


def main() -> dict:
  batch_sizes = _checked_sizes()
  run = _checked_run(FLAGS.config)
  if FLAGS.deviceless:
    try:  # before any compile, as txf-compile
      target = gpu_target(FLAGS.deviceless)
      devices = target.devices()  # ImportError: the GPU compiler is not installed
    except (ValueError, ImportError) as error:
      fail("target", error)
    return deviceless(
      run,
      target,
      devices,
      batch_sizes=batch_sizes,
      prompt_len=FLAGS.prompt_len,
      new_tokens=FLAGS.new_tokens,
      source_len=FLAGS.source_len,
    )
  with tempfile.TemporaryDirectory() as model_dir:
    hf = None
    if FLAGS.hf:
      hf = run_reference(
        "hf_gpt2_decode.py",
        hf_arguments(run, batch_sizes, FLAGS.prompt_len, FLAGS.new_tokens, FLAGS.repeats)
        + [f"--save_dir={model_dir}"],
        needs="transformers",
        python=FLAGS.hf_python,
      )
    return compare(
      run,
      batch_sizes=batch_sizes,
      prompt_len=FLAGS.prompt_len,
      new_tokens=FLAGS.new_tokens,
      repeats=FLAGS.repeats,
      hf=hf,
    )
