"""Output heads: language-model, masked-LM and sequence classification,
registered as `model.head` choices (txf.layers.model_config.HEADS; user code
adds its own with txf.register.head).

Every head is built as Head(cfg) and called as head(x_BxTxD, tokens_BxT,
embedder): the final hidden states, the model's input ids and its token
Embedder (each head reads what it needs)."""

from __future__ import annotations

from typing import cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf.layers import Embedder, Norm
from txf.layers.block import compute_dtype
from txf.layers.embedding import linear_logits
from txf.layers.model_config import HEADS, ModelConfig, OutputHead
from txf.layers.partitioning import projection_inits


def _lecun_kernel_init(*axes):
  """`nn.Dense`'s default kernel initializer, with logical axes."""
  return nn.with_logical_partitioning(nn.initializers.lecun_normal(), axes)


class LMHead(nn.Module):
  """Hidden states -> vocabulary logits, tied to the embedding or not (either
  way times d_model^-0.5 when cfg.scale_logits)."""

  cfg: ModelConfig

  def __call__(
    self,
    x_BxTxD: jax.Array,
    tokens_BxT: jax.Array,
    embedder: Embedder,
    dtype: jnp.dtype = jnp.float32,
  ) -> jax.Array:
    """[B, T, D] -> [B, T, V] in `dtype`.

    Args:
      x_BxTxD: final hidden states.
      tokens_BxT: the model's input ids (unused).
      embedder: the model's token embedder (its table is the projection when
        `model.tie_embeddings`).
      dtype: the logits' dtype: float32, or the compute dtype for a loss that
        reads the projection's output as it is (the train step's on a GPU).
    """
    return linear_logits(x_BxTxD, self.kernel(embedder), self.cfg, dtype)

  @nn.compact
  def kernel(self, embedder: Embedder) -> jax.Array:
    """The projection [D, V] in the compute dtype, before any logit scaling:
    the embedder's table transposed when tied, else this head's own
    `logits/kernel` (stored where `nn.Dense` stores it)."""
    cfg = self.cfg
    if cfg.tie_embeddings:
      return embedder.output_kernel()
    kernel_DxV = _Kernel((cfg.d_model, cfg.vocab_size), name="logits")()
    return kernel_DxV.astype(compute_dtype(cfg))

  def scaled_kernel(self, embedder: Embedder) -> jax.Array:
    """The float32 [D, V] that x is multiplied by for float32 logits: the
    kernel with d_model^-0.5 folded in when cfg.scale_logits (the fused
    chunked loss takes the head as this matrix, `txf.train.step`)."""
    kernel_DxV = self.kernel(embedder).astype(jnp.float32)
    if self.cfg.scale_logits:
      return kernel_DxV / jnp.sqrt(jnp.float32(self.cfg.d_model))
    return kernel_DxV


class _Kernel(nn.Module):
  """A bias-free projection's kernel, Glorot-initialised with logical axes
  (embed, vocab), as `nn.Dense` would hold it."""

  shape: tuple[int, int]

  @nn.compact
  def __call__(self) -> jax.Array:
    kernel_init = projection_inits(("embed",), ("vocab",))["kernel_init"]
    # cast: flax types a boxed initializer's parameter as the box; param returns it unboxed.
    return cast(jax.Array, self.param("kernel", kernel_init, self.shape, jnp.float32))


