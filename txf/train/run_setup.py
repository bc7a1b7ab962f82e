"""One run setup: everything that trains or evaluates a config is built here.

  run = parse(config)                      # the ConfigDict checked and typed (txf.runconfig)
  setup = setup_run(run, workdir)          # tokenizer, data, model, mesh, jitted steps
  state = setup.init()                     # created already sharded
  with setup.activation_sharding():
    state, metrics = setup.train_step(state, setup.to_device(batch))

  trained = load_run(workdir, {"data.seq_len": 256})   # a trained run, to evaluate
  trained.setup.evaluate(trained.params)
  with adding_to_run(workdir): ...   # writing into a trained run, as no one else does

A config with `replicas` = R > 1 trains R seeds (seed .. seed + R - 1) in
one program (txf.train.replicas): the state's leaves, checkpoints included,
carry a leading [R] axis, the train step's metrics are [R], and `evaluate`
reports every replica ('eval_loss/0', ...) with their mean and std. With
data.seed_per_replica each replica reads its own training batches (data seed
+ r; txf.data.stacked): train batches are [R, B, ...], put on the devices
by `train_to_device`.
`replica_params(params, r)` is replica r's parameters, a single run's.

A run's config.json, and which changes a later run may make to it, are
txf.rundir.resume's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import numpy as np
import optax
from etils import epath
from jax.sharding import Mesh

from txf import decode, hardware, interop, models
from txf.analysis import flops_per_token
from txf.choices import can_call
from txf.data import (
  Dataset,
  SentencePieceTokenizer,
  Tokenizer,
  make_dataset,
  make_tokenizer,
  num_classes,
)
from txf.data.pipeline import sentencepiece_model
from txf.data.spec import TASKS
from txf.data.stacked import StackedDatasets
from txf.decode.cache import check_cache_length, check_generative
from txf.layers.embedding import check_position_table
from txf.layers.model_config import FAMILIES
from txf.runconfig.run_config import ConfigError, RunConfig, TrainConfig
from txf.runconfig.tasks import task_kind
from txf.rundir.checkpoint import make_checkpointer, saved_steps
from txf.rundir.record import check_recorded_tokenizer
from txf.rundir.resume import (
  CONFIG_FILE,
  check_resumable,
  is_run_directory,
  read_held_config,
  saved_config,
)
from txf.rundir.workdir import (
  WorkdirLock,
  check_reachable,
  check_writable,
  run_path,
)
from txf.storage import read_json
from txf.train import replicas, sharding
from txf.train.pretrained import adopt_tokenizer, pretrained_params, starting_from
from txf.train.step import (
  TrainState,
  init_params,
  init_state,
  loss_scale_for,
  make_eval_step,
  make_train_step,
)


@dataclasses.dataclass(frozen=True)
class RunSetup:
  """What a run trains and evaluates with, built from its config by `setup_run`.

  Attributes:
    run: the checked, typed config (txf.runconfig.run_config.RunConfig) with
      its vocabulary (fit_vocabulary): its model, data, train and eval
      sections, its optimizer and schedule, its seeds.
    model: the linen module.
    task: 'lm', 'mlm', 'seq2seq' or 'classify'.
    train_data, eval_data: this process's rows of the train and validation
      batches (eval_data stops after eval.num_batches); with own batches
      per replica (run.own_batches) train_data is a StackedDatasets.
    mesh: the device mesh of config.parallel.
    state_sharding: a TrainState of NamedShardings, one per leaf.
    init: jitted () -> TrainState (stacked: leaves [R, ...] when R > 1),
      created already sharded (no host ever holds the whole model); with
      config.train.init_from, its parameters are that checkpoint's (a Hugging Face
      directory or a txf run; txf.train.pretrained.pretrained_params),
      except in a run directory with checkpoints, which restores its own.
    abstract_state: init's TrainState of ShapeDtypeStructs with shardings;
      restoring onto it reshards a checkpoint written on another mesh.
    train_step: jitted (state, batch) -> (state, metrics); donates the state;
      label smoothing, z-loss and gradient accumulation from config.train;
      metrics are [R] when R > 1.
    eval_step: jitted (params, batch) -> replicated loss/accuracy sums ([R]
      when R > 1).
    tokens_per_step: tokens (examples, for classification) a step trains on:
      one global batch's, R of them with own batches per replica.
    flops_per_token: training FLOPs per unit `tokens_per_step` counts (a
      token, 6N + attention; an example, seq_len tokens' worth, for
      classification), of all R replicas where they share the batch: their
      product is a step's FLOPs.
    peak_flops: the device's peak FLOP/s in the compute dtype; None if unknown.
    started_from: what `init` takes its parameters from (train.init_from:
      'the txf run in DIR, step N' or 'the Hugging Face ARCHITECTURE in
      DIR'); None where they are drawn from the seed.
  """

  run: RunConfig
  model: nn.Module
  task: str
  train_data: Dataset | StackedDatasets
  eval_data: Dataset
  mesh: Mesh
  state_sharding: Any
  init: Callable[[], TrainState]
  abstract_state: TrainState
  train_step: Callable[[TrainState, dict], tuple[TrainState, dict]]
  eval_step: Callable[[Any, dict], dict]
  tokens_per_step: int
  flops_per_token: float
  peak_flops: float | None
  started_from: str | None = None

  @property
  def init_key(self) -> jax.Array:
    """The key of the run's (its first replica's) seed."""
    return jax.random.key(self.run.seed)

  def replica_params(self, params: Any, r: int) -> Any:
    """Replica r's parameters (a single run's) from the run's parameters."""
    return replicas.replica_of(params, r, self.run.replicas)

  def to_device(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Global arrays, split over the mesh, from this process's rows (of an
    evaluation batch, or of a train batch every replica shares)."""
    return sharding.shard_batch(batch, self.mesh)

  def train_to_device(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
    """A train batch as `to_device` puts it, [R, B, ...] with own batches per replica."""
    return sharding.shard_batch(batch, self.mesh, replica_axis=self.run.own_batches)

  def activation_sharding(self) -> contextlib.AbstractContextManager:
    """The context the steps run (and are traced) in: activations' logical
    axes become sharding constraints on the mesh."""
    return sharding.activation_sharding(self.mesh)

  def evaluate(self, params: Any) -> dict[str, float]:
    """Loss, accuracy (and perplexity for language models) over eval_data,
    and each further sum of the task's `TaskKind.metric_sums` over the count
    (eval_<name>), or over its own denominator where the hook returns a
    (sum, denominator) pair; with R > 1 replicas (stacked params) each
    replica's ('eval_loss/0', ...) and their mean ('eval_loss') and std
    ('eval_loss_std')."""
    totals: dict[str, Any] = {}
    with self.activation_sharding():
      for batch in self.eval_data:
        sums = jax.device_get(self.eval_step(params, self.to_device(batch)))
        for key, value in sums.items():
          # A pair stays a pair: its sum and its denominator add up apart.
          added = jax.tree.map(lambda v: np.asarray(v, np.float64), value)
          totals[key] = added if key not in totals else jax.tree.map(np.add, totals[key], added)
    if not totals or not np.all(totals["count"]):
      raise ValueError("eval: the validation split produced no tokens")
    names = {"loss_sum": "eval_loss", "correct": "eval_accuracy"}
    result = {
      names.get(key, f"eval_{key}"): _over(total, totals["count"])
      for key, total in totals.items()
      if key != "count"
    }
    loss = result["eval_loss"]
    if task_kind(self.task).perplexity:
      result["eval_perplexity"] = np.exp(np.minimum(loss, 50.0))
    return replicas.scalars(result, self.run.replicas)


def _over(total: Any, count: np.ndarray) -> np.ndarray:
  """An evaluation's sum over the token (or example) count, or a (sum,
  denominator) pair's sum over its own denominator (NaN where it is 0)."""
  if isinstance(total, (tuple, list)):
    numerator, denominator = total
    with np.errstate(divide="ignore", invalid="ignore"):
      return np.where(denominator != 0, numerator / denominator, np.nan)
  return total / count


