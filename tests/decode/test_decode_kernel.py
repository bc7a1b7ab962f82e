"""Decoding with each attention step as one GPU kernel
(txf.ops.cache_attention_gpu: self-attention's KV cache update and the
attention over it; cross-attention over the cached encoding), and at batch
1 the output projections as matvec kernels (txf.ops.matvec_gpu), traced for a
GPU (`platform.compiling_for`) and run by Pallas's interpreter on the CPU:
the cached logits equal the full pass's (atol 1e-5, as in test_decode.py)
and greedy decoding gives the XLA path's tokens; and which steps the layer
gives the kernels.
"""

import functools
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import decode, models, register
from txf.layers import norm
from txf.layers.model_config import NORMS, ModelConfig
from txf.layers.norm import Norm
from txf.ops import cache_attention_gpu, matvec_gpu, platform

# Unlike test_decode.py's TINY (vocab 50), so that no program traced there
# for the CPU path is found in jax's caches here.
TINY = dict(vocab_size=53, d_model=32, num_heads=4, num_layers=2, max_len=16)
B, T = 2, 12


@functools.cache
def model_and_params(**overrides):
  cfg = ModelConfig(**{**TINY, **overrides})
  model = models.build(cfg)
  tokens = jnp.ones((1, 4), jnp.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  return model, jax.jit(model.init)(jax.random.key(0), *inputs)["params"]


def random_tokens(seed, shape):
  return jax.random.randint(jax.random.key(seed), shape, 1, TINY["vocab_size"])


def stepwise_logits(model, params, tokens_BxT):
  """Logits [B, T, V] from feeding tokens through the cache one per step."""
  tokens_to_logits = decode.make_tokens_to_logits(model, params)

  def step(cache, token_B):
    logits_BxV, cache = tokens_to_logits(token_B[:, None], cache)
    return cache, logits_BxV

  cache = decode.init_cache(model, tokens_BxT.shape[0], tokens_BxT.shape[1])
  return jax.lax.scan(step, cache, tokens_BxT.T)[1].transpose(1, 0, 2)


def interpreted(monkeypatch):
  """The kernels run by Pallas's interpreter (on the CPU)."""
  for module, name in (
    (cache_attention_gpu, "update_and_attend"),
    (cache_attention_gpu, "update_and_attend_packed"),
    (cache_attention_gpu, "normalize_project_and_attend"),
    (cache_attention_gpu, "attend"),
    (matvec_gpu, "matvec"),
  ):
    kernel = getattr(module, name)
    monkeypatch.setattr(module, name, functools.partial(kernel, interpret=True))


@pytest.fixture
def for_a_gpu(monkeypatch):
  """Traces for a GPU, with the kernels run by Pallas's interpreter; jax's
  caches cleared on both sides, so that no program traced for one path is
  reused for the other."""
  interpreted(monkeypatch)
  jax.clear_caches()
  with platform.compiling_for("gpu"):
    yield
  jax.clear_caches()


def uses_kernel(model, params, **apply_kwargs) -> bool:
  """Whether one cached decoding step of `model` calls the kernel."""
  cache = decode.init_cache(model, B, T)
  step = functools.partial(
    model.apply, use_cache=True, mutable=apply_kwargs.pop("mutable", ["cache"]), **apply_kwargs
  )
  jaxpr = jax.make_jaxpr(step)({"params": params, "cache": cache}, jnp.ones((B, 1), jnp.int32))
  return "cache_update_and_attention" in str(jaxpr)


@pytest.mark.parametrize(
  "overrides",
  [
    {},
    dict(num_kv_heads=2),
    dict(num_kv_heads=1),
    dict(window=3),
    dict(position="rope"),
    dict(position="learned", use_bias=True),  # q, k and v packed, with biases
  ],
  ids=str,
)
def test_cached_decoding_with_the_kernel_matches_full_pass(for_a_gpu, overrides):
  model, params = model_and_params(**overrides)
  assert uses_kernel(model, params)
  tokens = random_tokens(1, (B, T))
  full = jax.jit(model.apply)({"params": params}, tokens)
  got = jax.jit(stepwise_logits, static_argnums=0)(model, params, tokens)
  np.testing.assert_allclose(got, full, atol=1e-5)


def matvec_operands(fn, *args, **kwargs) -> list[int]:
  """The operand count of each matvec kernel call in fn's program: 2 for
  the product alone, 4 with the bias and the residual stream added."""
  counts = []

  def visit(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "pallas_call" and eqn.params["name"] == "matvec":
        counts.append(len(eqn.invars))
      for param in eqn.params.values():
        for sub in param if isinstance(param, tuple | list) else (param,):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            visit(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            visit(sub)

  visit(jax.make_jaxpr(functools.partial(fn, **kwargs))(*args).jaxpr)
  return counts


def test_at_batch_1_the_output_projections_are_kernels_that_add_the_stream(for_a_gpu):
  """One row a step: the attention's and the feed-forward's output
  projections as matvec kernels (ops.matvec_gpu), two a layer, each adding
  its bias and the residual stream (a Pre-LN block hands nothing to its
  next norm); the cached logits still the full pass's. At batch 2 XLA's
  products stay; with dropout applied the kernels add nothing."""
  model, params = model_and_params(position="learned", use_bias=True)
  tokens = random_tokens(5, (1, T))
  cache = decode.init_cache(model, 1, T)
  variables = {"params": params, "cache": cache}
  step = functools.partial(model.apply, use_cache=True, mutable=["cache"])
  assert matvec_operands(step, variables, tokens[:, :1]) == [4] * (2 * TINY["num_layers"])
  full = jax.jit(model.apply)({"params": params}, tokens)
  got = jax.jit(stepwise_logits, static_argnums=0)(model, params, tokens)
  np.testing.assert_allclose(got, full, atol=1e-5)
  cache = decode.init_cache(model, B, T)
  batch_2 = ({"params": params, "cache": cache}, jnp.ones((B, 1), jnp.int32))
  assert matvec_operands(step, *batch_2) == []
  # The same parameters under dropout (traced only: no init to compile).
  dropout_cfg = ModelConfig(**TINY, position="learned", use_bias=True, dropout_rate=0.1)
  dropout_model = models.build(dropout_cfg)
  dropped = matvec_operands(
    dropout_model.apply,
    {"params": params},
    tokens[:, :1],
    deterministic=False,
    rngs={"dropout": jax.random.key(1)},
  )
  assert dropped == [2] * (2 * TINY["num_layers"])


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_encoder_decoder_decoding_with_the_kernels_matches_full_pass(for_a_gpu):
  """Both attentions of each decoder layer as kernels: self-attention over
  its cache, cross-attention over the cached encoding (row 1's padded)."""
  model, params = model_and_params(family="encoder_decoder", position="sinusoidal")
  encoder_tokens = random_tokens(3, (B, 7)).at[1, 4:].set(0)
  decoder_tokens = random_tokens(4, (B, T))

  def stepwise(params, encoder_tokens, decoder_tokens):
    tokens_to_logits, cache = decode.encode_for_decoding(model, params, encoder_tokens, T)
    step = lambda cache, token_B: tokens_to_logits(token_B[:, None], cache)[::-1]
    return jax.lax.scan(step, cache, decoder_tokens.T)[1].transpose(1, 0, 2)

  jaxpr = str(jax.make_jaxpr(stepwise)(params, encoder_tokens, decoder_tokens))
  assert "cache_update_and_attention" in jaxpr and "cross_attention_step" in jaxpr
  full = jax.jit(model.apply)({"params": params}, encoder_tokens, decoder_tokens)
  got = jax.jit(stepwise)(params, encoder_tokens, decoder_tokens)
  np.testing.assert_allclose(got, full, atol=1e-5)


@pytest.mark.slow  # several compiles, one of each path
def test_greedy_tokens_with_the_kernel_equal_the_xla_paths(monkeypatch):
  """generate's program (prompts of different lengths, scanned layers,
  whose cache has a leading layer axis) with the kernel gives the CPU
  path's tokens."""
  model, params = model_and_params(scan_layers=True)
  prompts = [jnp.asarray([[5, 7, 9, 0], [3, 0, 0, 0]], jnp.int32), jnp.asarray([[4, 8, 0, 0]])]
  xla = [decode.generate(model, params, prompt, max_new_tokens=8) for prompt in prompts]
  interpreted(monkeypatch)
  jax.clear_caches()
  try:
    with platform.compiling_for("gpu"):
      assert uses_kernel(model, params)
      # batch 1: the output projections' kernels too
      kernel = [decode.generate(model, params, prompt, max_new_tokens=8) for prompt in prompts]
  finally:
    jax.clear_caches()
  for got, expected in zip(kernel, xla, strict=True):
    np.testing.assert_array_equal(got, expected)


def test_query_key_and_value_reach_the_kernel_packed_where_nothing_rotates_them(for_a_gpu):
  """Multi-head self-attention without RoPE hands the kernel its one q/k/v
  product (and the biases, added in the kernel); RoPE, which rotates q and k
  first, and grouped-query attention (k and v a product of their own) give
  it q, k and v apart."""

  def packed(**overrides):
    model, params = model_and_params(**overrides)
    variables = {"params": params, "cache": decode.init_cache(model, B, T)}
    step = functools.partial(model.apply, use_cache=True, mutable=["cache"])
    jaxpr = str(jax.make_jaxpr(step)(variables, jnp.ones((B, 1), jnp.int32)))
    assert "cache_update_and_attention" in jaxpr
    return "cache_update_and_attention_packed" in jaxpr

  assert packed(position="learned", use_bias=True)
  assert packed(position="none")
  assert not packed(position="rope")
  assert not packed(position="learned", num_kv_heads=2)


def kernel_names(model, params, batch, **overrides) -> list[str]:
  """The attention kernels one cached decoding step of `batch` rows calls,
  in order."""
  variables = {"params": params, "cache": decode.init_cache(model, batch, T)}
  step = functools.partial(model.apply, use_cache=True, mutable=["cache"])
  jaxpr = str(jax.make_jaxpr(step)(variables, jnp.ones((batch, 1), jnp.int32)))
  return re.findall(r"name=(cache_update_and_attention\w*)", jaxpr)


@pytest.mark.parametrize(
  "overrides", [dict(position="learned", use_bias=True), dict(norm="rms", position="none")], ids=str
)
def test_at_batch_1_the_attention_kernel_computes_the_norm_and_the_products(for_a_gpu, overrides):
  """One row: each layer's self-attention kernel takes the residual
  stream and computes the Pre-LN norm and the q/k/v products itself
  (ops.cache_attention_gpu.normalize_project_and_attend), LayerNorm and
  RMSNorm; the cached logits still the full pass's. At batch 2 XLA's norm
  and product stay before the packed kernel."""
  model, params = model_and_params(**overrides)
  layers = TINY["num_layers"]
  assert kernel_names(model, params, 1) == ["cache_update_and_attention_normalized"] * layers
  assert kernel_names(model, params, 2) == ["cache_update_and_attention_packed"] * layers
  tokens = random_tokens(6, (1, T))
  full = jax.jit(model.apply)({"params": params}, tokens)
  got = jax.jit(stepwise_logits, static_argnums=0)(model, params, tokens)
  np.testing.assert_allclose(got, full, atol=1e-5)


def test_a_norm_of_ones_own_is_applied_before_the_kernel(for_a_gpu):
  """A registered norm (here LayerNorm's entry under another name) is not
  one the kernel computes: the layer applies it and hands the kernel the
  product, with the same logits as the built-in entry's kernel."""
  model, params = model_and_params(position="learned", use_bias=True)
  tokens = random_tokens(7, (1, 6))
  built_in = jax.jit(stepwise_logits, static_argnums=0)(model, params, tokens)
  with NORMS.scoped():
    register.norm("layer_of_ones_own")(lambda layer, x, cfg: norm.layer_norm(layer, x, cfg))
    own = models.build(
      ModelConfig(**TINY, position="learned", use_bias=True, norm="layer_of_ones_own")
    )
    assert kernel_names(own, params, 1) == ["cache_update_and_attention_packed"] * 2
    got = jax.jit(stepwise_logits, static_argnums=0)(own, params, tokens)
  np.testing.assert_allclose(got, built_in, atol=1e-5)


def test_the_layer_chooses_the_kernel_only_where_it_can_take_the_step(for_a_gpu):
  """Not for an encoding that adds a bias, an attention_impl the config
  names, linear attention, or a step that records the weights."""
  assert uses_kernel(*model_and_params())
  assert not uses_kernel(*model_and_params(position="t5_bias"))
  assert not uses_kernel(*model_and_params(attention_impl="xla"))
  assert not uses_kernel(*model_and_params(attention="linear"))
  assert not uses_kernel(*model_and_params(), mutable=["cache", "intermediates"])


def test_the_cpu_path_keeps_xla():
  assert not uses_kernel(*model_and_params())


def test_a_norm_hands_a_kernel_its_parameters_only_where_the_ops_compute_it():
  """Norm.in_kernel: the stored scale and bias (none for RMSNorm) and eps
  for x in the compute dtype; None for x in another dtype (the norm then
  rounds x first) and before the parameters exist."""

  class Normalized(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
      layer = Norm(self.cfg)
      before = layer.in_kernel(x)
      return before, layer(x), layer.in_kernel(x), layer.in_kernel(x.astype(jnp.bfloat16))

  x = jax.random.normal(jax.random.key(2), (1, 1, TINY["d_model"]))
  for kind in ("layer", "rms"):
    module = Normalized(ModelConfig(**TINY, norm=kind, norm_eps=1e-3))
    (at_init, *_), variables = module.init_with_output(jax.random.key(0), x)
    assert at_init is None
    params = nn.meta.unbox(variables["params"]["Norm_0"])
    _, _, (scale, bias, eps), other_dtype = module.apply(variables, x)
    assert other_dtype is None and eps == 1e-3
    np.testing.assert_array_equal(scale, params["scale"])
    assert (bias is None) == (kind == "rms")
    if bias is not None:
      np.testing.assert_array_equal(bias, params["bias"])
