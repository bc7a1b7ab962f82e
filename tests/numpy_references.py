"""Float64 numpy references of txf's layers, written from the papers and
independent of `txf.ops`: dense, layer / RMS norm, the FFN activations, RoPE
(rotate-half layout), ALiBi slopes, T5 relative buckets, attention (masks,
sliding windows, GQA/MQA grouping), the blocks' residual wiring, the stacks,
the embedder's positions and tied logits. Each takes a layer's own parameters
(`f64` of them) and float64 arrays. And checks that a freshly drawn
parameter's entries look like draws of the distribution its initialiser
states (uniform, normal, truncated normal), within 5 standard errors."""

import math

import jax
import numpy as np


def f64(tree):
  """Every leaf of `tree` as a float64 numpy array."""
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def np_dense(x, p, axes=1):
  """x's last `axes` axes contracted with the kernel's first ones (+ bias)."""
  y = np.tensordot(x, p["kernel"], axes=axes)
  return y + p["bias"] if "bias" in p else y


def np_norm(p, x, kind, eps):
  """LayerNorm (Ba et al. 2016) or RMSNorm (Zhang & Sennrich 2019) over the last axis."""
  if kind == "layer":
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * p["scale"] + p["bias"]
  assert "bias" not in p, "RMSNorm has no bias"
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * p["scale"]


def np_gelu(x, approximate=True):
  """Hendrycks & Gimpel: x Phi(x) exactly (erf), or its tanh form (jax.nn.gelu's default)."""
  if approximate:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
  return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))


NP_ACTIVATIONS = {
  "relu": lambda x: np.maximum(x, 0),
  "gelu": np_gelu,
  "swiglu": lambda x: x / (1 + np.exp(-x)),
  "geglu": np_gelu,
}


def np_ffn(p, x, activation, gelu_approximate=True):
  """W_o act(x W_i), or W_o (act(x W_gate) * x W_i) for the gated kinds (Shazeer 2020)."""
  act = NP_ACTIVATIONS[activation]
  if activation in ("gelu", "geglu"):
    act = lambda h: np_gelu(h, gelu_approximate)
  if activation in ("swiglu", "geglu"):
    return np_dense(act(np_dense(x, p["gate"])) * np_dense(x, p["wi"]), p["wo"])
  assert "gate" not in p
  return np_dense(act(np_dense(x, p["wi"])), p["wo"])


def np_rope(x, positions, base, scale):
  """RoFormer rotation, rotate-half layout: feature i pairs with i + Dh/2.

  x [B, L, heads, Dh], positions [L]."""
  half = x.shape[-1] // 2
  out = np.empty_like(x)
  for i in range(half):
    angle = (positions / scale * base ** (-2 * i / x.shape[-1]))[None, :, None]
    a, b = x[..., i], x[..., i + half]
    out[..., i] = a * np.cos(angle) - b * np.sin(angle)
    out[..., i + half] = b * np.cos(angle) + a * np.sin(angle)
  return out


def np_alibi_slopes(n):
  """Press et al. (2022): a geometric sequence from 2^(-8/n) for a power of two
  n; otherwise those of the nearest lower power of two, then every other slope
  of twice that."""

  def geometric(m):
    return [2 ** (-8 / m * (i + 1)) for i in range(m)]

  if math.log2(n).is_integer():
    return np.array(geometric(n))
  closest = 2 ** math.floor(math.log2(n))
  return np.array(geometric(closest) + geometric(2 * closest)[0::2][: n - closest])


def np_t5_bucket(relative, bidirectional, num_buckets, max_distance):
  """Raffel et al. (2020) bucket of one relative position (key - query)."""
  n, offset = -relative, 0
  if bidirectional:
    num_buckets //= 2
    offset = num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return offset + n
  log_part = math.log(n / max_exact) / math.log(max_distance / max_exact)
  return offset + min(max_exact + int(log_part * (num_buckets - max_exact)), num_buckets - 1)