def train_step_for_seed(
  train_config: TrainConfig,
  dtype: str,
  model: nn.Module,
  optimizer: optax.GradientTransformation,
  task: str,
  sharded_params: bool,
  seed: int,
) -> Callable:
  """The (unjitted) train step of one replica's `seed`, as `train_config` sets
  it up for a model computing in `dtype` (model.dtype: its loss scale);
  sharded_params: the parameters are split over the mesh's devices."""
  return make_train_step(
    model,
    optimizer,
    task,
    seed=seed,
    grad_accum_steps=train_config.grad_accum_steps,
    label_smoothing=train_config.label_smoothing,
    z_loss=train_config.z_loss,
    loss_chunk_len=train_config.loss_chunk_len,
    sharded_params=sharded_params,
    loss_scale=loss_scale_for(dtype),
  )


def _dataset_args(run: RunConfig) -> dict[str, Any]:
  """This process's share of the data and the data stream's seed."""
  return dict(
    process_index=jax.process_index(), process_count=jax.process_count(), seed=run.data_seed
  )


def _train_data(
  run: RunConfig, workdir: str | os.PathLike | None, dataset_args: dict[str, Any]
) -> Dataset | StackedDatasets:
  """The training data: one stream of run.data_seed, or with own batches per
  replica one of each of run.data_seeds, stacked."""
  streams = [
    make_dataset(run.data, "train", workdir=workdir, **dict(dataset_args, seed=seed))
    for seed in run.data_seeds
  ]
  return StackedDatasets(streams, run.data_seeds) if run.own_batches else streams[0]


