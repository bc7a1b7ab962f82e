"""Learning-rate schedule and AdamW optimizer built from `config.train`.

Fields read (all under `train`):
  learning_rate    peak learning rate, reached at the end of warmup
  warmup_steps     linear warmup from 0 to the peak over this many steps (at
                   most `steps`: a longer warmup is clamped to it, see fitted_warmup)
  decay            shape after warmup: 'cosine' | 'linear' | 'constant' | 'rsqrt',
                   or one registered with txf.register.decay (DECAYS)
  steps            total training steps (the decay ends here)
  end_lr_fraction  final lr / peak, for 'cosine' and 'linear'
  weight_decay     decoupled weight decay, applied to matrices only
  b1, b2, eps      Adam moment decay rates and denominator epsilon
  grad_clip_norm   global-norm gradient clipping threshold; 0 turns it off

Gradient accumulation is not handled here: the train step averages
micro-batch gradients before calling the optimizer.
"""

from __future__ import annotations

import dataclasses
import numbers
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import optax

from txf import checks
from txf.choices import Registry, can_call

if TYPE_CHECKING:  # run_config's TrainConfig builds its optimizer here
  from txf.runconfig.run_config import TrainConfig

_MISSING = object()


def _field(train_config: TrainConfig, name: str) -> Any:
  """Returns `train_config.<name>`, or a ValueError naming `train.<name>`."""
  value = getattr(train_config, name, _MISSING)
  if value is _MISSING:
    raise ValueError(f"train.{name} is missing from the config.")
  return value


def _number(train_config: TrainConfig, name: str) -> Any:
  """Reads a real field; bools are rejected (they are ints in Python)."""
  value = _field(train_config, name)
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"train.{name}: must be a number, got {value!r}")
  return value


def _check(condition: bool, name: str, requirement: str, value: Any) -> None:
  if not condition:
    raise ValueError(f"train.{name}: must be {requirement}, got {value!r}")


def fitted_warmup(warmup_steps: int, steps: int) -> int:
  """The warmup a run of `steps` steps uses: `warmup_steps`, clamped to
  `steps`. A warmup longer than the run (a shipped config's 60 steps with
  --config.train.steps=30) warms up over the whole run, so the learning rate
  rises for all of it and never decays; txf.runconfig.run_config.parse
  says so in one line (RunConfig.notes)."""
  return min(warmup_steps, steps)


@dataclasses.dataclass(frozen=True)
class DecayPhase:
  """The learning rate after warmup, as a train.decay entry is asked to shape it.

  Attributes:
    peak: P, train.learning_rate: the rate warmup ends at.
    end_fraction: train.end_lr_fraction: the final rate over P, for a
      decay that ends somewhere.
    warmup: W, the steps of warmup (fitted_warmup; 0: none).
    steps: D, the steps from the end of warmup to train.steps (at least 1).
  """

  peak: float
  end_fraction: float
  warmup: int
  steps: int


# The decays by train.decay: txf's (below) and those user code registers
# (txf.register.decay). An entry is fn(DecayPhase) -> the schedule after
# warmup, a jax function of s = t - W (s >= 0; join_schedules also evaluates
# it, and discards it, for s < 0; make_schedule refuses anything else); it
# raises ValueError naming the train field whose value it cannot take.
DECAYS: Registry[Callable[[DecayPhase], optax.Schedule]] = Registry("train.decay")


@DECAYS.decorator("cosine")
def cosine(phase: DecayPhase) -> optax.Schedule:
  """P down to end_fraction * P along half a cosine over D steps."""
  return optax.cosine_decay_schedule(phase.peak, phase.steps, alpha=phase.end_fraction)


@DECAYS.decorator("linear")
def linear(phase: DecayPhase) -> optax.Schedule:
  """P down to end_fraction * P in a straight line over D steps."""
  return optax.linear_schedule(phase.peak, phase.peak * phase.end_fraction, phase.steps)


@DECAYS.decorator("constant")
def constant(phase: DecayPhase) -> optax.Schedule:
  """P throughout."""
  return optax.constant_schedule(phase.peak)