class MaskedLMHead(nn.Module):
  """BERT's MLM head: dense + GELU + norm, then the (tied) vocabulary projection
  plus a per-token output bias."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, tokens_BxT: jax.Array, embedder: Embedder) -> jax.Array:
    """[B, T, D] -> [B, T, V] float32.

    Args:
      x_BxTxD: final hidden states.
      tokens_BxT: the model's input ids (unused).
      embedder: the model's token embedder (the tied vocabulary projection).
    """
    cfg = self.cfg
    # [D, D]: one mesh axis cannot split both dimensions.
    h_BxTxD = nn.Dense(
      cfg.d_model,
      dtype=compute_dtype(cfg),
      kernel_init=_lecun_kernel_init("embed", None),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
      name="transform",
    )(x_BxTxD)
    h_BxTxD = jax.nn.gelu(h_BxTxD, approximate=cfg.gelu_approximate)
    h_BxTxD = Norm(cfg, name="norm")(h_BxTxD)
    logits_BxTxV = LMHead(cfg, name="projection")(h_BxTxD, tokens_BxT, embedder)
    # cast: flax types a boxed initializer's parameter as the box; param returns it unboxed.
    bias_V = cast(
      jax.Array,
      self.param(
        "bias",
        nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
        (cfg.vocab_size,),
        jnp.float32,
      ),
    )
    return logits_BxTxV + bias_V


def pool(x_BxTxD: jax.Array, valid_BxT: jax.Array, pooling: str) -> jax.Array:
  """Pools hidden states over the real (valid) tokens: [B, T, D] -> [B, D].

  cls: the first token; last: the last real token; mean / max: over real
  tokens only, so padding never changes the result. A row without real
  tokens pools to zeros (mean, max) or its first token (last).
  """
  if pooling == "cls":
    return x_BxTxD[:, 0]
  if pooling == "last":
    # The last True of each row, wherever the padding sits (left-padded,
    # gapped): the count of real tokens less one was a pad's position there.
    from_end_B = jnp.argmax(valid_BxT[:, ::-1], axis=1)
    last_B = jnp.where(jnp.any(valid_BxT, axis=1), valid_BxT.shape[1] - 1 - from_end_B, 0)
    return jnp.take_along_axis(x_BxTxD, last_B[:, None, None], axis=1)[:, 0]
  valid_BxTx1 = valid_BxT[..., None]
  if pooling == "mean":
    total_BxD = jnp.sum(jnp.where(valid_BxTx1, x_BxTxD, 0), axis=1, dtype=jnp.float32)
    return (total_BxD / jnp.maximum(jnp.sum(valid_BxTx1, axis=1), 1)).astype(x_BxTxD.dtype)
  if pooling == "max":
    largest_BxD = jnp.max(jnp.where(valid_BxTx1, x_BxTxD, jnp.finfo(x_BxTxD.dtype).min), axis=1)
    # finfo.min for a row of padding alone: the classifier made it +-1e38 and NaN.
    return jnp.where(jnp.any(valid_BxTx1, axis=1), largest_BxD, 0)
  raise ValueError(f"model.pooling: {pooling!r} is not one of cls, mean, max, last")


class ClassificationHead(nn.Module):
  """Pooling then a linear classifier: [B, T, D] -> float32 [B, num_classes]."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array, tokens_BxT: jax.Array, embedder: Embedder) -> jax.Array:
    """[B, T, D] -> float32 logits [B, num_classes].

    Args:
      x_BxTxD: final hidden states.
      tokens_BxT: the model's input ids: `pool` pools those that are not
        padding (`model.pad_id`).
      embedder: the model's token embedder (unused).
    """
    pooled_BxD = pool(x_BxTxD, tokens_BxT != self.cfg.pad_id, self.cfg.pooling)
    # A handful of classes: not worth splitting.
    return nn.Dense(
      self.cfg.num_classes,
      dtype=compute_dtype(self.cfg),
      kernel_init=_lecun_kernel_init("embed", None),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
      name="classifier",
    )(pooled_BxD).astype(jnp.float32)


def _vocabulary_projection(cfg: ModelConfig) -> int:
  return cfg.d_model * cfg.vocab_size


def _transform_and_projection(cfg: ModelConfig) -> int:
  return cfg.d_model * cfg.d_model + _vocabulary_projection(cfg)


def _per_sequence(cfg: ModelConfig) -> int:
  return 0  # a classifier's matmul is once a sequence: flops_per_token adds it


def _no_head(cfg: ModelConfig) -> int:
  return 0  # the hidden states are the output


HEADS.register(
  "lm",
  OutputHead(
    LMHead, ("lm", "seq2seq"), ("decoder", "encoder_decoder", "lstm"), _vocabulary_projection
  ),
)
HEADS.register("mlm", OutputHead(MaskedLMHead, ("mlm",), ("encoder",), _transform_and_projection))
HEADS.register(
  "classify", OutputHead(ClassificationHead, ("classify",), ("decoder", "encoder"), _per_sequence)
)
HEADS.register("none", OutputHead(None, (), ("decoder", "encoder"), _no_head))
