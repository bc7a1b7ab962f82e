"""A decoding loop's weights cast to the compute dtype once, before the loop.

XLA converts a while loop's float32 weights to the compute dtype inside the
loop, at every iteration: its loop-invariant code motion does not hoist a
conversion (too cheap to be worth it alone), so a decoding step of a model
trained with float32 parameters and bfloat16 compute reads every weight in
float32 and writes a bfloat16 copy of the tied output table, per generated
token (gpt2_small's evaluation sampler for an H100, deviceless: 653 MB a
token against 251 MB with the weights cast once; docs/benchmarks.md,
"Trained weights cast once, before the loop").

`cast_once` finds, in the jaxpr of one step, the parameters whose every use
is a conversion to the compute dtype (after operations that only move
elements, which commute with it: a gather of embedding rows, a transpose, a
reshape, ...), and converts those, once: inside the loop the step then
converts bfloat16 to bfloat16, which XLA drops. The same values reach the
same operations, so the step's results are bit for bit the same. A
parameter read in its own dtype anywhere (a norm's scale, a bias a GPU
kernel rounds itself) is left as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

__all__ = ["cast_once"]

# Operations that move or select elements of their first operand (every
# operand of a concatenation or a stack) without changing them: a conversion
# after them equals one before.
_MOVES = frozenset(
  {
    "broadcast_in_dim",
    "concatenate",
    "copy",
    "copy_p",
    "dynamic_slice",
    "expand_dims",
    "gather",
    "reshape",
    "rev",
    "slice",
    "squeeze",
    "stack",
    "transpose",
  }
)


def cast_once(step: Callable[..., Any], params: Any, *calls: tuple[Any, ...], dtype: Any) -> Any:
  """`params` with each floating leaf that `step(params, *args)` reads, and
  only converted to `dtype`, in every one of `calls` (each an `args`) cast
  to it (the others as they are), so that `step(cast params, *args)` equals
  `step(params, *args)` bit for bit for each.

  Args:
    step: the loop's body as a function of the parameters first.
    params: a pytree of arrays (tracers, inside a jitted function).
    *calls: the other arguments of each kind of call the loop makes, as
      arrays or jax.ShapeDtypeStructs (`step` is traced, not run): a
      parameter a step of one shape reads in its own dtype is kept.
    dtype: the compute dtype.
  """
  if not calls:
    raise ValueError("cast_once needs the arguments of at least one call of the step")
  dtype = np.dtype(dtype)
  leaves, treedef = jax.tree.flatten(params)
  jaxprs = [jax.make_jaxpr(step)(params, *args).jaxpr for args in calls]
  casts = [
    jnp.issubdtype(leaf.dtype, jnp.floating)
    and np.dtype(leaf.dtype) != dtype
    and all(_only_converted(jaxpr, jaxpr.invars[i], dtype) for jaxpr in jaxprs)
    for i, leaf in enumerate(leaves)
  ]
  return jax.tree.unflatten(
    treedef,
    [leaf.astype(dtype) if cast else leaf for leaf, cast in zip(leaves, casts, strict=True)],
  )


def _only_converted(jaxpr: jex.Jaxpr, var: Any, dtype: np.dtype) -> bool:
  """Whether `jaxpr` reads `var`, and only converted to `dtype` (a leaf no
  step reads is left as it is)."""
  return _used(jaxpr, var) and _escapes(jaxpr, var, dtype) == set()


def _used(jaxpr: jex.Jaxpr, var: Any) -> bool:
  """Whether an equation or an output of `jaxpr` reads `var`."""
  return any(out is var for out in jaxpr.outvars) or any(
    operand is var for eqn in jaxpr.eqns for operand in eqn.invars
  )


def _escapes(jaxpr: jex.Jaxpr, var: Any, dtype: np.dtype) -> set[int] | None:
  """None if a use of `var` in `jaxpr` reads it in its own dtype (arithmetic,
  a GPU kernel's call, a loop's carry, ...); otherwise the positions of the
  jaxpr's outputs it reaches unconverted (moved, perhaps), every other use
  converting it to `dtype`: directly, after element moves, or inside a
  jaxpr the use calls."""
  escaped = {k for k, out in enumerate(jaxpr.outvars) if out is var}
  for eqn in jaxpr.eqns:
    positions = [i for i, operand in enumerate(eqn.invars) if operand is var]
    if not positions:
      continue
    name = eqn.primitive.name
    if name == "convert_element_type":
      if np.dtype(eqn.params["new_dtype"]) != dtype:
        return None
      continue
    if name in _MOVES:
      moved = name in ("concatenate", "stack") or positions == [0]  # the others: indices
      reached = _escapes(jaxpr, eqn.outvars[0], dtype) if moved else None
    else:
      reached = _through_call(jaxpr, eqn, positions, dtype)
    if reached is None:
      return None
    escaped |= reached
  return escaped


# Calls whose jaxpr takes the call's operands and gives its results in order.
_CALLS = frozenset({"closed_call", "custom_jvp_call", "custom_vjp_call", "jit", "pjit", "remat2"})


def _through_call(
  jaxpr: jex.Jaxpr, eqn: Any, positions: list[int], dtype: np.dtype
) -> set[int] | None:
  """`_escapes` of the operands at `positions` of a call or a branch, in
  each jaxpr it runs, followed out of its results into `jaxpr`; None for
  anything else (a scan's carry is a loop's: None too)."""
  name, params = eqn.primitive.name, eqn.params
  if name == "cond":  # operand 0 is the branch index
    bodies, offset = [branch.jaxpr for branch in params["branches"]], 1
  elif name == "scan":  # consts and scanned inputs; results stacked or carried
    carry = range(params["num_consts"], params["num_consts"] + params["num_carry"])
    if any(i in carry for i in positions):
      return None
    bodies, offset = [params["jaxpr"].jaxpr], 0
  elif name in _CALLS:
    body = params["jaxpr"] if "jaxpr" in params else params["call_jaxpr"]
    bodies, offset = [getattr(body, "jaxpr", body)], 0
  else:
    return None
  results: set[int] = set()
  for body in bodies:
    for i in positions:
      reached = _escapes(body, body.invars[i - offset], dtype) if i >= offset else None
      if reached is None or (reached and name == "scan"):
        return None
      results |= reached
  escaped: set[int] = set()
  for k in results:
    reached = _escapes(jaxpr, eqn.outvars[k], dtype)
    if reached is None:
      return None
    escaped |= reached
  return escaped
