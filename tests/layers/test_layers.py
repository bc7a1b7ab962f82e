"""Tests for txf.layers, each layer in isolation against numpy float64 references
computed from the layer's own parameters.

Tolerance: float32 layers vs float64 references, atol = rtol = 1e-5 (inputs and
outputs are O(1); a few float32 roundings per output).
"""

import math

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from txf.layers import Embedder, FeedForward, MultiHeadAttention, Norm, TransformerBlock
from txf.layers.model_config import ModelConfig

TOL = dict(atol=1e-5, rtol=1e-5)
B, T, D = 2, 5, 16


def randn(seed, *shape):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def perturbed(params, seed=1):
  """Params (unboxed from their logical axes) plus N(0, 0.5) noise, so zero
  biases and unit scales are exercised too."""
  leaves, treedef = jax.tree_util.tree_flatten(nn.meta.unbox(params))
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_unflatten(
    treedef, [x + 0.5 * rng.normal(size=x.shape).astype(np.float32) for x in leaves]
  )


def f64(tree):
  return jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), tree)


def np_dense(x, p):
  """x @ kernel (+ bias) for Dense / DenseGeneral params, contracting x's last axis."""
  y = np.tensordot(x, p["kernel"], axes=1)
  return y + p["bias"] if "bias" in p else y


# ---------------------------------------------------------------------------
# FeedForward.


def np_gelu_tanh(x):
  # jax.nn.gelu's default (approximate=True): Hendrycks & Gimpel's tanh form.
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


NP_ACTIVATIONS = {
  "relu": lambda x: np.maximum(x, 0),
  "gelu": np_gelu_tanh,
  "swiglu": lambda x: x / (1 + np.exp(-x)),
  "geglu": np_gelu_tanh,
}


def np_feedforward(x, p, activation):
  """The FFN of float64 numpy params p (a dict as FeedForward's)."""
  act = NP_ACTIVATIONS[activation]
  if "gate" in p:
    hidden = act(np_dense(x, p["gate"])) * np_dense(x, p["wi"])
  else:
    hidden = act(np_dense(x, p["wi"]))
  return np_dense(hidden, p["wo"])


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu", "geglu"])
def test_feedforward_matches_numpy(activation):
  layer = FeedForward(ModelConfig(d_model=D, d_ff=24, activation=activation, use_bias=True))
  x = randn(0, B, T, D)
  params = perturbed(layer.init(jax.random.PRNGKey(0), x)["params"])
  assert ("gate" in params) == (activation in ("swiglu", "geglu"))
  expected = np_feedforward(x.astype(np.float64), f64(params), activation)
  np.testing.assert_allclose(layer.apply({"params": params}, x), expected, **TOL)


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_feedforward_gelus_take_the_exact_form_when_asked(activation):
  """model.gelu_approximate False: the GELUs are x * Phi(x) (erf), not the
  tanh form of the reference above (they differ by up to ~1e-3 at |x| ~ 2)."""
  cfg = ModelConfig(d_model=D, d_ff=24, activation=activation, gelu_approximate=False)
  layer = FeedForward(cfg)
  x = 2.0 * randn(0, B, T, D)
  params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(0), x)["params"])
  erf = np.vectorize(math.erf)
  exact = lambda h: 0.5 * h * (1 + erf(h / np.sqrt(2)))
  p, x64 = f64(params), x.astype(np.float64)
  if activation == "geglu":
    hidden = exact(np_dense(x64, p["gate"])) * np_dense(x64, p["wi"])
  else:
    hidden = exact(np_dense(x64, p["wi"]))
  got = jax.jit(layer.apply)({"params": params}, x)
  np.testing.assert_allclose(got, np_dense(hidden, p["wo"]), **TOL)