@DECAYS.decorator("rsqrt")
def rsqrt(phase: DecayPhase) -> optax.Schedule:
  """P * sqrt(W / t) at step t = s + W: the inverse square root of the step,
  continuous with warmup (so it needs one); ignores end_fraction."""
  _check(phase.warmup > 0, "warmup_steps", "positive when train.decay is 'rsqrt'", phase.warmup)

  def after_warmup(s):
    return phase.peak * jax.lax.rsqrt(jnp.maximum(s, 0) / phase.warmup + 1.0)

  return after_warmup


def _check_schedule(name: str, after_warmup: Any) -> None:
  """Refuses what decay `name` gave unless it is a schedule: a function of
  one argument that traces, at an int32 scalar step s (what optax calls it
  with), to a float scalar. A registered decay's schedule is otherwise
  first called in the compiled step, after the run directory is written (a
  Python branch on s, a rate of another shape: a traceback mid-run).

  Raises:
    ValueError: naming train.decay 'name' and what is wrong, in one line.
  """
  if not can_call(after_warmup, 0):
    raise ValueError(
      f"train.decay {name!r}: gave {reprlib.repr(after_warmup)}, not a schedule "
      "(a function of the step s after warmup)"
    )
  try:
    rate = jax.eval_shape(after_warmup, jax.ShapeDtypeStruct((), jnp.int32))
  except Exception as error:  # whatever the user's function raises, traced
    first_line = next(iter(str(error).splitlines()), "")
    raise ValueError(
      f"train.decay {name!r}: its schedule does not trace at a step s (an int32 scalar, "
      f"a jax value: no Python branch on it): {type(error).__name__}: {first_line}"
    ) from None
  if not (
    isinstance(rate, jax.ShapeDtypeStruct)
    and rate.shape == ()
    and jnp.issubdtype(rate.dtype, jnp.floating)
  ):
    got = f"{rate.dtype}{list(rate.shape)}" if hasattr(rate, "shape") else reprlib.repr(rate)
    raise ValueError(
      f"train.decay {name!r}: its schedule gave {got} at a step, not a float scalar "
      "(the learning rate)"
    )


