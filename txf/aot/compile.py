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
       counts differ slightly; memory does not (docs/benchmarks.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator
from typing import Any

import jax

from txf.aot.targets import CUDNN_VERSION, Target
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
  tokens, lowering, and its arguments."""
  if not task_kind(setup.task).causal_lm or setup.run.replicas > 1:
    raise ConfigError(
      "decode_tokens: decoding compiles for a language model's run (data.task 'lm', one "
      f"replica); this is a {setup.task!r} run of {setup.run.replicas} replica(s)"
    )
  arguments, options = sampler_arguments(setup, setup.abstract_state.params, step=0)
  options["max_new_tokens"] = decode_tokens
  generate = generation.build_generate(lower=True)
  return functools.partial(generate, **options), arguments


def untrained_tokenizer(run: RunConfig) -> RunConfig:
  """`run`, or for a sentencepiece run (whose tokenizer is trained into its
  work directory, which a compile has none of) one that tokenizes bytes with
  the model's vocabulary at the trained tokenizer's size: its
  `data.sp_vocab_size`, the most ids it can have, where `model.vocab_size`
  is unset. The programs see the vocabulary only through its size (the
  batches are [B, T] ids either way); nothing is trained.
  """
  if run.data.tokenizer != "sentencepiece":
    return run
  data = dataclasses.replace(run.data, tokenizer="bytes", sp_vocab_size=None)
  vocab_size = run.model.vocab_size or required(run.data.sp_vocab_size)
  return dataclasses.replace(run, data=data).with_vocabulary(vocab_size, num_classes(data))


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
    if decode_tokens:
      programs["decode"] = _decode_program(setup, decode_tokens)
    compiled, out_of_memory, seconds = {}, {}, {}
    with setup.activation_sharding():
      for name, (lower, arguments) in programs.items():
        start = time.perf_counter()
        try:
          with stage(f"compile: the {name.replace('_', ' ')} for {target.name}"):
            compiled[name] = lower(*arguments).compile()
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
  )
