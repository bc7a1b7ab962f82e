"""KV-cache generation: greedy decoding, sampling and beam search.

  generate       the one entry point for txf models (generation.py)
  sample         temperature / top-k / top-p sampling, greedy at 0 (sampling.py)
  beam_search    beam search over a named `BeamState` (beam_search.py)
  init_cache, cache_batch_axes, cache_length, cache_bytes,
  make_tokens_to_logits (a ModelSteps), encode_for_decoding
                 txf models' caches and the callables that thread them (cache.py)
  casting.py     a loop's weights cast to the compute dtype once, before it
  prompts.py     ragged prompts and the checks the searches share

The search functions (`sample`, `beam_search`) know nothing about models (t5x
style). They take

  tokens_to_logits(tokens_Bx1, cache) -> (logits_BxV, new_cache)

which feeds one token per row through the model at the cache's current index
and returns the float logits of the next token, and the cache pytree it
threads (any pytree: beam search also reorders it along each leaf's batch
axis, see `batch_axes`). The batch B seen by `tokens_to_logits` is the prompt
batch for `sample` and batch * num_beams for `beam_search`. Both run their
loop on device (`lax.while_loop`) and trace under `jax.jit`; `tokens_to_logits`
and the integer / search-shape arguments must then be static, so build the
callable inside the jitted function (as `generate` does) rather than passing
a fresh closure over parameters to a jitted search.

Prompts. A batch of prompts of different lengths is one int [B, P] array,
right-padded (the default) or left-padded (`padding_side='left'`), with the
lengths given (`prompt_lengths_B`) or counted as the tokens that are not
`pad_id`. Every row needs at least one token (e.g. BOS). The searches
right-align the prompts and feed position i of every row at step i, at one
shared cache index; while a row's prompt lasts, its next token is forced to
the prompt's (t5x style), so rows of any length share one loop. Outputs
keep the input's side: [B, P + N] holds each right-padded prompt followed
directly by its new tokens, or each left-padded prompt with the new tokens
from column P on. Each row generates at most N = max_new_tokens tokens, ends
after an EOS it generates (not one in its prompt) and holds pad_id after its
end.

Cache size. The cache needs room for P + N - 1 positions. Both searches check
this for a txf cache (one with self-attention `cached_key` leaves, as
`init_cache` builds) before tracing their loop, and raise a ValueError naming
the sizes; for another cache it is the caller's to ensure. `generate` also
refuses a cache and parameters larger than the device's memory
(`generation.check_decoding_fits`), before anything is allocated.

Encoder-decoders. `encode_for_decoding` runs the encoder once and stores each
decoder layer's cross-attention keys and values of the encoding (with its
padding mask) in the cache, so a decoding step only runs the decoder on its
one token. Beam search keeps one copy of them per example, which all its
beams attend to (`cache_batch_axes` marks them None), so neither copying
them per beam nor reordering them costs anything. Recomputing them at every
step instead (`encode_for_decoding(..., cache_cross_attention=False)`, or
`generation.build_generate(cache_cross_attention=False)`) is kept to compare
and benchmark against (benchmarks/seq2seq_decode.py): inside one
jitted loop, as in `generate`, XLA hoists that loop-invariant work out of the
loop by itself, so the cache saves time mainly when decoding runs step by
step.

Weights. XLA does not hoist the conversion of float32 parameters to a
bfloat16 compute dtype out of a loop, so `generate` casts the weights its
steps read only in the compute dtype once, before its loops
(`make_tokens_to_logits(...).cast_for(calls)`, `casting.cast_once`: for
each kind of step, sampling's one batch or beam search's prompt batch and
B * K rows; the norms' parameters and anything else a step reads in float32
stay as they are, and the steps' results are bit for bit the same).
"""

from txf.decode.beam_search import BeamState, beam_search, length_penalty_factor
from txf.decode.cache import (
  Cache,
  ModelSteps,
  TokensToLogits,
  cache_batch_axes,
  cache_bytes,
  cache_length,
  encode_for_decoding,
  init_cache,
  make_tokens_to_logits,
)
from txf.decode.generation import generate
from txf.decode.prompts import PADDING_SIDES
from txf.decode.sampling import sample

__all__ = [
  "PADDING_SIDES",
  "BeamState",
  "Cache",
  "ModelSteps",
  "TokensToLogits",
  "beam_search",
  "cache_batch_axes",
  "cache_bytes",
  "cache_length",
  "encode_for_decoding",
  "generate",
  "init_cache",
  "length_penalty_factor",
  "make_tokens_to_logits",
  "sample",
]
