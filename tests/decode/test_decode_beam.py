"""Tests for txf.decode's beam search: exact rankings on stubs (brute-force
enumeration and a plain reference beam search) for prompts of different
lengths on both padding sides, and `generate(num_beams=...)` on tiny
random-init models of both families.

Tolerances: scores vs enumeration atol 1e-5 (float32 sums of <= 5
log-probabilities); one example alone vs in a ragged batch atol 1e-5 (the
same math in programs of other shapes); beam scores vs a teacher-forced full
pass atol 1e-4 (sums of up to 8 log-probabilities).
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_decode import PROMPT, TINY, apply, model_and_params, random_tokens, to_left

from txf import decode, models
from txf.decode import generation
from txf.layers.model_config import ModelConfig

# ---------------------------------------------------------------------------
# Search logic on a stub whose log-probabilities are known.

# A path-dependent stub: the logits after a prefix are a fixed random row
# indexed by the prefix's base-V code, so every sequence's log-prob differs
# and can be enumerated. EOS is favoured (+4) so that hypotheses end early
# and the finished pool fills, which is when beam search may stop early. Its
# cache has a shared scalar and a leaf whose batch axis is 1, as scanned
# layers have.
BF_VOCAB, BF_EOS, BF_MAX_NEW = 4, 3, 5
# Prompts of lengths 1, 2, 3, 1 given by length (token 0 is a real token
# here); row 1's prompt ends in EOS, which must not end it.
BF_PROMPTS = np.array([[2, 0, 0], [1, 3, 0], [0, 2, 1], [3, 0, 0]])
BF_LENGTHS = np.array([1, 2, 3, 1])
BF_PROMPT_LEN = BF_PROMPTS.shape[1]
# The code of 1 followed by every fed token (at most P + N - 1 of them).
BF_TABLE = (
  (2.0 * jax.random.normal(jax.random.key(5), (BF_VOCAB ** (BF_PROMPT_LEN + BF_MAX_NEW), BF_VOCAB)))
  .at[:, BF_EOS]
  .add(4.0)
)
BF_LOGPROBS = np.asarray(jax.nn.log_softmax(BF_TABLE))
BF_AXES = {"index": None, "code": 1}
PATH_STUB_CALLS = []


def path_stub(tokens_Bx1, cache):
  jax.debug.callback(lambda: PATH_STUB_CALLS.append(1))
  code_1xB = cache["code"] * BF_VOCAB + tokens_Bx1[:, 0]
  return BF_TABLE[code_1xB[0]], {"index": cache["index"] + 1, "code": code_1xB}


def path_logprob(prompt, continuation):
  """log p(continuation | prompt) under path_stub (the code starts at 1)."""
  code, total = 1, 0.0
  for token in prompt:
    code = code * BF_VOCAB + token
  for token in continuation:
    total += BF_LOGPROBS[code, token]
    code = code * BF_VOCAB + token
  return total


def ranked(prompt, continuations, alpha, num_beams, max_new_tokens):
  """The best continuations as right-padded rows [K, P + N] (prompt
  included), with their scores."""
  score = lambda c: path_logprob(prompt, c) / ((5 + len(c)) / 6) ** alpha
  best = sorted(continuations, key=score, reverse=True)[:num_beams]
  width = BF_PROMPT_LEN + max_new_tokens
  tokens = [list(prompt) + list(c) + [0] * (width - len(prompt) - len(c)) for c in best]
  return np.array(tokens), np.array([score(c) for c in best])


def brute_force_beams(prompt, alpha, num_beams, max_new_tokens):
  """The num_beams best of all continuations of `prompt`, by enumeration."""
  continuations = set()
  for continuation in itertools.product(range(BF_VOCAB), repeat=max_new_tokens):
    if BF_EOS in continuation:
      continuation = continuation[: continuation.index(BF_EOS) + 1]
    continuations.add(continuation)
  return ranked(prompt, continuations, alpha, num_beams, max_new_tokens)


def reference_beam_search(prompt, alpha, num_beams, max_new_tokens):
  """Plain beam search, every step to the end: keep the 2K best expansions,
  move the ended ones to the pool, go on with the K best others."""
  live, ended = [()], []
  for step in range(1, max_new_tokens + 1):
    expansions = [c + (token,) for c in live for token in range(BF_VOCAB)]
    expansions = sorted(expansions, key=lambda c: path_logprob(prompt, c), reverse=True)[
      : 2 * num_beams
    ]
    done = lambda c, step=step: c[-1] == BF_EOS or step == max_new_tokens
    ended += [c for c in expansions if done(c)]
    live = [c for c in expansions if not done(c)][:num_beams]
  return ranked(prompt, ended, alpha, num_beams, max_new_tokens)


@functools.partial(jax.jit, static_argnames=("num_beams", "max_new_tokens", "padding_side"))
def stub_beam_search(prompt_BxP, lengths_B, alpha, num_beams, max_new_tokens, padding_side):
  cache = {"index": jnp.int32(0), "code": jnp.ones((1, prompt_BxP.shape[0]), jnp.int32)}
  return decode.beam_search(
    path_stub,
    cache,
    prompt_BxP,
    num_beams=num_beams,
    max_new_tokens=max_new_tokens,
    eos_id=BF_EOS,
    length_penalty=alpha,
    prompt_lengths_B=lengths_B,
    padding_side=padding_side,
    batch_axes=BF_AXES,
  )


def check_against(expected_fn, padding_side, alpha, num_beams, max_new_tokens):
  prompts = (
    BF_PROMPTS if padding_side == "right" else to_left(BF_PROMPTS, BF_LENGTHS, BF_PROMPT_LEN)
  )
  tokens, scores = stub_beam_search(
    prompts, BF_LENGTHS, alpha, num_beams, max_new_tokens, padding_side
  )
  for row, (prompt, length) in enumerate(zip(BF_PROMPTS, BF_LENGTHS)):
    expected_tokens, expected_scores = expected_fn(
      tuple(prompt[:length]), alpha, num_beams, max_new_tokens
    )
    if padding_side == "left":
      expected_tokens = to_left(expected_tokens, [length] * num_beams, BF_PROMPT_LEN)
    np.testing.assert_array_equal(tokens[row], expected_tokens)
    np.testing.assert_allclose(scores[row], expected_scores, atol=1e-5)


@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_wide_beam_search_finds_the_brute_force_ranking(padding_side):
  # With 3 new tokens, 16 beams keep every live continuation (at most 3 ** 2
  # = 9 before the last step), so the search is exact: the 16 best
  # hypotheses of each prompt, however long the others in its batch are.
  for alpha in (0.0, 0.6, 3.0):
    check_against(brute_force_beams, padding_side, alpha, num_beams=16, max_new_tokens=3)


@pytest.mark.parametrize(
  "num_beams, alpha, padding_side", [(2, 0.0, "right"), (2, 0.6, "right"), (3, 3.0, "left")]
)
def test_narrow_beam_search_matches_reference_without_early_stop(num_beams, alpha, padding_side):
  # Narrow beams prune, and stopping early must not change what they find.
  PATH_STUB_CALLS.clear()
  check_against(reference_beam_search, padding_side, alpha, num_beams, BF_MAX_NEW)
  jax.effects_barrier()
  if alpha == 0.0:
    # EOS has probability ~0.95: after a few steps the pool holds EOS-ended
    # hypotheses better than any live beam (log-probs only fall), so the
    # search must stop before the longest prompt's last step (the shortest
    # prompt, 1 token, needs no prefill; 3 + 5 - 1 steps reach the end).
    assert len(PATH_STUB_CALLS) < BF_PROMPT_LEN + BF_MAX_NEW - 1


# ---------------------------------------------------------------------------
# generate(num_beams=...) on models. Untied output embeddings keep the random
# models from merely repeating their input, so beams differ and reorder.

NEW, BEAMS, ALPHA = 6, 3, 0.6
EOS = 16  # a token the decoder's beams generate (checked below)


def teacher_forced_scores(
  model, params, tokens_BxKxT, lengths_B, eos_id, encoder_tokens=None, alpha=ALPHA
):
  """Scores [B, K] of right-padded hypotheses from one full forward pass:
  the log-probs of the tokens after each prompt, up to EOS or NEW tokens,
  over the length penalty ((5 + length) / 6) ** alpha."""
  batch, beams, width = tokens_BxKxT.shape
  flat = tokens_BxKxT.reshape(batch * beams, width)
  inputs = (flat[:, :-1],)
  if encoder_tokens is not None:
    inputs = (jnp.repeat(encoder_tokens, beams, axis=0),) + inputs
  logprobs = np.asarray(jax.nn.log_softmax(apply(model, {"params": params}, *inputs)))
  logprobs = logprobs.reshape(batch, beams, width - 1, -1)
  scores = np.zeros((batch, beams))
  for b, k in np.ndindex(batch, beams):
    start = lengths_B[b]
    row = np.asarray(tokens_BxKxT[b, k])
    ends = [t for t in range(start, start + NEW) if row[t] == eos_id]
    stop = ends[0] + 1 if ends else start + NEW
    total = sum(logprobs[b, k, t - 1, row[t]] for t in range(start, stop))
    scores[b, k] = total / ((5 + stop - start) / 6) ** alpha
  return scores


@pytest.fixture(scope="module")
def decoder():
  model, params = model_and_params(tie_embeddings=False)
  return model, params


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_ragged_beam_search_equals_each_prompt_alone(decoder):
  model, params = decoder
  lengths = np.asarray((PROMPT != 0).sum(1))  # 3 and 5
  beam = functools.partial(
    decode.generate,
    model,
    params,
    max_new_tokens=NEW,
    eos_id=EOS,
    num_beams=BEAMS,
    length_penalty=ALPHA,
    return_beams=True,
  )
  tokens, scores = beam(PROMPT)
  # Some hypotheses end at EOS, and hold pad after it.
  generated = np.asarray(tokens)[:, :, 3:]
  assert np.any(generated == EOS)
  assert not np.any(
    np.where(np.cumsum(generated == EOS, axis=-1) > (generated == EOS), generated, 0)
  )
  for row, length in enumerate(lengths):
    alone_tokens, alone_scores = beam(PROMPT[row : row + 1, :length])
    np.testing.assert_array_equal(tokens[row, :, : length + NEW], alone_tokens[0])
    assert not np.any(tokens[row, :, length + NEW :])  # pad after the row's own length
    np.testing.assert_allclose(scores[row], alone_scores[0], atol=1e-5)
  np.testing.assert_allclose(
    scores, teacher_forced_scores(model, params, tokens, lengths, EOS), atol=1e-4
  )


def beams_of_one_prompt(model, params, **kwargs):
  """decode.generate's beam search (BEAMS beams, NEW tokens, EOS) of PROMPT's second row."""
  return decode.generate(
    model, params, PROMPT[1:2], max_new_tokens=NEW, eos_id=EOS, num_beams=BEAMS, **kwargs
  )


@pytest.mark.parametrize("alpha", [0.0, 2.0])
def test_the_length_penalty_reaches_the_beams_scores(decoder, alpha):
  # Every generate test used 0.6, the default: one ignoring its argument passed.
  model, params = decoder
  tokens, scores = beams_of_one_prompt(model, params, length_penalty=alpha, return_beams=True)
  lengths = np.asarray((PROMPT[1:2] != 0).sum(1))
  want = teacher_forced_scores(model, params, tokens, lengths, EOS, alpha=alpha)
  np.testing.assert_allclose(scores, want, atol=1e-4)
  assert not np.allclose(want, teacher_forced_scores(model, params, tokens, lengths, EOS))


def test_generate_returns_the_best_beam(decoder):
  """generate(num_beams=K) is return_beams' first hypothesis, the one of the
  highest score (scores descending, each its teacher-forced score, atol
  1e-4), not another of the K, which differ here."""
  model, params = decoder
  run = functools.partial(beams_of_one_prompt, model, params, length_penalty=ALPHA)
  tokens, scores = run(return_beams=True)
  lengths = np.asarray((PROMPT[1:2] != 0).sum(1))
  np.testing.assert_allclose(
    scores, teacher_forced_scores(model, params, tokens, lengths, EOS), atol=1e-4
  )
  assert np.all(np.diff(scores, axis=1) < 0)  # the first strictly best
  assert len({tuple(row) for row in np.asarray(tokens[0])}) == BEAMS
  np.testing.assert_array_equal(run(), tokens[:, 0])


def test_one_beam_is_greedy_decoding(decoder):
  # Without EOS every hypothesis runs to NEW tokens, and one beam keeps the
  # most likely token at each step. (With EOS, one beam also keeps the ended
  # hypotheses it passes and may return one of them.)
  model, params = decoder
  run = functools.partial(decode.generate, model, params, PROMPT, max_new_tokens=NEW)
  tokens, scores = run(num_beams=1, return_beams=True, length_penalty=ALPHA)
  np.testing.assert_array_equal(tokens[:, 0], run(num_beams=1))
  np.testing.assert_allclose(
    scores, teacher_forced_scores(model, params, tokens, [3, 5], None), atol=1e-4
  )


@pytest.mark.slow  # several compiles: over 5 s on 2 cores
def test_seq2seq_ragged_beam_search_caches_cross_attention_and_equals_each_example_alone():
  # Scanned layers put the cache's batch (cross-attention keys/values too) on axis 1.
  model, params = model_and_params(family="encoder_decoder", scan_layers=True, tie_embeddings=False)
  # Ragged sources and ragged decoder prompts: BOS alone, and BOS + 2 forced tokens.
  encoder_tokens = random_tokens(6, (2, 7)).at[0, 5:].set(0)
  prompts = jnp.array([[1, 0, 0], [1, 7, 9]])
  options = dict(
    max_new_tokens=NEW, eos_id=2, num_beams=BEAMS, length_penalty=ALPHA, return_beams=True
  )
  beam = functools.partial(decode.generate, model, params, **options)
  tokens, scores = beam(prompts, encoder_tokens_BxS=encoder_tokens)
  uncached_beam = functools.partial(
    generation.build_generate(cache_cross_attention=False), model, params, **options
  )
  uncached_tokens, uncached_scores = uncached_beam(prompts, encoder_tokens_BxS=encoder_tokens)
  np.testing.assert_array_equal(tokens, uncached_tokens)
  np.testing.assert_allclose(scores, uncached_scores, atol=1e-5)
  for row in range(2):
    alone_tokens, alone_scores = beam(
      prompts[row : row + 1], encoder_tokens_BxS=encoder_tokens[row : row + 1]
    )
    np.testing.assert_array_equal(tokens[row], alone_tokens[0])
    np.testing.assert_allclose(scores[row], alone_scores[0], atol=1e-5)
  assert np.all(np.diff(scores, axis=1) <= 0)
  assert len({tuple(beam_tokens) for beam_tokens in np.asarray(tokens[1])}) == BEAMS
  np.testing.assert_allclose(
    scores, teacher_forced_scores(model, params, tokens, [1, 3], 2, encoder_tokens), atol=1e-4
  )


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(rng=jax.random.key(0)), "rng, top_k and top_p sample, but num_beams=2"),
    (dict(top_k=5), "beam search, which is deterministic"),
    (dict(top_p=0.9), "beam search, which is deterministic"),
    # return_beams runs beam search with one beam too.
    (
      dict(num_beams=1, return_beams=True, rng=jax.random.key(0)),
      "num_beams=1 / return_beams=True runs beam search, which is deterministic",
    ),
    (dict(num_beams=1, return_beams=True, top_k=5), "return_beams=True runs beam search"),
    (dict(num_beams=1, return_beams=True, top_p=0.9), "return_beams=True runs beam search"),
    (
      dict(num_beams=1, return_beams=True, length_penalty=-0.5),
      "length_penalty: must be a finite number >= 0",
    ),
    (dict(length_penalty=-0.5), "length_penalty: must be a finite number >= 0"),
    (dict(length_penalty=float("nan")), "length_penalty: must be a finite number >= 0"),
    (dict(length_penalty=float("inf")), "length_penalty: must be a finite number >= 0"),
    (dict(num_beams=0), r"num_beams: must be an integer >= 1, got 0"),
    # A float width failed inside the program (and jax cached the failure).
    (dict(num_beams=2.0), r"num_beams: must be an integer >= 1, got 2\.0"),
    (dict(num_beams=True), r"num_beams: must be an integer >= 1, got True"),
  ],
)
def test_bad_beam_arguments_are_rejected(kwargs, message):
  kwargs = dict(dict(num_beams=2), **kwargs)
  with pytest.raises(ValueError, match=message):  # before the parameters are read
    decode.generate(models.build(ModelConfig(**TINY)), None, PROMPT, max_new_tokens=2, **kwargs)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(), "encoder_tokens_BxS: an encoder_decoder needs encoder inputs"),
    (dict(encoder_tokens_BxS=PROMPT, prompt_BxP=PROMPT[:1]), "has 2 rows, prompt_BxP 1"),
    (
      dict(encoder_tokens_BxS=PROMPT.at[0, 0].set(TINY["vocab_size"])),
      rf"^generate: encoder_tokens_BxS: id {TINY['vocab_size']} outside the vocabulary",
    ),
    # One row without its batch axis: an IndexError before any check.
    (dict(encoder_tokens_BxS=PROMPT[0]), r"^generate: encoder_tokens_BxS must be \[B, L\], got"),
  ],
)
def test_bad_seq2seq_arguments_are_rejected(kwargs, message):
  model = models.build(ModelConfig(**TINY, family="encoder_decoder"))
  with pytest.raises(ValueError, match=message):
    decode.generate(model, None, max_new_tokens=2, **kwargs)


@pytest.mark.parametrize("alpha", [-0.5, float("nan"), float("inf")])
def test_beam_search_called_directly_refuses_a_length_penalty_out_of_range(alpha):
  """decode.beam_search checks a concrete length_penalty as generate does
  (NaN and infinity passed a `< 0` check)."""
  prompt_BxP = jnp.ones((1, 2), jnp.int32)
  with pytest.raises(
    ValueError, match="^beam_search: length_penalty: must be a finite number >= 0"
  ):
    decode.beam_search(
      path_stub,
      {"index": jnp.int32(0), "code": jnp.ones((1, 1), jnp.int32)},
      prompt_BxP,
      num_beams=2,
      max_new_tokens=2,
      eos_id=BF_EOS,
      length_penalty=alpha,
      batch_axes=BF_AXES,
    )
