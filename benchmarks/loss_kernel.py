"""The loss alone: XLA's passes against the GPU kernel's block sizes and warps
(`python -m benchmarks.run loss_kernel`):

  python -m benchmarks.run loss_kernel --config=configs/gpt2_small.py

The loss's statistics and gradient as the train step's forward pass computes
them (`ops.cross_entropy_sums` under jax.grad; its backward then only
scales the gradient by the cotangent, 1.0 in the step) over random
[B * T, V] logits of the config's shape and compute dtype, one way per
variant:

  xla               the XLA path: a max pass, an exp-sum pass, the gradient pass
  block{b}_warps{w} txf.ops.cross_entropy_gpu's kernel, blocks of b logits, w warps

each jitted alone with the logits donated (the kernel writes the gradient
over them, as in the step) and timed over --repeats calls on fresh logits
(median, each call waited for), with the largest difference of its gradient
and loss sum from the xla variant's. Without a GPU the kernel runs in
Pallas's interpreter, on --cpu_rows rows: a check of the harness, not a
figure.
"""

from __future__ import annotations

import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from txf.commands.cli import define_config_flag
from txf.ops import cross_entropy_gpu, losses
from txf.runconfig.run_config import parse
from txf.train.run_setup import fit_vocabulary

FLAGS = flags.FLAGS


def _loss_sum_and_gradient(statistics_and_gradient, logits_NxV, labels_N, weights_N):
  """(weighted loss sum, gradient [N, V]) from one way of computing them."""
  *row_statistics, grad_NxV = statistics_and_gradient(logits_NxV, labels_N, weights_N)
  loss_sum, _ = losses._weighted_sums(row_statistics, weights_N, logits_NxV.shape[-1], 0.0, 0.0)
  return loss_sum, grad_NxV


def _xla(logits_NxV, labels_N, weights_N):
  return losses._statistics_and_gradient_by_xla(logits_NxV, labels_N, weights_N, 0.0, 0.0)


def _kernel(block, num_warps, interpret, logits_NxV, labels_N, weights_N):
  return cross_entropy_gpu.statistics_and_gradient(
    logits_NxV,
    labels_N,
    weights_N,
    label_smoothing=0.0,
    z_loss=0.0,
    block=block,
    num_warps=num_warps,
    interpret=interpret,
  )


def _powers_of_two(values: list[str], most: int | None = None) -> bool:
  """Whether every value is a power of 2 (at most `most`), as Triton's block
  sizes and warp counts must be."""
  numbers = [int(v) if v.isdigit() else 0 for v in values]
  return all(n >= 1 and not n & (n - 1) and (most is None or n <= most) for n in numbers)


def define_flags() -> None:
  define_config_flag("Config file (model.vocab_size, model.dtype, data.batch_size and seq_len).")
  flags.DEFINE_integer("repeats", 20, "Timed calls per variant.", lower_bound=1)
  flags.DEFINE_list("blocks", ["4096", "8192", "16384", "32768", "65536"], "Kernel block sizes.")
  flags.DEFINE_list("warps", ["8", "16", "32"], "Kernel warp counts.")
  flags.DEFINE_integer(
    "cpu_rows", 4, "Rows of logits without a GPU (the interpreter is slow).", lower_bound=1
  )
  flags.register_validator("blocks", _powers_of_two, "--blocks: each must be a power of 2")
  flags.register_validator(
    "warps", lambda values: _powers_of_two(values, 32), "--warps: each must be 1, 2, 4, ... 32"
  )


def compare(config, *, repeats: int, blocks: list[int], warps: list[int], cpu_rows: int) -> dict:
  """Every variant's median milliseconds and its largest differences from xla's."""
  on_gpu = jax.default_backend() == "gpu"
  rows = config.data.batch_size * config.data.seq_len if on_gpu else cpu_rows
  vocab = fit_vocabulary(parse(config), None)[0].model.vocab_size
  dtype = jnp.dtype(config.model.dtype)
  labels_N = jax.random.randint(jax.random.key(1), (rows,), 0, vocab)
  weights_N = jnp.full((rows,), 1.0 / rows, jnp.float32)

  @jax.jit
  def fresh_logits(seed):
    return (4.0 * jax.random.normal(jax.random.key(seed), (rows, vocab))).astype(dtype)

  variants = {"xla": _xla}
  for block in blocks:
    for num_warps in warps:
      variants[f"block{block}_warps{num_warps}"] = functools.partial(
        _kernel, block, num_warps, not on_gpu
      )
  print(f"[{rows}, {vocab}] {dtype.name} logits")
  figures: dict = dict(rows=rows, vocab=vocab, dtype=dtype.name, variants={})
  reference = None
  for name, variant in variants.items():
    fn = jax.jit(functools.partial(_loss_sum_and_gradient, variant), donate_argnums=0)
    loss, grad = jax.device_get(fn(fresh_logits(0), labels_N, weights_N))
    grad = np.asarray(grad, np.float64)
    if reference is None:
      reference = float(loss), grad
    times = []
    for i in range(repeats):
      logits_NxV = jax.block_until_ready(fresh_logits(i + 1))
      start = time.perf_counter()
      jax.block_until_ready(fn(logits_NxV, labels_N, weights_N))
      times.append(time.perf_counter() - start)
    row = dict(
      ms=1e3 * statistics.median(times),
      loss_difference=abs(float(loss) - reference[0]),
      max_grad_difference=float(np.max(np.abs(grad - reference[1]))),
    )
    figures["variants"][name] = row
    print(
      f"{name:20s} {row['ms']:8.3f} ms   |loss - xla's| {row['loss_difference']:.3g}   "
      f"max |grad - xla's| {row['max_grad_difference']:.3g}"
    )
  return figures


def main() -> dict:
  return compare(
    FLAGS.config,
    repeats=FLAGS.repeats,
    blocks=[int(b) for b in FLAGS.blocks],
    warps=[int(w) for w in FLAGS.warps],
    cpu_rows=FLAGS.cpu_rows,
  )
