"""Why attention divides by sqrt(d_k) (textbook item 1).

For q, k with independent unit-variance entries, q . k is a sum of d_k
unit-variance products: its variance is d_k. Unscaled, the scores of a
softmax row spread as sqrt(d_k), so at large d_k the row puts almost all its
weight on one key (entropy -> 0) and the softmax saturates: its Jacobian
dp/ds = diag(p) - p p^T, whose largest entry is max_j p_j (1 - p_j) <= 1/4,
goes to 0 and gradients vanish. Scaling by 1/sqrt(d_k) keeps the variance at 1 and
the row's entropy and gradient the same at every d_k.

The weights are txf.ops.attention_weights' (scale=1 for "unscaled", its
default 1/sqrt(d_k) for "scaled"), the entropy is
txf.analysis.head_scores.attention_entropy, and the Jacobian is taken by
jax.jacfwd of the softmax of each row's scores.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from txf import ops
from txf.analysis.head_scores import attention_entropy
from txf.analysis.plots import line_plot
from txf.textbook.report import figure_path, markdown_table

NAME = "scaling"
FULL: dict[str, Any] = dict(d_ks=(16, 32, 64, 128, 256, 512, 1024), num_queries=256, num_keys=256)
QUICK: dict[str, Any] = dict(d_ks=(16, 64, 256), num_queries=64, num_keys=64)
# Rows whose softmax Jacobian is taken (each is [num_keys, num_keys]).
_JACOBIAN_ROWS = 64


@jax.jit
def _largest_jacobian_entries(scores_RxS: jax.Array) -> jax.Array:
  """[R]: max over i, j of |d softmax(s)_i / d s_j| for each row, by autodiff."""
  jacobians_RxSxS = jax.vmap(jax.jacfwd(jax.nn.softmax))(scores_RxS)
  return jnp.max(jnp.abs(jacobians_RxSxS), axis=(1, 2))


def _largest_jacobian_entry(scores_RxS: np.ndarray) -> float:
  """Median over rows of max |d softmax(s)_i / d s_j|.

  The median, because the mean of saturated rows is carried by the rare row
  whose two largest scores happen to tie."""
  return float(np.median(_largest_jacobian_entries(jnp.asarray(scores_RxS, jnp.float32))))


def compute(d_ks: Sequence[int], num_queries: int, num_keys: int, seed: int = 0) -> dict[str, Any]:
  """Variance of q . k, row entropy and largest softmax gradient per d_k.

  Args:
    d_ks: key/query widths.
    num_queries, num_keys: rows and columns of the score matrix (one head).
    seed: numpy seed of q, k ~ N(0, 1).

  Returns:
    {"d_k": [...], "num_keys": n, "uniform_entropy": log(n), and per d_k,
     for "unscaled" and "scaled": "variance_<case>" (of the scores
     scale * q . k), "entropy_<case>" (mean row entropy, nats),
     "max_gradient_<case>" (median over rows of the largest |dp_i/ds_j|)}.
  """
  rng = np.random.default_rng(seed)
  result: dict[str, Any] = {
    "d_k": list(d_ks),
    "num_keys": num_keys,
    "uniform_entropy": math.log(num_keys),
  }
  for case in ("unscaled", "scaled"):
    for quantity in ("variance", "entropy", "max_gradient"):
      result[f"{quantity}_{case}"] = []
  for d_k in d_ks:
    q_1xTx1xD = rng.standard_normal((1, num_queries, 1, d_k))
    k_1xSx1xD = rng.standard_normal((1, num_keys, 1, d_k))
    dots_TxS = q_1xTx1xD[0, :, 0] @ k_1xSx1xD[0, :, 0].T  # float64
    for case, scale in (("unscaled", 1.0), ("scaled", 1.0 / math.sqrt(d_k))):
      scores_TxS = scale * dots_TxS
      weights_1x1xTxS = ops.attention_weights(
        jnp.asarray(q_1xTx1xD, jnp.float32), jnp.asarray(k_1xSx1xD, jnp.float32), scale=scale
      )
      result[f"variance_{case}"].append(float(np.var(scores_TxS)))
      result[f"entropy_{case}"].append(float(attention_entropy(weights_1x1xTxS)[0]))
      result[f"max_gradient_{case}"].append(_largest_jacobian_entry(scores_TxS[:_JACOBIAN_ROWS]))
  return result


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """Variance, entropy and largest-gradient curves against d_k; the PNG paths."""
  d_k = np.asarray(result["d_k"], np.float64)
  dashed = {"linestyle": "--", "color": "gray"}
  figures = [
    line_plot(
      {
        "unscaled q.k": (d_k, result["variance_unscaled"]),
        "scaled q.k / sqrt(d_k)": (d_k, result["variance_scaled"]),
        "theory: d_k": (d_k, d_k),
        "theory: 1": (d_k, np.ones_like(d_k)),
      },
      figure_path(out_dir, NAME, "variance"),
      "Variance of attention scores, q, k ~ N(0, 1)",
      "d_k (dimensions)",
      "variance of the score",
      logx=True,
      logy=True,
      styles={"theory: d_k": dashed, "theory: 1": {**dashed, "linestyle": ":"}},
    ),
    line_plot(
      {
        "unscaled": (d_k, result["entropy_unscaled"]),
        "scaled by 1/sqrt(d_k)": (d_k, result["entropy_scaled"]),
        f"uniform over {result['num_keys']} keys": (
          d_k,
          np.full_like(d_k, result["uniform_entropy"]),
        ),
      },
      figure_path(out_dir, NAME, "entropy"),
      "Entropy of a softmax attention row",
      "d_k (dimensions)",
      "mean row entropy (nats)",
      logx=True,
      styles={f"uniform over {result['num_keys']} keys": dashed},
    ),
    line_plot(
      {
        "unscaled": (d_k, result["max_gradient_unscaled"]),
        "scaled by 1/sqrt(d_k)": (d_k, result["max_gradient_scaled"]),
        "bound 1/4": (d_k, np.full_like(d_k, 0.25)),
      },
      figure_path(out_dir, NAME, "gradient"),
      "Largest softmax gradient |dp_i / ds_j| of a row",
      "d_k (dimensions)",
      "median over rows of max |dp_i/ds_j|",
      logx=True,
      logy=True,
      styles={"bound 1/4": dashed},
    ),
  ]
  return [str(path) for path in figures]


def report(result: dict[str, Any]) -> str:
  header = [
    "d_k",
    "Var unscaled",
    "Var scaled",
    "entropy unscaled (nats)",
    "entropy scaled (nats)",
    "max grad unscaled",
    "max grad scaled",
  ]
  keys = [
    "variance_unscaled",
    "variance_scaled",
    "entropy_unscaled",
    "entropy_scaled",
    "max_gradient_unscaled",
    "max_gradient_scaled",
  ]
  rows = [[d_k, *(result[key][i] for key in keys)] for i, d_k in enumerate(result["d_k"])]
  return (
    f"Scores of {result['num_keys']} keys per query, q, k ~ N(0, 1); uniform attention "
    f"has entropy {result['uniform_entropy']:.3f} nats.\n\n" + markdown_table(header, rows)
  )


def run(out_dir: str | os.PathLike, *, quick: bool = False) -> dict[str, Any]:
  """Computes, plots and reports item 1 at full (or toy, `quick`) size."""
  result = compute(**(QUICK if quick else FULL))
  return {**result, "figures": plot(result, out_dir), "text": report(result)}
