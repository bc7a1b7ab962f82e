"""Tests for txf.decode: KV-cache correctness (self- and cross-attention),
sampling and greedy decoding, prompts of different lengths, cache checks.
Beam search is tested in test_decode_beam.py.

Model-level tests use tiny random-init float32 models; the search logic is
also checked on stub `tokens_to_logits` functions whose logits are known, so
the expected tokens are computed independently in numpy.
Tolerances: cached vs full-pass logits atol 1e-5 (same float32 math, other
summation order).
"""

import functools
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import decode, hardware, models
from txf.layers import MultiHeadAttention
from txf.layers.model_config import ModelConfig

TINY = dict(vocab_size=50, d_model=32, num_heads=4, num_layers=2, max_len=16)
B, T = 2, 12


@functools.cache
def model_and_params(**overrides):
  """A tiny model and its random-init parameters (cached per config)."""
  cfg = ModelConfig(**{**TINY, **overrides})
  model = models.build(cfg)
  tokens = jnp.ones((1, 4), jnp.int32)
  args = (tokens, tokens) if cfg.family == "encoder_decoder" else (tokens,)
  # Eager init is cheaper (the small ops' compilations are shared by all
  # configs), except for scanned layers, which eager mode recompiles per call.
  init = jax.jit(model.init) if cfg.scan_layers else model.init
  return model, init(jax.random.key(0), *args)["params"]


@functools.partial(jax.jit, static_argnames=("model", "method", "use_cache"))
def apply(model, variables, *args, method=None, use_cache=False):
  """Jitted model.apply; with use_cache, (outputs, variables) of a cached call."""
  if use_cache:
    return model.apply(variables, *args, method=method, use_cache=True, mutable=["cache"])
  return model.apply(variables, *args, method=method)


def random_tokens(seed, shape, low=1):
  """Tokens in [low, vocab) (low=1 keeps the pad id 0 out)."""
  return jax.random.randint(jax.random.key(seed), shape, low, TINY["vocab_size"])


# ---------------------------------------------------------------------------
# KV cache: feeding tokens one at a time reproduces the full forward pass.


@functools.partial(jax.jit, static_argnames=("model",))
def stepwise_logits(model, params, tokens_BxT):
  """Logits [B, T, V] from feeding tokens through the cache one per step."""
  tokens_to_logits = decode.make_tokens_to_logits(model, params)

  def step(cache, token_B):
    logits_BxV, cache = tokens_to_logits(token_B[:, None], cache)
    return cache, logits_BxV

  cache = decode.init_cache(model, tokens_BxT.shape[0], tokens_BxT.shape[1])
  _, logits_TxBxV = jax.lax.scan(step, cache, tokens_BxT.T)
  return logits_TxBxV.transpose(1, 0, 2)


# Every position encoding's own cache is tested in test_positions.py; here the
# decoding loop with one rotation and one bias encoding, and each attention variant
# (linear attention's cache holds its keys, as softmax attention's).
DECODER_VARIANTS = [dict(position=p) for p in ("rope", "t5_bias")] + [
  dict(num_kv_heads=2),
  dict(num_kv_heads=1),
  dict(window=3),
  dict(scan_layers=True),
  dict(attention="linear"),
]


@pytest.mark.parametrize("overrides", DECODER_VARIANTS, ids=str)
def test_cached_decoding_matches_full_pass(overrides):
  model, params = model_and_params(**overrides)
  tokens = random_tokens(1, (B, T))
  full = apply(model, {"params": params}, tokens)
  np.testing.assert_allclose(stepwise_logits(model, params, tokens), full, atol=1e-5)


def test_prefill_then_single_steps_match_full_pass():
  model, params = model_and_params(window=3)
  tokens = random_tokens(2, (B, T))
  prefill = 5
  cache = decode.init_cache(model, B, T)
  logits, variables = apply(
    model, {"params": params, "cache": cache}, tokens[:, :prefill], use_cache=True
  )
  assert int(variables["cache"]["positions"]["index"]) == prefill
  for t in range(prefill, T):
    step_logits, variables = apply(
      model, {"params": params, **variables}, tokens[:, t : t + 1], use_cache=True
    )
    logits = jnp.concatenate([logits, step_logits], axis=1)
  np.testing.assert_allclose(logits, apply(model, {"params": params}, tokens), atol=1e-5)


def seq2seq_model():
  # Scanned decoder layers put the cache's batch on axis 1.
  return model_and_params(family="encoder_decoder", position="t5_bias", scan_layers=True)


@functools.partial(jax.jit, static_argnames=("model",))
def seq2seq_stepwise(model, params, encoder_tokens_BxS, decoder_tokens_BxT):
  """Logits [B, T, V] from feeding decoder tokens one per step, with the
  cross-attention keys/values cached and recomputed at every step; and the
  cached path's cache after the encoding is stored."""

  def run(cache_cross_attention):
    tokens_to_logits, cache = decode.encode_for_decoding(
      model,
      params,
      encoder_tokens_BxS,
      decoder_tokens_BxT.shape[1],
      cache_cross_attention=cache_cross_attention,
    )
    step = lambda cache, token_B: tokens_to_logits(token_B[:, None], cache)[::-1]
    return jax.lax.scan(step, cache, decoder_tokens_BxT.T)[1].transpose(1, 0, 2), cache

  (cached, cache), (uncached, _) = run(True), run(False)
  return cached, uncached, cache


def test_an_encoder_decoder_starts_from_bos_even_where_it_is_the_pad_id():
  """T5's decoder starts from its pad token: generate's default start
  column of bos_id == pad_id is a token of each prompt, and greedy decoding
  continues it with the full model's argmax at every position."""
  model, params = seq2seq_model()
  source_BxS = jnp.array([[3, 4, 5, 6], [7, 8, 0, 0]])
  out_BxT = decode.generate(
    model, params, encoder_tokens_BxS=source_BxS, max_new_tokens=3, bos_id=model.cfg.pad_id
  )
  assert out_BxT.shape == (2, 4)
  np.testing.assert_array_equal(out_BxT[:, 0], model.cfg.pad_id)
  full_BxTxV = apply(model, {"params": params}, source_BxS, out_BxT[:, :-1])
  np.testing.assert_array_equal(out_BxT[:, 1:], jnp.argmax(full_BxTxV, axis=-1))


