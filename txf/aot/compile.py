"""Compile a run's exact programs for a target it does not run on.

  report = compile_run(parse(config), parse_target("v5e-256"))   # txf.runconfig.run_config.parse

`compile_run` builds the run as `txf-run` would (txf.train.run_setup.setup_run),
but on the target's devices, and compiles its train step and eval step on
abstract arguments (and, asked, the sampler its evaluations run, for
`decode_tokens` tokens): nothing is allocated and no accelerator is
needed, and a sentencepiece tokenizer is not trained (`untrained_tokenizer`).
The report (`report.py`) then reads memory, cost, collectives and, for GPUs,
kernels from the compiled programs.

What the compilers need on a machine without the hardware:
  TPU  libtpu (the tpu extra, txf.extras), told not to look for a TPU or ask
       a cloud metadata server (`prepare_environment`).
  GPU  jax's CUDA plugin and ptxas (the gpu-compile extra); the
       plugin's check for a CUDA driver and libraries is skipped, and jax's
       cuDNN attention checks, which ask the attached GPU and the loaded
       cuDNN, are answered for the target (`_cudnn_answered_for`). Without a
       GPU to time candidates on, XLA does not autotune: it keeps its default
       GEMM backend (Triton) where a real GPU may choose cuBLAS, so kernel
       counts differ slightly; memory does not (docs/benchmarks.md). Where
       its first Triton config does not tile a GEMM, the program compiles
       with every GEMM on cuBLAS, and says so (`compile_lowered`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from txf.aot.targets import CUDNN_VERSION, Target, gpu_target_config
from txf.data.spec import num_classes, required
from txf.decode import generation
from txf.ops import platform
from txf.progress import stage
from txf.runconfig.run_config import ConfigError, RunConfig
from txf.runconfig.tasks import task_kind
from txf.train import sharding
from txf.train.run_setup import RunSetup, sampler_arguments, setup_run

# Before jax starts a backend: compile for TPUs and GPUs on this CPU.
ENVIRONMENT = {
  "JAX_PLATFORMS": "cpu",  # run nothing on a TPU or GPU this machine may have
  "JAX_SKIP_CUDA_CONSTRAINTS_CHECK": "1",  # no CUDA driver or libraries needed
  "TPU_SKIP_MDS_QUERY": "1",  # libtpu: no cloud metadata server
  "TPU_ACCELERATOR_TYPE": "v5litepod-4",  # libtpu: any type, the topology names its own
  "TPU_WORKER_HOSTNAMES": "localhost",
  "TPU_WORKER_ID": "0",
  # libtpu otherwise lets one process at a time load it (a lock file in /tmp),
  # which guards a real TPU; compiling needs none.
  "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
}


def prepare_environment() -> None:
  """Sets what the deviceless compilers need (`ENVIRONMENT`, where unset).
  Call before jax starts a backend (before the first jax.devices())."""
  for name, value in ENVIRONMENT.items():
    os.environ.setdefault(name, value)
  # jax read JAX_PLATFORMS when it was imported.
  jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])


@dataclasses.dataclass(frozen=True)
class CompiledRun:
  """A run's programs compiled for a target.

  Attributes:
    target: what they were compiled for.
    setup: the run as built on the target's devices (its mesh, shapes,
      FLOPs per token); its programs can be lowered, not run.
    train_step, eval_step: the compiled programs (jax.stages.Compiled);
      None where the compiler refused one for want of memory.
    decode: the compiled decoding program, None where not asked for (or
      refused for want of memory); decode_tokens: its new tokens (0: none).
    out_of_memory: {'train_step' / 'eval_step' / 'decode': the compiler's
      message} for each program it refused (the TPU compiler checks memory
      itself).
    compile_seconds: {'train_step': s, 'eval_step': s[, 'decode': s]}.
    cudnn: whether GPU attention could go to cuDNN (False where this jax
      has no cuDNN checks to answer: attention then compiles as XLA's).
    cublas_gemms: {'train_step' / 'eval_step' / 'decode': the op of the
      dot XLA's Triton GEMM could not tile} for each GPU program compiled
      again with every GEMM on cuBLAS (`_compile`: CUBLAS_GEMMS).
  """

  target: Target
  setup: RunSetup
  train_step: Any
  eval_step: Any
  out_of_memory: dict[str, str]
  compile_seconds: dict[str, float]
  cudnn: bool
  decode: Any = None
  decode_tokens: int = 0
  cublas_gemms: dict[str, str] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def _cudnn_answered_for(target: Target) -> Iterator[bool]:
  """jax's cuDNN attention checks answered for the target GPU (they ask the
  attached GPU and the loaded cuDNN); yields whether that was possible."""
  if target.gpu is None:
    yield False
    return
  try:  # private: what jax.nn.dot_product_attention(implementation='cudnn') checks
    from jax._src.cudnn import fused_attention_stablehlo as checks
  except ImportError:
    yield False
    return
  names = ("check_cudnn_version", "check_compute_capability", "is_cuda_compute_capability_equal")
  if not all(hasattr(checks, name) for name in names):
    yield False
    return
  saved = {name: getattr(checks, name) for name in names}
  major, minor, patch = CUDNN_VERSION
  capability = target.gpu.compute_capability

  def parse(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split("."))

  checks.check_cudnn_version = lambda *_: major * 10000 + minor * 100 + patch
  checks.check_compute_capability = lambda cc: capability >= parse(cc)
  checks.is_cuda_compute_capability_equal = lambda cc: capability == parse(cc)
  try:
    with platform.compiling_for("gpu", capability[0]):
      yield True
  finally:
    for name, function in saved.items():
      setattr(checks, name, function)


def abstract_batch(setup: RunSetup, *, train: bool = True) -> dict[str, jax.ShapeDtypeStruct]:
  """The global training (or evaluation) batch's shapes and dtypes, split over
  the mesh as the run splits its batches: a training batch is [R, B, ...]
  where each replica trains on its own (run.own_batches)."""
  batch = next(iter(setup.train_data if train else setup.eval_data))
  split = sharding.batch_sharding(setup.mesh, replica_axis=train and setup.run.own_batches)
  return {
    key: jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=split)
    for key, value in batch.items()
  }


def _decode_program(setup: RunSetup, decode_tokens: int) -> tuple[Any, tuple]:
  """The evaluations' sampler (txf.train.run_setup.sampler_arguments: generate
  after eval.sample_prompt, one row, at eval.temperature) for `decode_tokens`
  tokens, lowered (a function returning it, and no arguments).

  Raises:
    ConfigError: decode_tokens the model cannot decode (a cache longer than
      its learned position table, ...: generate's checks, found by lowering)."""
  if not task_kind(setup.task).causal_lm or setup.run.replicas > 1:
    raise ConfigError(
      "decode_tokens: decoding compiles for a language model's run (data.task 'lm', one "
      f"replica); this is a {setup.task!r} run of {setup.run.replicas} replica(s)"
    )
  arguments, options = sampler_arguments(setup, setup.abstract_state.params, step=0)
  options["max_new_tokens"] = decode_tokens
  generate = generation.build_generate(lower=True)
  try:
    with setup.activation_sharding():  # as compile_run lowers the steps
      lowered = generate(*arguments, **options)
  except ValueError as error:
    raise ConfigError(f"decode_tokens: {error}") from error
  return lambda: lowered, ()


def compile_generate(
  model: Any,
  params: Any,
  target: Target,
  devices: list | None = None,
  *,
  batch_size: int,
  prompt_len: int,
  new_tokens: int,
  source_len: int = 0,
  compiler_options: dict[str, Any] | None = None,
  sampling: dict[str, Any] | None = None,
) -> tuple[Any, float]:
  """`decode.generate` (greedy unless `sampling` says otherwise, without
  EOS: every row generates all its tokens) compiled for one device of
  `target`, as a benchmark calls it.

  Args:
    model: a decoder or encoder-decoder (`txf.models.build`).
    params: its parameters, arrays or jax.ShapeDtypeStructs (their dtypes
      are the program's: the benchmarks hold them in the compute dtype).
    target, devices: the hardware and, if already made, its devices.
    batch_size, prompt_len, new_tokens: B prompts of P tokens (an
      encoder-decoder's: its default BOS column, P = 1), N new tokens each.
    source_len: an encoder-decoder's encoder inputs per row.
    compiler_options: XLA options for this compile (e.g. command buffers).
    sampling: generate's sampling arguments (rng, temperature, top_k,
      top_p); None: greedy.

  Returns:
    (the compiled program, the seconds its compile took).
  """
  devices = devices if devices is not None else target.devices()
  on_device = jax.sharding.SingleDeviceSharding(devices[0])
  params = jax.tree.map(
    lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=on_device), params
  )
  # Concrete prompts, as a caller's: generate checks them before tracing.
  arguments: dict[str, Any] = dict(max_new_tokens=new_tokens, **(sampling or {}))
  if model.cfg.family == "encoder_decoder":
    arguments["encoder_tokens_BxS"] = np.full((batch_size, source_len), 5, np.int32)
  else:
    arguments["prompt_BxP"] = np.full((batch_size, prompt_len), 5, np.int32)
  generate = generation.build_generate(lower=True)
  with _cudnn_answered_for(target):
    start = time.perf_counter()
    lowered = generate(model, params, **arguments)
    compiled = lowered.compile(compiler_options) if compiler_options else lowered.compile()
  return compiled, time.perf_counter() - start


