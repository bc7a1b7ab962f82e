"""Multi-head attention: projections, positional hooks, KV cache, dropout.

All math (scores, masks, RoPE, ALiBi, T5 buckets) lives in `txf.ops`; this
module holds the projection parameters and the decoding cache.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from txf import ops
from txf.layers import positions
from txf.layers.model_config import ModelConfig, derived
from txf.layers.norm import Norm
from txf.layers.partitioning import projection_inits
from txf.layers.projection import OutputProjection, stored_bias
from txf.ops import cache_attention_gpu, platform

Array = jax.Array
# The variable collection a caller passes to `apply` to scale heads' outputs.
HEAD_MASK = "head_mask"
# The 'cache' variables in which cross-attention keeps an encoder output.
CROSS_CACHE_NAMES = ("cross_key", "cross_value", "cross_mask")


class MultiHeadAttention(nn.Module):
  """Self- or cross-attention with MHA / GQA / MQA heads.

  Reads the model's config: heads (num_heads H, num_kv_heads K, head_dim
  Dh), position (an encoding that rotates q and k or adds a bias acts here;
  absolute ones act in the Embedder), window, use_bias, attention (softmax,
  or linear: txf.ops.linear_attention), attention_dropout_rate,
  attention_impl, scale_attention and the compute dtype.

  Attributes:
    cfg: the model's config.
    causal: queries attend only to keys at positions <= their own.
    causal_positions: T5's buckets are a causal model's, not split by sign
      (None: `causal`). A decoder's prefix-LM call attends bidirectionally
      (causal False) with the buckets it was trained with.
    cross: cross-attention: keys and values come from `kv_BxSxD` (an encoder
      output), which decoding may keep in the cache (see `__call__`); it
      carries no positional signal and no window (as in T5 and Vaswani et al.).
  """

  cfg: ModelConfig
  causal: bool = False
  causal_positions: bool | None = None
  cross: bool = False

  # What the layer reads of its config, named once.
  @property
  def num_heads(self) -> int:
    return self.cfg.num_heads

  @property
  def num_kv_heads(self) -> int:
    return derived(self.cfg.num_kv_heads)

  @property
  def head_dim(self) -> int:
    return derived(self.cfg.head_dim)

  @property
  def position(self) -> str:
    return "none" if self.cross else self.cfg.position

  @property
  def window(self) -> int | None:
    return None if self.cross else self.cfg.window

  @property
  def dtype(self) -> Any:
    return jnp.dtype(self.cfg.dtype)

  @property
  def scale(self) -> float | None:
    """Multiplier of the scores q.k; None: 1/sqrt(head_dim) (1.0 unscaled, T5)."""
    return None if self.cfg.scale_attention else 1.0

  @nn.compact
  def __call__(
    self,
    x_BxTxD: Array,
    kv_BxSxD: Array | None = None,
    *,
    q_positions_BxT: Array,
    key_mask: Array | None = None,
    relative_table: Array | None = None,
    cache_index: Array | None = None,
    deterministic: bool = True,
    use_cache: bool = False,
    add_bias: bool = True,
    residual_BxTxD: Array | None = None,
    norm: Norm | None = None,
  ) -> Array:
    """Attends from x to kv (x itself when kv is None).

    Args:
      x_BxTxD: queries' inputs.
      kv_BxSxD: keys' and values' inputs for cross-attention, else None
        (a `cross` layer under use_cache may omit it: see below).
      q_positions_BxT: absolute positions of the queries ([1, T] broadcasts).
      key_mask: bool, broadcastable to [B, 1, 1|T, S]: padding of the keys.
      relative_table: [num_buckets, H] table of an encoding with table='relative'
        (T5's bias).
      cache_index: scalar int32, the first free cache slot (use_cache only).
      deterministic: disables dropout.
      use_cache: self-attention reads and writes the KV cache (see below).
      add_bias: add the output projection's bias; False: leave it to the
        caller (`output_bias`; a Pre-LN block adds it in its next norm).
      residual_BxTxD: None, or the residual stream to add the output to (the
        output projection's kernel adds it at batch 1 on a GPU:
        `projection.adds_in_kernel`).
      norm: None, or the Pre-LN block's norm (a `Norm`) of x to attend from:
        a decoding step of one row whose query, key and value reach the GPU
        kernel as one product (`_packs`) has the kernel compute the norm and
        the product too (`Norm.in_kernel`); otherwise the norm is applied
        to x first.

    With use_cache the cache holds `cached_key`/`cached_value` [B, L, K, Dh];
    L is fixed when the cache is created by `model.init(..., use_cache=True)` on
    a length-L input (that call only creates it). Each later call writes its
    T new keys at `cache_index` and attends over all L slots, masking the
    ones after each query.

    A `cross` layer under use_cache keeps the keys and values of its encoder
    output, with their padding mask, as `cross_key`/`cross_value`
    [B, S, K, Dh] and `cross_mask` [B, 1, 1, S]: a call with `kv_BxSxD`
    computes and stores them, a call without reads the stored ones, so a
    decoding step need not project the encoder output again.

    Cross-attention keys/values may have fewer rows than the queries: with
    B = G * B_kv, query rows b * G .. b * G + G - 1 all attend to key row b
    (beam search's beams of one example share its encoding, txf.decode).

    With the 'intermediates' collection mutable (`apply(..., mutable=
    ['intermediates'])`), the float32 attention weights [B, H, T, S] (before
    attention dropout) are sown there as `attention_weights`.

    With a 'head_mask' collection passed to `apply` that holds this layer's
    `mask` [H] (see txf.analysis.ablation), each head's output is multiplied
    by its mask entry before the output projection (0 removes the head).
    Without it nothing changes: no variable, no extra op.

    Returns:
      [B, T, D] in the compute dtype (without the output projection's bias
      where add_bias is False), added to residual_BxTxD where given.
    """
    packs = self._packs(x_BxTxD, kv_BxSxD, key_mask, use_cache, deterministic)
    in_kernel = None
    if norm is not None:
      # One row: at more, XLA's product reads the weights once for all rows,
      # where each row's instances of the kernel would read them again.
      one_row = x_BxTxD.shape[0] * x_BxTxD.shape[1] == 1
      in_kernel = norm.in_kernel(x_BxTxD) if packs and one_row else None
      if in_kernel is None:
        x_BxTxD = norm(x_BxTxD)
    if in_kernel is not None:
      out_BxTxHxDh = self._update_cache_and_attend(
        self._normalized_step(x_BxTxD, *in_kernel), cache_index
      )
    elif packs:
      qkv_BxTx3xHxDh, biases = self._packed_product(x_BxTxD)
      out_BxTxHxDh = self._update_cache_and_attend(
        functools.partial(
          cache_attention_gpu.update_and_attend_packed, qkv_BxTx3xHxDh, biases=biases
        ),
        cache_index,
      )
    else:
      out_BxTxHxDh = self._attend_projections(
        x_BxTxD,
        kv_BxSxD,
        q_positions_BxT,
        key_mask,
        relative_table,
        cache_index,
        deterministic,
        use_cache,
      )
    if self.has_variable(HEAD_MASK, "mask"):
      mask_H: Array = self.get_variable(HEAD_MASK, "mask")
      out_BxTxHxDh = out_BxTxHxDh * mask_H.astype(out_BxTxHxDh.dtype)[:, None]
    out = OutputProjection(
      (self.num_heads, self.head_dim, x_BxTxD.shape[-1]),
      ("heads", "head_dim"),
      self.cfg.use_bias,
      self.dtype,
      name="out",
    )
    return out(out_BxTxHxDh, add_bias=add_bias, residual=residual_BxTxD)

  def _attend_projections(
    self,
    x_BxTxD: Array,
    kv_BxSxD: Array | None,
    q_positions_BxT: Array,
    key_mask: Array | None,
    relative_table: Array | None,
    cache_index: Array | None,
    deterministic: bool,
    use_cache: bool,
  ) -> Array:
    """The heads' outputs [B, T, H, Dh] from q, k and v projected apart
    (`_project`), rotated by the position encoding where it rotates them:
    by a GPU kernel where one takes the step (`_decoding_kernel`), by
    `_attend` otherwise (arguments as `__call__`'s)."""
    q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, key_mask = self._project(
      x_BxTxD, kv_BxSxD, key_mask, use_cache
    )
    is_self = kv_BxSxD is None and not self.cross
    k_positions_BxS = jnp.arange(k_BxSxKxDh.shape[1])[None]
    encoding = positions.encoding(self.position)
    if encoding.rotate is not None:
      q_BxTxHxDh = encoding.rotate(self.cfg, q_BxTxHxDh, q_positions_BxT)
      k_BxSxKxDh = encoding.rotate(
        self.cfg, k_BxSxKxDh, q_positions_BxT if is_self else k_positions_BxS
      )
    masking = dict(mask=key_mask, is_causal=self.causal, window=self.window)
    kernel = use_cache and self._decoding_kernel(deterministic)
    if kernel and is_self and key_mask is None and self._cache_fits_kernel(q_BxTxHxDh):
      out_BxTxHxDh = self._update_cache_and_attend(
        functools.partial(
          cache_attention_gpu.update_and_attend, q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh
        ),
        cache_index,
      )
    elif (
      kernel
      and self.cross
      and self._encoding_fits_kernel(q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, key_mask)
    ):
      out_BxTxHxDh = cache_attention_gpu.attend(
        q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, key_mask, scale=self.scale
      )
    else:
      if use_cache and is_self:
        k_BxSxKxDh, v_BxSxKxDh, masking = self._attend_over_cache(
          k_BxSxKxDh, v_BxSxKxDh, cache_index, masking
        )
        k_positions_BxS = jnp.arange(k_BxSxKxDh.shape[1])[None]
      bias = self._position_bias(encoding, q_positions_BxT, k_positions_BxS, relative_table)
      out_BxTxHxDh = self._attend(
        q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh, bias=bias, deterministic=deterministic, **masking
      )
    return out_BxTxHxDh

  def output_bias(self) -> Array | None:
    """The output projection's bias [D] as stored (float32), None without
    one: what a call with add_bias=False leaves out. Read after that call
    (which creates it at init)."""
    return stored_bias(self, "out")

  def _project(
    self, x_BxTxD: Array, kv_BxSxD: Array | None, key_mask: Array | None, use_cache: bool
  ) -> tuple[Array, Array, Array, Array | None]:
    """(q [B, T, H, Dh], k [B, S, K, Dh], v [B, S, K, Dh], the key mask): the
    projections of x, and of x or kv_BxSxD (a cached cross-attention may read
    its keys, values and mask from the cache instead)."""
    if kv_BxSxD is None and not self.cross:
      return (*self.project(x_BxTxD, x_BxTxD, x_BxTxD), key_mask)
    if use_cache:
      (q_BxTxHxDh,) = self.project(x_BxTxD)
      return (q_BxTxHxDh, *self._cross_cache(kv_BxSxD, key_mask))
    if kv_BxSxD is None:
      raise ValueError(
        "MultiHeadAttention: cross-attention needs kv_BxSxD (only use_cache "
        "may omit it, to read the keys/values a call with it stored)"
      )
    return (*self.project(x_BxTxD, kv_BxSxD, kv_BxSxD), key_mask)

  def project(self, *inputs: Array | None) -> tuple[Any, ...]:
    """The query, key and value projections of the first one, two or three of
    `inputs` (query [B, T, D], key [B, S, D], value [B, S, D]; None: not
    wanted): (q [B, T, H, Dh], k [B, S, K, Dh], v [B, S, K, Dh]), None for
    each input that was None.

    Projections of the same input array with as many heads are one GEMM over
    their kernels stacked (q, k and v of MHA self-attention; k and v of
    grouped-query and cross-attention): one read of the input and one wider
    product instead of three, as PyTorch's packed in-projection; on one GPU,
    forward, one GEMM each, their backward one over the stack
    (`_projections`). Each keeps
    its own parameters ('query', 'key', 'value'), so checkpoints and
    interop do not see the fusion. A caller that feeds a projection another
    input (path patching) intercepts this method and gets them apart.
    """
    names = ("query", "key", "value")[: len(inputs)]
    projected: dict[str, Array] = {}
    for group, x_BxTxD, kernels, biases in self._groups(names, inputs):
      projected.update(zip(group, _projections(x_BxTxD, kernels, biases)))
    return tuple(projected.get(name) for name in names)

  def _groups(
    self, names: tuple[str, ...], inputs: tuple[Array | None, ...]
  ) -> list[tuple[tuple[str, ...], Array, list[Array], list[Array]]]:
    """`project`'s groups of projections of one input with as many heads:
    (the names, the input [B, T, D] and the kernels [D, N, Dh] in the
    compute dtype, the biases [N, Dh] as stored or none)."""
    groups: dict[tuple[int, int], list[tuple[str, Array]]] = {}
    for name, x in zip(names, inputs):
      if x is not None:
        groups.setdefault((id(x), self._heads(name)[0]), []).append((name, x))
    result = []
    for group in groups.values():
      x_BxTxD = group[0][1]
      weights = [self._weights(name, x_BxTxD.shape[-1]) for name, _ in group]
      # Each kernel whole along D before the stack: under FSDP, XLA otherwise
      # gathered the stacked kernel anew for each of its uses (decoder_1b on
      # a v5e-16: 22.3 against 14.9 GiB of all-gathers a step).
      kernels = [
        nn.with_logical_constraint(
          kernel.astype(self.dtype), (None, self._heads(name)[1], "head_dim")
        )
        for (name, _), (kernel, _) in zip(group, weights)
      ]
      biases = [bias for _, bias in weights if bias is not None]
      result.append((tuple(name for name, _ in group), x_BxTxD.astype(self.dtype), kernels, biases))
    return result

  def _products(
    self, names: tuple[str, ...], inputs: tuple[Array | None, ...]
  ) -> list[tuple[tuple[str, ...], Array, list[Array]]]:
    """(the names, their product [B, T, P, N, Dh] in the compute dtype without
    the biases, the biases [N, Dh] as stored or none) for each of `_groups`."""
    return [
      (group, _stacked_product(x_BxTxD, kernels), biases)
      for group, x_BxTxD, kernels, biases in self._groups(names, inputs)
    ]

  def _packs(
    self,
    x_BxTxD: Array,
    kv_BxSxD: Array | None,
    key_mask: Array | None,
    use_cache: bool,
    deterministic: bool,
  ) -> bool:
    """Whether the GPU kernel takes a decoding step's query, key and value
    of multi-head self-attention together: as their one product [B, 1, 3,
    H, Dh] with their biases ([H, Dh] each, as stored, or none), which it
    adds as it reads them (`cache_attention_gpu.packs`: their biases and
    split are otherwise a kernel of their own), or at one row made by the
    kernel from the stream (`__call__`'s `norm`). Where `_decoding_kernel`,
    no key mask, and no position encoding that rotates them; otherwise
    `_project` gives them apart."""
    if not (
      use_cache
      and kv_BxSxD is None
      and not self.cross
      and key_mask is None
      and self.num_kv_heads == self.num_heads
      and positions.encoding(self.position).rotate is None
      and self._decoding_kernel(deterministic)
      and self.has_variable("cache", "cached_key")
    ):
      return False
    shape = (*x_BxTxD.shape[:2], 3, self.num_heads, self.head_dim)
    return cache_attention_gpu.packs(
      jax.ShapeDtypeStruct(shape, self.dtype),
      self.get_variable("cache", "cached_key"),
      self.get_variable("cache", "cached_value"),
    )

  def _packed_product(self, x_BxTxD: Array) -> tuple[Array, list[Array]]:
    """Where `_packs`: (the query, key and value product [B, 1, 3, H, Dh],
    their biases [H, Dh] as stored, or none)."""
    ((_, qkv_BxTx3xHxDh, biases),) = self._products(("query", "key", "value"), (x_BxTxD,) * 3)
    return qkv_BxTx3xHxDh, biases

  def _normalized_step(
    self, x_BxTxD: Array, norm_scale_D: Array, norm_bias_D: Array | None, eps: float
  ) -> Callable[..., tuple[Array, Array, Array]]:
    """Where `_packs` at one row, with the block's norm: the kernel's step
    from the residual stream x [1, 1, D], the norm's parameters
    (`Norm.in_kernel`) and the query, key and value kernels [D, H * Dh]
    cast to the compute dtype (by XLA, before the kernel: a decoding loop
    casts them once) with their biases as stored."""
    weights = [self._weights(name, x_BxTxD.shape[-1]) for name in ("query", "key", "value")]
    return functools.partial(
      cache_attention_gpu.normalize_project_and_attend,
      x_BxTxD.reshape(1, -1),
      norm_scale_D,
      norm_bias_D,
      [kernel.astype(self.dtype).reshape(x_BxTxD.shape[-1], -1) for kernel, _ in weights],
      biases=[bias for _, bias in weights if bias is not None],
      eps=eps,
    )

  def _heads(self, name: str) -> tuple[int, str]:
    """(N, the logical axis) of projection `name`'s heads: the queries' H, or
    the keys' and values' K."""
    return (self.num_heads, "heads") if name == "query" else (self.num_kv_heads, "kv_heads")

  def _weights(self, name: str, d_model: int) -> tuple[Array, Array | None]:
    """The kernel [D, N, Dh] and bias [N, Dh] (None without bias) of projection `name`."""
    heads, axis = self._heads(name)
    return ProjectionWeights(
      shape=(d_model, heads, self.head_dim),
      axes=(("embed",), (axis, "head_dim")),
      use_bias=self.cfg.use_bias,
      name=name,
    )()

  def _attend_over_cache(
    self, k_BxTxKxDh: Array, v_BxTxKxDh: Array, cache_index: Array | None, masking: dict
  ) -> tuple[Array, Array, dict]:
    """Self-attention under use_cache: writes the new keys and values into the
    cache and returns (k, v) over all L slots [B, L, K, Dh] with `masking`
    (mask, is_causal, window) made explicit for queries at cache_index + t."""
    if cache_index is None:
      raise ValueError("MultiHeadAttention: use_cache=True needs cache_index")
    q_len = k_BxTxKxDh.shape[1]
    k_BxLxKxDh, v_BxLxKxDh = self._update_cache(k_BxTxKxDh, v_BxTxKxDh, cache_index)
    if self.is_initializing():
      return k_BxLxKxDh, v_BxLxKxDh, masking
    # Queries sit at cache_index + t, so the causal and window masks are
    # offset; slots not written yet lie after every query and are masked.
    cache_len = k_BxLxKxDh.shape[1]
    mask = ops.combine_masks(
      masking["mask"], ops.causal_mask(q_len, cache_len, q_offset=cache_index)
    )
    if masking["window"] is not None:
      mask = ops.combine_masks(
        mask,
        ops.sliding_window_mask(q_len, cache_len, window=masking["window"], q_offset=cache_index),
      )
    return k_BxLxKxDh, v_BxLxKxDh, dict(mask=mask, is_causal=False, window=None)

  def _decoding_kernel(self, deterministic: bool) -> bool:
    """Whether a decoding step's attention may run as one GPU kernel
    (`ops.cache_attention_gpu`) instead of XLA's passes: on one GPU (the
    program on one device, as for the cross-entropy kernel), softmax
    attention without a position bias, the config's attention_impl left to
    choose (None), and nothing that needs the weights (dropout, the
    'intermediates' collection). The shapes are checked apart."""
    return (
      not self.is_initializing()
      and cache_attention_gpu.AVAILABLE
      and platform.backend() == "gpu"
      and jax.sharding.get_abstract_mesh().size <= 1
      and self.cfg.attention == "softmax"
      and self.cfg.attention_impl is None
      and positions.encoding(self.position).bias is None
      and (deterministic or self.cfg.attention_dropout_rate == 0.0)
      and not self.is_mutable_collection("intermediates")
    )

  def _cache_fits_kernel(self, q_BxTxHxDh: Array) -> bool:
    """Self-attention: one new token, and a cache the kernel takes."""
    return self.has_variable("cache", "cached_key") and cache_attention_gpu.applies(
      q_BxTxHxDh,
      self.get_variable("cache", "cached_key"),
      self.get_variable("cache", "cached_value"),
    )

  def _encoding_fits_kernel(
    self, q_BxTxHxDh: Array, k_BxSxKxDh: Array, v_BxSxKxDh: Array, mask: Array | None
  ) -> bool:
    """Cross-attention from the cache: one new token, keys the kernel takes,
    and a key mask [B_kv, 1, 1, S] (the cached one)."""
    return (
      mask is not None
      and mask.shape == (k_BxSxKxDh.shape[0], 1, 1, k_BxSxKxDh.shape[1])
      and cache_attention_gpu.applies_to_cross(q_BxTxHxDh, k_BxSxKxDh, v_BxSxKxDh)
    )

  def _update_cache_and_attend(
    self, step: Callable[..., tuple[Array, Array, Array]], cache_index: Array | None
  ) -> Array:
    """`_attend_over_cache` then `_attend`, as one GPU kernel (where
    `_decoding_kernel` and `_cache_fits_kernel`, or `_packs`): `step` is
    `cache_attention_gpu.update_and_attend` given the new query, key and
    value, `update_and_attend_packed` given their product, or
    `normalize_project_and_attend` given the stream, the norm and the
    kernels (`_normalized_step`); it writes the new key and value at
    cache_index and returns the heads' outputs [B, 1, H, Dh]."""
    if cache_index is None:
      raise ValueError("MultiHeadAttention: use_cache=True needs cache_index")
    out_BxTxHxDh, cached_key, cached_value = step(
      self.get_variable("cache", "cached_key"),
      self.get_variable("cache", "cached_value"),
      cache_index,
      scale=self.scale,
      window=self.window,
    )
    self.put_variable("cache", "cached_key", cached_key)
    self.put_variable("cache", "cached_value", cached_value)
    return out_BxTxHxDh

  def _attend(
    self, q_BxTxHxDh: Array, k_BxSxKxDh: Array, v_BxSxKxDh: Array, *, deterministic: bool, **attend
  ) -> Array:
    """The heads' outputs [B, T, H, Dh]; `attend` holds ops.dot_product_attention's
    bias, mask, is_causal and window. Query rows may outnumber key rows (a
    multiple of them: see __call__)."""
    batch, q_len = q_BxTxHxDh.shape[:2]
    kv_batch = k_BxSxKxDh.shape[0]
    if batch % kv_batch:
      raise ValueError(
        f"MultiHeadAttention: {batch} query rows cannot share {kv_batch} "
        "key/value rows (the queries' batch must be a multiple)"
      )
    # Each group of query rows sharing a key row attends as that row's queries.
    q_BxTxHxDh = q_BxTxHxDh.reshape((kv_batch, -1) + q_BxTxHxDh.shape[2:])
    unfold = lambda x_BxGTxN: x_BxGTxN.reshape((batch, q_len) + x_BxGTxN.shape[2:])
    dropout_rate = self.cfg.attention_dropout_rate
    dropout = dropout_rate > 0.0 and not deterministic
    # Recording the weights (an 'intermediates' collection made mutable by the
    # caller, see txf.analysis.attention_maps) takes this unfused path, so the
    # recorded weights are the ones the output is computed from; linear
    # attention has no fused path.
    linear = self.cfg.attention == "linear"
    if linear or dropout or self.is_mutable_collection("intermediates"):
      if linear:  # ModelConfig refuses it with a position bias, so attend's is None
        attend.pop("bias")
        weights_BxHxTxS = ops.linear_attention_weights(q_BxTxHxDh, k_BxSxKxDh, **attend)
      else:
        weights_BxHxTxS = ops.attention_weights(q_BxTxHxDh, k_BxSxKxDh, scale=self.scale, **attend)
      self.sow(
        "intermediates", "attention_weights", unfold(weights_BxHxTxS.swapaxes(1, 2)).swapaxes(1, 2)
      )
      weights_BxHxTxS = nn.Dropout(dropout_rate)(weights_BxHxTxS, deterministic=not dropout)
      out_BxTxHxDh = ops.apply_attention_weights(weights_BxHxTxS.astype(self.dtype), v_BxSxKxDh)
    else:
      out_BxTxHxDh = ops.dot_product_attention(
        q_BxTxHxDh,
        k_BxSxKxDh,
        v_BxSxKxDh,
        implementation=self.cfg.attention_impl,
        scale=self.scale,
        **attend,
      )
    return unfold(out_BxTxHxDh)

  def _position_bias(
    self,
    encoding: positions.PositionEncoding,
    q_positions_BxT: Array,
    k_positions_BxS: Array,
    relative_table: Array | None,
  ) -> Array | None:
    """The encoding's additive bias [B|1, H, T, S], or None if it adds none."""
    if encoding.bias is None:
      return None
    if encoding.table == "relative" and relative_table is None:
      raise ValueError(f"MultiHeadAttention: position={self.position!r} needs relative_table")
    causal = self.causal if self.causal_positions is None else self.causal_positions
    return encoding.bias(
      self.cfg, q_positions_BxT, k_positions_BxS, relative_table, bidirectional=not causal
    )

  def _cross_cache(self, kv_BxSxD, key_mask):
    """Cross-attention under use_cache: projects kv and stores the keys, values
    and key mask in the cache, or reads them back when kv_BxSxD is None.

    Returns (k [B, S, K, Dh], v [B, S, K, Dh], key mask [B, 1, 1, S]).
    """
    if kv_BxSxD is None:
      if not self.has_variable("cache", CROSS_CACHE_NAMES[0]):
        raise ValueError(
          "MultiHeadAttention: cross-attention without kv_BxSxD reads its keys/"
          "values from the cache, which holds none (store them by a use_cache "
          "call with the encoder output, see txf.decode.encode_for_decoding)"
        )
      k_BxSxKxDh, v_BxSxKxDh, cached_mask = (
        self.get_variable("cache", name) for name in CROSS_CACHE_NAMES
      )
      return k_BxSxKxDh, v_BxSxKxDh, ops.combine_masks(key_mask, cached_mask)
    _, k_BxSxKxDh, v_BxSxKxDh = self.project(None, kv_BxSxD, kv_BxSxD)
    mask_shape = (k_BxSxKxDh.shape[0], 1, 1, k_BxSxKxDh.shape[1])
    mask_Bx1x1xS = (
      jnp.ones(mask_shape, bool) if key_mask is None else jnp.broadcast_to(key_mask, mask_shape)
    )
    for name, value in zip(CROSS_CACHE_NAMES, (k_BxSxKxDh, v_BxSxKxDh, mask_Bx1x1xS)):
      self.put_variable("cache", name, value)
    return k_BxSxKxDh, v_BxSxKxDh, mask_Bx1x1xS

  def _update_cache(self, k_BxTxKxDh, v_BxTxKxDh, cache_index):
    """Writes the new keys/values at cache_index; returns the whole cache."""
    cached_key = self.variable("cache", "cached_key", jnp.zeros, k_BxTxKxDh.shape, k_BxTxKxDh.dtype)
    cached_value = self.variable(
      "cache", "cached_value", jnp.zeros, v_BxTxKxDh.shape, v_BxTxKxDh.dtype
    )
    if self.is_initializing():
      return k_BxTxKxDh, v_BxTxKxDh
    new_len, cache_len = k_BxTxKxDh.shape[1], cached_key.value.shape[1]
    if new_len > cache_len:
      raise ValueError(
        f"decode: {new_len} new tokens do not fit a KV cache of {cache_len} "
        "slots (init the cache with a longer input, at most model.max_len)"
      )
    # Past the end, dynamic_update_slice would clamp the write onto the last
    # slots without a word. Checked where the index is known (an eager step);
    # the searches, whose index is traced, size their caches themselves.
    if not isinstance(cache_index, jax.core.Tracer) and int(cache_index) + new_len > cache_len:
      raise ValueError(
        f"decode: {new_len} new tokens at position {int(cache_index)} pass the end of a KV "
        f"cache of {cache_len} slots (init the cache with a longer input)"
      )
    # The other indices in cache_index's own integer type: dynamic_update_slice
    # takes one type, and a python 0 is int64 where jax_enable_x64 is set.
    zero = jnp.zeros_like(cache_index)
    start = (zero, cache_index, zero, zero)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, k_BxTxKxDh, start)
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, v_BxTxKxDh, start)
    return cached_key.value, cached_value.value


def _projections(x_BxTxD: Array, kernels: list[Array], biases: list[Array]) -> list[Array]:
  """x [B, T, D] times each kernel [D, N, Dh] (P kernels), plus its bias [N, Dh]
  (`biases`: one each, or none), in x's dtype: [B, T, N, Dh] each.

  On one GPU, more than one position (a train step, an evaluation, a
  prompt's prefill) takes the products apart (`_apart_products`); everywhere
  else (the CPU, a mesh of GPUs, where the three products cost more
  launches than the split they save: decoder_1b on 16 H100s, 1,863 -> 2,007
  kernels for 1% of the bytes) one product of the kernels stacked
  (`_stacked_product`), its biases added, sliced apart.
  """
  if _one_gpu() and x_BxTxD.shape[1] > 1:
    return list(_apart_products(x_BxTxD, tuple(kernels), tuple(biases)))
  y_BxTxPxNxDh = _stacked_product(x_BxTxD, kernels)
  if biases:
    y_BxTxPxNxDh = y_BxTxPxNxDh + jnp.stack(biases).astype(y_BxTxPxNxDh.dtype)
  return [y_BxTxPxNxDh[:, :, p] for p in range(len(kernels))]


@jax.custom_vjp
def _apart_products(
  x_BxTxD: Array, kernels: tuple[Array, ...], biases: tuple[Array, ...]
) -> tuple[Array, ...]:
  """`_projections` as one product per kernel forward, one of the kernels
  stacked backward: x [B, T, D] in the compute dtype, the kernels [D, N, Dh]
  in it, the biases [N, Dh] as stored (float32) or none.

  Forward, each product writes its own [B, T, N, Dh], its bias added to the
  float32 product in the GEMM (in x's dtype, as the stacked product adds it
  after rounding, XLA leaves the addition a kernel of its own). The stacked
  product writes [B, T, P, N, Dh], which a kernel of its own then read
  whole to add the biases and write q, k and v apart for cuDNN's attention:
  gpt2_small, deviceless H100, 302 MB a layer, 3.6 of the step's 49.4 GB
  outside GEMMs. Backward, the cotangents stacked make one product for x's
  gradient and one for the kernels' (as the stacked product's own
  backward): apart, x's gradient was three products and a sum of them.
  """
  return _apart_forward(x_BxTxD, kernels, biases)[0]


def _kernel_stack(kernels: tuple[Array, ...]) -> Array:
  """The kernels [D, N, Dh] stacked, [P, D, N, Dh]: one array, which both
  directions read, behind a barrier (XLA otherwise cast each kernel apart
  for the forward's products and all of them again for the backward's)."""
  return jax.lax.optimization_barrier(jnp.stack(kernels))


def _apart_forward(x_BxTxD, kernels, biases):
  kernels_PxDxNxDh = _kernel_stack(kernels)
  y_P = [
    jnp.einsum("btd,dnh->btnh", x_BxTxD, kernel_DxNxDh, preferred_element_type=jnp.float32)
    for kernel_DxNxDh in kernels_PxDxNxDh
  ]
  if biases:
    y_P = [y_BxTxNxDh + bias for y_BxTxNxDh, bias in zip(y_P, biases)]
  y_P = tuple(y_BxTxNxDh.astype(x_BxTxD.dtype) for y_BxTxNxDh in y_P)
  return y_P, (x_BxTxD, kernels_PxDxNxDh, biases)


def _apart_backward(residuals, dy_P):
  x_BxTxD, kernels_PxDxNxDh, biases = residuals
  count = len(kernels_PxDxNxDh)
  # Stacked as the stacked product's slicing transposes (pads summed): XLA
  # then sums the biases' gradients in the kernel that stacks them, where
  # a concatenation left that sum a kernel of its own.
  shape = (*dy_P[0].shape[:2], count, *dy_P[0].shape[2:])
  unslice = jax.linear_transpose(
    lambda y: tuple(y[:, :, p] for p in range(count)), jax.ShapeDtypeStruct(shape, dy_P[0].dtype)
  )
  (dy_BxTxPxNxDh,) = unslice(tuple(dy_P))
  dx_BxTxD = jnp.einsum("btpnh,pdnh->btd", dy_BxTxPxNxDh, kernels_PxDxNxDh)
  dkernels_PxDxNxDh = jnp.einsum("btd,btpnh->pdnh", x_BxTxD, dy_BxTxPxNxDh)
  dkernels = tuple(dkernels_PxDxNxDh)
  if not biases:
    return dx_BxTxD, dkernels, ()
  # Summed in the cotangents' dtype, as the stacked product's backward sums them.
  zero = jnp.zeros((), dy_BxTxPxNxDh.dtype)
  dbias_PxNxDh = jax.lax.reduce(dy_BxTxPxNxDh, zero, jax.lax.add, (0, 1))
  return dx_BxTxD, dkernels, tuple(dbias_PxNxDh[p].astype(b.dtype) for p, b in enumerate(biases))


_apart_products.defvjp(_apart_forward, _apart_backward)


def _one_gpu() -> bool:
  """Whether the program is traced for one GPU (its mesh of one device)."""
  return platform.backend() == "gpu" and jax.sharding.get_abstract_mesh().size <= 1


def _stacked_product(x_BxTxD: Array, kernels: list[Array]) -> Array:
  """x [B, T, D] times each kernel [D, N, Dh], as one product: [B, T, P, N, Dh]
  (P kernels).

  A decoding step on one GPU (one position, the program on one device)
  multiplies by the kernels concatenated along their output features: XLA
  fuses the concatenation into the product, which reads the kernels where
  they are, and at batch 1 the norm before it too. The kernels stacked (the
  einsum below) left that norm a kernel of its own at batch 1 and, at batch
  32, copied the stack every token (gpt2_small, deviceless H100: 97 -> 85
  kernels a token at batch 1, 141 -> 129 at batch 32). The CPU's program,
  and a mesh's, is the stacked one everywhere.
  """
  if x_BxTxD.shape[1] == 1 and _one_gpu():
    d_model, heads, head_dim = kernels[0].shape
    kernel_DxF = jnp.concatenate([k.reshape(d_model, heads * head_dim) for k in kernels], axis=1)
    y_BxTxF = jnp.dot(x_BxTxD, kernel_DxF)
    return y_BxTxF.reshape(y_BxTxF.shape[:2] + (len(kernels), heads, head_dim))
  return jnp.einsum("btd,dpnh->btpnh", x_BxTxD, jnp.stack(kernels, axis=1))


class ProjectionWeights(nn.Module):
  """The parameters of one of attention's input projections, returned, not
  applied (MultiHeadAttention.project multiplies several at once).

  Attributes:
    shape: the kernel's (D, N, Dh); the bias is (N, Dh).
    axes: the kernel's logical axes, (input axes, output axes).
    use_bias: whether there is a bias.
  """

  shape: tuple[int, int, int]
  axes: tuple[tuple[str, ...], tuple[str, ...]]
  use_bias: bool

  @nn.compact
  def __call__(self) -> tuple[Array, Array | None]:
    """(kernel [D, N, Dh], bias [N, Dh] or None), float32 as stored."""
    d_model, heads, head_dim = self.shape
    inits = projection_inits(*self.axes, self.shape)
    # Asked flat, as nn.DenseGeneral asks: Glorot's fans are the [D, N * Dh]
    # matrix's, and the same key gives the same values as before.
    kernel = self.param("kernel", inits["kernel_init"], (d_model, heads * head_dim))
    bias = self.param("bias", inits["bias_init"], (heads * head_dim,)) if self.use_bias else None
    return kernel, bias
