"""Positional encodings: sinusoidal, rotary (RoPE, NTK-scaled), ALiBi and T5 relative buckets.

All functions are pure. Frequencies, slopes and bucket parameters depend only
on static Python values, so they are computed once in numpy at trace time;
everything that depends on positions is computed in float32.

Shape letters: B batch, T query length, S key length, L length,
H heads, D head dim.
"""

import math
import numbers

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
  "sinusoidal_embedding",
  "apply_rope",
  "apply_ntk_rope",
  "alibi_slopes",
  "alibi_bias",
  "relative_position_bucket",
  "last_bucket_start",
  "relative_position_bias",
]


def _check_positive_int(name, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_positive(name, value):
  if not isinstance(value, numbers.Real) or not value > 0:
    raise ValueError(f"{name} must be a positive number, got {value!r}")


def _inverse_frequencies(dim, base):
  """float32 `[dim // 2]`: base^(-2i/dim) for i = 0 .. dim/2 - 1."""
  return (base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)


def sinusoidal_embedding(positions, dim, *, max_timescale=10000.0):
  """Fixed sinusoidal encoding of Vaswani et al. (2017), interleaved layout.

  PE[pos, 2i] = sin(pos / max_timescale^(2i/dim)) and
  PE[pos, 2i+1] = cos(pos / max_timescale^(2i/dim)).

  Args:
    positions: int or float `[..., L]`.
    dim: even embedding width.
    max_timescale: wavelength scale of the slowest pair.

  Returns:
    float32 `[..., L, dim]`.
  """
  positions = jnp.asarray(positions)
  if positions.ndim < 1:
    raise ValueError(f"positions must have shape [..., L], got shape {positions.shape}")
  _check_positive_int("dim", dim)
  if dim % 2:
    raise ValueError(f"dim must be even, got {dim}")
  _check_positive("max_timescale", max_timescale)
  angles_xLxF = positions.astype(jnp.float32)[..., None] * _inverse_frequencies(dim, max_timescale)
  # Interleave so that each frequency owns the adjacent pair (2i, 2i+1).
  pe_xLxFx2 = jnp.stack([jnp.sin(angles_xLxF), jnp.cos(angles_xLxF)], axis=-1)
  return pe_xLxFx2.reshape(*positions.shape, dim)


def apply_rope(x, positions, *, base=10000.0, scale=1.0):
  """Rotary position embedding (Su et al., RoFormer) in the rotate-half layout.

  Feature i is rotated together with feature i + D/2 (GPT-NeoX/LLaMA/MaxText
  layout) by angle (position / scale) * base^(-2i/D). `scale` > 1 is linear
  position interpolation (Chen et al., 2023) for contexts longer than trained.

  Args:
    x: `[B, T, H, D]` queries or keys, D even.
    positions: int or float `[T]` or `[1, T]` (shared by the batch) or `[B, T]`.
    base: frequency base.
    scale: positions are divided by this.

  Returns:
    `[B, T, H, D]`, x's dtype; the rotation is computed in float32.
  """
  x = jnp.asarray(x)
  positions = jnp.asarray(positions)
  if x.ndim != 4:
    raise ValueError(f"x must have shape [B, T, H, D], got shape {x.shape}")
  if not jnp.issubdtype(x.dtype, jnp.floating):  # an int x would truncate the rotation
    raise ValueError(f"x must be a float array, got dtype {x.dtype}")
  batch, length, _, head_dim = x.shape
  if head_dim % 2:
    raise ValueError(f"x head dim (last axis) must be even, got shape {x.shape}")
  if positions.shape not in ((length,), (1, length), (batch, length)):
    raise ValueError(
      f"positions must have shape [T], [1, T] or [B, T] = {(length,)}, {(1, length)} or "
      f"{(batch, length)} for x of shape {x.shape}, got shape {positions.shape}"
    )
  _check_positive("base", base)
  _check_positive("scale", scale)

  positions_BxT = jnp.broadcast_to(positions.astype(jnp.float32), (batch, length))
  angles_BxTxF = (positions_BxT / scale)[..., None] * _inverse_frequencies(head_dim, base)
  # One angle per (token, frequency), shared by all heads.
  sin_BxTx1xF = jnp.sin(angles_BxTxF)[:, :, None, :]
  cos_BxTx1xF = jnp.cos(angles_BxTxF)[:, :, None, :]
  x1_BxTxHxF, x2_BxTxHxF = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate(
    [
      x1_BxTxHxF * cos_BxTx1xF - x2_BxTxHxF * sin_BxTx1xF,
      x2_BxTxHxF * cos_BxTx1xF + x1_BxTxHxF * sin_BxTx1xF,
    ],
    axis=-1,
  )
  return rotated.astype(x.dtype)


def apply_ntk_rope(x, positions, *, base=10000.0, scale=1.0):
  """RoPE with NTK-aware scaling (bloc97, 2023): the base, not the positions, is scaled.

  base' = base * scale^(D / (D - 2)) slows the low frequencies by about
  `scale` (the slowest pair exactly so) while the fastest pair keeps its
  angle, so nearby tokens stay as distinguishable as in training. scale=1 is
  plain RoPE.

  Args:
    x: `[B, T, H, D]` queries or keys, D even and at least 4.
    positions: int or float `[T]`, `[1, T]` or `[B, T]`.
    base: frequency base before scaling.
    scale: context extension factor, >= 1.

  Returns:
    `[B, T, H, D]`, x's dtype.
  """
  if jnp.ndim(x) != 4:  # its head dim is read first: a scalar was an IndexError
    raise ValueError(f"x must have shape [B, T, H, D], got shape {jnp.shape(x)}")
  head_dim = jnp.shape(x)[-1]
  if head_dim < 4:
    raise ValueError(f"x head dim must be at least 4 for NTK scaling, got shape {jnp.shape(x)}")
  if not isinstance(scale, numbers.Real) or not scale >= 1:
    raise ValueError(f"scale must be a number >= 1, got {scale!r}")
  return apply_rope(x, positions, base=base * scale ** (head_dim / (head_dim - 2)))


def alibi_slopes(num_heads):
  """Per-head ALiBi slopes (Press et al., 2022).

  For n a power of two: 2^(-8/n * (i+1)), i = 0 .. n-1. Otherwise the paper's
  rule: the slopes for the closest power of two n' < n, followed by every other
  slope of 2n' until there are n.

  Returns:
    float32 `[num_heads]`.
  """
  _check_positive_int("num_heads", num_heads)

  def power_of_two_slopes(n):
    return 2.0 ** (-8.0 / n * np.arange(1, n + 1))

  closest = 2 ** int(math.floor(math.log2(num_heads)))
  slopes = power_of_two_slopes(closest)
  if closest < num_heads:
    extra = power_of_two_slopes(2 * closest)[0::2][: num_heads - closest]
    slopes = np.concatenate([slopes, extra])
  return jnp.asarray(slopes, dtype=jnp.float32)


def _relative_positions(q_positions, k_positions):
  """k_pos - q_pos as `[B or 1, T, S]`, from positions `[T]`/`[B, T]` and `[S]`/`[B, S]`."""
  q_positions = jnp.asarray(q_positions)
  k_positions = jnp.asarray(k_positions)
  for name, pos in (("q_positions", q_positions), ("k_positions", k_positions)):
    if pos.ndim not in (1, 2):
      raise ValueError(f"{name} must have shape [L] or [B, L], got shape {pos.shape}")
  q_batch = q_positions.shape[0] if q_positions.ndim == 2 else 1
  k_batch = k_positions.shape[0] if k_positions.ndim == 2 else 1
  if q_batch != k_batch and 1 not in (q_batch, k_batch):
    raise ValueError(
      f"q_positions and k_positions batch sizes differ: shapes {q_positions.shape} "
      f"and {k_positions.shape}"
    )
  q_BxTx1 = q_positions.reshape(q_batch, -1, 1)
  k_Bx1xS = k_positions.reshape(k_batch, 1, -1)
  return k_Bx1xS - q_BxTx1


def alibi_bias(num_heads, q_positions, k_positions):
  """ALiBi additive attention bias: -slope_h * |q_pos - k_pos|.

  On positions a causal model may attend to this is the paper's bias; for
  bidirectional attention it is the usual symmetric extension.

  Args:
    num_heads: H.
    q_positions: int or float `[T]` or `[B, T]`.
    k_positions: int or float `[S]` or `[B, S]`.

  Returns:
    float32 `[1, H, T, S]`, or `[B, H, T, S]` when either positions is batched.
  """
  slopes_H = alibi_slopes(num_heads)
  distance_BxTxS = jnp.abs(_relative_positions(q_positions, k_positions).astype(jnp.float32))
  return -slopes_H[None, :, None, None] * distance_BxTxS[:, None, :, :]


def relative_position_bucket(
  relative_position, *, bidirectional=True, num_buckets=32, max_distance=128
):
  """T5's bucketing of relative positions (Raffel et al., 2020).

  Matches Hugging Face's T5 and mesh_tensorflow / t5x
  `_relative_position_bucket` but at an offset whose log ratio lands
  exactly on a bucket boundary in float32, where rounding decides: t5x adds
  float32's epsilon inside the log and Hugging Face's PyTorch code divides
  (exactly 1.0 there), while the program XLA compiles here rounds it just
  below, so with num_buckets=6, max_distance=100 offset 10 is bucket 2
  there and 1 here. No offset does at the default 32 / 128 (every offset to 3,000
  compared, both directions, against a float32 rendering of Hugging Face's
  formula). With
  bidirectional=True half the buckets hold keys before the query and half keys
  after it; otherwise keys after the query all fall in bucket 0. Within a
  direction, the first half of the buckets are exact offsets 0 .. n/2 - 1 and
  the rest are log-spaced up to max_distance; larger offsets share the last
  bucket.

  Args:
    relative_position: int `[...]`, k_pos - q_pos.
    bidirectional: whether keys after the query get their own buckets.
    num_buckets: total number of buckets.
    max_distance: offsets at or beyond this share the last bucket.

  Returns:
    int32 `[...]` in [0, num_buckets).
  """
  relative_position = jnp.asarray(relative_position)
  if not jnp.issubdtype(relative_position.dtype, jnp.integer):
    raise ValueError(f"relative_position must be integer, got dtype {relative_position.dtype}")
  _check_positive_int("num_buckets", num_buckets)
  _check_positive_int("max_distance", max_distance)
  buckets_per_side = num_buckets // 2 if bidirectional else num_buckets
  max_exact = buckets_per_side // 2
  if max_exact < 1 or (bidirectional and num_buckets % 2):
    raise ValueError(
      f"num_buckets must be even and >= {4 if bidirectional else 2} "
      f"(bidirectional={bidirectional}), got {num_buckets}"
    )
  if max_distance <= max_exact:
    raise ValueError(f"max_distance must exceed the {max_exact} exact buckets, got {max_distance}")

  n = -relative_position.astype(jnp.int32)
  if bidirectional:
    side_offset = jnp.where(n < 0, buckets_per_side, 0)
    n = jnp.abs(n)
  else:
    side_offset = 0
    n = jnp.maximum(n, 0)
  # The clamp keeps log() finite where the exact branch is selected anyway.
  log_ratio = jnp.log(jnp.maximum(n, max_exact).astype(jnp.float32) / max_exact)
  log_bucket = max_exact + (
    log_ratio / math.log(max_distance / max_exact) * (buckets_per_side - max_exact)
  ).astype(jnp.int32)
  log_bucket = jnp.minimum(log_bucket, buckets_per_side - 1)
  return (side_offset + jnp.where(n < max_exact, n, log_bucket)).astype(jnp.int32)


def last_bucket_start(*, num_buckets=32, max_distance=128):
  """The smallest distance a causal query puts in its last bucket: every key
  that far back or further shares that bucket's bias
  (`relative_position_bucket` with bidirectional=False), e.g. 113 for 32
  buckets and max distance 128, 31 for max distance 32.

  Returns:
    a python int in [1, max_distance].
  """
  _check_positive_int("max_distance", max_distance)
  distance_D = np.arange(max_distance + 1)  # max_distance itself is in the last bucket
  # Concrete even where a traced function asks (a bias computed under jit).
  with jax.ensure_compile_time_eval():
    bucket_D = np.asarray(
      relative_position_bucket(
        -distance_D, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
      )
    )
  return int(distance_D[bucket_D == num_buckets - 1].min())


def relative_position_bias(
  table, q_positions, k_positions, *, bidirectional=True, max_distance=128
):
  """T5 relative attention bias: a learned scalar per (bucket, head).

  Args:
    table: float `[num_buckets, H]`, held by the calling layer.
    q_positions: int `[T]` or `[B, T]`.
    k_positions: int `[S]` or `[B, S]`.
    bidirectional: passed to `relative_position_bucket`.
    max_distance: passed to `relative_position_bucket`.

  Returns:
    float32 `[1, H, T, S]`, or `[B, H, T, S]` when either positions is batched.
  """
  table = jnp.asarray(table)
  if table.ndim != 2:
    raise ValueError(f"table must have shape [num_buckets, H], got shape {table.shape}")
  relative_BxTxS = _relative_positions(q_positions, k_positions)
  if not jnp.issubdtype(relative_BxTxS.dtype, jnp.integer):
    raise ValueError(
      f"q_positions and k_positions must be integer, got dtype {relative_BxTxS.dtype}"
    )
  buckets_BxTxS = relative_position_bucket(
    relative_BxTxS,
    bidirectional=bidirectional,
    num_buckets=table.shape[0],
    max_distance=max_distance,
  )
  bias_BxTxSxH = jnp.take(table.astype(jnp.float32), buckets_BxTxS, axis=0)
  return jnp.transpose(bias_BxTxSxH, (0, 3, 1, 2))
