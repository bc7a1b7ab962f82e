"""Tests for txf.decode: KV-cache correctness, sampling, greedy and beam search.

Model-level tests use tiny random-init float32 models; the search logic is
also checked on stub `tokens_to_logits` functions whose logits are known, so
the expected tokens and scores are computed independently in numpy.
Tolerances: cached vs full-pass logits atol 1e-5 (same float32 math, other
summation order); beam scores vs a teacher-forced full pass atol 1e-4 (sums
of up to 8 log-probabilities).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from txf import decode, models
from txf.layers.config import ModelConfig

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


@functools.partial(jax.jit, static_argnames=("model", "method"))
def stepwise_logits(model, params, tokens_BxT, *context, method=None):
  """Logits [B, T, V] from feeding tokens through the cache one per step."""
  tokens_to_logits = decode.make_tokens_to_logits(model, params, *context, method=method)

  def step(cache, token_B):
    logits_BxV, cache = tokens_to_logits(token_B[:, None], cache)
    return cache, logits_BxV

  cache = decode.init_cache(model, tokens_BxT.shape[0], tokens_BxT.shape[1])
  _, logits_TxBxV = jax.lax.scan(step, cache, tokens_BxT.T)
  return logits_TxBxV.transpose(1, 0, 2)


DECODER_VARIANTS = [dict(position=p) for p in
                    ("sinusoidal", "learned", "rope", "alibi", "t5_bias", "none")] + [
    dict(num_kv_heads=2), dict(num_kv_heads=1), dict(window=3), dict(scan_layers=True)]


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
  logits, variables = apply(model, {"params": params, "cache": cache}, tokens[:, :prefill],
                            use_cache=True)
  assert int(variables["cache"]["positions"]["index"]) == prefill
  for t in range(prefill, T):
    step_logits, variables = apply(model, {"params": params, **variables},
                                   tokens[:, t:t + 1], use_cache=True)
    logits = jnp.concatenate([logits, step_logits], axis=1)
  np.testing.assert_allclose(logits, apply(model, {"params": params}, tokens), atol=1e-5)


def seq2seq_model():
  # Scanned decoder layers put the cache's batch on axis 1.
  return model_and_params(family="encoder_decoder", position="t5_bias", scan_layers=True)


def test_cached_seq2seq_decoding_matches_full_pass():
  model, params = seq2seq_model()
  encoder_tokens = random_tokens(3, (B, 7)).at[1, 4:].set(0)  # row 1 padded
  decoder_tokens = random_tokens(4, (B, T))
  encoded, mask = apply(model, {"params": params}, encoder_tokens, method="encode")
  stepwise = stepwise_logits(model, params, decoder_tokens, encoded, mask, method="decode")
  full = apply(model, {"params": params}, encoder_tokens, decoder_tokens)
  np.testing.assert_allclose(stepwise, full, atol=1e-5)


# ---------------------------------------------------------------------------
# init_cache.


def test_init_cache_shapes_and_batch_axes():
  # [B, L, K, Dh], with scanned layers [N, B, L, K, Dh]
  for overrides, layout in ((dict(num_kv_heads=2), (B, 10, 2, 8)),
                            (dict(scan_layers=True), (2, B, 10, 4, 8))):
    model, _ = model_and_params(**overrides)
    scan = "scan_layers" in overrides
    cache = decode.init_cache(model, B, 10)
    keys = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(cache)
            if "cached_key" in jax.tree_util.keystr(path)]
    assert keys and all(k.shape == layout and not k.any() for k in keys)
    axes = jax.tree_util.tree_leaves_with_path(decode.cache_batch_axes(model, 10),
                                               is_leaf=lambda a: a is None)
    for path, axis in axes:
      assert axis == (None if "index" in jax.tree_util.keystr(path) else int(scan))


@pytest.mark.parametrize("overrides, kwargs, field", [
    (dict(position="learned"), dict(cache_len=17), "model.max_len"),
    (dict(family="encoder", head="mlm"), dict(cache_len=8), "model.family"),
    (dict(head="classify", pooling="last"), dict(cache_len=8), "model.head"),
    (dict(), dict(cache_len=8, encoder_tokens=jnp.ones((B, 3), jnp.int32)), "encoder_tokens"),
])
def test_init_cache_errors(overrides, kwargs, field):
  model = models.build(ModelConfig(**{**TINY, **overrides}))
  with pytest.raises(ValueError, match=field):
    decode.init_cache(model, B, **kwargs)


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


@pytest.mark.parametrize("kwargs", [dict(top_k=1), dict(top_p=1e-6), dict(temperature=1e-5)],
                         ids=["top_k=1", "top_p=1e-6", "temperature=1e-5"])
def test_degenerate_sampling_is_greedy(lm, kwargs):
  model, params, greedy = lm
  sampled = decode.generate(model, params, PROMPT, max_new_tokens=NEW,
                            rng=jax.random.key(7), **kwargs)
  np.testing.assert_array_equal(sampled, greedy)


def test_sampling_is_reproducible_and_depends_on_rng(lm):
  model, params, greedy = lm
  run = lambda seed: np.asarray(decode.generate(model, params, PROMPT, max_new_tokens=NEW,
                                                rng=jax.random.key(seed), temperature=1.0))
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


def expected_counting(prompt_row, eos_id, max_new_tokens, pad_id=0):
  """(row of sample()'s output, position of its last generated token)."""
  tokens = [t for t in prompt_row if t != pad_id]
  for _ in range(max_new_tokens):
    tokens.append((tokens[-1] + 1) % COUNT_VOCAB)
    if tokens[-1] == eos_id:
      break
  end = len(tokens) - 1
  return tokens + [pad_id] * (len(prompt_row) + max_new_tokens - len(tokens)), end


@pytest.mark.parametrize("eos_id", [6, None])
def test_sample_stops_rows_at_eos_and_length(eos_id):
  # Row 1's prompt ends in the EOS id: a prompt token must not end the row.
  prompt = jnp.array([[1, 2, 0], [5, 6, 0], [4, 0, 0]])
  calls = []
  out = decode.sample(counting_stub(calls), {"index": jnp.int32(0)}, prompt,
                      max_new_tokens=6, rng=jax.random.key(0), temperature=0.0,
                      eos_id=eos_id)
  jax.effects_barrier()
  expected = [expected_counting(list(row), eos_id, 6) for row in np.asarray(prompt)]
  np.testing.assert_array_equal(out, [tokens for tokens, _ in expected])
  # The loop stops when the last row ends, before the buffer's end (8 steps).
  assert len(calls) == max(end for _, end in expected) < 8


@pytest.mark.parametrize("kwargs", [dict(top_k=3), dict(top_p=0.8), dict(top_k=4, top_p=0.9)],
                         ids=str)
def test_top_k_top_p_sample_exactly_the_kept_tokens(kwargs):
  logits = jnp.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])
  stub = lambda tokens_Bx1, cache: (jnp.broadcast_to(logits, (tokens_Bx1.shape[0], 8)), cache)
  out = decode.sample(stub, {}, jnp.ones((512, 1), jnp.int32), max_new_tokens=1,
                      rng=jax.random.key(3), **kwargs)
  probs = np.asarray(jax.nn.softmax(logits))  # sorted descending already
  kept = np.arange(kwargs.get("top_k", 8))
  kept = kept[(np.cumsum(probs) - probs)[kept] < kwargs.get("top_p", 1.0)]
  assert set(np.asarray(out[:, 1]).tolist()) == set(kept.tolist())