# XLA's command buffers (CUDA graphs) with the while loop and conditionals
# among the commands: a loop whose body and condition are all commands runs
# as one graph with conditional nodes, launched once, not once per iteration.
COMMAND_BUFFERS_WITH_LOOPS = {
  "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL"
}
# The CUDA driver XLA is told a deviceless GPU has, to decide which commands
# it may capture: conditional nodes (loops, branches) need 12.3 or later, and
# a topology description that declares none gets none.
DRIVER_VERSION = "13.0.0"


def with_driver(target: Target, driver_version: str = DRIVER_VERSION) -> list:
  """A GPU target's devices, their description declaring a CUDA driver (which
  `Target.devices` leaves out; XLA then captures no loop in a command buffer)."""
  from jax.experimental import topologies  # noqa: PLC0415 (as Target.devices)

  if target.gpu is None:
    raise ValueError(f"with_driver: {target.name} is no GPU")
  config = gpu_target_config(target.gpu).replace(
    "gpu_device_info {", f'gpu_device_info {{\n  driver_version: "{driver_version}"', 1
  )
  description = topologies.get_topology_desc(
    platform="cuda", topology=target.topology, target_config=config
  )
  return list(description.devices)


def loop_launch(thunk_sequence: str) -> str:
  """How XLA launches a program's token loop, from its thunk sequence
  (`thunk_sequence_after_thunk_passes.txt` of an XLA dump): 'one graph'
  where the loop (condition and body) lies inside a command buffer, 'a
  graph per iteration' where its body is one, else 'kernel by kernel'."""
  lines = thunk_sequence.splitlines()
  depth = lambda line: len(line) - len(line.lstrip())
  for i, line in enumerate(lines):
    if ": kWhile" not in line:
      continue
    enclosing = [
      other
      for other in lines[:i]
      if depth(other) < depth(line) and re.search(r"^\s*\d+: \w", other)
    ]
    if enclosing and ": kCommandBuffer" in enclosing[-1]:
      return "one graph"
    body = next((j for j in range(i, len(lines)) if lines[j].strip().endswith("body:")), None)
    thunks = (
      [other for other in lines[body + 1 :] if re.search(r"^\s*\d+: \w", other)] if body else []
    )
    return (
      "a graph per iteration" if thunks and ": kCommandBuffer" in thunks[0] else "kernel by kernel"
    )
  return "kernel by kernel"


