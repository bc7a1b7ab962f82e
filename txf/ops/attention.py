"""Scaled dot-product attention (pure jnp, no state).

For every batch row b, query head h and query position t::

    weights[b, h, t, :] = softmax_s( scale * q[b, t, h, :] . k[b, s, h // G, :]
                                     + bias[b, h, t, s] ; masked )
    out[b, t, h, :]     = sum_s weights[b, h, t, s] * v[b, s, h // G, :]

(Vaswani et al. 2017, "Attention Is All You Need", eq. 1), with
``scale = 1 / sqrt(D)`` by default and ``G = H // K`` query heads sharing each
key/value head (K == H: multi-head, 1 < K < H: grouped-query, K == 1:
multi-query attention). "masked" means that keys a query may not attend get
weight exactly 0; a query that may attend no key at all gets all-zero weights
and a zero output (never NaN, never a uniform average).

Non-finite inputs (XLA path): a key a query may not attend never contributes
to that query's output, even if its k or v holds NaN or inf (masked scores are
replaced before the softmax, and a value with weight exactly 0 is skipped, not
multiplied by 0). A query that gives nonzero weight to a value vector holding
a NaN or inf gets NaN in its whole output row. This holds for every mask
source (``mask``, ``is_causal``, ``window``, ``kv_lengths``) and for weights
passed to :func:`apply_attention_weights`. The cuDNN path only guarantees it
for keys past ``kv_lengths`` (see :func:`dot_product_attention`).

Shapes (letters used throughout):
  q ``[B, T, H, D]``, k ``[B, S, K, D]``, v ``[B, S, K, Dv]``;
  B batch, T query length, S key length, H query heads, K key/value heads,
  G = H // K, D query/key head dim, Dv value head dim (C: keys per block
  of the chunked path).
  mask: bool, broadcastable to ``[B, H, T, S]``, True = may attend.
  bias: float, broadcastable to ``[B, H, T, S]``, added to the scaled scores.

The mask sources ``mask``, ``is_causal``, ``window`` and ``kv_lengths`` are
ANDed. q, k, v (and weights) must be floating point; scores and the softmax
are computed in float32 whatever the input dtype. All shape and dtype checks
happen at trace time and raise ValueError.

Memory: the 'xla' path materialises the ``[B, H, T, S]`` scores and weights,
so its memory grows as T * S. The 'chunked' path (:func:`dot_product_attention`,
``implementation='chunked'``) never holds more than ``chunk_size`` keys' scores
per query: it scans over key blocks keeping a running maximum, normaliser and
weighted sum per query (the online softmax of Milakov & Gimelshein 2018, as in
Rabe & Staats 2021, "Self-attention does not need O(n^2) memory", and
FlashAttention), so its memory grows as T * chunk_size, forward and backward.
It runs on any backend (the long-context path on CPU) and gives the same
numbers as 'xla' up to float32 rounding.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from txf.ops import masks as _masks, platform

__all__ = ["apply_attention_weights", "attention_weights", "dot_product_attention"]

IMPLEMENTATIONS = (None, "xla", "cudnn", "chunked")
# Keys per block of the 'chunked' path when no chunk_size is given.
DEFAULT_CHUNK_SIZE = 512
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


# ----------------------------------------------------------------------------
# Validation (trace time; all shapes are static).


def _check_window(window):
  return None if window is None else _masks.check_window(window)


def _check_float(**arrays):
  """ValueError naming the first non-float array (an int q would truncate the output)."""
  for name, x in arrays.items():
    if x is not None and not jnp.issubdtype(x.dtype, jnp.floating):
      raise ValueError(f"{name} must be a floating-point array, got dtype {x.dtype}")


def _check_broadcastable(name, x, target):
  shape = tuple(x.shape)
  ok = len(shape) <= 4
  if ok:
    try:
      ok = np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
      ok = False
  if not ok:
    raise ValueError(
      f"{name} of shape {shape} is not broadcastable to [B, H, T, S] = {list(target)}"
    )


def _check_flags(is_causal, scale):
  """ValueError naming is_causal unless a python bool, or scale unless a scalar.

  is_causal picks the mask's program at trace time (a traced flag cannot), and
  scale multiplies every score alike (a per-head scale would broadcast against
  the wrong axis of the grouped scores).
  """
  if not isinstance(is_causal, (bool, np.bool_)):
    raise ValueError(f"is_causal must be a python bool, got {is_causal!r}")
  if scale is None:
    return
  shape = np.shape(scale)
  dtype = getattr(scale, "dtype", None)
  numeric = dtype is not None or isinstance(scale, (int, float, np.number))
  if isinstance(scale, bool) or not numeric or shape != ():
    given = f"an array of shape {shape}" if dtype is not None else repr(scale)
    raise ValueError(f"scale must be a number or a 0-d array, got {given}")


def _validate(q, k, v, bias, mask, kv_lengths, window, is_causal=False, scale=None):
  """Checks shapes/dtypes; returns (bias, mask, kv_lengths, window) as arrays/ints."""
  _check_flags(is_causal, scale)
  for name, x, layout in (
    ("q", q, "[B, T, H, D]"),
    ("k", k, "[B, S, K, D]"),
    ("v", v, "[B, S, K, Dv]"),
  ):
    if x is not None and x.ndim != 4:
      raise ValueError(f"{name} must have rank 4 {layout}, got shape {x.shape}")
  _check_float(q=q, k=k, v=v)
  B, T, H, D = q.shape
  _, S, K, Dk = k.shape
  if k.shape[0] != B or (v is not None and v.shape[0] != B):
    vs = "" if v is None else f", v {v.shape}"
    raise ValueError(f"batch sizes of q, k, v differ: q {q.shape}, k {k.shape}{vs}")
  if v is not None and v.shape[1] != S:
    raise ValueError(
      f"k and v lengths differ: k {k.shape} has S={S}, v {v.shape} has S={v.shape[1]}"
    )
  if v is not None and v.shape[2] != K:
    raise ValueError(
      f"k and v head counts differ: k {k.shape} has K={K}, v {v.shape} has K={v.shape[2]}"
    )
  if K == 0 or H % K:
    raise ValueError(
      f"query heads H={H} (q {q.shape}) must be a multiple of key/value heads K={K} (k {k.shape})"
    )
  if Dk != D:
    raise ValueError(f"q and k head dims differ: q {q.shape} has D={D}, k {k.shape} has D={Dk}")
  target = (B, H, T, S)
  if bias is not None:
    bias = jnp.asarray(bias)
    if not jnp.issubdtype(bias.dtype, jnp.floating):
      raise ValueError(
        f"bias must be a float array (additive), got dtype {bias.dtype}; "
        "pass boolean masks as mask="
      )
    _check_broadcastable("bias", bias, target)
  if mask is not None:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
      raise ValueError(
        f"mask must be boolean (True = may attend), got dtype "
        f"{mask.dtype} with shape {mask.shape}; pass additive "
        "masks as bias="
      )
    _check_broadcastable("mask", mask, target)
  if kv_lengths is not None:
    kv_lengths = jnp.asarray(kv_lengths)
    if kv_lengths.shape != (B,) or not jnp.issubdtype(kv_lengths.dtype, jnp.integer):
      raise ValueError(
        f"kv_lengths must be an int array of shape [B] = ({B},), got "
        f"shape {kv_lengths.shape} dtype {kv_lengths.dtype}"
      )
  window = _check_window(window)
  return bias, mask, kv_lengths, window


# ----------------------------------------------------------------------------
# XLA path.


def _combined_mask(mask, is_causal, window, kv_lengths, T, S):
  """AND of every mask source, broadcastable to [B, H, T, S]; None if there is none."""
  return _masks.combine_masks(
    mask,
    _masks.causal_mask(T, S) if is_causal else None,
    _masks.sliding_window_mask(T, S, window=window) if window is not None else None,
    (_masks.padding_mask(lengths=kv_lengths, k_len=S) if kv_lengths is not None else None),
  )


def _masked_softmax(logits, valid):
  """float32 softmax over the last axis; invalid keys get 0, rows with no valid key get 0."""
  if valid is not None:
    logits = jnp.where(valid, logits, jnp.finfo(logits.dtype).min)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  # A row whose logits are all -inf (e.g. from the bias) must not produce NaN.
  row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnorm = jnp.exp(logits - row_max)
  if valid is not None:
    unnorm = jnp.where(valid, unnorm, 0.0)
  denom = jnp.sum(unnorm, axis=-1, keepdims=True)
  return unnorm / jnp.where(denom > 0, denom, 1.0)


def _split_nonfinite(x_BxSxKxD):
  """Keys [B, S, K, D] (or values, D = Dv) with non-finite entries zeroed, and
  [B, K, 1, 1, S]: key s of head k is non-finite."""
  finite_BxSxKxD = jnp.isfinite(x_BxSxKxD)
  bad_BxKxS = jnp.transpose(~jnp.all(finite_BxSxKxD, axis=-1), (0, 2, 1))
  zeroed_BxSxKxD = jnp.where(finite_BxSxKxD, x_BxSxKxD, jnp.zeros((), x_BxSxKxD.dtype))
  return zeroed_BxSxKxD, bad_BxKxS[:, :, None, None, :]


def _grouped_queries(q, num_kv_heads):
  """[B, T, H, D] queries as [B, T, K, G, D]: query head k * G + g uses key head k."""
  B, T, H, D = q.shape
  return q.reshape(B, T, num_kv_heads, H // num_kv_heads, D)


def _scaled_scores(q_BxTxKxGxD, k_BxSxKxD, bad_BxKx1x1xS, scale):
  """float32 scale * q.k [B, K, G, T, S] (scale None: 1/sqrt(D)), NaN where a
  key is flagged non-finite in bad [B, K, 1, 1, S] (and zeroed in k)."""
  acc_dtype = jnp.promote_types(jnp.result_type(q_BxTxKxGxD, k_BxSxKxD), jnp.float32)
  logits_BxKxGxTxS = jnp.einsum(
    "btkgd,bskd->bkgts", q_BxTxKxGxD, k_BxSxKxD, preferred_element_type=acc_dtype
  )
  logits_BxKxGxTxS = jnp.where(bad_BxKx1x1xS, jnp.nan, logits_BxKxGxTxS).astype(jnp.float32)
  if scale is None:
    scale = 1.0 / math.sqrt(q_BxTxKxGxD.shape[-1])
  return logits_BxKxGxTxS * jnp.asarray(scale, jnp.float32)


def _weights(q, k, bias, mask, is_causal, scale, window, kv_lengths):
  """float32 [B, H, T, S] attention weights; inputs already validated."""
  B, T, H, _ = q.shape
  _, S, K, _ = k.shape
  # Non-finite keys enter the product as 0 and come back as NaN scores, which
  # the mask then replaces: a masked inf key poisons neither the output nor,
  # through 0 * inf in the backward pass, the gradient of q.
  k, bad_BxKx1x1xS = _split_nonfinite(k)
  logits_BxKxGxTxS = _scaled_scores(_grouped_queries(q, K), k, bad_BxKx1x1xS, scale)
  logits_BxHxTxS = logits_BxKxGxTxS.reshape(B, H, T, S)
  if bias is not None:
    logits_BxHxTxS = logits_BxHxTxS + bias.astype(jnp.float32)
  valid = _combined_mask(mask, bool(is_causal), window, kv_lengths, T, S)
  return _masked_softmax(logits_BxHxTxS, valid)


def _weighted_values(w_BxHxTxS, v, out_dtype):
  """[B, H, T, S] weights x [B, S, K, Dv] values -> [B, T, H, Dv] in out_dtype.

  Values with weight exactly 0 are skipped even when non-finite (0 * NaN would
  poison the row); a row with nonzero weight on a non-finite value is NaN.
  """
  B, H, T, S = w_BxHxTxS.shape
  _, _, K, Dv = v.shape
  G = H // K
  w_BxKxGxTxS = w_BxHxTxS.reshape(B, K, G, T, S)
  v, bad_BxKx1x1xS = _split_nonfinite(v)
  poisoned_BxKxGxT = jnp.any(bad_BxKx1x1xS & (w_BxKxGxTxS != 0), axis=-1)
  # Weights go to v's dtype for the product (bf16 matmul on accelerators);
  # the sum accumulates in at least float32.
  acc_dtype = jnp.promote_types(v.dtype, jnp.float32)
  out_BxTxKxGxDv = jnp.einsum(
    "bkgts,bskd->btkgd", w_BxKxGxTxS.astype(v.dtype), v, preferred_element_type=acc_dtype
  )
  poisoned_BxTxKxGx1 = jnp.transpose(poisoned_BxKxGxT, (0, 3, 1, 2))[..., None]
  out_BxTxKxGxDv = jnp.where(poisoned_BxTxKxGx1, jnp.nan, out_BxTxKxGxDv)
  return out_BxTxKxGxDv.reshape(B, T, H, Dv).astype(out_dtype)


def _xla_attention(q, k, v, bias, mask, is_causal, scale, window, kv_lengths):
  w_BxHxTxS = _weights(q, k, bias, mask, is_causal, scale, window, kv_lengths)
  return _weighted_values(w_BxHxTxS, v, q.dtype)


# ----------------------------------------------------------------------------
# Chunked path: online softmax over key blocks, O(T * chunk_size) memory.


def _heads_split(x4, K, G):
  """A [b, h, t, s] mask or bias (h = 1 or H = K * G) as [b, K|1, G|1, t, s]."""
  b, h, t, s = x4.shape
  return x4.reshape(b, K, G, t, s) if h > 1 else x4.reshape(b, 1, 1, t, s)


def _as_4d(x):
  return x.reshape((1,) * (4 - x.ndim) + x.shape)


def _key_blocks(x, axis, S_padded, fill):
  """`x` padded with `fill` to S_padded keys along `axis` (unless that axis has
  length 1: broadcast), and a function slicing keys [start, start + block)."""
  if x.shape[axis] == 1:
    return lambda start, block: x
  if S_padded > x.shape[axis]:
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, S_padded - x.shape[axis])
    x = jnp.pad(x, widths, constant_values=fill)
  return lambda start, block: jax.lax.dynamic_slice_in_dim(x, start, block, axis=axis)


def _chunked_attention(q, k, v, bias, mask, is_causal, scale, window, kv_lengths, chunk_size):
  """Same result as `_xla_attention`, scanning over blocks of `chunk_size` keys.

  Per query row the scan keeps m (the largest score so far), l (sum of
  exp(score - m)) and acc (sum of exp(score - m) * v); a new block rescales
  them by exp(m_old - m_new). The block's body is rematerialised in the
  backward pass, so gradients too hold one block's scores at a time.
  """
  B, T, H, _ = q.shape
  _, S, K, Dv = v.shape
  G = H // K
  block = min(chunk_size, S)
  num_blocks = -(-S // block)
  S_padded = num_blocks * block
  q_BxTxKxGxD = _grouped_queries(q, K)
  # Non-finite keys and values are zeroed and flagged, as on the xla path.
  k, bad_k_BxKx1x1xS = _split_nonfinite(k)
  v, bad_v_BxKx1x1xS = _split_nonfinite(v)
  k_blocks, v_blocks = (_key_blocks(x, 1, S_padded, 0) for x in (k, v))  # [B, S, K, D]
  bad_k_blocks, bad_v_blocks = (
    _key_blocks(bad, -1, S_padded, False)  # [B, K, 1, 1, S]
    for bad in (bad_k_BxKx1x1xS, bad_v_BxKx1x1xS)
  )
  mask_blocks = None if mask is None else _key_blocks(_as_4d(mask), -1, S_padded, False)
  bias_blocks = None if bias is None else _key_blocks(_as_4d(bias), -1, S_padded, 0.0)

  def attend_block(carry, start):
    m_BxKxGxT, l_BxKxGxT, acc_BxKxGxTxDv, poisoned_BxKxGxT = carry
    k_BxCxKxD, v_BxCxKxDv = k_blocks(start, block), v_blocks(start, block)
    logits_BxKxGxTxC = _scaled_scores(q_BxTxKxGxD, k_BxCxKxD, bad_k_blocks(start, block), scale)
    if bias_blocks is not None:
      logits_BxKxGxTxC = logits_BxKxGxTxC + _heads_split(bias_blocks(start, block), K, G).astype(
        jnp.float32
      )
    # Key j of this block sits at position start + j: the position masks are
    # the whole-sequence ones with the queries shifted by -start.
    offset = -start
    valid = _masks.combine_masks(
      None if mask_blocks is None else mask_blocks(start, block),
      _masks.causal_mask(T, block, q_offset=offset) if is_causal else None,
      (
        _masks.sliding_window_mask(T, block, window=window, q_offset=offset)
        if window is not None
        else None
      ),
      (
        _masks.padding_mask(lengths=kv_lengths - start, k_len=block)
        if kv_lengths is not None
        else None
      ),
      (
        _masks.padding_mask(lengths=jnp.reshape(S - start, (1,)), k_len=block)
        if S_padded > S
        else None
      ),
    )
    valid = None if valid is None else _heads_split(_as_4d(valid), K, G)
    masked_BxKxGxTxC = (
      logits_BxKxGxTxC if valid is None else jnp.where(valid, logits_BxKxGxTxC, -jnp.inf)
    )
    # The result does not depend on m (it cancels in acc / l), so no gradient
    # flows through it; a row with no finite score yet keeps m = -inf and is
    # referenced to 0 so that exp() stays finite.
    m_new = jax.lax.stop_gradient(jnp.maximum(m_BxKxGxT, jnp.max(masked_BxKxGxTxC, axis=-1)))
    reference = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
    rescale = jnp.exp(m_BxKxGxT - reference)
    p_BxKxGxTxC = jnp.exp(masked_BxKxGxTxC - reference[..., None])
    l_new = rescale * l_BxKxGxT + jnp.sum(p_BxKxGxTxC, axis=-1)
    acc_new = rescale[..., None] * acc_BxKxGxTxDv + jnp.einsum(
      "bkgts,bskd->bkgtd",
      p_BxKxGxTxC.astype(v.dtype),
      v_BxCxKxDv,
      preferred_element_type=jnp.promote_types(v.dtype, jnp.float32),
    )
    poisoned_new = poisoned_BxKxGxT | jnp.any(
      bad_v_blocks(start, block) & (p_BxKxGxTxC != 0), axis=-1
    )
    return (m_new, l_new, acc_new, poisoned_new), None

  init = (
    jnp.full((B, K, G, T), -jnp.inf, jnp.float32),
    jnp.zeros((B, K, G, T), jnp.float32),
    jnp.zeros((B, K, G, T, Dv), jnp.promote_types(v.dtype, jnp.float32)),
    jnp.zeros((B, K, G, T), bool),
  )
  starts = jnp.arange(num_blocks, dtype=jnp.int32) * block
  (_, l_BxKxGxT, acc_BxKxGxTxDv, poisoned_BxKxGxT), _ = jax.lax.scan(
    jax.checkpoint(attend_block), init, starts
  )
  # A row with no allowed key has l = 0 and acc = 0: output 0.
  out_BxKxGxTxDv = acc_BxKxGxTxDv / jnp.where(l_BxKxGxT > 0, l_BxKxGxT, 1.0)[..., None]
  out_BxKxGxTxDv = jnp.where(poisoned_BxKxGxT[..., None], jnp.nan, out_BxKxGxTxDv)
  return jnp.transpose(out_BxKxGxTxDv, (0, 3, 1, 2, 4)).reshape(B, T, H, Dv).astype(q.dtype)


# ----------------------------------------------------------------------------
# cuDNN path (jax.nn.dot_product_attention(implementation='cudnn')).


def _gpu_max_head_dim():
  """256 on Hopper or later (or where the GPU is unknown), 128 before (cuDNN
  flash attention limits)."""
  major = platform.gpu_compute_capability_major()
  return 128 if major is not None and major < 9 else 256


def _cudnn_problems(q, k, v, bias, mask, is_causal, window, *, auto):
  """Reasons cuDNN cannot take these inputs (empty list: it can)."""
  problems = []
  backend = platform.backend()
  if backend != "gpu":
    problems.append(f"it needs a GPU, but jax.default_backend() is '{backend}'")
  if q.dtype not in _CUDNN_DTYPES:
    problems.append(f"it needs bfloat16 or float16 inputs, got q dtype {q.dtype}")
  elif not q.dtype == k.dtype == v.dtype:
    problems.append(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
  D = q.shape[-1]
  max_d = _gpu_max_head_dim() if backend == "gpu" else 256
  if D % 8 or D > max_d:
    problems.append(f"the head dim D must be a multiple of 8 and <= {max_d}, got D={D}")
  if v.shape[-1] != D:
    problems.append(
      f"v head dim Dv={v.shape[-1]} must equal the q/k head dim D={D} "
      "(jax.nn.dot_product_attention needs k and v of one shape)"
    )
  if window is not None and window > 1 and not is_causal:
    problems.append(
      f"cuDNN takes only a causal (left) window; window={window} "
      "without is_causal=True is a two-sided band"
    )
  if auto:
    if mask is not None:
      problems.append("an explicit boolean mask was given")
    T, S = q.shape[1], k.shape[1]
    if bias is not None and (T % 2 or S % 2):
      # cuDNN's backward pass with a bias needs even lengths.
      problems.append(f"a bias with odd T={T} or S={S}")
  return problems


def _cudnn_attention(q, k, v, bias, mask, is_causal, scale, window, kv_lengths):
  B, T, H, _ = q.shape
  S = k.shape[1]

  def full_ts(x, dtype):
    # cuDNN wants 4-D bias/mask whose T and S dims are full (B and H may be 1).
    x = x.reshape((1,) * (4 - x.ndim) + x.shape)
    return jnp.broadcast_to(x, x.shape[:2] + (T, S)).astype(dtype)

  if kv_lengths is not None:
    # The kernel multiplies padded keys' values by weight 0, so a NaN there
    # would reach every row; padding is known per key, so zero it (cheap).
    keep_BxSx1x1 = (jnp.arange(S)[None, :] < kv_lengths[:, None])[:, :, None, None]
    k = jnp.where(keep_BxSx1x1, k, jnp.zeros((), k.dtype))
    v = jnp.where(keep_BxSx1x1, v, jnp.zeros((), v.dtype))
  local_window_size = None
  if window is not None:
    if window == 1:
      # Only the diagonal: causal with the same band. cuDNN applies a window
      # correctly only together with its causal mask.
      is_causal = True
    local_window_size = (window - 1, 0 if is_causal else window - 1)
  out = jax.nn.dot_product_attention(
    q,
    k,
    v,
    bias=None if bias is None else full_ts(bias, q.dtype),
    mask=None if mask is None else full_ts(mask, jnp.bool_),
    scale=scale,
    is_causal=bool(is_causal),
    key_value_seq_lengths=(None if kv_lengths is None else kv_lengths.astype(jnp.int32)),
    local_window_size=local_window_size,
    implementation="cudnn",
  )
  # cuDNN turns a boolean mask into a large negative bias, so a row with no
  # allowed key would average v uniformly; zero such rows (the documented
  # semantics). Same for rows of batch entries with kv_lengths == 0.
  keep = None
  if mask is not None:
    mask4 = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    keep = jnp.any(jnp.broadcast_to(mask4, (mask4.shape[0], H, T, S)), axis=-1)  # [b,H,T]
    keep = jnp.transpose(keep, (0, 2, 1))[..., None]  # [b,T,H,1]
  if kv_lengths is not None:
    has_keys = (kv_lengths > 0)[:, None, None, None]
    keep = has_keys if keep is None else jnp.logical_and(keep, has_keys)
  if keep is not None:
    out = jnp.where(keep, out, jnp.zeros((), out.dtype))
  return out


# ----------------------------------------------------------------------------
# Public API.


def attention_weights(
  q, k, *, bias=None, mask=None, is_causal=False, scale=None, window=None, kv_lengths=None
):
  """Softmax attention weights, float32 ``[B, H, T, S]`` (for analysis and plots).

  ``weights = softmax(scale * q.k + bias)`` over the keys allowed by every mask
  source (formula and shapes: module docstring). Each row sums to 1, except a
  row with no allowed key, which is all zeros.

  Args:
    q: ``[B, T, H, D]`` queries.
    k: ``[B, S, K, D]`` keys, ``H % K == 0`` (K < H: grouped/multi-query; the
      K heads are shared, not materialised H times).
    bias: optional float, broadcastable to ``[B, H, T, S]``; added after scaling.
    mask: optional bool, broadcastable to ``[B, H, T, S]``; True = may attend.
    is_causal: key ``j`` allowed for query ``i`` iff ``j <= i`` (top-left
      aligned, as :func:`txf.ops.masks.causal_mask` with ``q_offset=0``).
    scale: multiplier of ``q.k``; default ``1 / sqrt(D)``.
    window: optional int ``>= 1``; key ``j`` allowed iff ``|i - j| < window``
      (AND with ``is_causal`` for causal local attention).
    kv_lengths: optional int ``[B]``; only keys ``j < kv_lengths[b]`` are valid.

  Returns:
    float32 ``[B, H, T, S]``.
  """
  q, k = jnp.asarray(q), jnp.asarray(k)
  bias, mask, kv_lengths, window = _validate(
    q, k, None, bias, mask, kv_lengths, window, is_causal, scale
  )
  if k.shape[1] == 0:  # no key to attend: every row is a row with no allowed key
    return jnp.zeros((q.shape[0], q.shape[2], q.shape[1], 0), jnp.float32)
  return _weights(q, k, bias, mask, is_causal, scale, window, kv_lengths)


def apply_attention_weights(weights, v):
  """Mixes values by given weights: ``[B, H, T, S]`` x ``[B, S, K, Dv]`` -> ``[B, T, H, Dv]``.

  The second half of :func:`dot_product_attention` for callers that change
  the weights in between (attention dropout, head ablations); ``H % K == 0``
  as there. Output in v's dtype. A value with weight exactly 0 never
  contributes, even if non-finite; a row giving nonzero weight to a NaN/inf
  value is NaN.
  """
  weights, v = jnp.asarray(weights), jnp.asarray(v)
  _check_float(weights=weights, v=v)
  if weights.ndim != 4 or v.ndim != 4:
    raise ValueError(
      f"weights must be [B, H, T, S] and v [B, S, K, Dv], got weights "
      f"{weights.shape} and v {v.shape}"
    )
  B, H, _, S = weights.shape
  if v.shape[0] != B or v.shape[1] != S or H % v.shape[2]:
    raise ValueError(
      f"weights {weights.shape} do not fit v {v.shape}: need the same batch "
      f"and key length, and v heads dividing weights heads"
    )
  return _weighted_values(weights, v, v.dtype)


def dot_product_attention(
  q,
  k,
  v,
  *,
  bias=None,
  mask=None,
  is_causal=False,
  scale=None,
  window=None,
  kv_lengths=None,
  implementation=None,
  chunk_size=None,
):
  """Scaled dot-product attention, ``[B, T, H, Dv]`` in q's dtype.

  ``out = attention_weights(q, k, ...) @ v`` per head (formula and shapes:
  module docstring). A query with no allowed key gets a zero output. Keys a
  query may not attend never contribute, even when their k or v is NaN/inf
  (module docstring; for ``'cudnn'`` see below).

  Args:
    q: ``[B, T, H, D]`` queries.
    k: ``[B, S, K, D]`` keys, ``H % K == 0``.
    v: ``[B, S, K, Dv]`` values.
    bias, mask, is_causal, scale, window, kv_lengths: as in
      :func:`attention_weights`.
    implementation:
      ``'xla'``: this module's einsum path (float32 softmax; weights cast to
        v's dtype for the value product, accumulated in float32; non-finite
        k/v at masked keys never contribute).
      ``'cudnn'``: ``jax.nn.dot_product_attention(implementation='cudnn')``
        (flash attention; causal, window, kv_lengths, GQA handled by the
        kernel without materialising a ``[T, S]`` mask). Needs a GPU, bf16 or
        fp16 inputs, ``D % 8 == 0``, ``D <= 256`` (128 before Hopper),
        ``Dv == D`` and, for ``window``, ``is_causal=True``; otherwise
        ValueError saying why. Non-finite k/v at keys past ``kv_lengths``
        are zeroed first and never contribute; at keys excluded only by
        ``mask``, ``is_causal`` or ``window`` the kernel's behaviour is not
        guaranteed (a NaN there may reach rows that cannot attend it), so
        keep such inputs finite or use ``'xla'``.
      ``'chunked'``: memory-efficient attention on any backend: a scan over
        blocks of ``chunk_size`` keys with an online softmax (module
        docstring), holding ``[B, H, T, chunk_size]`` scores at a time
        instead of ``[B, H, T, S]``, in the forward and the backward pass.
        Same inputs, semantics and float32 softmax as ``'xla'``; a row is NaN
        where it gives nonzero weight to a non-finite value, with the weight
        taken before the final normalisation (an underflowing weight that
        'xla' rounds to 0 still counts). ``causal``, ``window`` and
        ``kv_lengths`` are generated per block; a ``mask`` or ``bias`` the
        caller passes with a full ``[T, S]`` extent is itself that big.
      ``None``: ``'cudnn'`` when it can take the inputs on the GPU backend and
        no explicit boolean ``mask`` is given (and, with a bias, T and S are
        even, which its backward pass needs); otherwise ``'xla'``.
    chunk_size: keys per block of ``'chunked'`` (default
      ``DEFAULT_CHUNK_SIZE``; S when S is smaller); only with
      ``implementation='chunked'``.

  Returns:
    ``[B, T, H, Dv]`` with q's dtype.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
      f"implementation must be None, 'xla', 'cudnn' or 'chunked', got {implementation!r}"
    )
  if chunk_size is not None:
    if implementation != "chunked":
      raise ValueError(
        f"chunk_size={chunk_size!r} applies only to implementation='chunked', "
        f"got implementation={implementation!r}"
      )
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
      raise ValueError(f"chunk_size must be a python int >= 1, got {chunk_size!r}")
  q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
  bias, mask, kv_lengths, window = _validate(
    q, k, v, bias, mask, kv_lengths, window, is_causal, scale
  )
  if k.shape[1] == 0:  # no key to attend: the zero output of a row with none allowed
    return jnp.zeros(q.shape[:3] + v.shape[3:], q.dtype)
  if implementation == "chunked":
    return _chunked_attention(
      q,
      k,
      v,
      bias,
      mask,
      is_causal,
      scale,
      window,
      kv_lengths,
      DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size,
    )
  if implementation is None:
    use_cudnn = not _cudnn_problems(q, k, v, bias, mask, is_causal, window, auto=True)
    implementation = "cudnn" if use_cudnn else "xla"
  elif implementation == "cudnn":
    problems = _cudnn_problems(q, k, v, bias, mask, is_causal, window, auto=False)
    if problems:
      raise ValueError("implementation='cudnn' cannot take these inputs: " + "; ".join(problems))
  if implementation == "cudnn":
    return _cudnn_attention(q, k, v, bias, mask, is_causal, scale, window, kv_lengths)
  return _xla_attention(q, k, v, bias, mask, is_causal, scale, window, kv_lengths)
