"""The run config, typed: its sections and `parse`, the one place a config
(an ml_collections ConfigDict, or a dict: config.json) becomes one.

  run = parse(config)                    # ConfigError naming the field, before any compute
  run.model.d_model, run.data.seq_len, run.train.steps, run.eval.every
  run.optimizer, run.schedule            # built once, from run.train
  run.seeds                              # (seed, ..., seed + replicas - 1)
  run.notes                              # what the parse fitted, one line each
  run = run.with_vocabulary(260, None)   # the tokenizer's ids (txf.train.run_setup does this)
  to_json(run)                           # config.json: parse(to_json(run)) == run

Each section is a frozen dataclass that declares its fields, their
defaults and docs (txf.fields): configs/base.py is built from them, and
`--print_config` prints their docs. A field a config leaves out takes its
default; an unknown field and an impossible combination across sections
are each a `ConfigError` naming the field. One setting that does not fit is
fitted instead, by a rule the run states in a line of `notes`: a
`train.warmup_steps` above `train.steps` is clamped to `train.steps`
(txf.runconfig.optim.fitted_warmup), so every config runs with
`--config.train.steps=N` for any N >= 1.

The vocabulary is the tokenizer's, which for sentencepiece is trained in
the run's directory: `parse` needs no tokenizer and leaves a
`model.vocab_size` of None as it is; `with_vocabulary` fills it (and a
classification dataset's `model.num_classes`), checking only those.
Below the parse only the typed RunConfig travels: the data pipeline takes
its DataSpec, setup its sections, config.json is `to_json(run)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import optax

from txf import checks
from txf.data.spec import TASKS, DataSpec, parse_data, text_source
from txf.fields import ConfigSection, check_known, documented, section, section_values
from txf.layers.embedding import check_position_table
from txf.layers.model_config import (
  FAMILIES,
  HEADS,
  ModelConfig,
  default_options,
  setting_owners,
)
from txf.runconfig.optim import fitted_warmup, make_optimizer, make_schedule
from txf.runconfig.tasks import task_kind
from txf.runconfig.tracker_kinds import tracker_names


class ConfigError(ValueError):
  """The run config is invalid; raised before any compute."""


@section()
class TrainConfig:
  """The `train` section; its optimizer and schedule are built (and so its
  optimizer fields checked) when it is made."""

  steps: int = documented("training steps (the schedule decays until here)", default=600)
  learning_rate: float = documented("peak, after warmup", default=3e-3)
  warmup_steps: int = documented(
    "linear warmup from 0 to learning_rate (at most train.steps: clamped)", default=60
  )
  decay: str = documented("after warmup: cosine | linear | constant | rsqrt", default="cosine")
  end_lr_fraction: float = documented("final lr / peak (cosine, linear)", default=0.1)
  weight_decay: float = documented("decoupled (AdamW), on matrices only", default=0.1)
  b1: float = documented("Adam first-moment decay rate", default=0.9)
  b2: float = documented("Adam second-moment decay rate", default=0.95)
  eps: float = documented("Adam denominator epsilon", default=1e-8)
  grad_clip_norm: float = documented("global gradient norm clip (0: none)", default=1.0)
  grad_accum_steps: int = documented(
    "micro-batches per step (batch_size must divide evenly)", default=1
  )
  label_smoothing: float = documented(
    "fraction of target mass spread over the vocabulary", default=0.0
  )
  z_loss: float = documented("weight of log(Z)^2 (PaLM), keeps logits from drifting", default=0.0)
  loss_chunk_len: int = documented(
    "> 0: loss fused with the LM head, this many positions at a time (the [B, T, V] "
    "logits are then never held at once; lm heads only)",
    default=0,
  )
  log_every: int = documented("steps between progress lines and training metrics", default=50)
  checkpoint_every: int = documented("steps between checkpoints (and one at the end)", default=200)
  max_to_keep: int = documented("newest checkpoints kept", default=2)
  keep_every: int = documented(
    "also keep every checkpoint at a multiple of this step (0: none; a multiple of "
    "train.checkpoint_every)",
    default=0,
  )
  keep_best: int = documented(
    "also keep this many checkpoints of lowest eval_loss (0: none; train.checkpoint_every "
    "a multiple of eval.every)",
    default=0,
  )
  init_from: str | None = documented(
    "a Hugging Face dir or a txf run dir to start from", default=None
  )
  trackers: tuple[str, ...] = documented(
    "experiment trackers, comma-separated: wandb (txf.rundir.trackers)", default=()
  )

  def __post_init__(self) -> None:
    # frozen: only __post_init__ may set. The optimizer and schedule are not
    # fields, so equality ignores them; making them checks the fields they
    # read (train.steps among them) ...
    object.__setattr__(self, "trackers", tracker_names(self.trackers))
    self._schedule: optax.Schedule
    self._optimizer: optax.GradientTransformation
    object.__setattr__(self, "_schedule", make_schedule(self))
    object.__setattr__(self, "_optimizer", make_optimizer(self))
    # ... but lets infinities through where they pass its comparisons.
    checks.finite_at_least(self.weight_decay, "train.weight_decay", 0.0)
    checks.finite_at_least(self.eps, "train.eps", 0.0, open_=True)
    checks.finite_at_least(self.grad_clip_norm, "train.grad_clip_norm", 0.0)
    checks.fraction(self.label_smoothing, "train.label_smoothing")
    checks.finite_at_least(self.z_loss, "train.z_loss", 0.0)
    for field in ("grad_accum_steps", "log_every", "checkpoint_every", "max_to_keep"):
      checks.positive_int(getattr(self, field), f"train.{field}")
    checks.int_at_least(self.loss_chunk_len, "train.loss_chunk_len", 0)
    checks.int_at_least(self.keep_best, "train.keep_best", 0)
    # A kept step must be a saved one: orbax keeps the multiples of keep_every
    # among the steps saved.
    if checks.int_at_least(self.keep_every, "train.keep_every", 0) % self.checkpoint_every:
      raise ValueError(
        f"train.keep_every: {self.keep_every} is not a multiple of "
        f"train.checkpoint_every={self.checkpoint_every} (no checkpoint is saved at its steps)"
      )

  @property
  def schedule(self) -> optax.Schedule:
    """The learning rate by step (txf.runconfig.optim.make_schedule)."""
    return self._schedule

  @property
  def optimizer(self) -> optax.GradientTransformation:
    """Clipping and AdamW on the schedule (txf.runconfig.optim.make_optimizer)."""
    return self._optimizer


@section()
class EvalConfig:
  """The `eval` section."""

  every: int = documented("steps between evaluations (and one at the end)", default=200)
  num_batches: int = documented("validation batches per evaluation", default=8)
  sample_tokens: int = documented("LMs: tokens sampled at each eval (0: none)", default=96)
  sample_prompt: str = documented("LMs: the sample's prompt", default="def ")
  temperature: float = documented("LMs: the sample's temperature (0: greedy)", default=0.8)

  def __post_init__(self) -> None:
    checks.positive_int(self.every, "eval.every")
    checks.positive_int(self.num_batches, "eval.num_batches")
    checks.int_at_least(self.sample_tokens, "eval.sample_tokens", 0)
    # NaN would pass `temperature < 0` and sample garbage.
    checks.finite_at_least(self.temperature, "eval.temperature", 0.0)
    if not isinstance(self.sample_prompt, str):  # else an AttributeError from the tokenizer
      raise ValueError(f"eval.sample_prompt: a string, got {self.sample_prompt!r}")


@section()
class ParallelConfig:
  """The `parallel` section: mesh axis sizes (-1: the devices left;
  txf.train.sharding.make_mesh checks them against the devices)."""

  data: int = documented(
    "devices splitting the batch (-1: all not used by the other axes)", default=-1
  )
  fsdp: int = documented(
    "devices splitting the batch and the parameters / optimizer state", default=1
  )
  tensor: int = documented(
    "devices splitting heads, MLP and vocabulary (Megatron-style)", default=1
  )

  def __post_init__(self) -> None:
    # Here, with the config, not where the mesh is made: --print_config and a
    # sweep's check see them (the sizes against the devices stay there).
    checks.positive_int(self.data, "parallel.data", sentinel=(-1, "all remaining devices"))
    checks.positive_int(self.fsdp, "parallel.fsdp")
    checks.positive_int(self.tensor, "parallel.tensor")


@section()
class RunConfig:
  """A checked run config (`parse`): each section typed; `notes`: a line
  for each setting the parse fitted (train.warmup_steps clamped to
  train.steps), which the run prints before training (not a setting:
  neither compared nor written to config.json)."""

  seed: int = documented("parameter init, dropout and (data.seed None) data order", default=0)
  replicas: int = documented(
    "seed replicas: R copies of the run, seeds seed .. seed + R - 1, trained side by side "
    "in one program on the same batches, or each on its own with data.seed_per_replica "
    "(txf.train.replicas)",
    default=1,
  )
  model: ModelConfig = documented(
    "the model (txf.layers.model_config.ModelConfig)", default_factory=ModelConfig
  )
  data: DataSpec = documented("the data (txf.data.spec.DataSpec)", default_factory=DataSpec)
  train: TrainConfig = documented("training and its optimizer", default_factory=TrainConfig)
  eval: EvalConfig = documented("evaluations and samples", default_factory=EvalConfig)
  parallel: ParallelConfig = documented("the device mesh", default_factory=ParallelConfig)
  notes: tuple[str, ...] = dataclasses.field(default=(), compare=False)

  @property
  def optimizer(self) -> optax.GradientTransformation:
    """train's optimizer, built once (TrainConfig.optimizer)."""
    return self.train.optimizer

  @property
  def schedule(self) -> optax.Schedule:
    """train's learning-rate schedule, built once (TrainConfig.schedule)."""
    return self.train.schedule

  @property
  def seeds(self) -> tuple[int, ...]:
    """The replicas' seeds: replica r is the single run of seed + r."""
    return replica_seeds(self.seed, self.replicas)

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
    return replica_seeds(self.data_seed, self.replicas if self.own_batches else 1)

  def check_extrapolates(self, where: str) -> None:
    """That length extrapolation (txf.trained.extrapolate) can score this run,
    `where` (e.g. 'the run in DIR'): a causal language model's task on a
    text stream.

    Raises:
      ValueError: naming data.task or data.name.
    """
    task, name = self.data.task, self.data.name
    if not task_kind(task).causal_lm:
      raise ValueError(
        f"data.task: length extrapolation needs a causal language model (a task kind "
        f"with causal_lm, as 'lm'), {where} trains {task!r}"
      )
    if text_source(name) is None:
      # Its rows are independent examples whose eval weights leave out what no
      # model can predict: joined into one stream, they would be scored whole.
      raise ValueError(
        f"data.name: length extrapolation scores a text stream, {where} trains on "
        f"{name!r}, whose rows are generated one by one"
      )

  def with_vocabulary(self, vocab_size: int, num_classes: int | None) -> RunConfig:
    """This run for a tokenizer of `vocab_size` ids and a dataset of
    `num_classes` labels (None: not a classification dataset):
    model.vocab_size None becomes the tokenizer's, a given one must hold its
    ids; model.num_classes becomes the dataset's (ModelConfig.with_vocabulary).

    Raises:
      ConfigError: naming model.vocab_size or model.pad_id.
    """
    try:
      model = self.model.with_vocabulary(vocab_size, num_classes)
    except ValueError as error:
      raise ConfigError(str(error)) from error
    return dataclasses.replace(self, model=model)

  def override(self, changes: Mapping[str, Any]) -> RunConfig:
    """This run with the dotted fields of `changes` set ({"data.seq_len":
    256}), parsed again as a whole (`parse`: the changed fields are checked
    as any config's).

    Raises:
      ConfigError: naming an unknown field or one the change makes invalid.
    """
    config = to_json(self)
    for name, value in changes.items():
      *path, field = name.split(".")
      node = config
      for part in path:
        node = node.get(part) if isinstance(node, dict) else None
      # model.options holds the chosen entries' settings only: another
      # entry's, chosen by the same changes, is checked by parse, as the
      # command line's (--config.model.position=t5_bias with its buckets).
      options = path == ["model", "options"]
      if not isinstance(node, dict) or (field not in node and not options):
        raise ConfigError(f"{name}: unknown field")
      node[field] = value
    # A data field this run's dataset does not read is None: left out, it
    # takes its default where a change makes the dataset read it
    # (data.tokenizer='sentencepiece' reads data.sp_vocab_size).
    config["data"] = {
      field: value
      for field, value in config["data"].items()
      if value is not None or f"data.{field}" in changes
    }
    return parse(config)


