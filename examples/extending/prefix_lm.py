"""A task kind registered from outside txf: the prefix LM (T5, UL2).

'prefix_lm' reads ordinary lm batches. Each row's first P tokens are a
prefix the decoder reads both ways (txf.models.Decoder's prefix_len_B); the
loss is on the suffix only, the targets after the prefix. P is drawn per row
in [1, T - 1] as a function of the row's tokens, so the same row gets the
same prefix in training and in evaluation, on every host, with no data
source of its own.
"""

import jax.numpy as jnp

from txf import register

# Odd multipliers of a row's tokens and a final mix (a multiplicative hash):
# the prefix length is a pseudo-random function of the row.
_MIX = 0x45D9F3B


def prefix_lengths(inputs_BxT):
  """int32 [B] in [1, T - 1]: each row's prefix length, from its tokens."""
  T = inputs_BxT.shape[1]
  odd_T = jnp.arange(T, dtype=jnp.uint32) * 2 + 1
  h_B = (jnp.asarray(inputs_BxT).astype(jnp.uint32) * odd_T).sum(axis=1, dtype=jnp.uint32)
  h_B = ((h_B >> 16) ^ h_B) * jnp.uint32(_MIX)
  h_B = (h_B >> 16) ^ h_B
  return (1 + h_B % jnp.uint32(T - 1)).astype(jnp.int32)


@register.task("prefix_lm", batches="lm", perplexity=True)
class PrefixLM:
  """A decoder attending bidirectionally within a prefix, trained on the suffix."""

  @staticmethod
  def model_inputs(batch):
    """(inputs [B, T], no segment ids, no positions, prefix lengths [B])."""
    return batch["inputs"], None, None, prefix_lengths(batch["inputs"])

  @staticmethod
  def labels_and_weights(batch):
    """(targets [B, T], float32 weights [B, T]): the lm weights where the
    target (the next token) lies after the prefix, 0 where it lies in it;
    a prefix position's own target is visible to it, so it cannot be trained."""
    prefix_B = prefix_lengths(batch["inputs"])
    T = batch["targets"].shape[1]
    in_suffix_BxT = jnp.arange(T)[None, :] + 1 >= prefix_B[:, None]
    return batch["targets"], batch["weights"].astype(jnp.float32) * in_suffix_BxT
