"""An output head registered from outside txf.

An LM head with one hidden layer: x -> Dense(D) -> GELU -> the tied
vocabulary projection (the token table, as txf's own 'lm' head ties it),
for decoders. Trains data.task 'lm' with `model.head = "mlp_lm"`.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import register
from txf.layers.model_config import ModelConfig


def matmul_params(cfg):
  """The weights each token is multiplied by: the hidden layer's D x D and
  the vocabulary projection's D x V (txf's FLOP count, MFU)."""
  return cfg.d_model * cfg.d_model + cfg.d_model * cfg.vocab_size


@register.head("mlp_lm", tasks=("lm",), families=("decoder",), matmul_params=matmul_params)
class MLPHead(nn.Module):
  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD, tokens_BxT, embedder):
    """[B, T, D] -> float32 logits [B, T, V] (tokens_BxT unused)."""
    # Every parameter declares its logical axes: txf shards parameters by them.
    hidden_BxTxD = nn.Dense(
      self.cfg.d_model,
      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", None)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name="hidden",
    )(x_BxTxD)
    return embedder.attend(jax.nn.gelu(hidden_BxTxD)).astype(jnp.float32)
