"""The token embedding's backward pass alone (`python -m benchmarks.run embedding_grad`):

  python -m benchmarks.run embedding_grad --config=configs/gpt2_small.py

The gradient of a [V, D] float32 table looked up by the config's own
training ids (byte text: about 100 distinct ids, so most of a batch's rows
land on a few table rows), one way per method:

  bf16_table  the table cast to the compute dtype, then the lookup (flax
              nn.Embed with dtype=bfloat16): a scatter-add into a bf16 table
  f32_table   the lookup in the float32 table, cast after: a float32 scatter-add
  one_hot     the gradient as one_hot(ids)^T @ cotangent, a [V, N] x [N, D] GEMM
  sorted      the ids sorted first, then a segment sum over sorted indices

Each is jitted on its own and timed over --repeats calls (median, each
call waited for) on a fresh bf16 cotangent, with the largest difference of
its gradient from a float64 numpy sum.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from txf.commands.cli import define_config_flag
from txf.data import make_dataset
from txf.runconfig.run_config import parse

FLAGS = flags.FLAGS


def _bf16_table(table_VxD, ids_N, cotangent_NxD):
  return jax.vjp(lambda t: jnp.take(t.astype(jnp.bfloat16), ids_N, axis=0), table_VxD)[1](
    cotangent_NxD
  )[0]


def _f32_table(table_VxD, ids_N, cotangent_NxD):
  lookup = lambda t: jnp.take(t, ids_N, axis=0).astype(jnp.bfloat16)  # noqa: E731
  return jax.vjp(lookup, table_VxD)[1](cotangent_NxD)[0]


def _one_hot(table_VxD, ids_N, cotangent_NxD):
  one_hot_NxV = jax.nn.one_hot(ids_N, table_VxD.shape[0], dtype=cotangent_NxD.dtype)
  return jnp.einsum("nv,nd->vd", one_hot_NxV, cotangent_NxD, preferred_element_type=jnp.float32)


def _sorted(table_VxD, ids_N, cotangent_NxD):
  order_N = jnp.argsort(ids_N)
  return jax.ops.segment_sum(
    cotangent_NxD[order_N].astype(jnp.float32),
    ids_N[order_N],
    num_segments=table_VxD.shape[0],
    indices_are_sorted=True,
  )


METHODS = {
  "bf16_table": _bf16_table,
  "f32_table": _f32_table,
  "one_hot": _one_hot,
  "sorted": _sorted,
}


def define_flags() -> None:
  define_config_flag("Config file (model.vocab_size, model.d_model, the data).")
  flags.DEFINE_integer("repeats", 20, "Timed calls per method (median).", lower_bound=1)


def compare(config, *, repeats: int) -> dict:
  """Every method's median milliseconds and largest error on the config's ids."""
  run = parse(config)
  data = make_dataset(run.data, "train", seed=run.data_seed)
  ids_N = np.asarray(next(data)["inputs"]).reshape(-1)
  vocab, d_model = run.model.vocab_size or data.vocab_size, run.model.d_model
  rng = np.random.default_rng(0)
  table_VxD = jnp.asarray(rng.normal(size=(vocab, d_model)), jnp.float32)
  cotangents = [jnp.asarray(rng.normal(size=(ids_N.size, d_model)), jnp.bfloat16) for _ in range(2)]
  reference_VxD = np.zeros((vocab, d_model))
  np.add.at(reference_VxD, ids_N, np.asarray(cotangents[0], np.float64))
  print(f"{ids_N.size} ids ({np.unique(ids_N).size} distinct) into a [{vocab}, {d_model}] table")
  figures = dict(ids=int(ids_N.size), distinct_ids=int(np.unique(ids_N).size), methods={})
  ids_N = jnp.asarray(ids_N)
  for name, method in METHODS.items():
    grad = jax.jit(method)
    error = float(np.max(np.abs(np.asarray(grad(table_VxD, ids_N, cotangents[0])) - reference_VxD)))
    times = []
    for i in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(grad(table_VxD, ids_N, cotangents[i % 2]))
      times.append(time.perf_counter() - start)
    ms = 1e3 * statistics.median(times)
    figures["methods"][name] = dict(ms=ms, max_abs_error=error)
    print(f"{name:12s} {ms:8.3f} ms   max |error| {error:.3g}")
  return figures


def main() -> dict:
  return compare(FLAGS.config, repeats=FLAGS.repeats)
