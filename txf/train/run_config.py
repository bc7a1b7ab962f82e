"""Checks a whole run config before any compute and returns it typed.

  run = check_run_config(config, vocab_size=260, num_classes=None)
  run.model.d_model, run.data.seq_len, run.train.steps, run.eval.every
  run.optimizer, run.schedule          # built once, here
  run.seeds                            # (seed, ..., seed + replicas - 1)
  run.notes                            # what the check changed, one line each

Unknown fields and impossible combinations across sections are each a
`ValueError` naming the field. One setting that does not fit is fitted
instead, by a rule the run states in a line of `notes`: a
`train.warmup_steps` above `train.steps` is clamped to `train.steps`
(txf.train.optim.fitted_warmup), so every config runs with
`--config.train.steps=N` for any N >= 1. `RunConfig` is what setup_run, the
loop and the commands read; its `source`, the ConfigDict as given, is what
config.json records and what a resumed run is compared with
(txf.train.resume), never read for a setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

from txf import checks
from txf.data.spec import DataSpec, read_data_config
from txf.fields import documented, section
from txf.layers.embedding import check_position_table
from txf.layers.model_config import FAMILIES, HEADS, ModelConfig
from txf.train import replicas as replicas_lib
from txf.train.optim import fitted_warmup, make_optimizer, make_schedule
from txf.train.trackers import tracker_names


@section()
class TrainConfig:
  """The `train` section (configs/base.py holds the defaults)."""

  steps: int = documented("training steps (the schedule decays until here)")
  learning_rate: float = documented("peak, after warmup")
  warmup_steps: int = documented(
    "linear warmup from 0 to learning_rate (at most train.steps: clamped)"
  )
  decay: str = documented("after warmup: cosine | linear | constant | rsqrt")
  end_lr_fraction: float = documented("final lr / peak (cosine, linear)")
  weight_decay: float = documented("decoupled (AdamW), on matrices only")
  b1: float = documented("Adam first-moment decay rate")
  b2: float = documented("Adam second-moment decay rate")
  eps: float = documented("Adam denominator epsilon")
  grad_clip_norm: float = documented("global gradient norm clip (0: none)")
  grad_accum_steps: int = documented("micro-batches per step (batch_size must divide evenly)")
  label_smoothing: float = documented("fraction of target mass spread over the vocabulary")
  z_loss: float = documented("weight of log(Z)^2 (PaLM), keeps logits from drifting")
  loss_chunk_len: int = documented(
    "> 0: loss fused with the LM head, this many positions at a time (the [B, T, V] "
    "logits are then never held at once; lm heads only)"
  )
  log_every: int = documented("steps between progress lines and training metrics")
  checkpoint_every: int = documented("steps between checkpoints (and one at the end)")
  max_to_keep: int = documented("newest checkpoints kept")
  init_from: str | None = documented("a Hugging Face dir or a txf run dir to start from")
  trackers: tuple[str, ...] = documented(
    "experiment trackers, comma-separated: wandb (txf.train.trackers)"
  )


@section()
class EvalConfig:
  """The `eval` section."""

  every: int = documented("steps between evaluations (and one at the end)")
  num_batches: int = documented("validation batches per evaluation")
  sample_tokens: int = documented("LMs: tokens sampled at each eval (0: none)")
  sample_prompt: str = documented("LMs: the sample's prompt")
  temperature: float = documented("LMs: the sample's temperature (0: greedy)")


@section()
class ParallelConfig:
  """The `parallel` section: mesh axis sizes (-1: the devices left)."""

  data: int = documented("devices splitting the batch (-1: all not used by the other axes)")
  fsdp: int = documented("devices splitting the batch and the parameters / optimizer state")
  tensor: int = documented("devices splitting heads, MLP and vocabulary (Megatron-style)")


@section(eq=False)
class RunConfig:
  """A checked run config: each section typed, the optimizer and its
  schedule built once from `train`; `notes`: a line for each setting the
  check fitted (train.warmup_steps clamped to train.steps), which the run
  prints before training; `source`: the config as given (what config.json
  records and txf.train.resume compares; settings are read from the typed
  sections, never from it)."""

  source: Any
  seed: int = documented("parameter init, dropout and (data.seed None) data order")
  replicas: int = documented(
    "seed replicas: R copies of the run, seeds seed .. seed + R - 1, trained side by side "
    "in one program on the same batches, or each on its own with data.seed_per_replica "
    "(txf.train.replicas)"
  )
  model: ModelConfig
  data: DataSpec
  train: TrainConfig
  eval: EvalConfig
  parallel: ParallelConfig
  optimizer: optax.GradientTransformation
  schedule: optax.Schedule
  notes: tuple[str, ...] = ()

  @property
  def seeds(self) -> tuple[int, ...]:
    """The replicas' seeds: replica r is the single run of seed + r."""
    return replicas_lib.replica_seeds(self.seed, self.replicas)

  @property
  def data_seed(self) -> int:
    """The data order's seed: `data.seed`, or the run's `seed` where that is None."""
    return data_order_seed(self.seed, self.data)

  @property
  def own_batches(self) -> bool:
    """Whether each replica trains on its own batches (data.seed_per_replica
    with replicas > 1): the train batches then carry a leading [R] axis."""
    return self.replicas > 1 and self.data.seed_per_replica

  @property
  def data_seeds(self) -> tuple[int, ...]:
    """The seeds of the training data streams: replica r's data_seed + r with
    own_batches, else the one stream every replica reads."""
    return replicas_lib.replica_seeds(self.data_seed, self.replicas if self.own_batches else 1)