def test_an_encoder_decoder_starts_from_bos_1_within_the_memory_its_encoding_takes(monkeypatch):
  """Without prompts, an encoder-decoder's rows start from bos_id's default,
  token 1. The memory bound counts the cache of the encoder's length (its
  cross-attention keys and values, counted here from init_cache's arrays):
  one byte short is refused, exactly it decodes, greedy at every position
  against the full model's argmax."""
  model, params = seq2seq_model()
  source_BxS = jnp.array([[3, 4, 5, 6], [7, 8, 0, 0]])
  cache = decode.init_cache(model, 2, decode.cache_length(1, 3), encoder_tokens=source_BxS)
  need = sum(np.asarray(x).nbytes for x in jax.tree.leaves((params, cache)))
  monkeypatch.setattr(hardware, "memory_bytes", lambda device: need - 1)
  with pytest.raises(ValueError, match=r"^max_new_tokens: 2 x 1 \+ 3 tokens' decoding cache"):
    decode.generate(model, params, encoder_tokens_BxS=source_BxS, max_new_tokens=3)
  monkeypatch.setattr(hardware, "memory_bytes", lambda device: need)
  out_BxT = decode.generate(model, params, encoder_tokens_BxS=source_BxS, max_new_tokens=3)
  np.testing.assert_array_equal(out_BxT[:, 0], 1)
  full_BxTxV = apply(model, {"params": params}, source_BxS, out_BxT[:, :-1])
  np.testing.assert_array_equal(out_BxT[:, 1:], jnp.argmax(full_BxTxV, axis=-1))


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_cached_cross_attention_matches_uncached_and_full_pass():
  model, params = seq2seq_model()
  encoder_tokens = random_tokens(3, (B, 7)).at[1, 4:].set(0)  # row 1 padded
  decoder_tokens = random_tokens(4, (B, T))
  cached, uncached, cache = seq2seq_stepwise(model, params, encoder_tokens, decoder_tokens)
  full = apply(model, {"params": params}, encoder_tokens, decoder_tokens)
  np.testing.assert_allclose(cached, uncached, atol=1e-5)
  np.testing.assert_allclose(cached, full, atol=1e-5)
  # The stored encoding: every layer's keys/values ([N, B, S, K, Dh] scanned)
  # and the encoder padding mask; the self-attention part is still empty.
  crossed = cache["decoder"]["blocks"]["cross_attention"]
  assert crossed["cross_key"].shape == (2, B, 7, 4, 8) and np.abs(crossed["cross_key"]).min() > 0
  np.testing.assert_array_equal(
    crossed["cross_mask"][:, :, 0, 0, :], np.broadcast_to(encoder_tokens != 0, (2, B, 7))
  )
  assert int(cache["positions"]["index"]) == 0
  assert not cache["decoder"]["blocks"]["self_attention"]["cached_key"].any()


def test_query_rows_sharing_an_encoding_equal_each_row_with_its_own_copy():
  # Beam search keeps one encoding per example for all its beams: 6 query
  # rows over 2 key rows must equal 6 rows over the key rows repeated 3 times.
  cfg = ModelConfig(d_model=8, num_heads=4, num_kv_heads=2, head_dim=4, position="none")
  attention = MultiHeadAttention(cfg, cross=True)
  x = jax.random.normal(jax.random.key(0), (6, 3, 8))
  kv = jax.random.normal(jax.random.key(1), (2, 5, 8))
  key_mask = (jnp.arange(5) < jnp.array([[5], [3]]))[:, None, None]  # row 1: 3 keys
  positions = jnp.arange(3)[None]
  variables = jax.jit(attention.init)(jax.random.key(2), x, kv, q_positions_BxT=positions)
  apply = jax.jit(
    lambda kv, key_mask: attention.apply(
      variables, x, kv, key_mask=key_mask, q_positions_BxT=positions, mutable=["intermediates"]
    )
  )
  shared, shared_maps = apply(kv, key_mask)
  copied, copied_maps = apply(jnp.repeat(kv, 3, axis=0), jnp.repeat(key_mask, 3, axis=0))
  np.testing.assert_allclose(shared, copied, atol=1e-6)
  np.testing.assert_allclose(
    jax.tree.leaves(shared_maps)[0], jax.tree.leaves(copied_maps)[0], atol=1e-6
  )
  with pytest.raises(ValueError, match="6 query rows cannot share 4 key/value rows"):
    jax.eval_shape(apply, jnp.ones((4, 5, 8)), None)


def test_cross_attention_without_a_stored_encoding_is_an_error():
  model, params = seq2seq_model()
  tokens = jnp.ones((B, 1), jnp.int32)
  with pytest.raises(ValueError, match="encoded_BxSxD=None .* needs use_cache=True"):
    model.apply({"params": params}, None, None, tokens, method="decode")
  cache = decode.init_cache(model, B, 4, encoder_tokens=tokens)
  del cache["decoder"]["blocks"]["cross_attention"]  # a cache that never stored one
  with pytest.raises(ValueError, match="reads its keys/values from the cache, which holds none"):
    model.apply(
      {"params": params, "cache": cache},
      None,
      None,
      tokens,
      use_cache=True,
      mutable=["cache"],
      method="decode",
    )


# ---------------------------------------------------------------------------
# init_cache.


