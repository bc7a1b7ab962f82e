"""Positional encodings (textbook item 3): sinusoidal, RoPE and ALiBi, from txf.ops.

Sinusoidal (Vaswani et al. 2017; txf's interleaved layout PE[p, 2i] =
sin(w_i p), PE[p, 2i+1] = cos(w_i p), w_i = 10000^(-2i/d)): each pair
(sin, cos) of PE(p + k) is the pair of PE(p) turned by the angle w_i k,

  [sin w(p+k)]   [ cos wk  sin wk] [sin wp]
  [cos w(p+k)] = [-sin wk  cos wk] [cos wp],

a rotation R_k that depends on the shift k and not on p; R_k is built here
from the closed form (float64 w_i) and checked against txf's encodings.
The cosine similarity of two encodings depends (nearly) only on |i - j|.

RoPE (Su et al.) rotates q and k by their positions, so the score
<RoPE(q, m), RoPE(k, n)> depends only on m - n: the score matrix is
constant along its diagonals (Toeplitz). Adding sinusoidal encodings to q and
k instead gives a score that depends on m and n, not only on m - n.

ALiBi (Press et al. 2022) adds -slope_h * |i - j| to head h's scores, with
geometric slopes 2^(-8/H), 2^(-16/H), ...
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from txf import ops
from txf.analysis.plots import heatmaps, line_plot
from txf.textbook.report import figure_path, markdown_table

NAME = "positions"
FULL: dict[str, Any] = dict(
  num_positions=256,
  dim=128,
  shifts=(1, 2, 5, 10, 50, 100),
  rope_positions=128,
  rope_dim=64,
  alibi_heads=8,
  alibi_len=16,
)
QUICK: dict[str, Any] = dict(
  num_positions=64,
  dim=32,
  shifts=(1, 5, 20),
  rope_positions=32,
  rope_dim=16,
  alibi_heads=4,
  alibi_len=8,
)
_MAX_TIMESCALE = 10000.0


def _frequencies(dim: int) -> np.ndarray:
  """float64 [dim / 2]: w_i = 10000^(-2i/dim)."""
  return _MAX_TIMESCALE ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def sinusoidal_float64(num_positions: int, dim: int) -> np.ndarray:
  """float64 [P, dim]: the encoding's closed form (interleaved sin, cos), for reference."""
  angles_PxF = np.arange(num_positions, dtype=np.float64)[:, None] * _frequencies(dim)
  return np.stack([np.sin(angles_PxF), np.cos(angles_PxF)], axis=-1).reshape(num_positions, dim)