# A path-dependent stub: the logits after a prefix are a fixed random row
# indexed by the prefix's base-V code, so every sequence's log-prob differs
# and can be enumerated. EOS is favoured (+4) so that hypotheses end early
# and the finished pool fills, which is when beam search may stop early. Its
# cache has a shared scalar and a leaf whose batch axis is 1, as scanned
# layers have.
BF_VOCAB, BF_EOS, BF_MAX_NEW = 4, 3, 5
BF_TABLE = (2.0 * jax.random.normal(jax.random.key(5), (BF_VOCAB ** (BF_MAX_NEW + 2), BF_VOCAB))
            ).at[:, BF_EOS].add(4.0)
BF_LOGPROBS = np.asarray(jax.nn.log_softmax(BF_TABLE))
BF_AXES = {"index": None, "code": 1}
PATH_STUB_CALLS = []


def path_stub(tokens_Bx1, cache):
  jax.debug.callback(lambda: PATH_STUB_CALLS.append(1))
  code_1xB = cache["code"] * BF_VOCAB + tokens_Bx1[:, 0]
  return BF_TABLE[code_1xB[0]], {"index": cache["index"] + 1, "code": code_1xB}


def path_logprob(tokens):
  """log p(tokens[1:] | tokens[0]) under path_stub (the code starts at 1)."""
  code, total = 1 * BF_VOCAB + tokens[0], 0.0
  for token in tokens[1:]:
    total += BF_LOGPROBS[code, token]
    code = code * BF_VOCAB + token
  return total