def test_init_cache_shapes_and_batch_axes():
  # [B, L, K, Dh], with scanned layers [N, B, L, K, Dh]
  for overrides, layout in (
    (dict(num_kv_heads=2), (B, 10, 2, 8)),
    (dict(scan_layers=True), (2, B, 10, 4, 8)),
  ):
    model, _ = model_and_params(**overrides)
    scan = "scan_layers" in overrides
    cache = decode.init_cache(model, B, 10)
    keys = [
      leaf
      for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
      if "cached_key" in jax.tree_util.keystr(path)
    ]
    assert keys and all(k.shape == layout and not k.any() for k in keys)
    axes = jax.tree_util.tree_leaves_with_path(
      decode.cache_batch_axes(model, 10), is_leaf=lambda a: a is None
    )
    for path, axis in axes:
      assert axis == (None if "index" in jax.tree_util.keystr(path) else int(scan))


def test_seq2seq_cache_holds_the_encoding_once_per_example():
  model, _ = seq2seq_model()
  cache = decode.init_cache(model, B, 10, encoder_tokens=jnp.ones((B, 7), jnp.int32))
  crossed = cache["decoder"]["blocks"]["cross_attention"]
  assert crossed["cross_key"].shape == crossed["cross_value"].shape == (2, B, 7, 4, 8)
  assert crossed["cross_mask"].shape == (2, B, 1, 1, 7)
  # Beam search keeps one copy per example (its beams share it): no batch
  # axis to copy or reorder, unlike the self-attention keys.
  axes = decode.cache_batch_axes(model, 10)
  assert axes["decoder"]["blocks"]["cross_attention"] == dict(
    cross_key=None, cross_value=None, cross_mask=None
  )
  assert axes["decoder"]["blocks"]["self_attention"] == dict(cached_key=1, cached_value=1)
  assert axes["positions"]["index"] is None


@pytest.mark.parametrize(
  "overrides, kwargs, field",
  [
    (dict(position="learned"), dict(cache_len=17), "model.max_len"),
    (dict(family="encoder", head="mlm"), dict(cache_len=8), "model.family"),
    (dict(head="classify", pooling="last"), dict(cache_len=8), "model.head"),
    (dict(), dict(cache_len=8, encoder_tokens=jnp.ones((B, 3), jnp.int32)), "encoder_tokens"),
    (dict(family="encoder_decoder"), dict(cache_len=8), "encoder_tokens: an encoder_decoder"),
    # A negative length gave an empty cache, a float a flax traceback.
    (dict(), dict(cache_len=-3), r"^init_cache: cache_len: must be an integer >= 1, got -3$"),
    (dict(), dict(cache_len=4.0), r"^init_cache: cache_len: must be an integer >= 1, got 4\.0$"),
    (
      dict(family="encoder_decoder"),
      dict(cache_len=8, encoder_tokens=jnp.ones(3, jnp.int32)),
      r"^init_cache: encoder_tokens must be \[B, S\], got shape \(3,\)$",
    ),
  ],
)
def test_init_cache_errors(overrides, kwargs, field):
  model = models.build(ModelConfig(**{**TINY, **overrides}))
  with pytest.raises(ValueError, match=field):
    decode.init_cache(model, B, **kwargs)


def test_init_cache_refuses_a_batch_that_is_not_a_positive_int():
  model = models.build(ModelConfig(**TINY))
  for batch_size in (0, -1, 2.0):
    with pytest.raises(ValueError, match=r"^init_cache: batch_size: must be an integer >= 1"):
      decode.init_cache(model, batch_size, 8)


def test_an_eager_step_past_the_cache_end_is_refused_not_written_onto_its_last_slot():
  """Six tokens fed one by one into a cache of four: the fifth and sixth
  overwrote slot 3 and gave wrong logits, without a word."""
  model, params = model_and_params()
  step = decode.make_tokens_to_logits(model, params)
  cache = decode.init_cache(model, 1, 4)
  tokens = jnp.array([[3, 4, 5, 6, 7, 8]])
  full = model.apply({"params": params}, tokens)
  for i in range(4):
    logits, cache = step(tokens[:, i : i + 1], cache)
    np.testing.assert_allclose(logits, full[:, i], atol=1e-5)
  with pytest.raises(ValueError, match=r"^decode: 1 new tokens at position 4 pass the end of a"):
    step(tokens[:, 4:5], cache)


def test_a_jitted_step_past_the_cache_end_gives_nan_logits_not_wrong_numbers():
  """The same under jax.jit, where the index is traced and cannot be
  refused: the fifth and sixth steps' logits were finite and wrong (0.6
  off the full pass), the write clamped onto slot 3."""
  model, params = model_and_params()
  step = jax.jit(decode.make_tokens_to_logits(model, params).__call__)
  cache = decode.init_cache(model, 1, 4)
  tokens = jnp.array([[3, 4, 5, 6, 7, 8]])
  full = model.apply({"params": params}, tokens)
  for i in range(6):
    logits, cache = step(tokens[:, i : i + 1], cache)
    if i < 4:
      np.testing.assert_allclose(logits, full[:, i], atol=1e-5)
    else:
      assert np.isnan(logits).all(), i


def test_init_cache_learned_positions_up_to_table_size():
  model, _ = model_and_params(position="learned")
  assert jax.tree.leaves(decode.init_cache(model, B, TINY["max_len"]))


# ---------------------------------------------------------------------------
# Sampling and greedy decoding on a random-init decoder.

PROMPT = jnp.array([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])  # lengths 3 and 5
NEW = 6


def reference_greedy(model, params, prompt, max_new_tokens, pad_id=0):
  """Greedy decoding by full forward passes over a fixed-size buffer (no cache)."""
  lengths = (np.asarray(prompt) != pad_id).sum(1)
  tokens = np.pad(np.asarray(prompt), ((0, 0), (0, max_new_tokens)), constant_values=pad_id)
  for row, length in enumerate(lengths):
    for position in range(length, length + max_new_tokens):
      # Causal: the pad after `position` does not change its logits.
      logits = apply(model, {"params": params}, tokens)
      tokens[row, position] = np.argmax(logits[row, position - 1])
  return tokens


@pytest.fixture(scope="module")
def lm():
  model, params = model_and_params()
  greedy = decode.generate(model, params, PROMPT, max_new_tokens=NEW)
  return model, params, np.asarray(greedy)


