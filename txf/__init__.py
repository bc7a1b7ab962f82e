"""txf: Transformers in JAX/Flax for research.

Subpackages (dependencies point one way, top to bottom):
  txf.checks    config field checks (ValueError naming the field)
  txf.ops       pure jnp functions: attention, masks, positions, norms, losses
  txf.layers    linen modules holding parameters, calling txf.ops
  txf.models    Encoder, Decoder, EncoderDecoder, heads, build(config.model)
  txf.decode    KV-cache generation
  txf.data      tokenizers, built-in corpus, synthetic tasks, batching
  txf.train     optimizer, train/eval steps, loop, checkpoints, metrics
  txf.analysis  parameter and FLOP counts

MultiHeadAttention sows its attention weights into the 'intermediates'
collection when asked (linen `mutable=['intermediates']`).
"""

__version__ = "0.1.0"