def command_buffer_launch(compile_once: Any) -> str:
  """`loop_launch` of the program `compile_once(compiler_options)` compiles,
  from the thunk sequence XLA dumps while compiling it (into a temporary
  directory)."""
  with tempfile.TemporaryDirectory() as directory:
    compile_once({"xla_dump_to": directory})
    found = sorted(pathlib.Path(directory).glob("*thunk_sequence_after_thunk_passes.txt"))
    # The largest program dumped is the decoding one (jax compiles small
    # helpers, a key's split, on the way).
    largest = max(found, key=lambda path: path.stat().st_size, default=None)
    return loop_launch(largest.read_text()) if largest else "unknown (XLA dumped no thunks)"


def untrained_tokenizer(run: RunConfig) -> RunConfig:
  """`run`, or for a sentencepiece run (whose tokenizer is trained into its
  work directory, which a compile has none of) one that tokenizes bytes with
  the model's vocabulary at the trained tokenizer's size: its
  `data.sp_vocab_size`, the most ids it can have, where `model.vocab_size`
  is unset. The programs see the vocabulary only through its size (the
  batches are [B, T] ids either way); nothing is trained. Nor is a
  `train.init_from` run read (`pretrained:RUN` of a sentencepiece run): its
  weights are of the trained tokenizer's ids, which setup_run refuses for
  the bytes one, and the programs compiled are the same from any start.
  """
  if run.data.tokenizer != "sentencepiece":
    return run
  data = dataclasses.replace(run.data, tokenizer="bytes", sp_vocab_size=None)
  train = dataclasses.replace(run.train, init_from=None)
  vocab_size = run.model.vocab_size or required(run.data.sp_vocab_size)
  return dataclasses.replace(run, data=data, train=train).with_vocabulary(
    vocab_size, num_classes(data)
  )