def test_greedy_matches_uncached_reference(lm):
  model, params, greedy = lm
  np.testing.assert_array_equal(greedy, reference_greedy(model, params, PROMPT, NEW))


@pytest.mark.parametrize(
  "kwargs",
  [dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-5)],
  ids=["top_k=1", "top_p=1e-6", "temperature=1e-5"],
)
def test_degenerate_sampling_is_greedy(lm, kwargs):
  model, params, greedy = lm
  sampled = decode.generate(
    model, params, PROMPT, max_new_tokens=NEW, rng=jax.random.key(7), **kwargs
  )
  np.testing.assert_array_equal(sampled, greedy)


def test_sampling_is_reproducible_and_depends_on_rng(lm):
  model, params, greedy = lm
  run = lambda seed: np.asarray(
    decode.generate(
      model, params, PROMPT, max_new_tokens=NEW, rng=jax.random.key(seed), temperature=1.0
    )
  )
  first = run(0)
  np.testing.assert_array_equal(first, run(0))
  assert not np.array_equal(first, run(1))
  assert not np.array_equal(first, greedy)
  np.testing.assert_array_equal(np.where(PROMPT != 0, first[:, :5], 0), PROMPT)


# ---------------------------------------------------------------------------
# Search logic on stubs (the cache is a dummy pytree).

COUNT_VOCAB = 16


def counting_stub(calls):
  """Always predicts token + 1, logging each call into `calls`."""

  def tokens_to_logits(tokens_Bx1, cache):
    jax.debug.callback(lambda: calls.append(1))
    logits = 10.0 * jax.nn.one_hot((tokens_Bx1[:, 0] + 1) % COUNT_VOCAB, COUNT_VOCAB)
    return logits, {"index": cache["index"] + 1}

  return tokens_to_logits


def expected_counting(prompt_row, eos_id, max_new_tokens, pad_id=0, length=None):
  """(row of sample()'s output, position of its last generated token) for a
  right-padded row; length None: the prompt is the tokens != pad_id."""
  tokens = [t for t in prompt_row if t != pad_id] if length is None else list(prompt_row[:length])
  for _ in range(max_new_tokens):
    tokens.append((tokens[-1] + 1) % COUNT_VOCAB)
    if tokens[-1] == eos_id:
      break
  end = len(tokens) - 1
  return tokens + [pad_id] * (len(prompt_row) + max_new_tokens - len(tokens)), end


def greedy_counting(prompt_BxP, **kwargs):
  """decode.sample's greedy output (max_new_tokens=4 unless given) on the
  counting stub, with a dummy cache."""
  kwargs = dict(dict(max_new_tokens=4), **kwargs)
  return decode.sample(
    counting_stub([]),
    {"index": jnp.int32(0)},
    prompt_BxP,
    rng=jax.random.key(0),
    temperature=0.0,
    **kwargs,
  )


@pytest.mark.parametrize("eos_id", [6, None])
def test_sample_stops_rows_at_eos_and_length(eos_id):
  # Row 1's prompt ends in the EOS id: a prompt token must not end the row.
  prompt = jnp.array([[1, 2, 0], [5, 6, 0], [4, 0, 0]])
  calls = []
  out = decode.sample(
    counting_stub(calls),
    {"index": jnp.int32(0)},
    prompt,
    max_new_tokens=6,
    rng=jax.random.key(0),
    temperature=0.0,
    eos_id=eos_id,
  )
  jax.effects_barrier()
  expected = [expected_counting(list(row), eos_id, 6) for row in np.asarray(prompt)]
  np.testing.assert_array_equal(out, [tokens for tokens, _ in expected])
  # The loop stops when the last row ends, before the buffer's end (8 steps).
  assert len(calls) == max(end for _, end in expected) < 8


def test_rows_that_end_early_are_filled_with_pad_id_to_the_end():
  """Every row ends at EOS on its first new token: the buffer's columns
  after it, which the loop never writes, hold pad_id (here not 0)."""
  pad_id, eos_id = COUNT_VOCAB - 1, 3
  prompt = jnp.array([[1, 2], [2, pad_id]])  # each row's next token is eos_id
  out = greedy_counting(prompt, eos_id=eos_id, pad_id=pad_id)
  expected = [expected_counting(list(row), eos_id, 4, pad_id)[0] for row in np.asarray(prompt)]
  np.testing.assert_array_equal(out, expected)


def test_each_new_token_is_drawn_with_its_own_key():
  """Twenty tokens drawn from one uniform distribution over 50 ids are not
  all one id (probability 50^-19 if each draw has its own key; certain if
  every step reused one)."""
  stub = lambda tokens_Bx1, cache: (jnp.zeros((tokens_Bx1.shape[0], 50)), cache)
  out = decode.sample(
    stub, {}, jnp.ones((1, 1), jnp.int32), max_new_tokens=20, rng=jax.random.key(0)
  )
  assert len(set(np.asarray(out[0, 1:]).tolist())) > 1


def to_left(rows, lengths, prompt_len):
  """Right-padded rows (prompts, or outputs laid out as sample's) moved to
  the left-padded layout: each shifted right by its padding, P - length."""
  return np.stack([np.roll(row, prompt_len - length) for row, length in zip(rows, lengths)])


RAGGED = np.array([[1, 2, 0], [5, 6, 0], [4, 0, 0], [7, 8, 9]])  # lengths 2, 2, 1, 3


def test_sample_on_left_padded_prompts():
  lengths = (RAGGED != 0).sum(1)
  out = greedy_counting(to_left(RAGGED, lengths, 3), eos_id=6, padding_side="left")
  expected = np.array([expected_counting(list(row), 6, 4)[0] for row in RAGGED])
  np.testing.assert_array_equal(out, to_left(expected, lengths, 3))