def data_order_seed(seed: int, data: DataSpec) -> int:
  """The data order's seed of a run of `seed`: `data.seed`, or `seed` where that is None."""
  return seed if data.seed is None else data.seed


def _field_names(cls: type) -> tuple[str, ...]:
  return tuple(field.name for field in dataclasses.fields(cls))


SECTIONS = ("seed", "replicas", "model", "data", "train", "eval", "parallel")
TRAIN_FIELDS = _field_names(TrainConfig)
EVAL_FIELDS = _field_names(EvalConfig)
PARALLEL_FIELDS = _field_names(ParallelConfig)
DATA_FIELDS = _field_names(DataSpec)


def task_models(task: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(the model.family values, the model.head values) that train data.task
  `task`: as each family and head declares in its registry entry."""
  families = tuple(name for name, family in FAMILIES.items() if task in family.tasks)
  heads = tuple(name for name, head in HEADS.items() if task in head.tasks)
  return families, heads


def _typed(cls: type, section: Any) -> Any:
  """`cls` from a checked section; a field the section lacks reads as None
  (and fails the check of its value)."""
  return cls(**{name: section.get(name) for name in _field_names(cls)})


class ConfigError(ValueError):
  """The run config is invalid; raised before any compute."""


def _check_known(section: str, config: Any, known: tuple[str, ...]) -> None:
  unknown = sorted(set(config.keys()) - set(known))
  if unknown:
    raise ValueError(f"{section}.{unknown[0]}: unknown field (known: {', '.join(known)})")


def check_run_config(config: Any, *, vocab_size: int, num_classes: int | None) -> RunConfig:
  """Validates `config` and returns it typed, its optimizer built.

  Args:
    config: the run's ConfigDict (sections: seed, replicas, model, data, train, eval,
      parallel).
    vocab_size: the tokenizer's vocabulary size (fills model.vocab_size=None).
    num_classes: the dataset's label count for classification, else None.
  """
  _check_known("config", config, SECTIONS)
  for name in SECTIONS:
    if name not in config:
      raise ValueError(f"config.{name}: missing section")
  _check_known("data", config.data, DATA_FIELDS)
  _check_known("train", config.train, TRAIN_FIELDS)
  _check_known("eval", config.eval, EVAL_FIELDS)
  _check_known("parallel", config.parallel, PARALLEL_FIELDS)
  checks.seed(config.seed, "seed")
  replicas = checks.positive_int(config.replicas, "replicas")
  if config.seed + replicas - 1 > checks.SEED_MAX:  # replica r trains with seed + r
    raise ValueError(
      f"seed: {config.seed} + replicas={replicas} - 1 is above the largest seed {checks.SEED_MAX}"
    )
  spec = read_data_config(config.data)
  data_seed = data_order_seed(config.seed, spec)
  if spec.seed_per_replica and data_seed + replicas - 1 > checks.SEED_MAX:
    raise ValueError(
      f"data.seed_per_replica: replica r reads data seed {data_seed} + r, above the largest "
      f"seed {checks.SEED_MAX} for replicas={replicas}"
    )

  model_fields = dict(config.model.items())
  if model_fields.get("vocab_size") is None:
    model_fields["vocab_size"] = vocab_size
  elif checks.positive_int(model_fields["vocab_size"], "model.vocab_size") < vocab_size:
    raise ValueError(
      f"model.vocab_size: {model_fields['vocab_size']} is smaller than the "
      f"tokenizer's {vocab_size} ids"
    )
  if num_classes is not None:
    model_fields["num_classes"] = num_classes
  model_cfg = ModelConfig.from_config(model_fields)

  families, heads = task_models(spec.task)
  if model_cfg.family not in families:
    raise ValueError(
      f"model.family: {model_cfg.family!r} cannot train data.task="
      f"{spec.task!r} (needs one of {families})"
    )
  if model_cfg.head not in heads:
    raise ValueError(
      f"model.head: {model_cfg.head!r} cannot train data.task={spec.task!r} (needs one of {heads})"
    )
  check_position_table(model_cfg.position, model_cfg.max_len, spec.seq_len, "data.seq_len")

  train = _typed(TrainConfig, config.train)
  train = dataclasses.replace(train, trackers=tracker_names(train.trackers))
  # Checks the optimizer and schedule fields (train.steps among them) ...
  optimizer, schedule = make_optimizer(train), make_schedule(train)
  notes = []
  warmup = fitted_warmup(train.warmup_steps, train.steps)
  if warmup != train.warmup_steps:  # the schedule above warms up over these steps too
    notes.append(
      f"train.warmup_steps: {train.warmup_steps} is more than train.steps={train.steps}; "
      f"clamped to {warmup} (the learning rate rises for the whole run)"
    )
    train = dataclasses.replace(train, warmup_steps=warmup)
  # ... but lets infinities through where they pass its comparisons.
  checks.finite_at_least(train.weight_decay, "train.weight_decay", 0.0)
  checks.finite_at_least(train.eps, "train.eps", 0.0, open_=True)
  checks.finite_at_least(train.grad_clip_norm, "train.grad_clip_norm", 0.0)
  checks.fraction(train.label_smoothing, "train.label_smoothing")
  checks.finite_at_least(train.z_loss, "train.z_loss", 0.0)
  for field in ("grad_accum_steps", "log_every", "checkpoint_every", "max_to_keep"):
    checks.positive_int(getattr(train, field), f"train.{field}")
  if spec.batch_size % train.grad_accum_steps:
    raise ValueError(
      f"train.grad_accum_steps: {train.grad_accum_steps} does not divide "
      f"data.batch_size={spec.batch_size}"
    )
  chunk_len = checks.int_at_least(train.loss_chunk_len, "train.loss_chunk_len", 0)
  if chunk_len and model_cfg.head != "lm":
    raise ValueError(
      f"train.loss_chunk_len: the fused loss needs an 'lm' head (a linear "
      f"one), not model.head={model_cfg.head!r}; set it to 0"
    )
  if chunk_len and spec.seq_len % chunk_len:
    raise ValueError(
      f"train.loss_chunk_len: {chunk_len} does not divide data.seq_len={spec.seq_len}"
    )
  checks.positive_int(config.eval.every, "eval.every")
  checks.positive_int(config.eval.num_batches, "eval.num_batches")
  checks.int_at_least(config.eval.sample_tokens, "eval.sample_tokens", 0)
  # NaN would pass `temperature < 0` and sample garbage.
  checks.finite_at_least(config.eval.temperature, "eval.temperature", 0.0)
  return RunConfig(
    source=config,
    seed=config.seed,
    replicas=replicas,
    model=model_cfg,
    data=spec,
    train=train,
    eval=_typed(EvalConfig, config.eval),
    parallel=_typed(ParallelConfig, config.parallel),
    optimizer=optimizer,
    schedule=schedule,
    notes=tuple(notes),
  )