def np_elu1(x):
  """elu(x) + 1, linear attention's feature map."""
  return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def np_attention(p, x, kv, key_valid, spec, table=None):
  """Multi-head attention (Vaswani et al. 2017; spec['attention'] 'linear':
  Katharopoulos et al. 2020's weights) from DenseGeneral params.

  x [B, T, D] queries' inputs, kv [B, S, D], key_valid bool [B, S]; spec: the
  MultiHeadAttention attributes. Queries sit at 0..T-1, keys at 0..S-1. Query
  head h reads key/value head h // (H / K). A query with no allowed key
  outputs 0. Returns [B, T, D].
  """
  num_heads, num_kv_heads = spec["num_heads"], spec["num_kv_heads"]
  q, k, v = np_dense(x, p["query"]), np_dense(kv, p["key"]), np_dense(kv, p["value"])
  q_pos, k_pos = np.arange(x.shape[1]), np.arange(kv.shape[1])
  if spec["position"] == "rope":
    q = np_rope(q, q_pos, spec["rope_base"], spec["rope_scale"])
    k = np_rope(k, k_pos, spec["rope_base"], spec["rope_scale"])
  relative_TxS = k_pos[None, :] - q_pos[:, None]
  allowed_BxTxS = key_valid[:, None, :] & np.ones(relative_TxS.shape, bool)
  if spec["causal"]:
    allowed_BxTxS = allowed_BxTxS & (relative_TxS <= 0)
  if spec["window"] is not None:
    allowed_BxTxS = allowed_BxTxS & (np.abs(relative_TxS) < spec["window"])
  bias_HxTxS = np.zeros((num_heads,) + relative_TxS.shape)
  if spec["position"] == "alibi":
    bias_HxTxS = -np_alibi_slopes(num_heads)[:, None, None] * np.abs(relative_TxS)
  elif spec["position"] == "t5_bias":
    buckets_TxS = np.vectorize(np_t5_bucket)(
      relative_TxS, spec["bidirectional_bias"], table.shape[0], spec["t5_max_distance"]
    )
    bias_HxTxS = np.moveaxis(table[buckets_TxS], -1, 0)
  heads = np.zeros(q.shape[:2] + (num_heads, v.shape[-1]))
  scale = 1 / np.sqrt(q.shape[-1]) if spec.get("scale") is None else spec["scale"]
  for h in range(num_heads):
    g = h // (num_heads // num_kv_heads)
    if spec.get("attention") == "linear":  # Katharopoulos et al. 2020: elu + 1 features
      unnormalised = np.einsum("btd,bsd->bts", np_elu1(q[:, :, h]), np_elu1(k[:, :, g]))
      unnormalised = np.where(allowed_BxTxS, unnormalised, 0.0)
    else:
      scores = np.einsum("btd,bsd->bts", q[:, :, h], k[:, :, g]) * scale
      scores = scores + bias_HxTxS[h]
      unnormalised = np.where(allowed_BxTxS, np.exp(scores - scores.max(-1, keepdims=True)), 0.0)
    total = unnormalised.sum(-1, keepdims=True)
    weights = unnormalised / np.where(total > 0, total, 1.0)
    heads[:, :, h] = np.einsum("bts,bsd->btd", weights, v[:, :, g])
  return np_dense(heads, p["out"], axes=2)


def attention_spec(cfg, causal, cross):
  """The attributes a block gives its self- (cross=False) or cross-attention."""
  return dict(
    num_heads=cfg.num_heads,
    num_kv_heads=cfg.num_kv_heads,
    head_dim=cfg.head_dim,
    position="none" if cross else cfg.position,
    causal=causal and not cross,
    bidirectional_bias=not causal,
    window=None if cross else cfg.window,
    # The position's settings (None where it has no such setting).
    **{name: cfg.options.get(name) for name in ("rope_base", "rope_scale", "t5_max_distance")},
    scale=None if cfg.scale_attention else 1.0,
    attention=cfg.attention,
  )


def np_block(p, x, cfg, *, causal, self_valid, table=None, cross=None, cross_valid=None):
  """One TransformerBlock: self-attention, [cross-attention,] FFN, each a
  residual x + f(norm(x)) (pre) or norm(x + f(x)) (post)."""

  def residual(name, x, sublayer):
    norm = lambda h: np_norm(p[f"{name}_norm"], h, cfg.norm, cfg.norm_eps)
    if cfg.norm_placement == "pre":
      return x + sublayer(norm(x))
    return norm(x + sublayer(x))

  self_spec = attention_spec(cfg, causal, cross=False)
  x = residual(
    "self_attention",
    x,
    lambda h: np_attention(p["self_attention"], h, h, self_valid, self_spec, table),
  )
  if cross is not None:
    cross_spec = attention_spec(cfg, causal, cross=True)
    x = residual(
      "cross_attention",
      x,
      lambda h: np_attention(p["cross_attention"], h, cross, cross_valid, cross_spec),
    )
  return residual("ffn", x, lambda h: np_ffn(p["ffn"], h, cfg.activation, cfg.gelu_approximate))