def test_sample_with_prompt_lengths_reads_only_those_tokens():
  # Given lengths, a prompt may hold the pad id (row 2 starts with token 0),
  # and whatever follows it (here 13s) is neither fed nor returned.
  lengths = np.array([2, 1, 3, 1])
  prompt = np.where(np.arange(3) < lengths[:, None], RAGGED, 13)
  prompt[2, 0] = 0
  out = greedy_counting(prompt, eos_id=6, prompt_lengths_B=jnp.asarray(lengths))
  expected = [expected_counting(list(row), 6, 4, length=n)[0] for row, n in zip(prompt, lengths)]
  np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
  "prompt, kwargs, message",
  [
    ([[0, 5, 6]], {}, r"rows \[0\] are not right-padded with pad_id=0"),
    ([[5, 0, 6], [5, 6, 0]], {}, r"rows \[0\] are not right-padded"),
    ([[5, 6, 0]], dict(padding_side="left"), r"rows \[0\] are not left-padded"),
    ([[5, 6], [0, 0]], {}, r"rows \[1\] hold only pad_id=0; every row needs a token"),
    ([[5, 6]], dict(prompt_lengths_B=jnp.array([3])), r"prompt_lengths_B must lie in \[1, 2\]"),
    # A row of no tokens would be fed the pad id as its first token.
    ([[5, 6]], dict(prompt_lengths_B=jnp.array([0])), r"prompt_lengths_B must lie in \[1, 2\]"),
    ([[5, 6]], dict(prompt_lengths_B=jnp.array([1, 2])), r"must have shape \(1,\), got \(2,\)"),
    ([[5, 6]], dict(padding_side="middle"), "padding_side must be one of"),
    ([[5, 6]], dict(max_new_tokens=0), "max_new_tokens: must be an integer >= 1, got 0"),
    ([[5, 6]], dict(max_new_tokens=2.0), "max_new_tokens: must be an integer >= 1, got 2.0"),
    ([[5, 6, 7]], dict(prompt_lengths_B=jnp.array([2.5])), "prompt_lengths_B must be integers"),
    ([5, 6], {}, r"prompts must be int \[B, P\]"),
  ],
  ids=[
    "pad first",
    "pad inside",
    "right as left",
    "empty row",
    "length > P",
    "length 0",
    "lengths shape",
    "side",
    "no new tokens",
    "float count",
    "float lengths",
    "1-D prompt",
  ],
)
def test_bad_prompts_are_rejected_before_decoding(prompt, kwargs, message):
  calls = []
  kwargs = dict(dict(max_new_tokens=3), **kwargs)
  with pytest.raises(ValueError, match=message):
    decode.sample(
      counting_stub(calls),
      {"index": jnp.int32(0)},
      jnp.array(prompt),
      rng=jax.random.key(0),
      **kwargs,
    )
  jax.effects_barrier()
  assert not calls


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(), "prompt_BxP: a decoder needs prompts"),
    (dict(prompt_BxP=PROMPT, encoder_tokens_BxS=PROMPT), "encoder_tokens_BxS only apply"),
    (dict(prompt_BxP=PROMPT[:, ::-1]), r"rows \[0\] are not right-padded"),
    # Both ends of the vocabulary [0, 50): the embedding clamped them (50 read
    # as 49) and generation continued another prompt, without a word.
    (
      dict(prompt_BxP=PROMPT.at[1, 0].set(50)),
      r"^generate: prompt_BxP: id 50 outside the vocabulary \[0, 50\) \(model.vocab_size\)$",
    ),
    (dict(prompt_BxP=PROMPT.at[0, 1].set(-1)), r"^generate: prompt_BxP: id -1 outside"),
    (dict(prompt_BxP=[[5, 6, 7], [4]]), r"^generate: prompt_BxP: rows of different lengths"),
    # An EOS the model can never emit: rows ran to max_new_tokens, without a word.
    (
      dict(prompt_BxP=PROMPT, eos_id=50),
      r"^generate: eos_id: must be an integer in \[0, 49\], got 50$",
    ),
    (dict(prompt_BxP=PROMPT, eos_id=-1), r"^generate: eos_id: must be an integer in \[0, 49\]"),
  ],
)
def test_bad_generate_arguments_are_rejected(kwargs, message):
  model, params = model_and_params()
  with pytest.raises(ValueError, match=message):
    decode.generate(model, params, max_new_tokens=2, **kwargs)


def test_an_empty_source_is_refused():
  """It decoded as if unconditioned: cross-attention over no keys is zeros."""
  model, params = model_and_params(family="encoder_decoder")
  with pytest.raises(
    ValueError,
    match=r"^generate: encoder_tokens_BxS must hold at least one token a row, got S = 0$",
  ):
    decode.generate(
      model, params, encoder_tokens_BxS=jnp.zeros((2, 0), jnp.int32), max_new_tokens=2
    )
  # So is a row of padding only: the encoder masks every key.
  sources_BxS = jnp.asarray([[5, 6, 7], [model.cfg.pad_id] * 3])
  with pytest.raises(
    ValueError,
    match=r"^generate: encoder_tokens_BxS rows \[1\] hold only pad_id=0; every source needs",
  ):
    decode.generate(model, params, encoder_tokens_BxS=sources_BxS, max_new_tokens=2)


