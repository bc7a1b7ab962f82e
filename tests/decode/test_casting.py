"""txf.decode.casting: the weights a decoding step reads only in the compute
dtype, cast once before the loop. Which parameters it casts is checked
against what each one's uses are (ground truth written out per leaf), and
the step's results with the cast parameters against those with the stored
ones, bit for bit (the same conversions, done earlier).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import decode, models
from txf.decode import casting
from txf.layers.model_config import ModelConfig
from txf.ops import cache_attention_gpu, matvec_gpu, platform

BF16 = jnp.bfloat16


def every_kind_of_use(p, x_Bx4):
  """Each leaf of `p` used one way (the comment says whether only converted)."""

  def scanned(carry, w_4x4):
    return carry @ w_4x4.astype(BF16), None

  y = jax.lax.scan(scanned, x_Bx4, p["scanned"])[0]  # scanned over: converted
  # A loop's carry, only converted in the loop's body but replaced by the
  # loop's inputs after the first step: no.
  ys = jax.lax.scan(lambda c, x: (x, c.astype(BF16)), p["carry"], jnp.zeros((2, 4)))[1]
  y = y + ys[0] + ys[1]
  y = jax.checkpoint(lambda a: jnp.sin(a @ p["remat"].astype(BF16)))(y)  # converted
  rows = jnp.take(p["gathered"], jnp.array([1, 2]), axis=0).astype(BF16)  # gathered, then converted
  y = jax.lax.cond(y.sum() > 0, lambda a: a + p["branch"].astype(BF16), lambda a: a, y)

  @jax.custom_vjp
  def times(a, b):
    return a * b

  times.defvjp(lambda a, b: (a * b, None), lambda _, g: (g, g))
  y = times(y, p["custom_vjp"].astype(BF16))  # converted
  y = y + jnp.stack([p["stacked"], p["stacked"]]).T.astype(BF16)[:, 0]  # stacked, moved, converted
  y = jax.jit(lambda a: a + rows.sum())(y) * p["arithmetic"]  # read in float32: no
  half = p["other_dtype"].astype(jnp.float16)  # converted to another dtype: no
  both = p["both"].astype(BF16) + p["both"]  # converted and read: no
  return y, half, both, p["returned"]  # returned as it is: no


ONLY_CONVERTED = {"scanned", "remat", "gathered", "branch", "custom_vjp", "stacked"}


def test_only_the_leaves_read_only_in_the_compute_dtype_are_cast():
  shapes = dict(scanned=(2, 4, 4), remat=(4, 4), gathered=(5, 4))
  names = ONLY_CONVERTED | {"carry", "arithmetic", "other_dtype", "both", "returned"}
  rng = np.random.default_rng(0)
  params = {
    name: jnp.asarray(rng.standard_normal(shapes.get(name, (4,))), jnp.float32) for name in names
  }
  params["indices"] = jnp.arange(4)  # not floating: left as it is
  params["unused"] = jnp.ones(4)  # read by nothing: left as it is
  x = jnp.asarray(rng.standard_normal((3, 4)), BF16)
  cast = casting.cast_once(every_kind_of_use, params, (x,), dtype=BF16)
  expected = {name: BF16 if name in ONLY_CONVERTED else params[name].dtype for name in params}
  assert {name: leaf.dtype for name, leaf in cast.items()} == expected
  for got, want in zip(every_kind_of_use(cast, x), every_kind_of_use(params, x), strict=True):
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
  # Already in the compute dtype: nothing to do.
  assert casting.cast_once(every_kind_of_use, params, (x,), dtype=jnp.float32) == params


def test_a_leaf_read_in_float32_by_any_kind_of_call_is_kept():
  """A step whose one-row calls convert w and whose two-row calls read it
  (as a layer's GPU kernel may at one row only): w is cast for the first
  kind of call alone, kept for both; no call at all is an error."""

  def step(p, x):
    return x @ (p["w"].astype(BF16) if x.shape[0] == 1 else p["w"]).astype(x.dtype)

  params, one_row, two_rows = (
    {"w": jnp.ones((4, 4))},
    (jnp.ones((1, 4), BF16),),
    (jnp.ones((2, 4)),),
  )
  assert casting.cast_once(step, params, one_row, dtype=BF16)["w"].dtype == BF16
  assert casting.cast_once(step, params, one_row, two_rows, dtype=BF16)["w"].dtype == jnp.float32
  with pytest.raises(ValueError, match="at least one call"):
    casting.cast_once(step, params, dtype=BF16)


TINY = dict(vocab_size=53, d_model=32, num_heads=4, num_layers=1, max_len=16, dtype="bfloat16")


@functools.cache
def bf16_model_and_params(**overrides):
  """A bfloat16 model with float32 parameters, as training keeps them."""
  cfg = ModelConfig(**{**TINY, **overrides})
  model, tokens = models.build(cfg), jnp.ones((1, 4), jnp.int32)
  inputs = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  return model, jax.jit(model.init)(jax.random.key(0), *inputs)["params"]


def cast_dtypes(params):
  """{'stack/block_0/ffn/wi/kernel': its dtype, ...}."""
  return {
    "/".join(key.key for key in path if hasattr(key, "key")): leaf.dtype
    for path, leaf in jax.tree_util.tree_leaves_with_path(params)
  }


def assert_same_steps(cast_step, step, tokens, cache):
  """The two steps' logits and caches, bit for bit."""
  got, want = (jax.tree.leaves(jax.jit(f)(tokens, cache)) for f in (cast_step, step))
  for got_leaf, want_leaf in zip(got, want, strict=True):
    np.testing.assert_array_equal(
      np.asarray(got_leaf, np.float32), np.asarray(want_leaf, np.float32)
    )


def test_a_sampling_loop_casts_the_weights_and_keeps_the_norms():
  """make_tokens_to_logits(...).cast_for((tokens, cache)): every projection's kernel and
  bias and the embedding tables in bfloat16, the norms' scales and biases
  float32 (read in float32); each step's logits and cache bit for bit the
  uncast step's; and generate's loops take the cast ones, sampling's and
  beam search's."""
  model, params = bf16_model_and_params(position="learned", use_bias=True)
  tokens, cache = jnp.asarray([[3], [5]]), decode.init_cache(model, 2, 8)
  step = decode.make_tokens_to_logits(model, params)
  cast_step = step.cast_for((tokens, cache))
  dtypes = cast_dtypes(cast_step.params)
  for name, dtype in dtypes.items():
    assert dtype == (jnp.float32 if "norm" in name else BF16), name
  assert sum("norm" not in name for name in dtypes) > len(dtypes) / 2
  assert_same_steps(cast_step, step, tokens, cache)
  # generate's loop takes the tables cast: the token embedding [V, D] in bfloat16 only.
  prompt = jnp.asarray([[3, 4, 5], [6, 7, 0]], jnp.int32)
  generate = lambda params, num_beams: decode.generate(
    model, params, prompt, max_new_tokens=5, num_beams=num_beams
  )
  table = params["embedder"]["token"]["embedding"].value.shape
  for num_beams in (1, 2):  # sampling's loop; beam search's prompt loop and search loop
    search = functools.partial(generate, num_beams=num_beams)
    loops = [
      eqn
      for eqn in equations(jax.make_jaxpr(search)(params).jaxpr)
      if eqn.primitive.name == "while"
    ]
    assert len(loops) == num_beams
    for loop in loops:
      loop_inputs = [(var.aval.shape, var.aval.dtype) for var in loop.invars]
      assert (table, BF16) in loop_inputs and (table, jnp.float32) not in loop_inputs


@pytest.mark.slow  # four compiles of an encoder-decoder: about 8 s on 2 cores
def test_an_encoder_decoders_steps_cast_alike():
  """encode_for_decoding's steps cast for their batch: the decoder's steps over the
  cached encoding take the decoder's weights cast (its norms kept; what no
  step reads left as it is) and give the uncast
  steps' logits and cache bit for bit."""
  model, params = bf16_model_and_params(family="encoder_decoder", position="sinusoidal")
  source = jnp.asarray([[4, 5, 6, 0], [7, 8, 9, 10]], jnp.int32)
  step, cache = decode.encode_for_decoding(model, params, source, 6)
  tokens = jnp.asarray([[1], [1]])
  cast_step = step.cast_for((tokens, cache))
  for name, dtype in cast_dtypes(cast_step.params).items():
    # The encoder's and the cross-attention's keys and values: read once,
    # before the steps, which read the cached encoding.
    unread = (
      name.startswith("encoder/")
      or "cross_attention/key" in name
      or "cross_attention/value" in name
    )
    kept = "norm" in name or unread
    assert dtype == (jnp.float32 if kept else BF16), name
  assert_same_steps(cast_step, step, tokens, cache)


def equations(jaxpr):
  """Every equation of `jaxpr`, at any depth."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, tuple | list) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr | jax.extend.core.Jaxpr):
          yield from equations(getattr(sub, "jaxpr", sub))


def test_at_batch_1_on_a_gpu_the_kernels_take_the_cast_weights(monkeypatch):
  """Traced for one GPU: the output projections' matvec kernels read their
  weights cast once (contract casts before the kernel), the attention
  kernel its q/k/v biases as stored (it rounds them itself)."""
  model, params = bf16_model_and_params(position="learned", use_bias=True)
  for module, name in (
    (cache_attention_gpu, "update_and_attend_packed"),
    (matvec_gpu, "matvec"),
  ):
    monkeypatch.setattr(module, name, functools.partial(getattr(module, name), interpret=True))
  tokens, cache = jnp.asarray([[3]]), decode.init_cache(model, 1, 8)
  jax.clear_caches()
  try:
    with platform.compiling_for("gpu"):
      dtypes = cast_dtypes(
        decode.make_tokens_to_logits(model, params).cast_for((tokens, cache)).params
      )
  finally:
    jax.clear_caches()
  for name, dtype in dtypes.items():
    stored = "norm" in name or (
      "/bias" in name and name.split("/")[-2] in ("query", "key", "value")
    )
    assert dtype == (jnp.float32 if stored else BF16), name
  assert dtypes["stack/block_0/ffn/wo/kernel"] == dtypes["stack/block_0/self_attention/out/bias"]
