"""A decoding step's self-attention over its KV cache, and the cache's
update, in one GPU kernel (Pallas, lowered to Triton): what each
self-attention layer runs per generated token on one GPU
(`txf.layers.attention` under use_cache, where `applies` says so).

One kernel instance per batch row and key/value head writes the new key
and value into the cache at `index` (in place: the caches are the kernel's
outputs, aliased to its inputs) and attends the G query heads that share
them (G = H // K) over the slots before `index` (within the window) and
the new one: an online softmax over blocks of cache slots (the running
maximum, normaliser and weighted sum of Milakov & Gimelshein 2018, as in
`ops.attention`'s chunked path), ending at `index`. So a step reads the
slots it attends and no more, and the new key and value come from the
inputs, never read back from the cache they are written to. Multi-head
self-attention may give them as one product with their biases
(`update_and_attend_packed`): the kernel reads q, k and v where they lie
and adds the biases, which XLA would do in a kernel of its own. At one row
(batch 1), a Pre-LN block's self-attention hands the kernel its residual
stream instead (`normalize_project_and_attend`): each instance computes the
norm and its head's query, key and value too, which XLA's norm and product
before the kernel would launch a kernel for.

XLA compiles the same step as 8 to 10 kernels a layer (gpt2_small for an
H100): the cache's two updates (one per array), the scores, their maximum,
their sum, the weighted values' sum over the slots (its product a kernel of
its own), and the passes of `ops.attention`'s non-finite checks, reading
every slot of the cache, masked or not (docs/benchmarks.md, "Decoding").

Numerics, as `ops.dot_product_attention`'s 'xla' path up to float32
rounding: scores q.k in float32 times the scale, a float32 softmax, float32
sums of the weighted values, the output in q's dtype; a key or value that
is non-finite contributes only where attended (a NaN or inf key a query
attends, or a value it gives nonzero weight, makes its output row NaN; as
on the chunked path the weight is the one before the final normalisation).
The weights are not rounded to the values' dtype before the product (the
'xla' path rounds them), so a bfloat16 output can differ from the 'xla'
path's by a unit in its last place.

The block size (slots per step of the walk) is chosen so that a block's
G x block x D products fit the registers of the default 4 warps; neither it
nor the warp count is tuned on a GPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

# Whether this jax can lower the kernel (the layer uses XLA's passes where
# not): it needs jaxlib's Triton bindings, and txf imports without them.
try:
  from jax.experimental.pallas import triton as plgpu

  AVAILABLE = True
except ImportError:
  AVAILABLE = False

__all__ = [
  "AVAILABLE",
  "applies",
  "applies_to_cross",
  "attend",
  "normalize_project_and_attend",
  "packs",
  "update_and_attend",
  "update_and_attend_packed",
]

_NUM_WARPS = 4
# Products q * k of one block held at once: G * block * D of them.
_BLOCK_ELEMENTS = 8192
_MIN_BLOCK, _MAX_BLOCK = 16, 256
# normalize_project_and_attend: the elements of each kernel's block of rows
# one instance loads at once (3 x 8 KiB of bfloat16 in flight), and its
# warps: at 8 warps Triton's code for an H100 spills no register (ptxas;
# at 4 it spills: docs/benchmarks.md). The block size is untuned.
_PRODUCT_ELEMENTS = 4096
_NORMALIZED_NUM_WARPS = 8


def _is_power_of_2(n: int) -> bool:
  return n >= 1 and not n & (n - 1)


def applies(q_BxTxHxD, k_cache_BxLxKxD, v_cache_BxLxKxDv) -> bool:
  """Whether the kernel can take these shapes: one new token (T = 1) a row
  of the caches, and the head dims and the query heads per key/value head
  (G) powers of 2 (Triton's blocks are)."""
  return _heads_fit(q_BxTxHxD, k_cache_BxLxKxD, v_cache_BxLxKxDv) and (
    q_BxTxHxD.shape[0] == k_cache_BxLxKxD.shape[0] == v_cache_BxLxKxDv.shape[0]
  )


def _heads_fit(q_BxTxHxD, k_BxLxKxD, v_BxLxKxDv) -> bool:
  """One new token (T = 1), and the head dims and the query heads per
  key/value head (G) powers of 2 (Triton's blocks are)."""
  _, q_len, heads, head_dim = q_BxTxHxD.shape
  kv_heads = k_BxLxKxD.shape[2]
  return (
    q_len == 1
    and heads % kv_heads == 0
    and _is_power_of_2(heads // kv_heads)
    and _is_power_of_2(head_dim)
    and _is_power_of_2(v_BxLxKxDv.shape[-1])
  )


def _block_size(groups: int, head_dim: int) -> int:
  block = _BLOCK_ELEMENTS // (groups * head_dim)
  block = 1 << (max(block, 1).bit_length() - 1)  # the power of 2 at most that
  return min(max(block, _MIN_BLOCK), _MAX_BLOCK)


def _any(x, axis=None):
  """jnp.any as Triton lowers it (a max over int32: Pallas lowers no
  reduce_or / reduce_and)."""
  return jnp.max(x.astype(jnp.int32), axis=axis) > 0


def _online_softmax(q_GxD, scale):
  """The online softmax's initial state and its step over N slots: each
  query row's (running max, normaliser, weighted sum of values, poisoned)."""
  groups = q_GxD.shape[0]
  minus_inf = jnp.float32(-jnp.inf)

  def start(value_dim):
    return (
      jnp.full((groups,), minus_inf, jnp.float32),
      jnp.zeros((groups,), jnp.float32),
      jnp.zeros((groups, value_dim), jnp.float32),
      jnp.zeros((groups,), jnp.bool_),
    )

  def step(carry, k_NxD, v_NxDv, valid_N):
    top_G, total_G, acc_GxDv, poisoned_G = carry
    k_NxD, v_NxDv = k_NxD.astype(jnp.float32), v_NxDv.astype(jnp.float32)
    finite_k_NxD, finite_v_NxDv = jnp.isfinite(k_NxD), jnp.isfinite(v_NxDv)
    # As the 'xla' path: non-finite keys and values enter as 0, and an
    # attended one makes its rows NaN at the end.
    k_NxD = jnp.where(finite_k_NxD, k_NxD, 0.0)
    v_NxDv = jnp.where(finite_v_NxDv, v_NxDv, 0.0)
    bad_k_N = valid_N & _any(~finite_k_NxD, axis=-1)
    bad_v_N = _any(~finite_v_NxDv, axis=-1)
    scores_GxN = jnp.sum(q_GxD[:, None, :] * k_NxD[None, :, :], axis=-1) * scale
    scores_GxN = jnp.where(valid_N[None, :], scores_GxN, minus_inf)
    new_top_G = jnp.maximum(top_G, jnp.max(scores_GxN, axis=-1))
    # A row with no valid slot yet keeps -inf and is referenced to 0.
    reference_G = jnp.where(new_top_G > minus_inf, new_top_G, 0.0)
    rescale_G = jnp.exp(top_G - reference_G)
    p_GxN = jnp.exp(scores_GxN - reference_G[:, None])
    total_G = rescale_G * total_G + jnp.sum(p_GxN, axis=-1)
    acc_GxDv = rescale_G[:, None] * acc_GxDv + jnp.sum(
      p_GxN[:, :, None] * v_NxDv[None, :, :], axis=1
    )
    poisoned_G = poisoned_G | _any(bad_k_N) | _any(bad_v_N[None, :] & (p_GxN != 0.0), axis=-1)
    return new_top_G, total_G, acc_GxDv, poisoned_G

  return start, step


def _walk(step, carry, k_ref, v_ref, row, head, first, end, block, valid=None):
  """`step` over slots [first, end) of row `row`, head `head` of the caches
  [B, L, K, D|Dv], a block at a time; valid(slots) further masks slots."""
  head_dim, value_dim = k_ref.shape[3], v_ref.shape[3]
  first_block = first // block

  def one_block(i, carry):
    start = (first_block + i) * block
    slots_N = start + jnp.arange(block)
    valid_N = (slots_N >= first) & (slots_N < end)
    if valid is not None:
      valid_N = valid_N & valid(slots_N, valid_N)
    k_NxD = plgpu.load(
      k_ref.at[row, pl.ds(start, block), head, :],
      mask=jnp.broadcast_to(valid_N[:, None], (block, head_dim)),
      other=0.0,
    )
    v_NxDv = plgpu.load(
      v_ref.at[row, pl.ds(start, block), head, :],
      mask=jnp.broadcast_to(valid_N[:, None], (block, value_dim)),
      other=0.0,
    )
    return step(carry, k_NxD, v_NxDv, valid_N)

  return jax.lax.fori_loop(0, pl.cdiv(end, block) - first_block, one_block, carry)


def _output(carry, out_ref, row, heads):
  """The rows' outputs, normalised (0 where no slot was valid, NaN where
  poisoned), into out_ref[row, 0, heads]."""
  _, total_G, acc_GxDv, poisoned_G = carry
  out_GxDv = acc_GxDv / jnp.where(total_G > 0, total_G, 1.0)[:, None]
  out_GxDv = jnp.where(poisoned_G[:, None], jnp.nan, out_GxDv)
  out_ref[row, 0, heads, :] = out_GxDv.astype(out_ref.dtype)


def _update_kernel(
  index_ref,
  q_ref,
  k_new_ref,
  v_new_ref,
  *refs,
  groups: int,
  block: int,
  scale: float,
  window: int | None,
  packed: bool,
  biased: bool,
):
  """Batch row pl.program_id(0), key/value head pl.program_id(1): refs are
  the whole arrays (q, out [B, 1, H, D|Dv], new keys/values [B, 1, K, D|Dv],
  caches [B, L, K, D|Dv], index a scalar); `packed`: q, k_new and v_new
  are one array [B, 3, H, D], the query, key and value at 0, 1 and 2, and
  `biased`: their biases ([H, D] each, any float dtype) are rounded to
  their dtype and added as they are read, rounded again (as XLA's add of
  the two in that dtype)."""
  bias_refs = refs[:3] if biased else None
  row, head = pl.program_id(0), pl.program_id(1)
  k_at, v_at = (1, 2) if packed else (0, 0)

  def biased_by(x, part, heads):
    return x if bias_refs is None else _plus_bias(x, bias_refs[part], heads)

  heads = pl.ds(head * groups, groups)
  _attend_and_write(
    index_ref,
    biased_by(q_ref[row, 0, heads, :], 0, heads),
    # The new key and value, from the inputs (always attended: window >= 1).
    biased_by(k_new_ref[row, pl.ds(k_at, 1), head, :], 1, pl.ds(head, 1)),
    biased_by(v_new_ref[row, pl.ds(v_at, 1), head, :], 2, pl.ds(head, 1)),
    *refs[-3:],
    block=block,
    scale=scale,
    window=window,
  )


def _plus_bias(x, bias_ref, heads):
  """x + bias_ref[heads] in x's dtype: the bias rounded to it, the sum
  rounded (XLA's add of the two in that dtype)."""
  bias = bias_ref[heads, :].astype(x.dtype).astype(jnp.float32)
  return (x.astype(jnp.float32) + bias).astype(x.dtype)


def _attend_and_write(
  index_ref,
  q_GxD,
  k_new_1xD,
  v_new_1xDv,
  out_ref,
  k_cache_ref,
  v_cache_ref,
  *,
  block,
  scale,
  window,
):
  """This instance's G queries (batch row pl.program_id(0), key/value head
  pl.program_id(1)) attended over the cache's slots before `index` (within
  the window) and the new key and value, into out_ref [B, 1, H, Dv]; the
  new key and value written at slot `index` of the caches [B, L, K, D|Dv]
  (whose inputs are the same buffers)."""
  row, head = pl.program_id(0), pl.program_id(1)
  groups = q_GxD.shape[0]
  position = index_ref[...]
  # dynamic_update_slice's clamp, which the XLA path's update applies.
  slot = jnp.clip(position, 0, k_cache_ref.shape[1] - 1)
  start, step = _online_softmax(q_GxD.astype(jnp.float32), scale)
  first = 0 if window is None else jnp.maximum(position + 1 - window, 0)
  carry = _walk(
    step, start(v_cache_ref.shape[3]), k_cache_ref, v_cache_ref, row, head, first, slot, block
  )
  carry = step(carry, k_new_1xD, v_new_1xDv, jnp.ones((1,), jnp.bool_))
  _output(carry, out_ref, row, pl.ds(head * groups, groups))
  k_cache_ref[row, pl.ds(slot, 1), head, :] = k_new_1xD.astype(k_cache_ref.dtype)
  v_cache_ref[row, pl.ds(slot, 1), head, :] = v_new_1xDv.astype(v_cache_ref.dtype)


def _normalize_project_kernel(
  index_ref,
  x_ref,
  norm_scale_ref,
  *refs,
  eps: float,
  center: bool,
  biased: bool,
  block_d: int,
  block: int,
  scale: float,
  window: int | None,
):
  """Batch row pl.program_id(0), head pl.program_id(1) of multi-head
  self-attention: the row's norm of x [B, D] (LayerNorm where `center`,
  with its bias [D] the first of refs; RMSNorm otherwise; scale [D]),
  rounded to x's dtype, times this head's columns of the query, key and
  value kernels [D, H * Dh] (float32 sums rounded to x's dtype, then the
  biases [H, Dh] where `biased`, as `_update_kernel` adds them), attended
  and written as `_update_kernel` does."""
  norm_bias_ref, refs = (refs[0], refs[1:]) if center else (None, refs)
  kernel_refs, refs = refs[:3], refs[3:]
  bias_refs, refs = (refs[:3], refs[3:]) if biased else (None, refs)
  out_ref = refs[-3]
  row, head = pl.program_id(0), pl.program_id(1)
  features = x_ref.shape[1]
  head_dim = out_ref.shape[3]
  blocks = pl.cdiv(features, block_d)

  def load(ref, i, *index):
    cols_N = i * block_d + jnp.arange(block_d)
    ok_N = cols_N < features
    return plgpu.load(ref.at[(*index, cols_N)], mask=ok_N, other=0.0).astype(jnp.float32), ok_N

  # ops.norms' statistics: sums of terms already divided by D, the variance
  # two-pass (its mean-square for RMSNorm); in float32.
  inverse_d = 1.0 / features
  mean = None
  if center:
    mean = jax.lax.fori_loop(
      0, blocks, lambda i, total: total + jnp.sum(load(x_ref, i, row)[0] * inverse_d), 0.0
    )

  def squares(i, total):
    x_N, ok_N = load(x_ref, i, row)
    deviation_N = jnp.where(ok_N, x_N if mean is None else x_N - mean, 0.0)
    return total + jnp.sum(jnp.square(deviation_N) * inverse_d)

  rstd = jax.lax.rsqrt(jax.lax.fori_loop(0, blocks, squares, 0.0) + eps)
  cols_H = head * head_dim + jnp.arange(head_dim)

  def products(i, sums):
    x_N, ok_N = load(x_ref, i, row)
    y_N = (x_N if mean is None else x_N - mean) * rstd * load(norm_scale_ref, i)[0]
    if norm_bias_ref is not None:
      y_N = y_N + load(norm_bias_ref, i)[0]
    # The norm's output in x's dtype, as the norm returns it to the product.
    y_N = jnp.where(ok_N, y_N.astype(x_ref.dtype).astype(jnp.float32), 0.0)
    rows_N = i * block_d + jnp.arange(block_d)
    w = lambda ref: plgpu.load(
      ref.at[rows_N[:, None], cols_H[None, :]], mask=ok_N[:, None], other=0.0
    ).astype(jnp.float32)
    # Summed over the block's rows at once: the registers then hold one
    # block of the three kernels, as large as they allow (the bytes one
    # instance has in flight set how fast it reads the weights).
    return tuple(
      sum_H + jnp.sum(y_N[:, None] * w(ref), axis=0) for sum_H, ref in zip(sums, kernel_refs)
    )

  zeros = jnp.zeros((head_dim,), jnp.float32)
  sums = jax.lax.fori_loop(0, blocks, products, (zeros,) * 3)
  q_k_v = [sum_H[None, :].astype(x_ref.dtype) for sum_H in sums]
  if bias_refs is not None:
    q_k_v = [_plus_bias(x, ref, pl.ds(head, 1)) for x, ref in zip(q_k_v, bias_refs)]
  _attend_and_write(index_ref, *q_k_v, *refs[-3:], block=block, scale=scale, window=window)


def _cross_kernel(q_ref, k_ref, v_ref, mask_ref, out_ref, *, groups, block, scale, rows_per_kv_row):
  """Batch row pl.program_id(0), key/value head pl.program_id(1): q, out
  [B, 1, H, D|Dv]; keys, values [B_kv, S, K, D|Dv] and their mask [B_kv, S]
  (True: attended), B = rows_per_kv_row * B_kv."""
  row, head = pl.program_id(0), pl.program_id(1)
  kv_row = row // rows_per_kv_row
  heads = pl.ds(head * groups, groups)
  start, step = _online_softmax(q_ref[row, 0, heads, :].astype(jnp.float32), scale)

  def valid(slots_N, in_range_N):
    return plgpu.load(mask_ref.at[kv_row, slots_N], mask=in_range_N, other=False)

  carry = _walk(
    step, start(v_ref.shape[3]), k_ref, v_ref, kv_row, head, 0, k_ref.shape[1], block, valid
  )
  _output(carry, out_ref, row, heads)


def update_and_attend(
  q_BxTxHxD,
  k_new_BxTxKxD,
  v_new_BxTxKxDv,
  k_cache_BxLxKxD,
  v_cache_BxLxKxDv,
  index,
  *,
  scale: float | None = None,
  window: int | None = None,
  block: int | None = None,
  num_warps: int = _NUM_WARPS,
  interpret: bool = False,
):
  """Writes one new key and value per row at slot `index` of the caches and
  attends each query (at position `index`) over the slots up to it.

  The same as `jax.lax.dynamic_update_slice` of the caches at (0, index,
  0, 0) followed by `ops.dot_product_attention(q, k_cache, v_cache,
  mask=causal_mask(1, L, q_offset=index) [& sliding_window_mask(...)])`,
  up to float32 rounding (module docstring).

  Args:
    q_BxTxHxD: queries, T = 1.
    k_new_BxTxKxD, v_new_BxTxKxDv: the new token's keys and values.
    k_cache_BxLxKxD, v_cache_BxLxKxDv: the caches; H % K == 0 (G = H // K,
      a power of 2, as D and Dv: `applies`).
    index: int scalar in [0, L), the new token's slot (and position).
    scale: multiplier of q.k; None: 1 / sqrt(D).
    window: keys at most `window - 1` positions before the query (>= 1);
      None: all.
    block: cache slots per step of the walk, a power of 2 (None: as many
      as G x block x D <= 8,192 products allow, 16 to 256).
    num_warps: Triton warps per instance.
    interpret: run in Pallas's interpreter (any backend: the tests' way to
      check the kernel without a GPU).

  Returns:
    (out [B, 1, H, Dv] in q's dtype, k_cache, v_cache updated).

  Raises:
    ValueError: shapes the kernel cannot take (`applies`), or a block or
      warp count that is no power of 2.
  """
  _check_launch(block, num_warps)
  if not applies(q_BxTxHxD, k_cache_BxLxKxD, v_cache_BxLxKxDv):
    raise ValueError(
      "update_and_attend takes one new token (T = 1) a row of the caches and powers of 2 "
      f"for the head dims and the query heads per key/value head, got q {q_BxTxHxD.shape}, "
      f"k_cache {k_cache_BxLxKxD.shape}, v_cache {v_cache_BxLxKxDv.shape}"
    )
  return _update_call(
    (
      q_BxTxHxD,
      k_new_BxTxKxD.astype(k_cache_BxLxKxD.dtype),
      v_new_BxTxKxDv.astype(v_cache_BxLxKxDv.dtype),
    ),
    (),
    k_cache_BxLxKxD,
    v_cache_BxLxKxDv,
    index,
    packed=False,
    scale=scale,
    window=window,
    block=block,
    num_warps=num_warps,
    interpret=interpret,
  )


def packs(qkv_BxTxPxNxD, k_cache_BxLxKxD, v_cache_BxLxKxDv) -> bool:
  """Whether `update_and_attend_packed` can take a product of queries, keys
  and values stacked (P = 3) with as many query as key/value heads, in the
  caches' dtype, and the shapes `applies` takes."""
  _, _, parts, heads, _ = qkv_BxTxPxNxD.shape
  return (
    parts == 3
    and heads == k_cache_BxLxKxD.shape[2]
    and qkv_BxTxPxNxD.dtype == k_cache_BxLxKxD.dtype == v_cache_BxLxKxDv.dtype
    and qkv_BxTxPxNxD.shape[-1] == v_cache_BxLxKxDv.shape[-1]
    and applies(
      jax.ShapeDtypeStruct(qkv_BxTxPxNxD.shape[:2] + qkv_BxTxPxNxD.shape[3:], qkv_BxTxPxNxD.dtype),
      k_cache_BxLxKxD,
      v_cache_BxLxKxDv,
    )
  )


def update_and_attend_packed(
  qkv_BxTx3xHxD,
  k_cache_BxLxHxD,
  v_cache_BxLxHxD,
  index,
  *,
  biases=(),
  scale: float | None = None,
  window: int | None = None,
  block: int | None = None,
  num_warps: int = _NUM_WARPS,
  interpret: bool = False,
):
  """`update_and_attend` of the query, key and value stacked in one array
  (one product of multi-head self-attention: `qkv[:, :, 0]`, `[:, :, 1]`,
  `[:, :, 2]`), which the kernel reads where they are, adding `biases`
  (the three [H, D] biases, as stored: rounded to qkv's dtype in the
  kernel; none: no bias). Added and split by XLA, they would be a kernel
  of their own (and the biases' stack another, every token).

  Raises:
    ValueError: shapes `packs` refuses, or `update_and_attend`'s errors.
  """
  _check_launch(block, num_warps)
  if not packs(qkv_BxTx3xHxD, k_cache_BxLxHxD, v_cache_BxLxHxD) or (
    len(biases) not in (0, 3) or any(b.shape != qkv_BxTx3xHxD.shape[3:] for b in biases)
  ):
    raise ValueError(
      "update_and_attend_packed takes one new token's query, key and value [B, 1, 3, H, D] "
      "as update_and_attend takes them apart, in the caches' dtype, got qkv "
      f"{qkv_BxTx3xHxD.shape} {qkv_BxTx3xHxD.dtype}, k_cache {k_cache_BxLxHxD.shape} "
      f"{k_cache_BxLxHxD.dtype}, biases {[b.shape for b in biases]}"
    )
  batch, _, _, heads, head_dim = qkv_BxTx3xHxD.shape
  # [B, 3, H, D]: T = 1 folded away, so that the query sits at [b, 0] as
  # update_and_attend's [b, 0] of q and the key and value at [b, 1], [b, 2].
  qkv_Bx3xHxD = qkv_BxTx3xHxD.reshape(batch, 3, heads, head_dim)
  return _update_call(
    (qkv_Bx3xHxD,) * 3,
    tuple(biases),
    k_cache_BxLxHxD,
    v_cache_BxLxHxD,
    index,
    packed=True,
    scale=scale,
    window=window,
    block=block,
    num_warps=num_warps,
    interpret=interpret,
  )


def normalize_project_and_attend(
  x_BxD,
  norm_scale_D,
  norm_bias_D,
  kernels,
  k_cache_BxLxHxD,
  v_cache_BxLxHxD,
  index,
  *,
  eps: float,
  biases=(),
  scale: float | None = None,
  window: int | None = None,
  block: int | None = None,
  num_warps: int = _NORMALIZED_NUM_WARPS,
  interpret: bool = False,
):
  """`update_and_attend_packed` of the query, key and value a Pre-LN block's
  multi-head self-attention makes of its residual stream x, made in the
  kernel: each instance (a row, a head) normalises its row of x as
  `ops.layer_norm` (or `ops.rms_norm`: no norm bias) does, rounds the norm
  to x's dtype and multiplies it by its head's columns of the three kernels
  (float32 sums, rounded to x's dtype), then adds the biases and attends as
  `update_and_attend_packed` does. XLA's norm and product before the
  kernel are a kernel of their own. Each instance reads its head's columns
  of the kernels, so the weights are read by B * H instances, H at batch 1,
  where XLA's product spreads them over the whole GPU: whether that is
  faster only a GPU can tell (docs/benchmarks.md, "Decoding").

  Args:
    x_BxD: one new token's residual stream, in the caches' dtype.
    norm_scale_D, norm_bias_D: the norm's scale and bias (float32 as
      stored); norm_bias_D None: RMSNorm.
    kernels: the query, key and value kernels [D, H * Dh], in x's dtype.
    k_cache_BxLxHxD, v_cache_BxLxHxD: the caches, as `update_and_attend`'s.
    index: as `update_and_attend`'s.
    eps: the norm's epsilon.
    biases: the query, key and value biases [H, Dh] as stored, or none.
    scale, window, block, num_warps, interpret: as `update_and_attend`'s.

  Returns:
    (out [B, 1, H, Dh] in x's dtype, k_cache, v_cache updated).

  Raises:
    ValueError: operands of other shapes or dtypes, or the shapes
      `packs` refuses.
  """
  _check_launch(block, num_warps)
  batch, features = x_BxD.shape if x_BxD.ndim == 2 else (0, 0)
  _, _, heads, head_dim = k_cache_BxLxHxD.shape
  stacked = jax.ShapeDtypeStruct((batch, 1, 3, heads, head_dim), x_BxD.dtype)
  norm_params = (norm_scale_D,) + (() if norm_bias_D is None else (norm_bias_D,))
  if (
    x_BxD.ndim != 2
    or not packs(stacked, k_cache_BxLxHxD, v_cache_BxLxHxD)
    or any(p.shape != (features,) for p in norm_params)
    or len(kernels) != 3
    or any(k.shape != (features, heads * head_dim) or k.dtype != x_BxD.dtype for k in kernels)
    or len(biases) not in (0, 3)
    or any(b.shape != (heads, head_dim) for b in biases)
  ):
    raise ValueError(
      "normalize_project_and_attend takes one new token's stream [B, D], the norm's "
      "parameters [D], the query, key and value kernels [D, H * Dh] in its dtype and "
      f"their biases [H, Dh], got x {x_BxD.shape} {x_BxD.dtype}, norm "
      f"{[p.shape for p in norm_params]}, kernels {[(k.shape, str(k.dtype)) for k in kernels]}, "
      f"biases {[b.shape for b in biases]}, k_cache {k_cache_BxLxHxD.shape} "
      f"{k_cache_BxLxHxD.dtype}"
    )
  kernel = functools.partial(
    _normalize_project_kernel,
    eps=float(eps),
    center=norm_bias_D is not None,
    biased=bool(biases),
    block_d=min(max(_PRODUCT_ELEMENTS // head_dim, 1), pl.next_power_of_2(features)),
    block=block or _block_size(1, head_dim),
    scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
    window=window,
  )
  operands = (*norm_params, *kernels, *biases)
  return pl.pallas_call(
    kernel,
    out_shape=(
      jax.ShapeDtypeStruct((batch, 1, heads, head_dim), x_BxD.dtype),
      jax.ShapeDtypeStruct(k_cache_BxLxHxD.shape, k_cache_BxLxHxD.dtype),
      jax.ShapeDtypeStruct(v_cache_BxLxHxD.shape, v_cache_BxLxHxD.dtype),
    ),
    grid=(batch, heads),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    # The caches are updated where they lie: no copy of them per token.
    input_output_aliases={2 + len(operands): 1, 3 + len(operands): 2},
    interpret=interpret,
    name="cache_update_and_attention_normalized",
  )(jnp.asarray(index, jnp.int32), x_BxD, *operands, k_cache_BxLxHxD, v_cache_BxLxHxD)


def _check_launch(block: int | None, num_warps: int) -> None:
  for name, value in (("block", block), ("num_warps", num_warps)):
    if value is not None and not _is_power_of_2(value):
      raise ValueError(f"{name} must be a power of 2 (Triton's), got {value}")


def _update_call(
  q_k_v,
  biases,
  k_cache_BxLxKxD,
  v_cache_BxLxKxDv,
  index,
  *,
  packed,
  scale,
  window,
  block,
  num_warps,
  interpret,
):
  """The kernel's call on (q, k_new, v_new) and their 3 biases or none
  (`_update_kernel`'s refs)."""
  q = q_k_v[0]
  batch, heads, head_dim = q.shape[0], q.shape[2], q.shape[3]
  kv_heads = k_cache_BxLxKxD.shape[2]
  groups = heads // kv_heads
  kernel = functools.partial(
    _update_kernel,
    groups=groups,
    block=block or _block_size(groups, max(head_dim, v_cache_BxLxKxDv.shape[-1])),
    scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
    window=window,
    packed=packed,
    biased=bool(biases),
  )
  out_shape = (
    jax.ShapeDtypeStruct((batch, 1, heads, v_cache_BxLxKxDv.shape[-1]), q.dtype),
    jax.ShapeDtypeStruct(k_cache_BxLxKxD.shape, k_cache_BxLxKxD.dtype),
    jax.ShapeDtypeStruct(v_cache_BxLxKxDv.shape, v_cache_BxLxKxDv.dtype),
  )
  return pl.pallas_call(
    kernel,
    out_shape=out_shape,
    grid=(batch, kv_heads),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    # The caches are updated where they lie: no copy of them per token.
    input_output_aliases={4 + len(biases): 1, 5 + len(biases): 2},
    interpret=interpret,
    name="cache_update_and_attention" + ("_packed" if packed else ""),
  )(jnp.asarray(index, jnp.int32), *q_k_v, *biases, k_cache_BxLxKxD, v_cache_BxLxKxDv)


def applies_to_cross(q_BxTxHxD, k_BxSxKxD, v_BxSxKxDv) -> bool:
  """Whether `attend` can take these shapes: `applies`' conditions, but the
  query rows a multiple of the key/value rows."""
  kv_rows = k_BxSxKxD.shape[0]
  return (
    _heads_fit(q_BxTxHxD, k_BxSxKxD, v_BxSxKxDv)
    and kv_rows == v_BxSxKxDv.shape[0]
    and q_BxTxHxD.shape[0] % kv_rows == 0
  )


def attend(
  q_BxTxHxD,
  k_BxSxKxD,
  v_BxSxKxDv,
  mask_Bx1x1xS,
  *,
  scale: float | None = None,
  block: int | None = None,
  num_warps: int = _NUM_WARPS,
  interpret: bool = False,
):
  """A decoding step's cross-attention over keys and values computed once
  (an encoder-decoder's, kept in its cache): each query attends the keys its
  mask allows, as `ops.dot_product_attention(q, k, v, mask=mask)` up to
  float32 rounding (module docstring; a query no key is allowed gets 0).

  Args:
    q_BxTxHxD: queries, T = 1.
    k_BxSxKxD, v_BxSxKxDv: keys and values; B_kv rows, of which query rows
      b * G_r .. b * G_r + G_r - 1 share row b (B = G_r * B_kv: beam search's
      beams of one example).
    mask_Bx1x1xS: bool, True where a key may be attended (B_kv rows).
    scale, block, num_warps, interpret: as `update_and_attend`'s.

  Returns:
    [B, 1, H, Dv] in q's dtype.

  Raises:
    ValueError: shapes the kernel cannot take (`applies_to_cross`), or a
      block or warp count that is no power of 2.
  """
  _check_launch(block, num_warps)
  if not applies_to_cross(q_BxTxHxD, k_BxSxKxD, v_BxSxKxDv):
    raise ValueError(
      "attend takes one query token (T = 1), powers of 2 for the head dims and the query "
      "heads per key/value head, and query rows a multiple of the key rows, got q "
      f"{q_BxTxHxD.shape}, k {k_BxSxKxD.shape}, v {v_BxSxKxDv.shape}"
    )
  batch, _, heads, head_dim = q_BxTxHxD.shape
  kv_batch, keys, kv_heads, _ = k_BxSxKxD.shape
  groups = heads // kv_heads
  kernel = functools.partial(
    _cross_kernel,
    groups=groups,
    block=block or _block_size(groups, max(head_dim, v_BxSxKxDv.shape[-1])),
    scale=1.0 / math.sqrt(head_dim) if scale is None else float(scale),
    rows_per_kv_row=batch // kv_batch,
  )
  return pl.pallas_call(
    kernel,
    out_shape=jax.ShapeDtypeStruct((batch, 1, heads, v_BxSxKxDv.shape[-1]), q_BxTxHxD.dtype),
    grid=(batch, kv_heads),
    compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=1),
    interpret=interpret,
    name="cross_attention_step",
  )(
    q_BxTxHxD,
    k_BxSxKxD,
    v_BxSxKxDv,
    jnp.broadcast_to(mask_Bx1x1xS, (kv_batch, 1, 1, keys)).reshape(kv_batch, keys),
  )