def fit_vocabulary(
  run: RunConfig, workdir: str | os.PathLike | None
) -> tuple[RunConfig, Tokenizer]:
  """The run's tokenizer, and `run` with its vocabulary (RunConfig.with_vocabulary:
  model.vocab_size None becomes the tokenizer's, model.num_classes the
  dataset's labels). A sentencepiece tokenizer is trained into `workdir` the
  first time (txf.data.make_tokenizer), or copied from the txf run its
  weights come from (train.init_from; txf.train.pretrained.adopt_tokenizer).
  The evaluations' sample must fit a learned position table: found here, not
  at the first evaluation.

  Raises:
    ConfigError: naming the field, for a config the run would reject.
  """
  try:
    if run.data.tfds_data_dir:  # a gs:// one needs the gcs extra
      run_path(run.data.tfds_data_dir, "data.tfds_data_dir")
    if workdir is not None:  # the weights' own ids, not a model trained anew
      adopt_tokenizer(run.data, run.train.init_from, workdir)
    trained = workdir if workdir is not None and saved_steps(workdir) else None
    if trained is not None:  # a resume, an evaluation
      _check_sentencepiece_kept(run, trained)
    tokenizer = make_tokenizer(run.data, workdir)
    if trained is not None:  # an hf tokenizer's files are data.tokenizer_path's
      field = "data.tokenizer_path" if run.data.tokenizer == "hf" else "data.tokenizer"
      check_recorded_tokenizer(trained, tokenizer.sha256, field)
    run = run.with_vocabulary(tokenizer.vocab_size, num_classes(run.data))
    if workdir is None or not is_run_directory(workdir):
      # A new run only: one trained before this check is read, evaluated and
      # resumed as it was trained (its model.pad_id cannot change on resume).
      run.model.check_padding(tokenizer.pad_id, tokenizer.eos_id)
    if task_kind(run.data.task).causal_lm and run.eval.sample_tokens:
      sample_len = decode.cache_length(
        _prompt_length(tokenizer, run.eval.sample_prompt), run.eval.sample_tokens
      )
      check_position_table(
        run.model.position,
        run.model.max_len,
        sample_len,
        "eval.sample_prompt plus eval.sample_tokens",
      )
  except ValueError as error:
    raise ConfigError(str(error)) from error
  return run, tokenizer


def _check_sentencepiece_kept(run: RunConfig, workdir: str | os.PathLike) -> None:
  """Refuses a trained run whose sentencepiece model is gone: make_tokenizer
  would train one into the run (a reader writing into it, on a corpus that
  may have changed since).

  Raises:
    ValueError: naming data.tokenizer and the file.
  """
  if run.data.tokenizer != "sentencepiece":
    return
  model = sentencepiece_model(run.data, workdir)
  if not model.exists():
    raise ValueError(
      f"data.tokenizer: {workdir} holds no {model.name}, the sentencepiece model its "
      "checkpoints were trained with (restore it from a copy of the run)"
    )