def test_feedforward_drops_its_hidden_units_at_its_rate_in_training():
  """dropout_rate 0.5 in training: the hidden layer (T5's placement) is
  dropped, each unit zeroed or scaled by 1 / (1 - 0.5); of its 240 units
  0.5 +- 0.15 are dropped (4.7 standard errors; a fixed key), and the output
  is the output projection of the dropped hidden layer."""
  layer = FeedForward(ModelConfig(d_model=D, d_ff=24, activation="gelu", dropout_rate=0.5))
  x = randn(0, B, T, D)
  params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(0), x)["params"])

  def run(params, x):
    seen = {}

    def record(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, nn.Dropout):
        seen["hidden"] = (args[0], out)
      return out

    with nn.intercept_methods(record):
      y = layer.apply(
        {"params": params}, x, deterministic=False, rngs={"dropout": jax.random.key(1)}
      )
    return y, seen["hidden"]

  y, (hidden, dropped) = jax.tree.map(np.asarray, jax.jit(run)(params, x))
  assert hidden.shape == (B, T, 24) and np.all(hidden != 0)
  kept = dropped != 0
  np.testing.assert_allclose(dropped[kept], hidden[kept] / 0.5, rtol=1e-6)
  assert abs(1 - kept.mean() - 0.5) < 0.15
  np.testing.assert_allclose(y, np_dense(dropped.astype(np.float64), f64(params)["wo"]), **TOL)


@pytest.mark.parametrize("use_bias", [True, False])
def test_feedforward_leaves_its_output_bias_to_the_caller_when_asked(use_bias):
  """add_bias=False: the output without wo's bias, and output_bias() that bias
  as stored (None without one); added back in the compute dtype, exactly the
  default call's output."""
  layer = FeedForward(ModelConfig(d_model=D, d_ff=24, use_bias=use_bias))
  x = randn(0, B, T, D)
  params = perturbed(layer.init(jax.random.PRNGKey(0), x)["params"])
  whole = layer.apply({"params": params}, x)
  apart, bias = layer.apply(
    {"params": params}, x, method=lambda m, x: (m(x, add_bias=False), m.output_bias())
  )
  if not use_bias:
    assert bias is None
    np.testing.assert_array_equal(apart, whole)
    return
  np.testing.assert_array_equal(bias, params["wo"]["bias"])
  assert np.max(np.abs(apart - whole)) > 0.01  # the perturbed bias is not ~0
  np.testing.assert_array_equal(apart + bias.astype(apart.dtype), whole)


@pytest.mark.parametrize("activation", ["gelu", "geglu"])
def test_feedforward_bias_and_input_gradients_match_central_differences(activation):
  """The hidden layer is recomputed in the backward pass with the projections'
  biases added inside it: their gradients and x's against float64 central
  differences of the numpy FFN (float32 gradients: rtol 1e-4 of the largest)."""
  layer = FeedForward(ModelConfig(d_model=D, d_ff=24, activation=activation, use_bias=True))
  x = randn(0, 1, 3, D)
  dy = randn(2, 1, 3, D).astype(np.float64)
  params = perturbed(layer.init(jax.random.PRNGKey(0), x)["params"])
  got_params, got_x = jax.grad(
    lambda params, x: jnp.sum(layer.apply({"params": params}, x) * dy), argnums=(0, 1)
  )(params, x)
  p, x64 = f64(params), x.astype(np.float64)

  def central(array, loss, step=1e-6):
    grad = np.zeros_like(array)
    for index in np.ndindex(array.shape):
      saved = array[index]
      array[index] = saved + step
      plus = loss()
      array[index] = saved - step
      minus = loss()
      array[index] = saved
      grad[index] = (plus - minus) / (2 * step)
    return grad

  loss = lambda: np.sum(np_feedforward(x64, p, activation) * dy)
  checks = [(got_x, central(x64, loss))]
  for name in ("wi", "gate") if activation == "geglu" else ("wi",):
    checks.append((got_params[name]["bias"], central(p[name]["bias"], loss)))
  for got, want in checks:
    np.testing.assert_allclose(
      np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-4 * np.abs(want).max()
    )


