"""Starting a run from trained parameters (config.train.init_from): a
Hugging Face checkpoint or another txf run, checked against the run's model.

setup_run (txf.train.run_setup) reads that model (its init_from_model, which
sets up a txf run as setup_run does), checks it with `pretrained_params`
while it builds the run, and starts the state from them with `starting_from`. The weights' rows
are the source run's token ids: setup's fit_vocabulary first copies a txf run's
sentencepiece model into the new run (`adopt_tokenizer`) instead of training
another, and setup_run refuses a tokenizer whose contents differ from the
one the source run recorded (txf.rundir.record.check_recorded_tokenizer,
from init_from_model).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import optax

from txf import interop
from txf.data.pipeline import sentencepiece_model
from txf.data.spec import DataSpec
from txf.layers.model_config import COMPUTE_FIELDS, ModelConfig
from txf.rundir.resume import is_run_directory
from txf.storage import write_file
from txf.train.step import TrainState

# ModelConfig fields a run may set apart from its train.init_from checkpoint: they
# change how the model trains or runs, not the function its parameters compute.
FREE_PRETRAINED_FIELDS = (*COMPUTE_FIELDS, "init", "max_len", "head", "num_classes", "pooling")


def pretrained_params(
  pretrained: interop.Pretrained, directory: str, model_cfg: ModelConfig, boxed_params: Any
) -> Any:
  """The parameters of `pretrained`, the model in `directory`
  (config.train.init_from: a Hugging Face checkpoint, or the latest
  checkpoint of a txf run, its first replica; txf.train.run_setup.init_from_model),
  which must be the run's model: the same ModelConfig up to
  FREE_PRETRAINED_FIELDS and exactly the same parameters.

  Raises:
    ValueError: naming the first model field or parameter that differs.
  """
  hint = f"(start from --config=pretrained:{directory}, which writes its model section)"
  set_apart = []
  for field in dataclasses.fields(ModelConfig):
    ours, theirs = getattr(model_cfg, field.name), getattr(pretrained.config, field.name)
    if ours == theirs:
      continue
    if field.name not in FREE_PRETRAINED_FIELDS:
      raise ValueError(
        f"model.{field.name}: {ours!r} differs from the checkpoint's {theirs!r} "
        f"in train.init_from={directory} {hint}"
      )
    if field.name not in COMPUTE_FIELDS:  # how it computes shapes no parameter
      set_apart.append(f"model.{field.name}={ours!r} (the checkpoint's {theirs!r})")
  if set_apart:  # which may still shape a parameter (max_len a learned table): the fix
    hint = f"(this run sets {', '.join(set_apart)})"
  expected = interop.rules.flatten(nn.meta.unbox(boxed_params))
  found = interop.rules.flatten(pretrained.params)
  for path in sorted(set(expected) | set(found)):
    if path not in found or path not in expected:
      where = "the run's model" if path not in found else "the checkpoint"
      raise ValueError(f"train.init_from: parameter {path} is only in {where} {directory} {hint}")
    shape = tuple(expected[path].shape)
    if shape != found[path].shape:
      raise ValueError(
        f"train.init_from: parameter {path} has shape {shape} in the run's "
        f"model but {found[path].shape} in {directory} {hint}"
      )
  return pretrained.params


def adopt_tokenizer(spec: DataSpec, init_from: str | None, workdir: str | os.PathLike) -> None:
  """Puts the sentencepiece model of the txf run `init_from` into `workdir`
  (atomically, where it has none yet) for a run that starts from that run's
  weights: training another on the corpus as it is now would give other ids
  to the same embedding rows. Nothing for another tokenizer or start.

  Raises:
    ValueError: one line naming train.init_from, when that run has no model
      of data.sp_vocab_size, or `workdir` holds one with other contents.
  """
  if spec.tokenizer != "sentencepiece" or not init_from or not is_run_directory(init_from):
    return
  source, target = sentencepiece_model(spec, init_from), sentencepiece_model(spec, workdir)
  name = source.name
  if not source.exists():
    raise ValueError(
      f"train.init_from: {init_from} holds no {name}: this run's sentencepiece ids would not "
      "be the ones its weights were trained on (keep its data.tokenizer and data.sp_vocab_size)"
    )
  model = source.read_bytes()
  if not target.exists():
    write_file(target, model)
  elif target.read_bytes() != model:
    raise ValueError(
      f"train.init_from: {target} is not the sentencepiece model of {init_from}: its ids "
      "would differ from the ones the weights were trained on; use a new --workdir"
    )


def starting_from(
  init_fn: Callable[[jax.Array], TrainState], optimizer: optax.GradientTransformation
) -> Callable[[jax.Array, Any], TrainState]:
  """(rng, params) -> init_fn's state with those parameters and their fresh
  optimizer state."""

  def init(rng: jax.Array, params: Any) -> TrainState:
    state = init_fn(rng)  # its random parameters are dead code once replaced
    # dataclasses.replace is what flax's TrainState.replace does (untyped there).
    return dataclasses.replace(state, params=params, opt_state=optimizer.init(params))

  return init