def _prompt_length(tokenizer: Tokenizer, prompt: str) -> int:
  """The tokens eval.sample_prompt encodes to; ValueError naming the field
  for a prompt the tokenizer refuses (symbols outside its vocabulary)."""
  try:
    return len(tokenizer.encode(prompt))
  except ValueError as error:
    raise ValueError(f"eval.sample_prompt: {error}") from None


def check_sample_prompt(setup: RunSetup) -> None:
  """Refuses, before a run trains, an eval.sample_prompt that encodes to no
  tokens where its evaluations sample (it trained, then failed sampling at
  the first evaluation, before any checkpoint was saved). Only training
  asks: a trained run is loaded (evaluated, exported) whatever its prompt.

  Raises:
    ConfigError: naming eval.sample_prompt.
  """
  prompt = setup.run.eval.sample_prompt
  if not len(setup.train_data.tokenizer.encode(prompt)):
    raise ConfigError(
      f"eval.sample_prompt: {prompt!r} encodes to no tokens; the sample continues a prompt "
      "of one or more (eval.sample_tokens=0 samples nothing)"
    )


def precheck_run(run: RunConfig) -> RunConfig:
  """`run` with the vocabulary it will have, where that is known without
  training a tokenizer (a sweep checks its points so before it runs any): a
  sentencepiece vocabulary counts as the fewest ids a trained one has, so no
  vocabulary is refused early; the other tokenizers are made as
  fit_vocabulary makes them.

  Raises:
    ConfigError: naming the field.
  """
  if run.data.tokenizer == "sentencepiece":
    vocab_size = SentencePieceTokenizer.RESERVED_IDS + 1
  else:
    try:
      vocab_size = make_tokenizer(run.data).vocab_size
    except ValueError as error:
      raise ConfigError(str(error)) from error
  return run.with_vocabulary(vocab_size, num_classes(run.data))


