"""txf: Transformers in JAX/Flax for research.

Subpackages (dependencies point one way, top to bottom):
  txf.checks    config field checks (ValueError naming the field)
  txf.ops       pure jnp functions: attention, masks, positions, norms, losses
  txf.layers    linen modules holding parameters, calling txf.ops
  txf.models    Encoder, Decoder, EncoderDecoder, heads, build(config.model)
  txf.decode    KV-cache generation: sampling, beam search, `generate`
  txf.data      tokenizers, built-in corpus, synthetic and in-context tasks, batching
  txf.interop   Hugging Face checkpoints in and out (BERT, GPT-2, T5 shapes)
  txf.analysis  parameter and FLOP counts, attention maps, head scores and ablation
  txf.train     run config, optimizer, train/eval steps, loop, checkpoints, metrics
  txf.sweep     grids of runs, their results tables and plots, length extrapolation
  txf.textbook  the numbers and figures a Transformer course claims, measured

MultiHeadAttention sows its attention weights into the 'intermediates'
collection when asked (linen `mutable=['intermediates']`).
"""

__version__ = "0.1.0"