def make_schedule(train_config: TrainConfig) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then the `decay` shape (DECAYS).

  With t the step and W = fitted_warmup(warmup_steps, steps), D = steps - W,
  P = learning_rate, E = end_lr_fraction * P:
    t < W:     P * t / W   (so the very first update uses lr 0, as in optax)
    cosine:    E + (P - E) * (1 + cos(pi * min(t - W, D) / D)) / 2
    linear:    P + (E - P) * min(t - W, D) / D
    constant:  P
    rsqrt:     P * sqrt(W / t)   (needs W > 0; ignores end_lr_fraction)
  Steps past `steps` stay at the final value (cosine, linear, constant;
  rsqrt keeps decaying, as its formula says). When W == steps the decay
  phase is empty and D is taken as 1.

  Raises:
    ValueError: naming the offending `train.<field>`, or `train.decay
      'name'` for a decay that gives no schedule.
  """
  peak = _number(train_config, "learning_rate")
  warmup = checks.int_at_least(_field(train_config, "warmup_steps"), "train.warmup_steps", 0)
  total = checks.positive_int(_field(train_config, "steps"), "train.steps")
  end_fraction = _number(train_config, "end_lr_fraction")
  _check(0 < peak < float("inf"), "learning_rate", "positive and finite", peak)
  _check(0 <= end_fraction <= 1, "end_lr_fraction", "in [0, 1]", end_fraction)
  name = _field(train_config, "decay")
  decay = DECAYS[name]

  warmup = fitted_warmup(warmup, total)
  after_warmup = decay(DecayPhase(peak, end_fraction, warmup, max(total - warmup, 1)))
  if not DECAYS.provenance(name)["builtin"]:  # txf's own are schedules by construction
    _check_schedule(name, after_warmup)
  if warmup == 0:
    return after_warmup
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after_warmup], [warmup])


# Flax's names for a layer's bias and a norm's scale: vectors, whatever their
# rank (attention's per-head bias is [H, Dh]; a scanned stack's are [L, ...]).
NOT_DECAYED = ("bias", "scale")


def decay_mask(params: Any) -> Any:
  """True for leaves that get weight decay: matrices, embeddings and
  position tables (ndim >= 2, not named in NOT_DECAYED).

  Biases and norm scales are left alone: decaying them only pulls the model
  towards a degenerate solution without regularising it. Their rank does not
  say so (ndim >= 2 decayed the norms of a scanned stack and attention's
  biases): their names do.
  """

  def decays(path: tuple[Any, ...], leaf: Any) -> bool:
    name = getattr(path[-1], "key", None) if path else None
    return jnp.ndim(leaf) >= 2 and name not in NOT_DECAYED

  return jax.tree_util.tree_map_with_path(decays, params)


# Leaves smaller than this many elements are concatenated by
# `global_norm(concatenated=True)`: gpt2_small's vectors (768 to 3,072) are,
# its matrices (589,824 and up) are not.
CONCATENATED_BELOW = 65536


def global_norm(tree: Any, *, concatenated: bool = False) -> jax.Array:
  """sqrt of the sum of squares of every element of `tree` (optax.global_norm's
  value), in float32.

  Each leaf is reduced on its own, which works wherever the leaves live.
  concatenated: the small leaves (under `CONCATENATED_BELOW` elements:
  biases, norm scales) are reduced concatenated, one reduction for all of
  them where each would be a kernel of its own; the large ones are still
  reduced on their own, since concatenating them would copy the gradient
  (gpt2_small: 0.7 GB more traffic a step). Only for leaves that are whole
  on each device. Leaves sharded over devices (FSDP, tensor parallelism)
  must not be: their concatenation would gather every leaf whole onto each
  device (5 GB more per chip for a 1.3B model's float32 gradient).
  """
  leaves = [leaf.astype(jnp.float32) for leaf in jax.tree.leaves(tree)]
  small = [concatenated and leaf.size < CONCATENATED_BELOW for leaf in leaves]
  squares = [jnp.sum(leaf * leaf) for leaf, is_small in zip(leaves, small) if not is_small]
  if any(small):
    flat = jnp.concatenate([jnp.ravel(leaf) for leaf, is_small in zip(leaves, small) if is_small])
    squares.append(jnp.sum(flat * flat))
  return jnp.sqrt(sum(squares))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformationExtraArgs:
  """optax.clip_by_global_norm that takes the gradients' global norm from
  its caller (`update(..., grad_norm=norm)`) where the caller has it: the
  train step computes it once, for its non-finite check, instead of every
  leaf being reduced again. The same state (empty) and result as optax's."""

  def init(params: Any) -> optax.EmptyState:
    del params
    return optax.EmptyState()

  def update(updates, state, params=None, *, grad_norm=None, **extra_args):
    del params, extra_args
    norm = global_norm(updates) if grad_norm is None else grad_norm
    clipped = jax.tree.map(
      lambda t: jnp.where(norm < max_norm, t, (t / norm.astype(t.dtype)) * max_norm), updates
    )
    return clipped, state

  return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(train_config: TrainConfig) -> optax.GradientTransformationExtraArgs:
  """Global-norm clipping (if `grad_clip_norm` > 0), then AdamW.

  Weight decay is decoupled from the Adam statistics and scaled by the
  scheduled learning rate (as in `optax.adamw` and PyTorch's AdamW):
  update = -lr_t * (adam_direction + weight_decay * param) for masked params.
  `update` takes the gradients' global norm as `grad_norm=` where known
  (`clip_by_global_norm`).

  Raises:
    ValueError: naming the offending `train.<field>`.
  """
  schedule = make_schedule(train_config)
  weight_decay = _number(train_config, "weight_decay")
  b1 = checks.fraction(_field(train_config, "b1"), "train.b1")
  b2 = checks.fraction(_field(train_config, "b2"), "train.b2")
  eps = _number(train_config, "eps")
  clip = _number(train_config, "grad_clip_norm")
  _check(weight_decay >= 0, "weight_decay", "non-negative", weight_decay)
  _check(eps > 0, "eps", "positive", eps)
  _check(clip >= 0, "grad_clip_norm", "non-negative (0 turns clipping off)", clip)

  adamw = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
  if clip == 0:
    return optax.with_extra_args_support(adamw)
  return optax.chain(clip_by_global_norm(clip), adamw)