def setup_run(
  run: RunConfig, workdir: str | os.PathLike | None = None, devices: Sequence[Any] | None = None
) -> RunSetup:
  """Builds everything a run of `run` trains and evaluates with: its
  tokenizer and vocabulary first (`fit_vocabulary`), then its data, model,
  mesh and programs; `RunSetup.run` is `run` with its vocabulary.

  Nothing is computed on the devices: parameters exist once `init` is called.
  The data are this process's share (jax.process_index() of
  jax.process_count()).

  Args:
    run: the checked run config (txf.runconfig.run_config.parse).
    workdir: the run's directory, where a sentencepiece tokenizer is
      trained; None where no tokenizer needs one.
    devices: the devices of the mesh (default: all of them); those of a
      topology description compile the run's programs for hardware this
      process does not have (txf.aot), which then only lower and compile.

  Raises:
    ConfigError: naming the field, for a config that cannot run (including a
      dimension that does not divide its mesh axis), before any compute.
  """
  run, tokenizer = fit_vocabulary(run, workdir)
  # One tokenizer for both splits (a sentencepiece or HF one is a file read).
  dataset_args = dict(_dataset_args(run), tokenizer=tokenizer)
  try:
    train_data = _train_data(run, workdir, dataset_args)
    eval_data = make_dataset(
      run.data, "validation", workdir=workdir, num_batches=run.eval.num_batches, **dataset_args
    )
    mesh = sharding.make_mesh(run.parallel, devices)
    sharding.check_batch(run.data.batch_size, mesh)
    task = train_data.task
    model = models.build(run.model)
    first_batch = next(iter(eval_data))  # shapes only: train and eval batches match
    _check_model_inputs(model, run.model.family, task, first_batch)
    init_fn = functools.partial(init_state, model, run.optimizer, first_batch, task)
    # Abstract evaluation only: a dimension that does not divide its mesh
    # axis fails here, before any parameter exists.
    # The boxed parameters carry each one's logical axes.
    key = jax.random.key(run.seed)
    boxed_params = jax.eval_shape(functools.partial(init_params, model, first_batch, task), key)
    eval_step = make_eval_step(model, task, loss_chunk_len=run.train.loss_chunk_len)
    # A registered task kind's step traced once here: labels or weights that
    # do not fit the model's output are refused by the loss's check (naming
    # the shapes), which otherwise ran inside the first step, after the run
    # directory was written. txf's own fit by construction (a trace spared).
    if not TASKS.provenance(task)["builtin"]:
      try:
        jax.eval_shape(eval_step, boxed_params, first_batch)
      except ValueError as error:
        raise ValueError(f"data.task {task!r}: {error}") from None
    state_sharding = sharding.state_shardings(jax.eval_shape(init_fn, key), boxed_params, mesh)
    pretrained, started_from = None, None
    # A run with checkpoints restores its weights from them: the checkpoint
    # it started from is not read again (it may have moved since, with the
    # Hub cache it was in; and loading it only to replace it cost a read).
    restores_only = bool(run.train.init_from) and workdir is not None and bool(saved_steps(workdir))
    if run.train.init_from and not restores_only:
      source, started_from = init_from_model(run.train.init_from, tokenizer)
      pretrained = pretrained_params(source, run.train.init_from, run.model, boxed_params)
  except ValueError as error:
    raise ConfigError(str(error)) from error

  device = mesh.devices.flat[0]
  platform = "gpu" if device.platform in ("cuda", "rocm") else device.platform
  # The pretrained parameters (None without init_from) are an argument of the
  # jitted init, not constants baked into its program.
  start = (
    starting_from(init_fn, run.optimizer)
    if pretrained is not None
    else (lambda rng, params: init_fn(rng))
  )
  sharded_params = not all(s.is_fully_replicated for s in jax.tree.leaves(state_sharding.params))
  programs = replicas.for_seeds(
    run.seeds,
    start=start,
    step_for_seed=functools.partial(
      train_step_for_seed, run.train, run.model.dtype, model, run.optimizer, task, sharded_params
    ),
    eval_step=eval_step,
    state_sharding=state_sharding,
    backend=platform,
    own_batches=run.own_batches,
  )
  init_from = jax.jit(programs.init, out_shardings=programs.state_sharding)
  replicated = sharding.replicated(mesh)
  seq_len = run.data.seq_len
  batches = len(run.data_seeds)  # global batches a step trains on
  # A classifier's throughput counts examples: its FLOPs are counted per
  # example too (they were per token, so its MFU was seq_len times too low).
  per_example = task_kind(task).per_example
  tokens_counted = seq_len if per_example else 1
  return RunSetup(
    run=run,
    model=model,
    task=task,
    train_data=train_data,
    eval_data=eval_data,
    mesh=mesh,
    state_sharding=programs.state_sharding,
    init=(
      _refuse_init(run.train.init_from, workdir)
      if restores_only
      else functools.partial(init_from, pretrained)
    ),
    # Of the jitted function itself: through a partial, eval_shape would
    # lose the out_shardings that restoring onto another mesh needs.
    abstract_state=init_from.eval_shape(pretrained),
    train_step=jax.jit(
      programs.train_step, out_shardings=(programs.state_sharding, replicated), donate_argnums=0
    ),
    eval_step=jax.jit(programs.eval_step, out_shardings=replicated),
    tokens_per_step=batches * run.data.batch_size * (1 if per_example else seq_len),
    flops_per_token=run.replicas // batches * flops_per_token(run.model, seq_len) * tokens_counted,
    peak_flops=hardware.peak_flops_per_device(device, dtype=run.model.dtype),
    started_from=started_from,
  )


def _check_model_inputs(model: nn.Module, family: str, task: str, batch: Mapping) -> None:
  """Refuses a data.task whose inputs (its model_inputs, traced on `batch`'s
  shapes) `model` cannot be called with: a task kind reading lm batches
  fits every family that trains lm by its batches, but the prefix LM feeds
  a decoder four inputs, where the LSTM takes one (a TypeError inside
  model.init, a traceback).

  Raises:
    ValueError: naming data.task, model.family and the inputs' count.
  """
  inputs = jax.eval_shape(task_kind(task).model_inputs, batch)
  if not can_call(model, *inputs):
    # Packed rows carry their documents' ids and positions: a model without
    # a segment mask can read the row as one stream instead.
    packed = (
      "; its rows pack documents (data.attend_across_documents=True feeds the tokens alone)"
      if "segment_ids" in batch
      else ""
    )
    raise ValueError(
      f"data.task {task!r}: feeds the model {len(inputs)} inputs, which model.family "
      f"{family!r} does not take (it is called as {type(model).__name__}"
      f"{inspect.signature(model.__call__)}){packed}"
    )


