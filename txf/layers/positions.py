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
(`RelativePositionTable`), passed to `bias` as `table`; an encoding owning
one declares the setting t5_num_buckets (its settings a `T5BiasSettings`).

An encoding's own settings are a small dataclass registered with it
(`RopeSettings` of rope and rope_ntk, `T5BiasSettings` of t5_bias), whose
values the config's `model.options` holds. The callables receive the
model's config (`cfg`, a ModelConfig) first and read from it: `cfg.d_model`,
`cfg.num_heads`, and the chosen encoding's settings
(`cfg.settings("position").rope_base`). `bias` also receives
`bidirectional`: the layer is not causal (T5 buckets split by sign). The
math itself lives in `txf.ops.positional`. rope_ntk reads rope_scale as its
NTK factor (the base is scaled, positions are not).

A new encoding is one function and one `txf.register.position` call, in txf
or in a file of one's own (docs/extending.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from txf import checks
from txf.choices import Registry
from txf.fields import documented, section
from txf.ops import positional

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
    at_least: the smallest that dimension may be (rope_ntk's scaling
      divides by head_dim - 2: 4).
  """

  contributes: str
  # The table argument is an Array when `table` is set and None when it is
  # not, so each function declares one or the other: Any here.
  embed: Callable[[Any, Array, Any], Array] | None = None
  rotate: Callable[[Any, Array, Array], Array] | None = None
  bias: Callable[..., Array] | None = None  # (cfg, q, k, table, *, bidirectional)
  table: str | None = None
  even: str | None = None
  at_least: int = 0

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


@section()
class RopeSettings:
  """The settings of rope and rope_ntk (model.options)."""

  rope_base: float = documented("wavelength base of the rotation frequencies", default=10000.0)
  rope_scale: float = documented(
    "> 1: context extension (rope: positions / rope_scale; rope_ntk: the NTK factor)", default=1.0
  )

  def check(self) -> None:
    checks.finite_at_least(self.rope_base, "model.options.rope_base", 0.0, open_=True)
    checks.finite_at_least(self.rope_scale, "model.options.rope_scale", 1.0)  # > 1: interpolation


@section()
class T5BiasSettings:
  """The settings of t5_bias (model.options): its relative table's size and bucketing."""

  t5_num_buckets: int = documented("relative-position buckets", default=32)
  t5_max_distance: int = documented("distances from here on share the last bucket", default=128)

  def check(self) -> None:
    """What txf.ops.positional.relative_position_bucket needs of a
    bidirectional stack (an encoder's; a decoder's prefix): an even count
    (half for each direction), at least two exact buckets per direction, and
    a max_distance past its num_buckets / 4 exact buckets. Found here, naming
    the field; they failed at the first call, naming neither."""
    checks.int_at_least(self.t5_num_buckets, "model.options.t5_num_buckets", 4)
    if self.t5_num_buckets % 2:
      raise ValueError(
        f"model.options.t5_num_buckets: must be even (half for keys on each side), "
        f"got {self.t5_num_buckets}"
      )
    checks.positive_int(self.t5_max_distance, "model.options.t5_max_distance")
    self._check_past_exact(self.t5_num_buckets // 4, "a bidirectional")

  def check_causal(self) -> None:
    """What a causal stack (a decoder's) needs beyond check(): its one side
    holds every bucket, so a max_distance past num_buckets / 2 exact ones
    (ModelConfig asks it of the families that generate: it takes a family
    registered without generative=True for one without a causal stack)."""
    self._check_past_exact(self.t5_num_buckets // 2, "a causal")

  def _check_past_exact(self, exact: int, stack: str) -> None:
    if self.t5_max_distance <= exact:
      raise ValueError(
        f"model.options.t5_max_distance: must exceed the {exact} exact buckets of {stack} "
        f"stack with t5_num_buckets={self.t5_num_buckets}, got {self.t5_max_distance}"
      )


def _learned_embedding(cfg, positions_BxT: Array, table_LxD: Array) -> Array:
  return jnp.take(table_LxD, positions_BxT, axis=0)


def _sinusoidal_embedding(cfg, positions_BxT: Array, table: None) -> Array:
  return positional.sinusoidal_embedding(positions_BxT, cfg.d_model)


def _rope(cfg, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  rope: RopeSettings = cfg.settings("position")
  return positional.apply_rope(
    x_BxTxHxDh, positions_BxT, base=rope.rope_base, scale=rope.rope_scale
  )


def _ntk_rope(cfg, x_BxTxHxDh: Array, positions_BxT: Array) -> Array:
  rope: RopeSettings = cfg.settings("position")
  return positional.apply_ntk_rope(
    x_BxTxHxDh, positions_BxT, base=rope.rope_base, scale=rope.rope_scale
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
    max_distance=cfg.settings("position").t5_max_distance,
  )


ENCODINGS: Registry[PositionEncoding] = Registry("model.position")
for _name, _entry, _settings in (
  ("sinusoidal", PositionEncoding("embedding", embed=_sinusoidal_embedding, even="d_model"), None),
  ("learned", PositionEncoding("embedding", embed=_learned_embedding, table="absolute"), None),
  ("rope", PositionEncoding("rotation", rotate=_rope, even="head_dim"), RopeSettings),
  (
    "rope_ntk",
    PositionEncoding("rotation", rotate=_ntk_rope, even="head_dim", at_least=4),
    RopeSettings,
  ),
  ("alibi", PositionEncoding("bias", bias=_alibi), None),
  ("t5_bias", PositionEncoding("bias", bias=_t5_bias, table="relative"), T5BiasSettings),
  ("none", PositionEncoding("nothing"), None),
):
  ENCODINGS.register(_name, _entry, settings=_settings)


def encoding(name: str) -> PositionEncoding:
  """The entry for `model.position` = name; ValueError naming the choices."""
  return ENCODINGS[name]