def ranked(hypotheses, alpha, num_beams, max_new_tokens):
  """Top hypotheses (token tuples incl. the first token) as padded arrays, with scores."""
  score = lambda h: path_logprob(h) / ((5 + len(h) - 1) / 6) ** alpha
  best = sorted(hypotheses, key=score, reverse=True)[:num_beams]
  tokens = [list(h) + [0] * (1 + max_new_tokens - len(h)) for h in best]
  return np.array(tokens), np.array([score(h) for h in best])


def brute_force_beams(first_token, alpha, num_beams, max_new_tokens):
  """The num_beams best of all hypotheses after `first_token`, by enumeration."""
  hypotheses = set()
  for continuation in itertools.product(range(BF_VOCAB), repeat=max_new_tokens):
    if BF_EOS in continuation:
      continuation = continuation[:continuation.index(BF_EOS) + 1]
    hypotheses.add((first_token, *continuation))
  return ranked(hypotheses, alpha, num_beams, max_new_tokens)


def reference_beam_search(first_token, alpha, num_beams, max_new_tokens):
  """Plain beam search, every step to the end: keep the 2K best expansions,
  move the ended ones to the pool, go on with the K best others."""
  live, ended = [(first_token,)], []
  for step in range(1, max_new_tokens + 1):
    expansions = [h + (token,) for h in live for token in range(BF_VOCAB)]
    expansions = sorted(expansions, key=path_logprob, reverse=True)[:2 * num_beams]
    done = lambda h, step=step: h[-1] == BF_EOS or step == max_new_tokens
    ended += [h for h in expansions if done(h)]
    live = [h for h in expansions if not done(h)][:num_beams]
  return ranked(ended, alpha, num_beams, max_new_tokens)


@functools.partial(jax.jit, static_argnames=("beam_size", "max_new_tokens"))
def stub_beam_search(prompt_Bx1, alpha, beam_size, max_new_tokens):
  cache = {"index": jnp.int32(0), "code": jnp.ones((1, prompt_Bx1.shape[0]), jnp.int32)}
  return decode.beam_search(path_stub, cache, prompt_Bx1, beam_size=beam_size,
                            max_new_tokens=max_new_tokens, eos_id=BF_EOS,
                            length_penalty=alpha, batch_axes=BF_AXES)


FIRST_TOKENS = jnp.array([[0], [1], [2], [3]])


@pytest.mark.parametrize("alpha", [0.0, 0.6, 3.0])
def test_wide_beam_search_finds_the_brute_force_ranking(alpha):
  # With 3 new tokens, 16 beams keep every live prefix (at most 3 ** 2 = 9
  # before the last step), so the search is exact: the 16 best hypotheses.
  tokens, scores = stub_beam_search(FIRST_TOKENS, alpha, beam_size=16, max_new_tokens=3)
  for row, first_token in enumerate(np.asarray(FIRST_TOKENS[:, 0])):
    expected_tokens, expected_scores = brute_force_beams(first_token, alpha, 16, 3)
    np.testing.assert_array_equal(tokens[row], expected_tokens)
    np.testing.assert_allclose(scores[row], expected_scores, atol=1e-5)