# ---------------------------------------------------------------------------
# Norm.


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_matches_numpy(kind):
  eps = 1e-6
  layer = Norm(ModelConfig(d_model=D, norm=kind, norm_eps=eps))
  x = 3.0 * randn(2, B, T, D) + 1.5  # offset and scale, so centring matters
  params = perturbed(layer.init(jax.random.PRNGKey(0), x)["params"])
  p, x64 = f64(params), x.astype(np.float64)
  if kind == "layer":
    centred = x64 - x64.mean(-1, keepdims=True)
    expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps) * p["scale"]
    expected += p["bias"]
  else:
    assert "bias" not in p
    expected = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + eps) * p["scale"]
  np.testing.assert_allclose(layer.apply({"params": params}, x), expected, **TOL)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_takes_the_configs_eps(kind):
  """model.norm_eps 1e-2 on rows of variance (mean square) about 1e-2: eps
  halves the output there, so the ops' default 1e-6 instead fails."""
  eps = 1e-2
  layer = Norm(ModelConfig(d_model=D, norm=kind, norm_eps=eps))
  x = 0.1 * randn(2, B, T, D)
  params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(0), x)["params"])
  x64 = x.astype(np.float64)
  centred = x64 - x64.mean(-1, keepdims=True) if kind == "layer" else x64
  expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + eps)
  np.testing.assert_allclose(jax.jit(layer.apply)({"params": params}, x), expected, **TOL)


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_norm_adds_output_and_bias_to_a_stream_of_another_dtype(kind):
  """A float32 stream under a bfloat16 compute dtype takes the layer's own
  adds (not the op's): with residual, (x + (f + b) in float32, the norm of
  that in bfloat16, within its rounding, 2^-8 relative of O(1) values)."""
  cfg = ModelConfig(d_model=D, norm=kind, dtype="bfloat16")
  layer = Norm(cfg)
  x, f, b = randn(2, B, T, D), randn(3, B, T, D), randn(4, D)
  params = nn.meta.unbox(jax.jit(layer.init)(jax.random.PRNGKey(0), x)["params"])
  apply = lambda p, x, f, b: layer.apply({"params": p}, x, add=f, add_bias=b, residual=True)
  s, y = jax.jit(apply)(params, x, f, b)
  s64 = x.astype(np.float64) + f + b
  np.testing.assert_allclose(s, s64, rtol=1e-6, atol=1e-6)
  centred = s64 - s64.mean(-1, keepdims=True) if kind == "layer" else s64
  expected = centred / np.sqrt((centred**2).mean(-1, keepdims=True) + cfg.norm_eps)
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=2**-7, atol=2**-7)


# ---------------------------------------------------------------------------
# MultiHeadAttention.