def test_a_search_refuses_a_cache_of_other_rows_a_scanned_one_without_axes_and_no_key():
  """Each was a jax error from inside the search (a cache of fewer rows a
  dynamic_update_slice shape, of more rows the attention layer's 'cannot
  share key/value rows', a scanned cache's beams a shape at the first
  step, rng=None a TypeError about the key's type), nothing traced."""
  model, params = model_and_params()
  steps, calls = decode.make_tokens_to_logits(model, params), []
  prompt = jnp.array([[5, 6], [7, 8]])
  searches = {
    "sample": functools.partial(decode.sample, rng=jax.random.key(0)),
    "beam_search": functools.partial(decode.beam_search, num_beams=2, eos_id=None),
  }
  for name, search in searches.items():
    for rows in (1, 3):
      with pytest.raises(
        ValueError, match=rf"^{name}: the cache holds {rows} rows, but there are 2 prompts"
      ):
        search(counting_stub(calls), decode.init_cache(model, rows, 4), prompt, max_new_tokens=2)
  for rng in (None, jax.random.split(jax.random.key(0))):
    with pytest.raises(ValueError, match=r"^sample: rng: one PRNG key \(jax.random.key\(0\)\)"):
      decode.sample(steps, decode.init_cache(model, 2, 4), prompt, max_new_tokens=2, rng=rng)
  scanned, _ = model_and_params(scan_layers=True)
  with pytest.raises(ValueError, match=r"^beam_search: batch_axes: the cache holds its rows after"):
    searches["beam_search"](
      counting_stub(calls), decode.init_cache(scanned, 2, 4), prompt, max_new_tokens=2
    )
  jax.effects_barrier()
  assert not calls
  # A legacy raw key is one key too.
  legacy = decode.sample(
    steps, decode.init_cache(model, 2, 4), prompt, max_new_tokens=2, rng=jax.random.PRNGKey(0)
  )
  assert legacy.shape == (2, 4)


def test_generate_takes_lists_of_prompt_lengths_as_it_takes_lists_of_prompts():
  """A list of lengths passed the checks and failed inside the program."""
  model, params = model_and_params()
  prompt = [[5, 6, 7], [4, 8, 0]]
  as_arrays = decode.generate(
    model, params, jnp.array(prompt), max_new_tokens=2, prompt_lengths_B=jnp.array([3, 2])
  )
  as_lists = decode.generate(model, params, prompt, max_new_tokens=2, prompt_lengths_B=[3, 2])
  np.testing.assert_array_equal(as_lists, as_arrays)


# Each was accepted by the library (only txf-generate's flags were checked):
# top_p=0 returned only pad_id, top_p NaN or past 1 and temperature NaN / inf
# sampled unfiltered or went greedy without a word, a negative temperature
# sampled from the inverted distribution.
BAD_SAMPLING = {
  "temperature=nan": (dict(temperature=float("nan")), "temperature: must be a finite number >= 0"),
  "temperature=inf": (dict(temperature=float("inf")), "temperature: must be a finite number >= 0"),
  "temperature=-1": (dict(temperature=-1.0), "temperature: must be a finite number >= 0"),
  "temperature=[1,2]": (dict(temperature=jnp.array([1.0, 2.0])), "temperature: must be a scalar"),
  "top_p=nan": (dict(top_p=float("nan")), r"top_p: must be in \(0, 1\], got nan"),
  "top_p=0": (dict(top_p=0.0), r"top_p: must be in \(0, 1\], got 0.0"),
  "top_p=1.5": (dict(top_p=1.5), r"top_p: must be in \(0, 1\], got 1.5"),
  "top_k=-1": (dict(top_k=-1), "top_k: must be an integer >= 0, got -1"),
}


@pytest.mark.parametrize("kwargs, message", list(BAD_SAMPLING.values()), ids=list(BAD_SAMPLING))
def test_sampling_arguments_out_of_range_are_rejected_by_generate_and_sample(kwargs, message):
  """Also with rng=None (greedy), where they would be ignored: an argument
  out of range is a caller's mistake either way."""
  model, params = model_and_params()
  for rng in (None, jax.random.key(0)):
    with pytest.raises(ValueError, match=message):
      decode.generate(model, params, PROMPT, max_new_tokens=2, rng=rng, **kwargs)
  calls = []
  with pytest.raises(ValueError, match=message):
    decode.sample(
      counting_stub(calls),
      {"index": jnp.int32(0)},
      jnp.array([[5, 6]]),
      max_new_tokens=2,
      rng=jax.random.key(0),
      **kwargs,
    )
  jax.effects_barrier()
  assert not calls


def test_a_traced_temperature_is_left_to_the_caller():
  """One compiled program serves every temperature: under jit its value is
  not known, and sample still runs (temperature 0: greedy)."""
  calls = []
  run = jax.jit(
    lambda temperature: decode.sample(
      counting_stub(calls),
      {"index": jnp.int32(0)},
      jnp.array([[5, 6]]),
      max_new_tokens=2,
      rng=jax.random.key(0),
      temperature=temperature,
    )
  )
  np.testing.assert_array_equal(run(0.0), [[5, 6, 7, 8]])


@pytest.mark.parametrize("overrides", [dict(), dict(scan_layers=True)], ids=str)
def test_a_cache_too_short_for_prompt_and_new_tokens_is_an_error(overrides):
  # A caller-built cache: PROMPT (5 columns) and NEW = 6 tokens need 10 positions.
  model, params = model_and_params(**overrides)
  tokens_to_logits = decode.make_tokens_to_logits(model, params)
  cache = decode.init_cache(model, B, 9)
  with pytest.raises(
    ValueError,
    match=r"sample: the cache holds 9 positions, but prompts of 5 "
    r"tokens and max_new_tokens=6 need 10",
  ):
    decode.sample(tokens_to_logits, cache, PROMPT, max_new_tokens=NEW, rng=jax.random.key(0))
  with pytest.raises(ValueError, match=r"beam_search: the cache holds 9 positions, .* need 10"):
    decode.beam_search(
      tokens_to_logits, cache, PROMPT, num_beams=2, max_new_tokens=NEW, eos_id=None
    )


def test_a_caller_built_cache_of_the_right_size_decodes_as_generate(lm):
  model, params, greedy = lm
  sample = jax.jit(
    lambda cache: decode.sample(
      decode.make_tokens_to_logits(model, params),
      cache,
      PROMPT,
      max_new_tokens=NEW,
      rng=jax.random.key(0),
      temperature=0.0,
    )
  )
  np.testing.assert_array_equal(sample(decode.init_cache(model, B, 10)), greedy)