def check_memory(setup: RunSetup, samples: bool) -> None:
  """Refuses a run whose train state, or that state with the cache of the
  evaluations' sample (where it `samples`), cannot fit one device's memory
  (txf.hardware.check_fits: a lower bound, activations not counted).

  Raises:
    ConfigError: naming the field (model or eval.sample_tokens) and the sizes.
  """
  device = setup.mesh.devices.flat[0]
  state = hardware.bytes_per_device(setup.abstract_state)
  eval_config = setup.run.eval
  try:
    hardware.check_fits("model", "the parameters and optimizer state", state, device)
    if samples:
      try:
        check_generative(setup.model)
      except ValueError as error:  # a registered family's: the run need not sample
        raise ConfigError(f"{error}; eval.sample_tokens=0 trains it without samples") from None
      prompt_len = len(setup.train_data.tokenizer.encode(eval_config.sample_prompt))
      cache_len = check_cache_length("eval.sample_tokens", prompt_len, eval_config.sample_tokens)
      hardware.check_fits(
        "eval.sample_tokens",
        f"a sample of {eval_config.sample_tokens} tokens' decoding cache and the train state",
        state + decode.cache_bytes(setup.model, 1, cache_len),
        device,
      )
  except ValueError as error:
    raise ConfigError(str(error)) from error


def sampler_arguments(setup: RunSetup, params: Any, step: int) -> tuple[tuple, dict]:
  """decode.generate's arguments for the evaluations' sample of
  eval.sample_prompt at `step`, the prompt a host array [1, P] (txf.aot
  compiles the same program for hardware it does not have)."""
  eval_config, tokenizer = setup.run.eval, setup.train_data.tokenizer
  return (
    (setup.model, params, tokenizer.encode(eval_config.sample_prompt)[None]),
    dict(
      max_new_tokens=eval_config.sample_tokens,
      rng=jax.random.fold_in(setup.init_key, step),
      temperature=eval_config.temperature,
      eos_id=tokenizer.eos_id,
    ),
  )


# ---------------------------------------------------------------------------
# A trained run, for evaluation.


class TrainedRun(NamedTuple):
  """A trained run restored for evaluation: `setup.evaluate(params)`."""

  setup: RunSetup
  params: Any  # stacked ([R, ...] leaves) for a run of R > 1 replicas
  step: int  # the checkpoint's step


def check_holds_run(workdir: epath.Path) -> None:
  """Raises ConfigError unless `workdir` holds a txf run (is_run_directory:
  its config.json, or where that was lost its run_record.json or
  checkpoints), saying what it holds instead: a Hugging Face model
  directory (what txf-export writes) is no run that txf-export,
  txf-generate's and txf-embed's run side, txf-analyze or txf-extrapolate
  read."""
  if is_run_directory(workdir):
    return
  path = workdir / CONFIG_FILE
  if not path.exists():
    raise ConfigError(f"workdir: {workdir} holds no run ({path} does not exist)")
  saved = saved_config(workdir)
  if saved is None:  # a cut or garbled file: say so, as txf-generate's reader does
    try:
      read_json(path)
    except ValueError as error:
      raise ConfigError(f"workdir: {workdir} holds no readable run: {error}") from None
  saved = saved or {}
  what = "its config.json is not a txf run's (no model and train sections)"
  if "architectures" in saved or "model_type" in saved:
    found = (saved.get("architectures") or [saved.get("model_type")])[0]
    what = f"it is a Hugging Face model directory ({found})"
  raise ConfigError(
    f"workdir: {workdir} holds no txf run: {what}; the command takes the work directory "
    "of a txf run (txf-run's --workdir)"
  )


@contextlib.contextmanager
def adding_to_run(workdir: str | os.PathLike) -> Iterator[epath.Path]:
  """Holds the work directory of the trained run in `workdir` while files
  are added to it (its length extrapolation, its attention analysis):
  checks, before anything is computed, that it holds a run, can be written
  and is held by no other process -- a run still training there is refused
  as a second run would be -- and holds its lock (WorkdirLock) for the
  block. Yields the directory as a path.

  Raises:
    ConfigError: `workdir` holds no run (nothing is created).
    WorkdirError: `workdir` cannot be reached or written (a read-only file
      system), or another process holds it (naming its host and pid).
  """
  workdir = run_path(workdir)
  check_reachable(workdir)
  check_holds_run(workdir)
  check_writable(workdir)
  with WorkdirLock(workdir):
    yield workdir