def np_stack(p, x, cfg, num_layers, *, causal, self_valid=None, cross=None, cross_valid=None):
  """Blocks 0..N-1 sharing the stack's T5 table, then the Pre-LN final norm."""
  if self_valid is None:
    self_valid = np.ones(x.shape[:2], bool)
  table = p["relative_position"]["table"] if cfg.position == "t5_bias" else None
  for i in range(num_layers):
    x = np_block(
      p[f"block_{i}"],
      x,
      cfg,
      causal=causal,
      self_valid=self_valid,
      table=table,
      cross=cross,
      cross_valid=cross_valid,
    )
  if cfg.norm_placement == "pre":
    return np_norm(p["final_norm"], x, cfg.norm, cfg.norm_eps)
  assert "final_norm" not in p, "Post-LN already ends in a norm"
  return x


def np_sinusoidal(positions, dim):
  """Vaswani et al. (2017), interleaved: PE[p, 2i] = sin(p / 10000^(2i/dim)), PE[p, 2i+1] = cos."""
  pe = np.zeros(positions.shape + (dim,))
  for i in range(dim // 2):
    angle = positions / 10000.0 ** (2 * i / dim)
    pe[..., 2 * i], pe[..., 2 * i + 1] = np.sin(angle), np.cos(angle)
  return pe


def np_embed(p, tokens, positions, position, token_types=None, norm=None, eps=1e-6):
  """Token rows plus the absolute position encoding (if any), plus the
  token-type rows (BERT's segments; type 0 when not given), then a norm."""
  x = p["token"]["embedding"][np.asarray(tokens)]
  if position == "learned":
    x = x + p["position_table"][positions]
  elif position == "sinusoidal":
    x = x + np_sinusoidal(positions, x.shape[-1])
  else:
    assert "position_table" not in p
  if "token_type_table" in p:
    types = np.zeros(np.shape(tokens), int) if token_types is None else np.asarray(token_types)
    x = x + p["token_type_table"][types]
  if norm is not None:
    x = np_norm(p["embed_norm"], x, norm, eps)
  return x


def np_tied_logits(p_embedder, x, scaled=True):
  """x E^T / sqrt(D), as txf scales tied logits (embedding rows are N(0, 1));
  x E^T when not scaled (GPT-2, BERT)."""
  embedding = p_embedder["token"]["embedding"]
  return x @ embedding.T / (np.sqrt(embedding.shape[1]) if scaled else 1.0)


def uniform_sample_checks(values, bound, what):
  """`values` look like N draws of U(-bound, bound): none beyond the bound
  (1e-6 relative slack for float32 rounding of the bound), and the std, the
  mean and the fraction within bound / 2 each within 5 standard errors of
  the uniform's: std bound / sqrt(3) with relative standard error
  sqrt((9/5 - 1) / (4 N)) (kurtosis 9/5), mean 0 with standard error
  std / sqrt(N), fraction 1/2 with standard error sqrt(1 / (4 N)). A normal
  draw of the same std has 0.61 of its entries within bound / 2."""
  values = np.ravel(np.asarray(values, np.float64))
  count, std = values.size, bound / np.sqrt(3.0)
  assert np.abs(values).max() <= bound * (1 + 1e-6), what
  np.testing.assert_allclose(
    values.std(), std, rtol=5 * np.sqrt((9 / 5 - 1) / (4 * count)), err_msg=what
  )
  assert abs(values.mean()) < 5 * std / np.sqrt(count), what
  assert abs(np.mean(np.abs(values) < bound / 2) - 0.5) < 5 * np.sqrt(1 / (4 * count)), what


def normal_sample_checks(values, std, what):
  """`values` look like N draws of N(0, std) (or a normal truncated at 2 std,
  whose kurtosis is below 3): the sample std within 5 relative standard
  errors sqrt(1 / (2 N)) (a normal's; kurtosis 3) and the mean within 5
  standard errors std / sqrt(N)."""
  values = np.ravel(np.asarray(values, np.float64))
  count = values.size
  np.testing.assert_allclose(values.std(), std, rtol=5 * np.sqrt(1 / (2 * count)), err_msg=what)
  assert abs(values.mean()) < 5 * std / np.sqrt(count), what


def truncated_normal_std(bound):
  """The std of a unit normal truncated to [-bound, bound]:
  sqrt(1 - 2 bound phi(bound) / (2 Phi(bound) - 1))."""
  phi = np.exp(-(bound**2) / 2) / np.sqrt(2 * np.pi)
  return np.sqrt(1 - 2 * bound * phi / math.erf(bound / np.sqrt(2)))