@pytest.mark.parametrize(
  "kwargs",
  [dict(top_k=3), dict(top_p=0.8), dict(top_k=4, top_p=0.9), dict(top_k=8), dict(top_k=9)],
  ids=str,
)
def test_top_k_top_p_sample_exactly_the_kept_tokens(kwargs):
  """The tokens drawn are those the filters keep; a k of the vocabulary's
  size (8) or above keeps every token."""
  logits = jnp.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
  drawn = drawn_tokens(logits, rows=512, seed=3, **kwargs)
  probs = np.asarray(jax.nn.softmax(logits))  # sorted descending already
  kept = np.arange(min(kwargs.get("top_k", 8), 8))
  kept = kept[(np.cumsum(probs) - probs)[kept] < kwargs.get("top_p", 1.0)]
  assert drawn == set(kept.tolist())


def drawn_tokens(logits, *, rows, seed, **sampling):
  """The set of tokens `decode.sample` draws, one per row of `rows`, from
  the fixed logits [V] (a stub model) under `sampling`'s filters."""
  stub = lambda tokens_Bx1, cache: (
    jnp.broadcast_to(logits, (tokens_Bx1.shape[0], logits.shape[-1])),
    cache,
  )
  out = decode.sample(
    stub,
    {},
    jnp.ones((rows, 1), jnp.int32),
    max_new_tokens=1,
    rng=jax.random.key(seed),
    **sampling,
  )
  return set(np.asarray(out[:, 1]).tolist())


def nucleus_reference(logits, top_k, top_p):
  """The tokens top-k then top-p keep, by their definitions in float64: the
  k largest and every tie with the k-th; then, over the whole row sorted,
  each token whose more likely tokens hold less than top_p (a tie with the
  last such token kept with it)."""
  logits = np.asarray(logits, np.float64)
  kept = logits >= np.sort(logits)[::-1][top_k - 1] if top_k else np.ones(len(logits), bool)
  probs = np.where(kept, np.exp(logits - logits.max()), 0.0)
  probs /= probs.sum()
  order = np.argsort(-logits, kind="stable")
  mass_before = np.cumsum(probs[order]) - probs[order]
  cutoff = logits[order][(mass_before < top_p) & kept[order]].min()
  return set(np.flatnonzero(kept & (logits >= cutoff)).tolist())


def test_top_p_keeps_a_token_only_while_the_mass_before_it_is_below_top_p():
  """At the boundary (the tokens before one hold exactly top_p) the token is
  not kept: probabilities [.5, .25, .25] at top_p=0.5 keep {0}, [.5, .25,
  .125, .125] at 0.75 keep {0, 1} (a `<=` kept every token of both). A
  top_p just below 1 still filters: 0.997 drops a tail of ~0.0025 that
  4096 unfiltered draws reach (a filter skipped above 0.99 drew it). Each
  against nucleus_reference's float64 definition."""
  cases = [([0.5, 0.25, 0.25], 0.5, {0}), ([0.5, 0.25, 0.125, 0.125], 0.75, {0, 1})]
  for probs, top_p, kept in cases:
    logits = jnp.log(jnp.array(probs))
    assert nucleus_reference(logits, 0, top_p) == kept
    assert drawn_tokens(logits, rows=1024, seed=0, top_p=top_p) == kept, (probs, top_p)
  logits = jnp.array([0.0, 0.0, -5.3])  # token 2: probability 0.0025
  assert nucleus_reference(logits, 0, 0.997) == {0, 1}
  assert drawn_tokens(logits, rows=4096, seed=0) == {0, 1, 2}  # the rows reach the tail
  assert drawn_tokens(logits, rows=4096, seed=0, top_p=0.997) == {0, 1}


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_top_p_keeps_the_nucleus_of_the_tempered_distribution(temperature):
  """The nucleus is that of softmax(logits / temperature): a sharper
  distribution (0.5) holds 80% in 2 tokens, a flatter one (2.0) in 6.
  Every top-p test ran at temperature 1, where filtering before dividing
  is the same."""
  logits = jnp.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
  drawn = drawn_tokens(logits, rows=1024, seed=5, top_p=0.8, temperature=temperature)
  want = nucleus_reference(np.asarray(logits) / temperature, 0, 0.8)
  assert want != nucleus_reference(np.asarray(logits), 0, 0.8)
  assert drawn == want


@pytest.mark.parametrize("top_p", [0.4, 0.5, 0.95])
def test_top_p_after_top_k_keeps_the_ties_with_the_kth_logit(top_p):
  """Three logits tied with the 2nd largest: top_k=2 keeps all four, and
  top-p, which reads only the k largest logits, keeps what the definition
  over the whole sorted row keeps (1 token at top_p=0.4, all 4 at 0.5 and
  0.95)."""
  logits = jnp.array([2.0, 1.0, 1.0, 1.0, 0.0, -1.0, -2.0, -3.0])
  drawn = drawn_tokens(logits, rows=512, seed=5, top_k=2, top_p=top_p)
  expected = nucleus_reference(logits, 2, top_p)
  assert len(expected) == (1 if top_p == 0.4 else 4)
  assert drawn == expected


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0, 2.5])
def test_one_argmax_samples_the_token_jax_random_categorical_samples(temperature):
  """The sampler's single pass over the vocabulary (Gumbel noise chosen
  before the argmax) draws what jax.random.categorical draws from the same
  key, and the argmax at temperature 0."""
  from txf.decode.sampling import _next_token

  logits = jax.random.normal(jax.random.key(1), (16, 300)) * 3
  for seed in range(4):
    rng = jax.random.key(seed)
    want = (
      jax.random.categorical(rng, logits / temperature, axis=-1)
      if temperature
      else jnp.argmax(logits, axis=-1)
    )
    np.testing.assert_array_equal(_next_token(rng, logits, temperature, 0, 1.0), want)