def np_attention_weights(p, x, kv, *, num_heads, num_kv_heads, causal, key_valid):
  """float64 attention weights [B, H, T, S] from DenseGeneral params.

  x [B, T, D], kv [B, S, D], key_valid bool [B, S].
  """
  q = np_dense(x, p["query"])  # [B, T, H, Dh]
  k = np_dense(kv, p["key"])  # [B, S, K, Dh]
  k = np.repeat(k, num_heads // num_kv_heads, axis=2)
  scores = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(q.shape[-1])
  allowed = np.broadcast_to(key_valid[:, None, None, :], scores.shape).copy()
  if causal:
    allowed &= np.tril(np.ones(scores.shape[-2:], bool))
  scores = np.where(allowed, scores, -np.inf)
  weights = np.exp(scores - scores.max(-1, keepdims=True))
  return weights / weights.sum(-1, keepdims=True)


def np_attention(p, x, kv, *, num_heads, num_kv_heads, causal, key_valid):
  """float64 multi-head attention from DenseGeneral params: [B, T, D]."""
  weights = np_attention_weights(
    p, x, kv, num_heads=num_heads, num_kv_heads=num_kv_heads, causal=causal, key_valid=key_valid
  )
  v = np.repeat(np_dense(kv, p["value"]), num_heads // num_kv_heads, axis=2)
  heads = np.einsum("bhts,bshd->bthd", weights, v)
  out = np.einsum("bthd,hdo->bto", heads, p["out"]["kernel"])
  return out + p["out"]["bias"] if "bias" in p["out"] else out


ATTENTION_CASES = pytest.mark.parametrize(
  "num_kv_heads,causal,kv_len",
  [
    (4, False, None),  # MHA self-attention with padding
    (2, True, None),  # GQA causal self-attention with padding
    (1, False, 7),  # MQA cross-attention to a longer, padded source
  ],
)


def attention_case(num_kv_heads, causal, kv_len):
  """A 4-head layer, its perturbed params, its inputs and call arguments, and
  the arguments of the float64 references."""
  cfg = ModelConfig(
    d_model=D, num_heads=4, num_kv_heads=num_kv_heads, head_dim=4, position="none", use_bias=True
  )
  # Keys and values from kv (an encoder output): a cross-attention layer.
  layer = MultiHeadAttention(cfg, causal=causal, cross=kv_len is not None)
  x = randn(3, B, T, D)
  kv = None if kv_len is None else randn(4, B, kv_len, D)
  S = T if kv_len is None else kv_len
  # Row 0 sees every key, row 1 only the first 3 (keeps causal rows non-empty).
  key_valid = np.arange(S)[None, :] < np.array([[S], [3]])
  call = dict(q_positions_BxT=jnp.arange(T)[None], key_mask=key_valid[:, None, None, :])
  # Jitted: eager, each of init's operations compiled on its own (seconds a case).
  params = perturbed(jax.jit(layer.init)(jax.random.PRNGKey(0), x, kv, **call)["params"])
  reference = dict(
    p=f64(params),
    x=x.astype(np.float64),
    kv=(x if kv is None else kv).astype(np.float64),
    num_heads=4,
    num_kv_heads=num_kv_heads,
    causal=causal,
    key_valid=key_valid,
  )
  return layer, params, (x, kv), call, reference


@ATTENTION_CASES
def test_multi_head_attention_matches_numpy(num_kv_heads, causal, kv_len):
  layer, params, inputs, call, reference = attention_case(num_kv_heads, causal, kv_len)
  assert params["key"]["kernel"].shape == (D, num_kv_heads, 4)
  np.testing.assert_allclose(
    layer.apply({"params": params}, *inputs, **call), np_attention(**reference), **TOL
  )


@ATTENTION_CASES
def test_multi_head_attention_records_the_weights_it_uses(num_kv_heads, causal, kv_len):
  layer, params, inputs, call, reference = attention_case(num_kv_heads, causal, kv_len)
  out, state = layer.apply({"params": params}, *inputs, **call, mutable=["intermediates"])
  (weights,) = state["intermediates"]["attention_weights"]
  assert weights.shape == (B, 4, T, reference["kv"].shape[1])
  np.testing.assert_allclose(weights, np_attention_weights(**reference), **TOL)
  np.testing.assert_allclose(np.sum(weights, -1), 1.0, atol=1e-6)
  # Recording takes the unfused path; the output is the same up to float32 rounding.
  np.testing.assert_allclose(out, layer.apply({"params": params}, *inputs, **call), atol=1e-6)


def test_cached_self_attention_keeps_the_callers_key_mask():
  """Under use_cache, self-attention ANDs the caller's key mask with the
  cache's causal mask: a prefill of T tokens into a cache of T slots with
  key 1 masked (a pad inside a prompt) is the full pass with that key masked."""
  layer = MultiHeadAttention(ModelConfig(d_model=D, num_heads=2, head_dim=4), causal=True)
  x = randn(3, 1, T, D)
  valid = np.arange(T) != 1
  call = dict(q_positions_BxT=jnp.arange(T)[None], key_mask=jnp.asarray(valid)[None, None, None])
  cached = dict(call, cache_index=jnp.int32(0), use_cache=True)

  def run(x):  # one compile for the three calls
    variables = layer.init(jax.random.PRNGKey(0), x, **cached)
    full = layer.apply({"params": variables["params"]}, x, **call)
    return full, layer.apply(variables, x, **cached, mutable=["cache"])[0]

  full, step = jax.jit(run)(x)
  np.testing.assert_allclose(step, full, **TOL)


def stacked_projection_widths(jaxpr, d_model):
  """P of every product with a stacked projection kernel [D, P, N, Dh] in a
  jaxpr (nested ones included): how many projections each product fuses."""
  widths = []
  for eqn in jaxpr.eqns:
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      widths += stacked_projection_widths(sub, d_model)
    if eqn.primitive.name == "dot_general":
      shapes = [var.aval.shape for var in eqn.invars]
      widths += [shape[1] for shape in shapes if len(shape) == 4 and shape[0] == d_model]
  return widths


@ATTENTION_CASES
def test_projections_of_one_input_are_one_product(num_kv_heads, causal, kv_len):
  """q, k and v of MHA self-attention are one GEMM; GQA self-attention and
  cross-attention project q alone and k with v (different head counts or
  inputs); the fused products still match numpy (test above)."""
  layer, params, inputs, call, _ = attention_case(num_kv_heads, causal, kv_len)
  jaxpr = jax.make_jaxpr(lambda p, *xs: layer.apply({"params": p}, *xs, **call))(params, *inputs)
  expected = [3] if num_kv_heads == 4 and kv_len is None else [1, 2]
  assert sorted(stacked_projection_widths(jaxpr.jaxpr, D)) == expected


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_a_decoding_step_on_a_gpu_projects_by_the_kernels_concatenated(num_kv_heads):
  """One position traced for one GPU: the product of one input is by its
  kernels concatenated along their features ([D, P * N * Dh]), with the
  same output as the stacked product the CPU trace takes."""
  from txf.ops import platform

  cfg = ModelConfig(
    d_model=D,
    num_heads=4,
    num_kv_heads=num_kv_heads,
    head_dim=4,
    position="none",
    use_bias=True,
    attention_impl="xla",
  )
  layer = MultiHeadAttention(cfg, causal=True)
  x = randn(9, B, 1, D)
  call = dict(q_positions_BxT=jnp.zeros((1, 1), jnp.int32))
  params = perturbed(layer.init(jax.random.PRNGKey(0), x, **call)["params"])

  def attend():
    # A function of its own for each trace (jax caches traces by function).
    fn = lambda p, x: layer.apply({"params": p}, x, **call)
    return fn(params, x), jax.make_jaxpr(fn)(params, x).jaxpr

  cpu, cpu_jaxpr = attend()
  with platform.compiling_for("gpu"):
    gpu, gpu_jaxpr = attend()
  stacked = [3] if num_kv_heads == 4 else [1, 2]
  assert sorted(stacked_projection_widths(cpu_jaxpr, D)) == stacked
  assert stacked_projection_widths(gpu_jaxpr, D) == []
  concatenated = [
    eqn.outvars[0].aval.shape for eqn in gpu_jaxpr.eqns if eqn.primitive.name == "concatenate"
  ]
  # q, k, v of 4 heads of 4 (MHA); k and v of 2 heads (GQA: q is a product of its own).
  assert concatenated == ([(D, 3 * 4 * 4)] if num_kv_heads == 4 else [(D, 2 * 2 * 4)])
  np.testing.assert_allclose(gpu, cpu, **TOL)


def central_differences(f, arrays, h=1e-6):
  """The gradient of the float64 function f() with respect to each array it
  reads (changed in place, restored), by central differences: [each array's
  shape]."""
  grads = []
  for array in arrays:
    grad = np.zeros(array.shape)
    for index in np.ndindex(*array.shape):
      value = array[index]
      array[index] = value + h
      above = f()
      array[index] = value - h
      grad[index] = (above - f()) / (2 * h)
      array[index] = value
    grads.append(grad)
  return grads


@pytest.mark.parametrize(
  "num_kv_heads,causal,kv_len,use_bias",
  [(4, False, None, True), (4, False, None, False), (2, True, None, True), (1, False, 7, True)],
)
def test_a_gpu_program_of_many_positions_projects_apart(num_kv_heads, causal, kv_len, use_bias):
  """More than one position traced for a GPU: one product per projection
  forward (no stacked kernel; a custom backward stacks the cotangents). Its
  output is the float64 reference's, and its gradients (parameters and
  inputs) are as close to float64 central differences as the CPU trace's
  (the stacked product and its own backward): float32 through a softmax,
  within 2e-5 of each array's largest entry, or of 1 where that is smaller
  (the keys' bias: its gradient is zero, softmax ignoring a shift common to
  all keys)."""
  from txf.ops import platform

  layer, params, inputs, call, reference = attention_case(num_kv_heads, causal, kv_len)
  layer = layer.clone(cfg=layer.cfg.replace(attention_impl="xla", use_bias=use_bias))
  if not use_bias:
    params = {name: {"kernel": p["kernel"]} for name, p in params.items()}
    reference["p"] = f64(params)
  x, kv = inputs
  argnums = (0, 1) if kv is None else (0, 1, 2)

  def traced():
    # A function of its own for each trace (jax caches traces by function).
    def attend(params, x, kv):
      return layer.apply({"params": params}, x, kv, **call)

    loss = lambda *args: jnp.sum(jnp.sin(attend(*args)))
    grads = jax.jit(jax.grad(loss, argnums=argnums))(params, x, kv)
    return jax.jit(attend)(params, x, kv), grads, jax.make_jaxpr(attend)(params, x, kv).jaxpr

  cpu_out, cpu_grads, cpu_jaxpr = traced()
  with platform.compiling_for("gpu"):
    gpu_out, gpu_grads, gpu_jaxpr = traced()
  assert stacked_projection_widths(cpu_jaxpr, D) != []
  assert stacked_projection_widths(gpu_jaxpr, D) == []
  np.testing.assert_allclose(gpu_out, np_attention(**reference), **TOL)

  leaves, treedef = jax.tree.flatten(reference["p"])
  sources = [reference["x"]] if kv is None else [reference["x"], reference["kv"]]
  if kv is None:
    reference["kv"] = reference["x"]  # one array, as the layer reads it
  want = central_differences(lambda: np.sum(np.sin(np_attention(**reference))), leaves + sources)
  want = (jax.tree.unflatten(treedef, want[: len(leaves)]), *want[len(leaves) :])
  for got_cpu, got_gpu, grad in zip(
    jax.tree.leaves(cpu_grads), jax.tree.leaves(gpu_grads), jax.tree.leaves(want), strict=True
  ):
    tolerance = 2e-5 * max(1.0, np.abs(grad).max())
    np.testing.assert_allclose(got_cpu, grad, atol=tolerance, rtol=0)
    np.testing.assert_allclose(got_gpu, grad, atol=tolerance, rtol=0)


# ---------------------------------------------------------------------------
# Embedder.


def test_learned_position_table_rejects_longer_sequence():
  embedder = Embedder(ModelConfig(vocab_size=10, d_model=D, position="learned", max_len=6))
  tokens = jnp.ones((1, 6), jnp.int32)
  variables = nn.meta.unbox(embedder.init(jax.random.PRNGKey(0), tokens, jnp.arange(6)[None]))
  assert variables["params"]["position_table"].shape == (6, D)
  too_long = jnp.ones((1, 7), jnp.int32)
  with pytest.raises(ValueError, match=r"model\.max_len"):
    embedder.apply(variables, too_long, jnp.arange(7)[None])


# ---------------------------------------------------------------------------
# Pre-LN vs Post-LN.


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_post_ln_block_output_is_normalised_pre_ln_is_not(placement):
  cfg = ModelConfig(d_model=D, num_heads=2, norm="layer", norm_placement=placement, position="none")
  block = TransformerBlock(cfg, causal=False)
  # A residual stream far from normalised: per-token mean ~2, std ~4.
  x = 4.0 * randn(5, B, T, D) + 2.0
  args = (x, jnp.arange(T)[None], None, None, None, None, None)
  variables = block.init(jax.random.PRNGKey(0), *args)
  out, _ = block.apply(variables, *args)
  mean, var = np.mean(out, -1), np.var(out, -1)
  if placement == "post":
    # LayerNorm with its init scale 1 and bias 0 is the last operation.
    np.testing.assert_allclose(mean, 0.0, atol=1e-5)
    np.testing.assert_allclose(var, 1.0, atol=1e-4)
  else:
    # x + f(norm(x)) keeps x's statistics: nowhere near mean 0, variance 1.
    assert np.min(np.abs(var - 1.0)) > 1.0
    assert np.mean(np.abs(mean)) > 0.5


def test_block_dropout_is_off_in_evaluation():
  """dropout_rate 0.5 (residual, attention and hidden dropout): a
  deterministic block (evaluation) needs no dropout rng and gives the output
  of the same parameters at rate 0 (that training drops: test_models)."""
  cfg = ModelConfig(d_model=D, num_heads=2, position="none")
  args = (randn(5, B, T, D), jnp.arange(T)[None], None, None, None, None, None)

  def run(x):  # one compile for both rates
    block = lambda rate: TransformerBlock(
      cfg.replace(dropout_rate=rate, attention_dropout_rate=rate)
    )
    variables = block(0.0).init(jax.random.PRNGKey(0), x, *args[1:])
    return [block(rate).apply(variables, x, *args[1:])[0] for rate in (0.5, 0.0)]

  evaluated, want = jax.jit(run)(args[0])
  np.testing.assert_array_equal(evaluated, want)


def test_residual_dropout_drops_each_output_with_its_bias():
  """Pre-LN training, dropout_rate 0.5, biases on (0.5, not their 0): the
  block's output is x plus its two residual dropouts' outputs, each a
  sub-layer's output with its output projection's bias, dropped together
  (a dropped entry adds nothing, bias included), to float32 rounding."""
  cfg = ModelConfig(d_model=D, num_heads=2, position="none", use_bias=True, dropout_rate=0.5)
  block = TransformerBlock(cfg, deterministic=False)
  x = randn(5, B, T, D)
  args = (jnp.arange(T)[None], None, None, None, None, None)

  def run(x):  # one compile for init and apply
    rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.key(1)}
    params = nn.meta.unbox(block.init(rngs, x, *args)["params"])
    params = jax.tree_util.tree_map_with_path(  # biases 0.5, not their initial 0
      lambda path, p: p + 0.5 if path[-1].key == "bias" else p, params
    )
    residual = []

    def record(next_fun, args, kwargs, context):
      out = next_fun(*args, **kwargs)
      if isinstance(context.module, nn.Dropout) and len(context.module.path) == 1:
        residual.append(out)  # the block's own dropouts, not its sub-layers'
      return out

    with nn.intercept_methods(record):
      y = block.apply({"params": params}, x, *args, rngs={"dropout": jax.random.key(2)})[0]
    return y, residual

  y, residual = jax.jit(run)(x)
  assert len(residual) == 2 and all(np.mean(r == 0) > 0.3 for r in residual)
  np.testing.assert_allclose(y - x, residual[0] + residual[1], atol=1e-5)


# ---------------------------------------------------------------------------
# The residual stream's adds in the norms (traced for one GPU).


@pytest.mark.parametrize("use_bias", [True, False])
def test_pre_ln_blocks_hand_their_last_output_to_the_next_norm(use_bias):
  """An unscanned Pre-LN stack: each block after the first adds the previous
  block's FFN output and wo bias in its first norm, the final norm the last
  block's; the same output, bit for bit, as blocks that add it themselves."""
  from txf.layers import TransformerStack

  cfg = ModelConfig(d_model=D, num_heads=2, use_bias=use_bias, position="none")
  stack = TransformerStack(cfg, num_layers=3, causal=True)
  x = randn(3, B, T, D)
  positions = jnp.arange(T)[None]
  params = perturbed(stack.init(jax.random.key(0), x, q_positions_BxT=positions)["params"])
  adds = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, Norm) and context.method_name == "__call__":
      adds[context.module.path] = (kwargs.get("add"), kwargs.get("add_bias"))
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(record):
    got = stack.apply({"params": params}, x, q_positions_BxT=positions)
  for i in range(3):
    handed = adds[(f"block_{i}", "self_attention_norm")]
    assert (handed[0] is None) == (i == 0)
    wo_bias = params[f"block_{i - 1}"]["ffn"]["wo"]["bias"] if use_bias and i else None
    assert (handed[1] is None) == (wo_bias is None)
  final_add, final_bias = adds[("final_norm",)]
  assert final_add is not None and (final_bias is None) == (not use_bias)

  block = TransformerBlock(cfg, causal=True)
  want = x
  for i in range(3):
    want, _ = block.apply({"params": params[f"block_{i}"]}, want, positions, *(None,) * 5)
  want = Norm(cfg).apply({"params": params["final_norm"]}, want)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_a_pre_ln_block_traced_for_a_gpu_computes_what_the_cpu_trace_does(norm):
  """Traced for one GPU, a Pre-LN block's norms after the first add the
  previous sub-layer's output and bias to the stream in their own op (the
  GPU kernels there, for 1,024 rows or more); lowered for this CPU the
  same trace runs XLA's passes through that op, and gives the CPU trace's
  output and gradients (of the input and of every parameter, the output
  projections' biases included) to float32 rounding."""
  from txf.ops import platform

  cfg = ModelConfig(
    d_model=D, num_heads=2, norm=norm, use_bias=True, position="none", attention_impl="xla"
  )
  block = TransformerBlock(cfg, causal=True)
  x = randn(7, 2, 512, D)
  rest = (jnp.arange(512)[None], None, None, None, None, None)
  params = block.init(jax.random.key(0), x, *rest)["params"]

  def value_and_grads():
    # A function of its own for each trace: jax caches traces by function,
    # and the platform traced for is not part of the key.
    def loss(params, x):
      out, _ = block.apply({"params": params}, x, *rest)
      return jnp.sum(jnp.sin(out))

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    return value, grads, str(jax.make_jaxpr(loss)(params, x))

  cpu_value, cpu_grads, cpu_jaxpr = value_and_grads()
  with platform.compiling_for("gpu"):
    gpu_value, gpu_grads, gpu_jaxpr = value_and_grads()
  assert "pallas_call" not in cpu_jaxpr and "norm_forward" in gpu_jaxpr
  np.testing.assert_allclose(gpu_value, cpu_value, rtol=1e-5)
  for got, want in zip(jax.tree.leaves(gpu_grads), jax.tree.leaves(cpu_grads), strict=True):
    np.testing.assert_allclose(got, want, **TOL)