def load_run(
  workdir: str | os.PathLike,
  overrides: Mapping[str, Any] | None = None,
  *,
  saved: RunConfig | None = None,
) -> TrainedRun:
  """Restores the latest checkpoint of the run in `workdir` for evaluation.

  The setup is built from the run's config.json, or where that was lost its
  run_record.json's (`saved`, where the caller has read it:
  txf.rundir.resume.read_held_config) with `overrides` applied
  (RunConfig.override), e.g. {"data.seq_len": 256, "eval.num_batches": 4}:
  any field the checkpoint does not depend on (see
  txf.rundir.resume.check_resumable), laid out on a mesh of this machine's
  devices (`_reading_layout`: the run's own where it fits). Nothing in `workdir` is
  written (nor created: a directory without checkpoints stays without a
  checkpoints/ directory); config.json keeps describing how the run was
  trained. The run may be training still: a checkpoint replaced while it is
  read (the run saved a newer one and deleted it) is read again from the
  newest step (see txf.rundir.checkpoint.Checkpointer.restore).

  Raises:
    ConfigError: `workdir` holds no run (no config.json or no checkpoint), or
      an override names an unknown field, changes one the checkpoint depends
      on, or makes the config invalid -- before any compute.
    RestoreError: no checkpoint restores, or they kept being replaced while
      read (each says so).
  """
  workdir = epath.Path(workdir)
  check_holds_run(workdir)
  try:
    saved = saved or read_held_config(workdir, trained=True)[0]
    assert saved is not None  # else read_held_config refused a run with no config
    run = saved.override(overrides) if overrides else saved
    # Not a resume: a new --workdir is no remedy for a trained run read.
    check_resumable(run, saved, workdir, advice="its checkpoints depend on it")
    run, devices = _reading_layout(run)
  except ValueError as error:
    raise ConfigError(str(error)) from error
  with make_checkpointer(run.train, workdir, read_only=True) as checkpointer:
    if checkpointer.latest_step() is None:
      raise ConfigError(f"workdir: {workdir} holds no checkpoint to evaluate")
    setup = setup_run(run, workdir, devices)
    restored = checkpointer.restore(setup.abstract_state)
    if restored is None:  # deleted since latest_step() saw it
      raise ConfigError(f"workdir: {workdir} holds no checkpoint to evaluate")
    step, state, _ = restored
  return TrainedRun(setup=setup, params=state.params, step=step)


# What a run read on a machine its own mesh does not fit is laid out as.
_DATA_PARALLEL = {"parallel.data": -1, "parallel.fsdp": 1, "parallel.tensor": 1}


def _reading_layout(run: RunConfig) -> tuple[RunConfig, list[jax.Device] | None]:
  """`run` and the devices to read it on here: its own mesh where that fits
  this machine's devices and data.batch_size; else data parallel over all of
  them where that divides the batch; else one device. A run trained with
  parallel.fsdp=8 or on 8 devices is read on a laptop (the parameters
  restore onto any mesh; evaluations give its numbers to float rounding).
  With several processes, the run's own, checked as setup_run does."""
  devices = jax.devices()
  if jax.process_count() > 1 or _fits(run, devices):
    return run, None
  data_parallel = run.override(_DATA_PARALLEL)  # parsed again: only where it is read
  return data_parallel, None if _fits(data_parallel, devices) else devices[:1]