# Below MIN_TEMPERATURE (1e-6): logits / temperature overflowed to inf from
# about 1e-37 (inf - inf, NaN, in top-p's softmax) and the first token at
# inf, not the argmax, was drawn; 1e-38 and 1e-45 are float32 subnormals.
TINY_TEMPERATURES = [0.0, 1e-45, 1e-38, 2e-38, 1e-30, 1e-12, 9e-7]


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.9), (5, 0.9)])
def test_a_tiny_temperature_samples_the_argmax(top_k, top_p):
  from txf.decode.sampling import MIN_TEMPERATURE, _next_token

  # Logits of order 1e3 with a gap of 1e-3 between the two largest of row 0:
  # at MIN_TEMPERATURE, still sampled, the noise (about 1e-6 of them) keeps
  # the argmax; at a thousandth of their gap it draws either.
  logits = jax.random.normal(jax.random.key(1), (16, 300)) * 1e3
  logits = logits.at[0, 7].set(jnp.max(logits[0]) + 1e-3)
  for temperature in TINY_TEMPERATURES + [MIN_TEMPERATURE]:
    for seed in range(3):
      token = _next_token(jax.random.key(seed), logits, temperature, top_k, top_p)
      np.testing.assert_array_equal(token, jnp.argmax(logits, axis=-1), err_msg=str(temperature))
  tokens = [_next_token(jax.random.key(seed), logits, 1e-3, top_k, top_p)[0] for seed in range(40)]
  assert len(set(np.asarray(tokens).tolist())) == 2  # sampled, not the argmax


@pytest.mark.parametrize("temperature", [1e30, 1e38, 3.4e38])
def test_a_huge_temperature_samples_the_top_k_alike(temperature):
  """Every logit scales to about 0 (past 1e38 a subnormal, flushed to 0): the
  top-k filter, which read the scaled logits, kept every token tied there."""
  from txf.decode.sampling import _next_token

  logits = jax.random.normal(jax.random.key(1), (8, 300)) * 3
  top_5 = jax.lax.top_k(logits, 5)[1]
  tokens = np.stack(
    [_next_token(jax.random.key(seed), logits, temperature, 5, 0.9) for seed in range(20)], 1
  )
  for row, drawn in enumerate(tokens):
    assert set(drawn.tolist()) <= set(top_5[row].tolist()), row
  assert len(set(tokens[0].tolist())) > 1  # not the argmax: the 5 alike


def test_prefill_longer_than_the_cache_is_rejected():
  """Writing more new tokens than the cache has slots is a clear error at
  trace time, not a silently clamped write."""
  model, params = model_and_params()
  cache = decode.init_cache(model, 1, 4)
  with pytest.raises(ValueError, match="KV cache of 4 slots"):
    model.apply(
      {"params": params, "cache": cache},
      jnp.ones((1, 6), jnp.int32),
      use_cache=True,
      mutable=["cache"],
    )


def test_generate_leaves_the_benchmark_switches_to_build_generate():
  """The public signature holds what a user chooses; comparing against the
  uncached cross-attention and lowering the program are reached inside."""
  switches = {"cache_cross_attention", "lower"}
  assert not switches & set(inspect.signature(decode.generate).parameters)
  assert switches == set(inspect.signature(decode.generation.build_generate).parameters)


def test_generate_refuses_parameters_and_a_cache_past_the_devices_memory(lm, monkeypatch):
  """The bound is the parameters and the cache generate makes (counted here
  from init_cache's arrays; beams multiply its rows): one byte short is
  refused naming max_new_tokens, before anything runs; exactly it decodes."""
  model, params, greedy = lm

  def need(rows):
    cache = decode.init_cache(model, rows, decode.cache_length(PROMPT.shape[1], NEW))
    return sum(np.asarray(x).nbytes for x in jax.tree.leaves((params, cache)))

  monkeypatch.setattr(hardware, "memory_bytes", lambda device: need(B) - 1)
  with pytest.raises(ValueError, match=r"^max_new_tokens: 2 x 5 \+ 6 tokens' decoding cache"):
    decode.generate(model, params, PROMPT, max_new_tokens=NEW)
  monkeypatch.setattr(hardware, "memory_bytes", lambda device: need(B))
  np.testing.assert_array_equal(decode.generate(model, params, PROMPT, max_new_tokens=NEW), greedy)
  with pytest.raises(ValueError, match=r"^max_new_tokens: 6 x 5 \+ 6 tokens' decoding cache"):
    decode.generate(model, params, PROMPT, max_new_tokens=NEW, num_beams=3)


def test_a_cache_is_at_most_what_int32_positions_index():
  top = decode.cache.MAX_CACHE_LEN
  assert top == np.iinfo(np.int32).max
  assert decode.cache.check_cache_length("n", 1, top) == top
  with pytest.raises(ValueError, match=r"^n: prompts of 1 tokens and 2147483648 new ones"):
    decode.cache.check_cache_length("n", 1, top + 1)
  model, params = model_and_params()
  with pytest.raises(ValueError, match=r"^generate: max_new_tokens: prompts of 5 tokens"):
    decode.generate(model, params, PROMPT, max_new_tokens=top)


@pytest.mark.parametrize(
  "family",
  # The encoder-decoder's six compiles (11 s on 2 cores) outside the fast subset.
  ["decoder", pytest.param("encoder_decoder", marks=pytest.mark.slow)],
)
def test_decoding_under_jax_enable_x64_gives_the_tokens_of_32_bit_ints(family):
  # Research code sets jax_enable_x64 for float64 references; python ints and
  # argmax are then int64 and met the int32 cache index and token buffer
  # (dynamic_update_slice takes one index type): a TypeError at the first
  # cache write, in greedy decoding, sampling and beam search.
  model, params = model_and_params(family=family)
  prompt_BxP = random_tokens(3, (B, 4))
  kwargs = dict(max_new_tokens=4)
  if family == "encoder_decoder":
    prompt_BxP, kwargs["encoder_tokens_BxS"] = None, random_tokens(4, (B, 6))
  for options in (dict(), dict(num_beams=2), dict(rng=jax.random.key(5), temperature=0.0)):
    expected = decode.generate(model, params, prompt_BxP, **kwargs, **options)
    with jax.enable_x64(True):
      tokens = decode.generate(model, params, prompt_BxP, **kwargs, **options)
    assert tokens.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(tokens), np.asarray(expected))