def shift_rotation(dim: int, shift: int) -> np.ndarray:
  """float64 [dim, dim]: R_k with PE(p + shift) = R_k PE(p) (the closed form above)."""
  rotation = np.zeros((dim, dim))
  for i, w in enumerate(_frequencies(dim)):
    c, s = math.cos(w * shift), math.sin(w * shift)
    rotation[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
  return rotation


def _cosine_similarity(x_NxD: np.ndarray) -> np.ndarray:
  unit = x_NxD / np.linalg.norm(x_NxD, axis=-1, keepdims=True)
  return unit @ unit.T


def _mean_by_distance(matrix_NxN: np.ndarray) -> np.ndarray:
  """[N]: the mean of matrix[i, j] over the pairs with |i - j| = d, d = 0..N-1."""
  n = matrix_NxN.shape[0]
  return np.array([np.mean(np.diagonal(matrix_NxN, offset=d)) for d in range(n)])


def _toeplitz_deviation(matrix_NxN: np.ndarray) -> float:
  """Largest |matrix[i, j] - matrix[i + s, j + s]|: 0 iff it depends on i - j only."""
  n = matrix_NxN.shape[0]
  return max(float(np.ptp(np.diagonal(matrix_NxN, offset=d))) for d in range(-n + 1, n))


def _rope_scores(q_D: np.ndarray, k_D: np.ndarray, positions: int) -> np.ndarray:
  """[P, P]: <RoPE(q, m), RoPE(k, n)> for query position m and key position n."""
  at = lambda x: np.asarray(
    ops.apply_rope(
      jnp.broadcast_to(jnp.asarray(x, jnp.float32), (1, positions, 1, x.size)),
      jnp.arange(positions),
    ),
    np.float64,
  )[0, :, 0]
  return at(q_D) @ at(k_D).T


def compute(
  num_positions: int,
  dim: int,
  shifts: Sequence[int],
  rope_positions: int,
  rope_dim: int,
  alibi_heads: int,
  alibi_len: int,
  seed: int = 0,
) -> dict[str, Any]:
  """The numbers and matrices of the positional-encoding experiment.

  Returns:
    {"encoding": float32 [P, dim] sinusoidal matrix (ops.sinusoidal_embedding),
     "similarity": [P, P] cosine similarities, "similarity_by_distance": [P],
     "similarity_toeplitz_deviation": how far the similarity is from a
       function of |i - j|,
     "shifts": [...], "rotation_error": per shift k, max over p of
       |PE(p + k) - R_k PE(p)| (float32 encodings vs the float64 rotation),
     "encoding_error": max |PE - its float64 closed form|, the float32
       rounding of txf's encodings (the identity cannot hold to better than
       about twice this),
     "rope_scores": [P, P] RoPE scores of one random q, k pair at every
       (m, n), "rope_toeplitz_deviation" (0 up to float32 rounding) and
       "rope_score_scale" (their largest |score|), "absolute_scores" and
       "absolute_toeplitz_deviation" (the same for q + PE(m), k + PE(n),
       which is not relative),
     "alibi_slopes": [H], "alibi_bias": [H, L, L] with -inf above the
       diagonal (causal)}. Arrays are numpy; `run` lists them.
  """
  rng = np.random.default_rng(seed)
  encoding = np.asarray(ops.sinusoidal_embedding(jnp.arange(num_positions), dim))
  similarity = _cosine_similarity(encoding.astype(np.float64))
  rotation_error = []
  for shift in shifts:
    rotated = encoding[: num_positions - shift].astype(np.float64) @ shift_rotation(dim, shift).T
    rotation_error.append(float(np.max(np.abs(encoding[shift:] - rotated))))

  q_D, k_D = rng.standard_normal(rope_dim), rng.standard_normal(rope_dim)
  rope_scores = _rope_scores(q_D, k_D, rope_positions)
  pe = np.asarray(ops.sinusoidal_embedding(jnp.arange(rope_positions), rope_dim), np.float64)
  absolute_scores = (q_D + pe) @ (k_D + pe).T

  positions = jnp.arange(alibi_len)
  bias = np.asarray(ops.alibi_bias(alibi_heads, positions, positions))[0]
  causal = np.asarray(ops.causal_mask(alibi_len))[0, 0]
  return {
    "encoding": encoding,
    "similarity": similarity,
    "similarity_by_distance": _mean_by_distance(similarity),
    "encoding_error": float(np.max(np.abs(encoding - sinusoidal_float64(num_positions, dim)))),
    "similarity_toeplitz_deviation": _toeplitz_deviation(similarity),
    "shifts": list(shifts),
    "rotation_error": rotation_error,
    "rope_scores": rope_scores,
    "rope_toeplitz_deviation": _toeplitz_deviation(rope_scores),
    "rope_score_scale": float(np.max(np.abs(rope_scores))),
    "absolute_scores": absolute_scores,
    "absolute_toeplitz_deviation": _toeplitz_deviation(absolute_scores),
    "alibi_slopes": np.asarray(ops.alibi_slopes(alibi_heads)).tolist(),
    "alibi_bias": np.where(causal, bias, -np.inf),
  }


def plot(result: dict[str, Any], out_dir: str | os.PathLike) -> list[str]:
  """The encoding matrix, similarities, RoPE scores and ALiBi biases; the PNG paths."""
  P, dim = result["encoding"].shape
  distance = np.arange(P)
  rope_scores = result["rope_scores"]
  offsets = np.arange(-(rope_scores.shape[0] // 4), rope_scores.shape[0] // 4 + 1)
  starts = (rope_scores.shape[0] // 4, rope_scores.shape[0] // 2, 3 * rope_scores.shape[0] // 4 - 1)
  slopes = result["alibi_slopes"]
  # The RoPE curves coincide: thick solid under thinner dashed and dotted.
  styles = {
    f"query at m = {m}": {"linestyle": style, "linewidth": width}
    for m, style, width in zip(starts, ("-", "--", ":"), (5.0, 2.5, 1.5))
  }
  paths = [
    heatmaps(
      {f"PE[pos, i], d = {dim}": result["encoding"]},
      figure_path(out_dir, NAME, "sinusoidal"),
      "Sinusoidal positional encoding",
      xlabel="encoding dimension i",
      ylabel="position pos (tokens)",
      colorbar_label="PE value",
      cmap="RdBu_r",
      vmin=-1.0,
      vmax=1.0,
    ),
    heatmaps(
      {"cos(PE(i), PE(j))": result["similarity"]},
      figure_path(out_dir, NAME, "similarity"),
      "Cosine similarity between sinusoidal encodings",
      xlabel="position j (tokens)",
      ylabel="position i (tokens)",
      colorbar_label="cosine similarity",
      cmap="RdBu_r",
      vmin=-1.0,
      vmax=1.0,
    ),
    line_plot(
      {"mean over pairs at |i - j|": (distance, result["similarity_by_distance"])},
      figure_path(out_dir, NAME, "similarity_by_distance"),
      f"Sinusoidal encodings (d = {dim}): similarity falls with distance",
      "distance |i - j| (tokens)",
      "cosine similarity",
    ),
    line_plot(
      {f"query at m = {m}": (offsets, rope_scores[m, m - offsets]) for m in starts},
      figure_path(out_dir, NAME, "rope_relative"),
      "RoPE: the score depends only on the offset m - n",
      "offset m - n (tokens)",
      "score <RoPE(q, m), RoPE(k, n)>",
      styles=styles,
    ),
    line_plot(
      {f"query at m = {m}": (offsets, result["absolute_scores"][m, m - offsets]) for m in starts},
      figure_path(out_dir, NAME, "absolute_not_relative"),
      "Sinusoidal added to q, k: the score depends on m, not only m - n",
      "offset m - n (tokens)",
      "score <q + PE(m), k + PE(n)>",
      styles=styles,
    ),
    heatmaps(
      {f"head {h}, slope {slope:.4g}": result["alibi_bias"][h] for h, slope in enumerate(slopes)},
      figure_path(out_dir, NAME, "alibi"),
      "ALiBi bias per head (causal)",
      xlabel="key position j (tokens)",
      ylabel="query position i (tokens)",
      colorbar_label="bias added to the score (blank: masked)",
      columns=min(4, len(slopes)),
      cmap="magma",
    ),
  ]
  return [str(path) for path in paths]


def report(result: dict[str, Any]) -> str:
  rotation = markdown_table(
    ["shift k", "max abs(PE(p+k) - R_k PE(p))"],
    list(zip(result["shifts"], result["rotation_error"])),
  )
  slopes = ", ".join(f"{slope:.4g}" for slope in result["alibi_slopes"])
  P, dim = result["encoding"].shape
  return (
    f"Sinusoidal encodings, positions 0-{P - 1}, d = {dim}. PE(p + k) as the fixed "
    f"rotation R_k of PE(p) (float32 encodings vs float64 R_k, every p):\n\n{rotation}\n"
    f"txf's float32 encodings differ from the float64 closed form by up to "
    f"{result['encoding_error']:.3g} (float32 frequencies and angles up to {P - 1} rad), "
    f"so the identity holds to the encodings' own rounding (twice that bounds it).\n\n"
    f"Cosine similarity: largest spread along a diagonal (same |i - j|) "
    f"{result['similarity_toeplitz_deviation']:.3g}; similarity at distance 1, 10, "
    f"{P - 1}: "
    + ", ".join(f"{result['similarity_by_distance'][d]:.3f}" for d in (1, min(10, P - 1), P - 1))
    + ".\n\n"
    f"RoPE relative property: largest |score(m, n) - score(m + s, n + s)| = "
    f"{result['rope_toeplitz_deviation']:.3g} for scores up to "
    f"{result['rope_score_scale']:.3g}; with sinusoidal encodings added to q and k "
    f"instead it is {result['absolute_toeplitz_deviation']:.3g}.\n\n"
    f"ALiBi slopes ({len(result['alibi_slopes'])} heads): {slopes}.\n"
  )


def run(out_dir: str | os.PathLike, *, quick: bool = False) -> dict[str, Any]:
  """Computes, plots and reports item 3 at full (or toy, `quick`) size."""
  result = compute(**(QUICK if quick else FULL))
  figures = plot(result, out_dir)
  numbers = {
    key: value
    for key, value in result.items()
    if key not in ("encoding", "similarity", "rope_scores", "absolute_scores", "alibi_bias")
  }
  numbers["similarity_by_distance"] = result["similarity_by_distance"].tolist()
  return {**numbers, "figures": figures, "text": report(result)}