def _fits(run: RunConfig, devices: list[jax.Device]) -> bool:
  """Whether `run`'s mesh fits `devices` and splits its data.batch_size."""
  try:
    sharding.check_batch(run.data.batch_size, sharding.make_mesh(run.parallel, devices))
  except ValueError:
    return False
  return True


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  """A txf run's latest checkpoint, as txf.interop reads a checkpoint.

  Attributes:
    pretrained: the model config (resolved: derived fields filled in) and
      parameters (float32 numpy; replica 0 of a run of several), with the
      tokenizer's pad/bos/eos ids (and the decoder's start, BOS, for an
      encoder-decoder) as `token_ids`.
    tokenizer: the run's tokenizer (its sentencepiece model read from the run).
    step: the checkpoint's step.
    task: the run's data.task ('lm', 'mlm', 'seq2seq', 'classify').
    seed: the run's seed, replica 0's.
    replicas: how many seed replicas the run trained (1: a single run).
  """

  pretrained: interop.Pretrained
  tokenizer: Tokenizer
  step: int
  task: str
  seed: int = 0
  replicas: int = 1

  @property
  def replica_read(self) -> str | None:
    """Which replica a command reads, in words, for a run of several (None
    for a single run): a command takes replica 0 and should say so."""
    if self.replicas == 1:
      return None
    return f"its first of {self.replicas} seed replicas (seed {self.seed})"

  def check_runs_causally(self) -> None:
    """Refuses a model that generates as a causal LM (a decoder, an LSTM, a
    registered generative family; not an encoder-decoder, which decodes
    from its source) trained for a task kind that is not a causal language
    model (a prefix LM attends bidirectionally within its prefix):
    generation, and a Hugging Face causal LM, run it causally.

    Raises:
      ValueError: naming data.task.
    """
    kind = task_kind(self.task)
    generative = FAMILIES[self.pretrained.config.family].generative
    if generative and kind.batches != "seq2seq" and not kind.causal_lm:
      raise ValueError(
        f"data.task: {self.pretrained.architecture} trained for {self.task!r}, not a causal "
        f"language model (its task kind's causal_lm is False), so it cannot run as one "
        "(generated from, or exported as a causal LM)"
      )


def load_trained(workdir: str | os.PathLike) -> TrainedModel:
  """The latest checkpoint of the txf run in `workdir` (see the module docstring).

  Raises:
    ConfigError: `workdir` holds no run or no checkpoint, or its config no
      longer checks.
    RestoreError: no checkpoint restores.
  """
  trained = load_run(workdir)
  setup = trained.setup
  try:
    params = jax.device_get(nn.meta.unbox(setup.replica_params(trained.params, 0)))
  finally:
    setup.train_data.close()
  tokenizer = setup.train_data.tokenizer
  cfg = setup.run.model
  token_ids: dict[str, int | None] = dict(
    pad_token_id=tokenizer.pad_id,
    bos_token_id=tokenizer.bos_id,
    eos_token_id=tokenizer.eos_id,
    decoder_start_token_id=tokenizer.bos_id if cfg.family == "encoder_decoder" else None,
  )
  pretrained = interop.Pretrained(
    config=cfg,
    params=params,
    architecture=f"the txf run in {workdir}",
    token_ids=token_ids,
  )
  return TrainedModel(
    pretrained=pretrained,
    tokenizer=tokenizer,
    step=trained.step,
    task=setup.task,
    seed=setup.run.seed,
    replicas=setup.run.replicas,
  )


def _refuse_init(init_from: str | None, workdir: Any) -> Callable[[], TrainState]:
  """RunSetup.init of a run set up to restore its checkpoints, train.init_from
  unread: called only where none is left to restore (removed after the run
  was set up), where drawing from the seed would train a model that did not
  start from train.init_from. Raises ConfigError saying to run again (the
  directory then holds no checkpoint, and train.init_from is read)."""

  def init() -> TrainState:
    raise ConfigError(
      f"train.init_from: {init_from} was not read, as {workdir} held checkpoints when the "
      "run was set up; none restores now: run again to start from train.init_from"
    )

  return init


def init_from_model(directory: str, tokenizer: Tokenizer) -> tuple[interop.Pretrained, str]:
  """The model a run of `tokenizer` starts from (config.train.init_from),
  and what it is (RunSetup.started_from): the latest checkpoint of the txf
  run in `directory` (`load_trained`, which sets that run up as `setup_run`
  sets up this one), once `tokenizer` is found to be the one that run
  recorded (`check_recorded_tokenizer`), or a Hugging Face checkpoint.

  Raises:
    ValueError: naming train.init_from, for a directory that holds neither,
      or another tokenizer than the txf run's.
  """
  try:
    if is_run_directory(directory):
      check_recorded_tokenizer(directory, tokenizer.sha256, "train.init_from")
      trained = load_trained(directory)
      return trained.pretrained, f"the txf run in {directory}, step {trained.step}"
    pretrained = interop.load_pretrained(directory)
    return pretrained, f"the Hugging Face {pretrained.architecture} in {directory}"
  except (interop.CheckpointError, ConfigError) as error:
    raise ValueError(f"train.init_from: {error}") from None