@pytest.mark.parametrize("beam_size, alpha", [(2, 0.0), (2, 0.6), (3, 3.0)])
def test_narrow_beam_search_matches_reference_without_early_stop(beam_size, alpha):
  # Narrow beams prune, and stopping early must not change what they find.
  PATH_STUB_CALLS.clear()
  tokens, scores = stub_beam_search(FIRST_TOKENS, alpha, beam_size=beam_size,
                                    max_new_tokens=BF_MAX_NEW)
  jax.effects_barrier()
  for row, first_token in enumerate(np.asarray(FIRST_TOKENS[:, 0])):
    expected_tokens, expected_scores = reference_beam_search(first_token, alpha, beam_size,
                                                             BF_MAX_NEW)
    np.testing.assert_array_equal(tokens[row], expected_tokens)
    np.testing.assert_allclose(scores[row], expected_scores, atol=1e-5)
  if alpha == 0.0:
    # EOS has probability ~0.95: after a few steps the pool holds EOS-ended
    # hypotheses better than any live beam (log-probs only fall), so the
    # search must stop before its last step.
    assert len(PATH_STUB_CALLS) < BF_MAX_NEW


# ---------------------------------------------------------------------------
# Beam search on models.


def test_beam_size_one_is_greedy(lm):
  model, params, _ = lm
  prompt = PROMPT[:, :3] + 20  # beam_search takes prompts of one length

  @jax.jit
  def beam(prompt):
    return decode.beam_search(decode.make_tokens_to_logits(model, params),
                              decode.init_cache(model, B, 3 + NEW - 1), prompt,
                              beam_size=1, max_new_tokens=NEW, eos_id=None)

  tokens, _ = beam(prompt)
  greedy = decode.generate(model, params, prompt, max_new_tokens=NEW)
  np.testing.assert_array_equal(tokens[:, 0], greedy)


@pytest.fixture(scope="module")
def seq2seq():
  model, params = seq2seq_model()
  encoder_tokens = random_tokens(6, (B, 7)).at[0, 5:].set(0)
  return model, params, encoder_tokens


def test_seq2seq_beam_size_one_is_greedy(seq2seq):
  model, params, encoder_tokens = seq2seq
  greedy = decode.generate_seq2seq(model, params, encoder_tokens, max_new_tokens=8)
  beams, _ = decode.generate_seq2seq(model, params, encoder_tokens, max_new_tokens=8, beam_size=1)
  assert greedy.shape == (B, 8)
  np.testing.assert_array_equal(beams[:, 0], greedy)


def test_seq2seq_beam_scores_match_full_pass(seq2seq):
  # Beams of the random model swap rows, so a wrong cache gather breaks the
  # scores. EOS handling is covered by the stub tests above.
  model, params, encoder_tokens = seq2seq
  alpha, max_new_tokens, bos_id, beams = 0.6, 8, 1, 4
  tokens, scores = decode.generate_seq2seq(model, params, encoder_tokens,
                                           max_new_tokens=max_new_tokens, beam_size=beams,
                                           length_penalty=alpha, bos_id=bos_id)
  assert tokens.shape == (B, beams, max_new_tokens)
  assert np.all(np.diff(scores, axis=1) <= 0)
  flat_tokens = tokens.reshape(B * beams, max_new_tokens)
  decoder_inputs = jnp.concatenate([jnp.full((B * beams, 1), bos_id), flat_tokens[:, :-1]], 1)
  logits = apply(model, {"params": params}, jnp.repeat(encoder_tokens, beams, axis=0),
                 decoder_inputs)
  logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits), flat_tokens[..., None], -1)
  expected = logprobs.sum((1, 2)) / ((5 + max_new_tokens) / 6) ** alpha
  np.testing.assert_allclose(scores.reshape(-1), expected, atol=1e-4)


def test_prefill_longer_than_the_cache_is_rejected():
  """Writing more new tokens than the cache has slots is a clear error at
  trace time, not a silently clamped write."""
  model, params = model_and_params()
  cache = decode.init_cache(model, 1, 4)
  with pytest.raises(ValueError, match="KV cache of 4 slots"):
    model.apply({"params": params, "cache": cache}, jnp.ones((1, 6), jnp.int32), use_cache=True,
                mutable=["cache"])
