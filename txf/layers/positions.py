"""The position-encoding registry: what each `model.position` contributes.

An encoding contributes one of four things, and the layers ask its entry
instead of branching on its name:

  embedding  added to the token embeddings (Embedder): `embed`
  rotation   of queries and keys (MultiHeadAttention): `rotate`
  bias       added to the attention scores (MultiHeadAttention): `bias`
  nothing    (NoPE: causal masking alone carries order)

`table` names the parameters it owns: 'absolute' is a learned [max_len, D]
`position_table` in the Embedder (sequences longer than max_len are refused);
'relative' is T5's learned [t5_num_buckets, H] table, one per stack
(`RelativePositionTable`), passed to `bias` as `table`.

The callables read their settings from the calling layer (`layer`), whose
attributes repeat the ModelConfig fields: `d_model` (Embedder), `num_heads`,
`rope_base`, `rope_scale`, `t5_max_distance`, `bidirectional_bias`
(MultiHeadAttention). The math itself lives in `txf.ops.positional`. rope_ntk reads rope_scale
as its NTK factor (the base is scaled, positions are not).

Adding an encoding is one function there, one entry in ENCODINGS and one
config file in configs/; docs/positions.md walks through an example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from txf.ops import positional

Array = jax.Array
CONTRIBUTIONS = ("embedding", "rotation", "bias", "nothing")
TABLES = ("absolute", "relative")


@dataclasses.dataclass(frozen=True)
class PositionEncoding:
  """One `model.position` choice.

  Attributes:
    contributes: one of CONTRIBUTIONS; exactly the matching callable is set.
    embed: (layer, positions [B|1, T], table [max_len, D] or None) -> [B|1, T, D].
    rotate: (layer, x [B, T, H, Dh], positions [B|1, T]) -> rotated x.
    bias: (layer, q positions [B|1, T], k positions [B|1, S], table [buckets, H] or None)
      -> float32 additive bias [B|1, H, T, S].
    table: None, or one of TABLES: the learned parameters it owns.
    even: None, or the ModelConfig dimension ('d_model' or 'head_dim') that must be even.
  """

  contributes: str
  # The table argument is an Array when `table` is set and None when it is
  # not, so each function declares one or the other: Any here.
  embed: Callable[[Any, Array, Any], Array] | None = None
  rotate: Callable[[Any, Array, Array], Array] | None = None
  bias: Callable[[Any, Array, Array, Any], Array] | None = None
  table: str | None = None
  even: str | None = None

  def __post_init__(self):
    if self.contributes not in CONTRIBUTIONS:
      raise ValueError(f"contributes: {self.contributes!r} not in {CONTRIBUTIONS}")
    given = {name for name in ("embed", "rotate", "bias") if getattr(self, name) is not None}
    expected = {"embedding": {"embed"}, "rotation": {"rotate"}, "bias": {"bias"}, "nothing": set()}[
      self.contributes
    ]
    if given != expected:
      raise ValueError(
        f"contributes={self.contributes!r} takes {sorted(expected) or 'none'} "
        f"of embed/rotate/bias, got {sorted(given) or 'none'}"
      )
    if self.table not in (None,) + TABLES:
      raise ValueError(f"table: {self.table!r} not in {TABLES}")


def _learned_embedding(layer, positions_BxT: Array, table_LxD: Array) -> Array:
  return jnp.take(table_LxD, positions_BxT, axis=0)


def _sinusoidal_embedding(layer, positions_BxT: Array, table: None) -> Array:
  return positional.sinusoidal_embedding(positions_BxT, layer.d_model)


def _rope(layer, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  return positional.apply_rope(
    x_BxTxHxDh, positions_BxT, base=layer.rope_base, scale=layer.rope_scale
  )


def _ntk_rope(layer, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  return positional.apply_ntk_rope(
    x_BxTxHxDh, positions_BxT, base=layer.rope_base, scale=layer.rope_scale
  )


def _alibi(layer, q_positions: Array, k_positions: Array, table: None) -> Array:
  return positional.alibi_bias(layer.num_heads, q_positions, k_positions)


def _t5_bias(layer, q_positions: Array, k_positions: Array, table_NxH: Array) -> Array:
  return positional.relative_position_bias(
    table_NxH,
    q_positions,
    k_positions,
    bidirectional=layer.bidirectional_bias,
    max_distance=layer.t5_max_distance,
  )


ENCODINGS: dict[str, PositionEncoding] = {
  "sinusoidal": PositionEncoding("embedding", embed=_sinusoidal_embedding, even="d_model"),
  "learned": PositionEncoding("embedding", embed=_learned_embedding, table="absolute"),
  "rope": PositionEncoding("rotation", rotate=_rope, even="head_dim"),
  "rope_ntk": PositionEncoding("rotation", rotate=_ntk_rope, even="head_dim"),
  "alibi": PositionEncoding("bias", bias=_alibi),
  "t5_bias": PositionEncoding("bias", bias=_t5_bias, table="relative"),
  "none": PositionEncoding("nothing"),
}


def encoding(name: str) -> PositionEncoding:
  """The entry for `model.position` = name; ValueError naming the choices."""
  if name not in ENCODINGS:
    raise ValueError(
      f"model.position: {name!r} is not a registered encoding (choose from {tuple(ENCODINGS)})"
    )
  return ENCODINGS[name]