def replica_seeds(seed: int, replicas: int) -> tuple[int, ...]:
  """The seeds of a run of `replicas` replicas from `seed`: replica r is the
  single run of seed + r (config fields `seed` and `replicas`)."""
  return tuple(range(seed, seed + replicas))


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
  `task`: those whose registry entry names the batch format the task reads."""
  batches = TASKS[task].batches
  families = tuple(name for name, family in FAMILIES.items() if batches in family.tasks)
  heads = tuple(name for name, head in HEADS.items() if batches in head.tasks)
  return families, heads


def to_json(run: RunConfig) -> dict[str, Any]:
  """`run` as JSON values (config.json; run_record.json's `config`): every
  field of every section, derived ones filled in; `parse` reads it back to
  an equal RunConfig."""
  sections = {field.name: getattr(run, field.name) for field in dataclasses.fields(run)}
  del sections["notes"]
  return _json(sections)


def _json(value: Any) -> Any:
  """A section's values as JSON values: dataclasses and mappings as objects, tuples as lists."""
  if dataclasses.is_dataclass(value) and not isinstance(value, type):
    return {f.name: _json(getattr(value, f.name)) for f in dataclasses.fields(value)}
  if isinstance(value, Mapping):
    return {str(key): _json(item) for key, item in value.items()}
  if isinstance(value, list | tuple):
    return [_json(item) for item in value]
  return value


def parse(config: ConfigSection) -> RunConfig:
  """`config` (a ConfigDict or a dict: sections seed, replicas, model, data,
  train, eval, parallel; what it leaves out takes the declared default)
  checked and typed: each section read once, then the checks across
  sections. No tokenizer is needed: a model.vocab_size of None stays None
  until `RunConfig.with_vocabulary`.

  Raises:
    ConfigError: naming the field.
  """
  try:
    return _parse(config)
  except ConfigError:
    raise
  except ValueError as error:
    raise ConfigError(str(error)) from error


def _parse(config: ConfigSection) -> RunConfig:
  check_known(RunConfig, config, "config")
  for name in ("model", "data", "train", "eval", "parallel"):  # else a TypeError or AttributeError
    if name in config and not hasattr(config[name], "items"):
      raise ValueError(f"{name}: a section of fields (a dict), got {config[name]!r}")
  given = lambda name, default: config[name] if name in config else default  # noqa: E731
  seed = checks.seed(given("seed", RunConfig.seed), "seed")
  replicas = checks.positive_int(given("replicas", RunConfig.replicas), "replicas")
  if seed + replicas - 1 > checks.SEED_MAX:  # replica r trains with seed + r
    raise ValueError(
      f"seed: {seed} + replicas={replicas} - 1 is above the largest seed {checks.SEED_MAX}"
    )
  train, notes = _parse_train(given("train", {}))
  model = ModelConfig.from_config(given("model", {}))
  notes += _unread_options(given("model", {}), model)
  data = parse_data(given("data", {}))
  notes += _unread_data(given("data", {}), data)
  run = RunConfig(
    seed=seed,
    replicas=replicas,
    model=model,
    data=data,
    train=train,
    eval=EvalConfig(**section_values(EvalConfig, given("eval", {}), "eval")),
    parallel=ParallelConfig(**section_values(ParallelConfig, given("parallel", {}), "parallel")),
    notes=notes,
  )
  _check_across(run)
  return run


def _unread_options(section: ConfigSection, model: ModelConfig) -> tuple[str, ...]:
  """A note for each model.options setting given a value other than its
  default that no chosen entry reads (ModelConfig keeps the chosen entries'
  settings only): it changes nothing, which a run would not say otherwise."""
  options = section["options"] if "options" in section else {}
  defaults = default_options()
  return tuple(
    f"model.options.{name}={value!r} changes nothing: no chosen entry reads it "
    f"(read by {setting_owners(name)} only)"
    for name, value in options.items()
    if name not in model.options and name in defaults and value != defaults[name]
  )


def _unread_data(section: ConfigSection, data: DataSpec) -> tuple[str, ...]:
  """A note for each data field given a value other than its default that
  the dataset does not read (DataSpec holds it None, and so does
  config.json): it changes nothing, which a run would not say otherwise."""
  defaults = {f.name: f.default for f in dataclasses.fields(DataSpec)}
  return tuple(
    f"data.{name}={section[name]!r} changes nothing: data.name {data.name!r} (data.task "
    f"{data.task!r}) does not read it"
    for name in defaults
    if name in section
    and getattr(data, name) is None
    and section[name] not in (None, defaults[name])
  )


def _parse_train(section: ConfigSection) -> tuple[TrainConfig, tuple[str, ...]]:
  """The train section, its warmup fitted to its steps, and the note saying so."""
  values = section_values(TrainConfig, section, "train")
  # The train state counts steps in int32: past it the count would wrap.
  steps = checks.int_at_least(values["steps"], "train.steps", 1, checks.INT32_MAX)
  warmup = checks.int_at_least(values["warmup_steps"], "train.warmup_steps", 0)
  if fitted_warmup(warmup, steps) == warmup:
    return TrainConfig(**values), ()
  note = (
    f"train.warmup_steps: {warmup} is more than train.steps={steps}; "
    f"clamped to {steps} (the learning rate rises for the whole run)"
  )
  return TrainConfig(**{**values, "warmup_steps": steps}), (note,)


def _check_across(run: RunConfig) -> None:
  """The checks of fields of different sections."""
  spec, model, train = run.data, run.model, run.train
  if spec.seed_per_replica and run.data_seed + run.replicas - 1 > checks.SEED_MAX:
    raise ValueError(
      f"data.seed_per_replica: replica r reads data seed {run.data_seed} + r, above the largest "
      f"seed {checks.SEED_MAX} for replicas={run.replicas}"
    )
  families, heads = task_models(spec.task)
  if model.family not in families:
    raise ValueError(
      f"model.family: {model.family!r} cannot train data.task="
      f"{spec.task!r} (needs one of {families})"
    )
  if model.head not in heads:
    raise ValueError(
      f"model.head: {model.head!r} cannot train data.task={spec.task!r} (needs one of {heads})"
    )
  check_position_table(model.position, model.max_len, spec.seq_len, "data.seq_len")
  if spec.batch_size % train.grad_accum_steps:
    raise ValueError(
      f"train.grad_accum_steps: {train.grad_accum_steps} does not divide "
      f"data.batch_size={spec.batch_size}"
    )
  if train.keep_best and train.checkpoint_every % run.eval.every:
    raise ValueError(
      f"train.keep_best: ranks checkpoints by the evaluation at their step, but "
      f"train.checkpoint_every={train.checkpoint_every} is not a multiple of "
      f"eval.every={run.eval.every}"
    )
  if train.loss_chunk_len and model.head != "lm":
    raise ValueError(
      f"train.loss_chunk_len: the fused loss needs an 'lm' head (a linear "
      f"one), not model.head={model.head!r}; set it to 0"
    )
  if train.loss_chunk_len and not task_kind(spec.task).builtin_loss:
    raise ValueError(
      f"train.loss_chunk_len: data.task={spec.task!r} has its own loss "
      f"(loss_sums), which the fused loss cannot compute; set it to 0"
    )
  if train.loss_chunk_len and spec.seq_len % train.loss_chunk_len:
    raise ValueError(
      f"train.loss_chunk_len: {train.loss_chunk_len} does not divide data.seq_len={spec.seq_len}"
    )
