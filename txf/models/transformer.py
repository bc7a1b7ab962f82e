"""The three model families, composed from the same layers.

  Encoder          bidirectional, padding-aware; MLM or classification head.
  Decoder          causal LM (or last-token classification); KV-cache decoding.
  EncoderDecoder   bidirectional encoder, causal decoder with cross-attention.

head='none' makes an Encoder or Decoder return its final hidden states [B, T, D].

Every model reads one `ModelConfig`; token id `cfg.pad_id` marks padding.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import ops
from txf.layers import Embedder, TransformerStack
from txf.layers.embedding import Positions
from txf.layers.inits import apply_init
from txf.layers.model_config import HEADS, ModelConfig

Array = jax.Array


def _embedder(cfg: ModelConfig, name: str | None = None) -> Embedder:
  return Embedder(cfg, name=name)


def _check_packing(
  tokens_BxT: Array, segment_ids_BxT: Array | None, positions_BxT: Array | None
) -> None:
  """ValueError unless the tokens are [B, T] with a row at least (1-D ids
  failed deep in the stack, an empty batch dividing by zero) and the
  packing inputs given are int arrays shaped like them."""
  shape = jnp.shape(tokens_BxT)
  if len(shape) != 2 or not shape[0]:
    raise ValueError(f"tokens: expected ids [B, T] with B >= 1, got shape {shape}")
  for name, array in (("segment_ids", segment_ids_BxT), ("positions", positions_BxT)):
    if array is not None and (
      array.shape != tokens_BxT.shape or not jnp.issubdtype(array.dtype, jnp.integer)
    ):
      raise ValueError(
        f"{name}: expected int [B, T] = {tokens_BxT.shape} like the tokens, "
        f"got {array.dtype} {array.shape}"
      )


class _OneStackModel(nn.Module):
  """Embedding, one stack and a head: the body Decoder and Encoder share."""

  cfg: ModelConfig
  _causal = False

  def init(self, rngs, *args, **kwargs):
    """flax's init, then the config's initialisation scheme (txf.layers.inits)."""
    return apply_init(super().init(rngs, *args, **kwargs), self.cfg, rngs)

  def setup(self):
    cfg = self.cfg
    self.embedder = _embedder(cfg)
    self.positions = Positions()
    self.embed_dropout = nn.Dropout(cfg.dropout_rate)
    self.stack = TransformerStack(cfg, cfg.num_layers, causal=self._causal)
    head = HEADS[cfg.head].module
    self.head = None if head is None else head(cfg)

  def _forward(
    self,
    tokens_BxT: Array,
    key_mask: Array | None,
    positions_BxT: Array | None,
    *,
    deterministic: bool,
    use_cache: bool,
    token_types_BxT: Array | None = None,
    causal: bool | None = None,
  ) -> Array:
    positions_1xT, cache_index = self.positions(tokens_BxT.shape[1], use_cache)
    # Packed documents restart the absolute encodings (learned, sinusoidal);
    # the relative ones act in attention on the window's positions, which give
    # the same distances within a document, and the segment mask hides the rest.
    embed_positions = positions_1xT if positions_BxT is None else positions_BxT
    x_BxTxD = self.embed_dropout(
      self.embedder(tokens_BxT, embed_positions, token_types_BxT), deterministic=deterministic
    )
    x_BxTxD = self.stack(
      x_BxTxD,
      q_positions_BxT=positions_1xT,
      self_mask=key_mask,
      cache_index=cache_index,
      deterministic=deterministic,
      use_cache=use_cache,
      causal=causal,
    )
    if self.head is None:
      return x_BxTxD
    return self.head(x_BxTxD, tokens_BxT, self.embedder)


class Decoder(_OneStackModel):
  """GPT-style causal decoder: token embedding (and the config's position
  encoding), `num_layers` causal blocks, a final norm and the config's head.

  Built by `txf.models.build` from a config with family='decoder'; `init`
  applies the config's initialisation scheme (`model.init`).

      model = Decoder(ModelConfig(vocab_size=260))
      params = model.init(jax.random.key(0), tokens_BxT)["params"]
      logits_BxTxV = model.apply({"params": params}, tokens_BxT)
  """

  _causal = True

  def __call__(
    self,
    tokens_BxT: Array,
    segment_ids_BxT: Array | None = None,
    positions_BxT: Array | None = None,
    prefix_len_B: Array | None = None,
    *,
    deterministic: bool = True,
    use_cache: bool = False,
  ) -> Array:
    """tokens [B, T] -> logits [B, T, V] (lm) or [B, num_classes] (classify).

    Args:
      tokens_BxT: int token ids [B, T].
      segment_ids_BxT: packed rows (several documents in one row, txf.data):
        int [B, T], 1, 2, ... per document and 0 for padding; a token attends
        only to earlier tokens of its own document. None: one document a row.
      positions_BxT: int [B, T], each token's position (each document's from
        0) for an absolute position encoding (learned, sinusoidal); None:
        0..T-1. The relative ones (rope, alibi, t5_bias) act on the row's own
        positions 0..T-1, whose distances within a packed document are the
        same, so they do not read it: positions with gaps change nothing there.
      prefix_len_B: int [B]: a prefix LM (T5, UL2): row b's first
        prefix_len_B[b] tokens attend to each other both ways, the later ones
        causally (`ops.prefix_lm_mask`); None: causal throughout. Not with
        segment ids or use_cache.
      deterministic: False applies dropout (needs a 'dropout' rng).
      use_cache: continue from the KV cache in the 'cache' collection (see
        `txf.decode`); not with segment ids.

    Returns:
      float32 logits [B, T, V] (head 'lm'), [B, num_classes] ('classify'),
        or the final hidden states [B, T, D] ('none').
    """
    _check_packing(tokens_BxT, segment_ids_BxT, positions_BxT)
    mask = None
    if segment_ids_BxT is not None:
      if use_cache:
        raise ValueError("Decoder: segment_ids (packed documents) do not go with use_cache")
      mask = ops.segment_mask(segment_ids_BxT)
    if prefix_len_B is not None:
      if use_cache or segment_ids_BxT is not None:
        raise ValueError("Decoder: prefix_len_B goes with neither segment_ids nor use_cache")
      # The mask is causal after the prefix, so the stack's own causal mask,
      # which it would be ANDed with, is off for this call.
      mask = ops.prefix_lm_mask(prefix_len_B, tokens_BxT.shape[1])
    return self._forward(
      tokens_BxT,
      mask,
      positions_BxT,
      deterministic=deterministic,
      use_cache=use_cache,
      causal=False if prefix_len_B is not None else None,
    )


class Encoder(_OneStackModel):
  """BERT-style bidirectional encoder: token embedding (and the config's
  position encoding, token types), `num_layers` blocks attending both ways, a
  final norm and the config's head. Padding tokens (`model.pad_id`) are never
  attended to. Built by `txf.models.build` from a config with family='encoder'.
  """

  def __call__(
    self,
    tokens_BxS: Array,
    segment_ids_BxS: Array | None = None,
    positions_BxS: Array | None = None,
    *,
    token_types_BxS: Array | None = None,
    deterministic: bool = True,
  ) -> Array:
    """tokens [B, S] -> logits [B, S, V] (mlm) or [B, num_classes] (classify).

    Args:
      tokens_BxS: int token ids [B, S]; `model.pad_id` marks padding.
      segment_ids_BxS: packed rows, as `Decoder`'s: int [B, S], 1, 2, ... per
        document, 0 for padding; a token attends only to its own document.
      positions_BxS: int [B, S] positions for the position encoding; None: 0..S-1.
      token_types_BxS: int [B, S] BERT segment (sentence A/B) ids
        (`model.num_token_types` > 0 only); None: type 0 everywhere.
      deterministic: False applies dropout (needs a 'dropout' rng).

    Returns:
      float32 logits [B, S, V] (head 'mlm'), [B, num_classes] ('classify'),
        or the final hidden states [B, S, D] ('none').
    """
    _check_packing(tokens_BxS, segment_ids_BxS, positions_BxS)
    key_mask = ops.padding_mask(tokens=tokens_BxS, pad_id=self.cfg.pad_id)
    if segment_ids_BxS is not None:
      key_mask = ops.combine_masks(key_mask, ops.segment_mask(segment_ids_BxS))
    return self._forward(
      tokens_BxS,
      key_mask,
      positions_BxS,
      deterministic=deterministic,
      use_cache=False,
      token_types_BxT=token_types_BxS,
    )


class EncoderDecoder(nn.Module):
  """Transformer / T5-style sequence-to-sequence model: an encoder stack over
  the source, a causal decoder stack with cross-attention to it, and an LM
  head (embeddings shared between the two when `model.share_embeddings`).
  `encode` and `decode` are its two halves (`txf.decode` calls them apart).
  """

  cfg: ModelConfig

  def init(self, rngs, *args, **kwargs):
    """flax's init, then the config's initialisation scheme (txf.layers.inits)."""
    return apply_init(super().init(rngs, *args, **kwargs), self.cfg, rngs)

  def setup(self):
    cfg = self.cfg
    self.encoder_embedder = _embedder(cfg)
    self.decoder_embedder = self.encoder_embedder if cfg.share_embeddings else _embedder(cfg)
    self.positions = Positions()
    self.embed_dropout = nn.Dropout(cfg.dropout_rate)
    self.encoder = TransformerStack(cfg, cfg.num_layers, causal=False)
    self.decoder = TransformerStack(cfg, cfg.num_decoder_layers, causal=True, has_cross=True)
    self.head = HEADS[cfg.head].module(cfg)

  def encode(self, encoder_tokens_BxS: Array, *, deterministic: bool = True) -> tuple[Array, Array]:
    """tokens [B, S] -> (encoded [B, S, D], key mask [B, 1, 1, S]).

    Args:
      encoder_tokens_BxS: int source token ids [B, S]; `model.pad_id` marks padding.
      deterministic: False applies dropout (needs a 'dropout' rng).
    """
    _check_packing(encoder_tokens_BxS, None, None)
    positions_1xS, _ = self.positions(encoder_tokens_BxS.shape[1], False)
    key_mask = ops.padding_mask(tokens=encoder_tokens_BxS, pad_id=self.cfg.pad_id)
    x_BxSxD = self.embed_dropout(
      self.encoder_embedder(encoder_tokens_BxS, positions_1xS), deterministic=deterministic
    )
    encoded_BxSxD = self.encoder(
      x_BxSxD, q_positions_BxT=positions_1xS, self_mask=key_mask, deterministic=deterministic
    )
    return encoded_BxSxD, key_mask

  def decode(
    self,
    encoded_BxSxD: Array | None,
    encoder_mask: Array | None,
    decoder_tokens_BxT: Array,
    *,
    deterministic: bool = True,
    use_cache: bool = False,
  ) -> Array:
    """Decoder tokens [B, T] attending to an encoding -> logits [B, T, V].

    With use_cache (see `txf.decode`) each cross-attention layer stores the
    keys and values of `encoded_BxSxD` (and `encoder_mask`) in the cache;
    pass None for both to attend to the stored ones instead of projecting
    the encoding again. Decoding zero tokens only stores them.

    Args:
      encoded_BxSxD: `encode`'s encoding [B, S, D], or None (use_cache only).
      encoder_mask: `encode`'s key mask [B, 1, 1, S], or None with it.
      decoder_tokens_BxT: int target-side token ids [B, T] (teacher forcing:
        BOS + the target shifted right).
      deterministic: False applies dropout (needs a 'dropout' rng).
      use_cache: continue from the KV cache in the 'cache' collection.
    """
    if encoded_BxSxD is None and not use_cache:
      raise ValueError(
        "EncoderDecoder.decode: encoded_BxSxD=None reads the encoding from the "
        "cache and needs use_cache=True"
      )
    positions_1xT, cache_index = self.positions(decoder_tokens_BxT.shape[1], use_cache)
    y_BxTxD = self.embed_dropout(
      self.decoder_embedder(decoder_tokens_BxT, positions_1xT), deterministic=deterministic
    )
    y_BxTxD = self.decoder(
      y_BxTxD,
      q_positions_BxT=positions_1xT,
      cache_index=cache_index,
      cross_x_BxSxD=encoded_BxSxD,
      cross_mask=encoder_mask,
      deterministic=deterministic,
      use_cache=use_cache,
    )
    return self.head(y_BxTxD, decoder_tokens_BxT, self.decoder_embedder)

  def __call__(
    self,
    encoder_tokens_BxS: Array,
    decoder_tokens_BxT: Array,
    *,
    deterministic: bool = True,
    use_cache: bool = False,
  ) -> Array:
    """encoder tokens [B, S], decoder tokens [B, T] -> logits [B, T, V]:
    `encode`, then `decode`.

    Args:
      encoder_tokens_BxS: int source token ids [B, S]; `model.pad_id` marks padding.
      decoder_tokens_BxT: int target-side token ids [B, T] (BOS + the target
        shifted right).
      deterministic: False applies dropout (needs a 'dropout' rng).
      use_cache: continue from the KV cache (see `txf.decode`).

    Returns:
      float32 logits [B, T, V].

    Raises:
      ValueError: for source and target rows of different counts (`decode`
        pairs an encoding with its beams, so there they would be paired off
        silently).
    """
    encoded_BxSxD, encoder_mask = self.encode(encoder_tokens_BxS, deterministic=deterministic)
    _check_packing(decoder_tokens_BxT, None, None)
    if decoder_tokens_BxT.shape[0] != encoder_tokens_BxS.shape[0]:
      raise ValueError(
        f"EncoderDecoder: {encoder_tokens_BxS.shape[0]} source rows and "
        f"{decoder_tokens_BxT.shape[0]} target rows: one target row a source row"
      )
    return self.decode(
      encoded_BxSxD,
      encoder_mask,
      decoder_tokens_BxT,
      deterministic=deterministic,
      use_cache=use_cache,
    )
