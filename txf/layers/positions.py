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

The callables receive the model's config (`cfg`, a ModelConfig) first and
read their settings from it: `cfg.d_model`, `cfg.num_heads`,
`cfg.rope_base`, `cfg.rope_scale`, `cfg.t5_max_distance`, or an option
the encoding was registered with (`cfg.option("name")`). `bias` also
receives `bidirectional`: the layer is not causal (T5 buckets split by sign).
The math itself lives in `txf.ops.positional`. rope_ntk reads rope_scale as
its NTK factor (the base is scaled, positions are not).

A new encoding is one function and one `txf.register.position` call, in txf
or in a file of one's own (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from txf.ops import positional
from txf.registry import Registry

Array = jax.Array
CONTRIBUTIONS = ("embedding", "rotation", "bias", "nothing")
TABLES = ("absolute", "relative")


@dataclasses.dataclass(frozen=True)
class PositionEncoding:
  """One `model.position` choice.

  Attributes:
    contributes: one of CONTRIBUTIONS; exactly the matching callable is set.
    embed: (cfg, positions [B|1, T], table [max_len, D] or None) -> [B|1, T, D].
    rotate: (cfg, x [B, T, H, Dh], positions [B|1, T]) -> rotated x.
    bias: (cfg, q positions [B|1, T], k positions [B|1, S], table [buckets, H]
      or None, *, bidirectional) -> float32 additive bias [B|1, H, T, S].
    table: None, or one of TABLES: the learned parameters it owns.
    even: None, or the ModelConfig dimension ('d_model' or 'head_dim') that must be even.
  """

  contributes: str
  # The table argument is an Array when `table` is set and None when it is
  # not, so each function declares one or the other: Any here.
  embed: Callable[[Any, Array, Any], Array] | None = None
  rotate: Callable[[Any, Array, Array], Array] | None = None
  bias: Callable[..., Array] | None = None  # (cfg, q, k, table, *, bidirectional)
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


def _learned_embedding(cfg, positions_BxT: Array, table_LxD: Array) -> Array:
  return jnp.take(table_LxD, positions_BxT, axis=0)


def _sinusoidal_embedding(cfg, positions_BxT: Array, table: None) -> Array:
  return positional.sinusoidal_embedding(positions_BxT, cfg.d_model)


def _rope(cfg, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  return positional.apply_rope(x_BxTxHxDh, positions_BxT, base=cfg.rope_base, scale=cfg.rope_scale)


def _ntk_rope(cfg, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  return positional.apply_ntk_rope(
    x_BxTxHxDh, positions_BxT, base=cfg.rope_base, scale=cfg.rope_scale
  )


def _alibi(cfg, q_positions: Array, k_positions: Array, table: None, *, bidirectional) -> Array:
  return positional.alibi_bias(cfg.num_heads, q_positions, k_positions)


def _t5_bias(
  cfg, q_positions: Array, k_positions: Array, table_NxH: Array, *, bidirectional
) -> Array:
  return positional.relative_position_bias(
    table_NxH,
    q_positions,
    k_positions,
    bidirectional=bidirectional,
    max_distance=cfg.t5_max_distance,
  )


ENCODINGS: Registry[PositionEncoding] = Registry("model.position")
for _name, _entry in (
  ("sinusoidal", PositionEncoding("embedding", embed=_sinusoidal_embedding, even="d_model")),
  ("learned", PositionEncoding("embedding", embed=_learned_embedding, table="absolute")),
  ("rope", PositionEncoding("rotation", rotate=_rope, even="head_dim")),
  ("rope_ntk", PositionEncoding("rotation", rotate=_ntk_rope, even="head_dim")),
  ("alibi", PositionEncoding("bias", bias=_alibi)),
  ("t5_bias", PositionEncoding("bias", bias=_t5_bias, table="relative")),
  ("none", PositionEncoding("nothing")),
):
  ENCODINGS.register(_name, _entry)


def encoding(name: str) -> PositionEncoding:
  """The entry for `model.position` = name; ValueError naming the choices."""
  return ENCODINGS[name]