# Without a GPU to time candidates on, XLA (jaxlib 0.10.2's autotuner pass)
# gives each Triton GEMM fusion its search space's first config without
# compiling it, and the fusion's tiling may refuse that config: a dot whose
# operand is a transpose folding a dimension that no power-of-two block
# divides (seq2seq's out projection reads [B, T=24, ...] rows, 16 rows a
# block) fails with this message. A GPU's autotuner compiles every candidate,
# drops those that do not tile and takes cuBLAS where none does (Triton's
# blocks are 16 rows or more). No option reaches one fusion, so the program
# compiles again with every GEMM on cuBLAS, and the report says so.
UNTILED_TRITON_GEMM = "Couldn't find output tile sizes that satisfy"
CUBLAS_GEMMS = {"xla_gpu_enable_triton_gemm": False}


def _untiled_dot(message: str) -> str:
  """The op (its metadata's op_name, else the HLO) of the dot named by an
  UNTILED_TRITON_GEMM error."""
  line = message[message.index(UNTILED_TRITON_GEMM) :].splitlines()[0]
  found = re.search(r'op_name="([^"]*)"', line)
  return found[1] if found else line[len(UNTILED_TRITON_GEMM) :].strip()


def compile_lowered(lowered: Any, target: Target) -> tuple[Any, str | None]:
  """`lowered` compiled for `target`, and None; or, for a GPU whose Triton GEMM
  default does not tile a dot (UNTILED_TRITON_GEMM), the program compiled
  with every GEMM on cuBLAS (CUBLAS_GEMMS) and that dot's op."""
  try:
    return lowered.compile(), None
  except Exception as error:  # jax's JaxRuntimeError
    if target.gpu is None or UNTILED_TRITON_GEMM not in str(error):
      raise
    dot = _untiled_dot(str(error))
  return lowered.compile(CUBLAS_GEMMS), dot


class CompileError(RuntimeError):
  """The target's compiler refused one of the run's programs (for a reason
  other than memory): names the program, the target and the compiler's
  first line."""


def compile_run(
  run: RunConfig, target: Target, devices: list | None = None, *, decode_tokens: int = 0
) -> CompiledRun:
  """Compiles `run` for `target` (see the module docstring).

  Args:
    run: a run config, parsed as txf-run parses it (txf.runconfig.run_config.parse).
    target: the hardware (txf.aot.targets.parse_target).
    devices: the target's devices if already made (`target.devices()`).
    decode_tokens: > 0: also compile decoding that many tokens.

  Raises:
    ImportError: the target's compiler is not installed (names the extra).
    ConfigError: a config that cannot run there (a mesh that does not
      divide the target's devices, a batch that does not split), naming it;
      decoding asked of a run that is no language model's.
    CompileError: the compiler failed on a program for a reason other than
      memory (a program that does not fit is reported, not raised).
  """
  devices = devices if devices is not None else target.devices()
  with _cudnn_answered_for(target) as cudnn:
    setup = setup_run(untrained_tokenizer(run), devices=devices)
    batch, eval_batch = abstract_batch(setup), abstract_batch(setup, train=False)
    # The steps are jitted (RunSetup types them as plain callables): they lower.
    train_step: Any = setup.train_step
    eval_step: Any = setup.eval_step
    programs: dict[str, tuple[Any, tuple]] = {  # name: (a function that lowers, its arguments)
      "train_step": (train_step.lower, (setup.abstract_state, batch)),
      "eval_step": (eval_step.lower, (setup.abstract_state.params, eval_batch)),
    }
    if decode_tokens:  # lowered first: a bad decode_tokens is found before any compile
      programs["decode"] = _decode_program(setup, decode_tokens)
    compiled, out_of_memory, seconds, cublas_gemms = {}, {}, {}, {}
    with setup.activation_sharding():
      for name, (lower, arguments) in programs.items():
        start = time.perf_counter()
        try:
          with stage(f"compile: the {name.replace('_', ' ')} for {target.name}"):
            compiled[name], dot = compile_lowered(lower(*arguments), target)
          if dot is not None:
            cublas_gemms[name] = dot
        except Exception as error:  # jax's JaxRuntimeError, which XlaRuntimeError was
          message = str(error).strip()
          if "RESOURCE_EXHAUSTED" not in message:
            first_line = message.splitlines()[0] if message else type(error).__name__
            raise CompileError(
              f"the {name.replace('_', ' ')} does not compile for {target.name}: {first_line}"
            ) from error
          compiled[name], out_of_memory[name] = None, message
        seconds[name] = time.perf_counter() - start
  return CompiledRun(
    target,
    setup,
    compiled["train_step"],
    compiled["eval_step"],
    out_of_memory,
    seconds,
    cudnn,
    decode=compiled.get("decode"),
    decode_tokens=decode_tokens,
    cublas_gemms=cublas_gemms,
  )
