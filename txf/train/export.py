"""A trained txf run as a Hugging Face model: its latest checkpoint read the
way txf.interop reads a Hugging Face directory (txf-generate, txf-embed and
train.init_from take either), and written as one (txf-export).

  trained = load_trained("runs/rope")       # Pretrained, tokenizer, step
  logits = trained.pretrained.model().apply({"params": trained.pretrained.params}, tokens_BxT)
  export_run("runs/gpt2_tiny", "out/hf")    # config.json, model.safetensors, tokenizer.json

A run is read through txf.train.setup.load_run (its config.json, the latest
checkpoint, its tokenizer; nothing in the run is written); a run of R > 1
seed replicas gives its first replica (seed `seed`). The export writes the
families txf.interop writes: a decoder as GPT-2, an encoder as BERT, an
encoder-decoder as T5 -- when the run's model is of that shape (GPT-2:
learned positions, LayerNorm, Pre-LN, biases, logits not scaled, ...);
otherwise it names every field that does not map (CheckpointError) before
anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import flax.linen as nn
import jax
from etils import epath

from txf import interop
from txf.data.tokenizers import Tokenizer, hf_tokenizer_files
from txf.interop.tensors import CONFIG, SAFETENSORS
from txf.train.resume import read_run_config
from txf.train.run_config import ConfigError
from txf.train.setup import load_run

GENERATION_CONFIG = "generation_config.json"


def is_run_directory(path: str | os.PathLike) -> bool:
  """Whether `path` holds a txf run (a config.json with `model` and `train`
  sections) rather than a Hugging Face model directory (whose config.json
  has neither)."""
  path = epath.Path(path)
  if not (path / CONFIG).exists():
    return False
  try:
    saved = json.loads((path / CONFIG).read_text())
  except (ValueError, OSError):  # a broken file: the reader it is given to says so
    return False
  return isinstance(saved, dict) and all(
    isinstance(saved.get(section), dict) for section in ("model", "train")
  )


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
  """

  pretrained: interop.Pretrained
  tokenizer: Tokenizer
  step: int
  task: str


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
    pretrained=pretrained, tokenizer=tokenizer, step=trained.step, task=setup.task
  )


def without_head(pretrained: interop.Pretrained) -> interop.Pretrained:
  """`pretrained` returning its final hidden states (head 'none'): the head's
  parameters dropped, as txf.interop's `head='none'` drops a checkpoint's."""
  if pretrained.config.head == "none":
    return pretrained
  params = {name: value for name, value in pretrained.params.items() if name != "head"}
  return dataclasses.replace(
    pretrained, config=dataclasses.replace(pretrained.config, head="none"), params=params
  )


@dataclasses.dataclass(frozen=True)
class Export:
  """What `export_run` wrote: the directory, the architecture, the
  checkpoint's step, the files, and why no tokenizer was written (None when
  one was)."""

  directory: epath.Path
  architecture: str
  step: int
  files: tuple[str, ...]
  no_tokenizer: str | None


def check_out(workdir: epath.Path, out: epath.Path) -> None:
  """Refuses an output directory that would overwrite a run (the run's own
  directory, or another run's: its config.json would be replaced).

  Raises:
    ConfigError: naming `out`.
  """
  if out.exists() and not out.is_dir():
    raise ConfigError(f"out: {out} exists and is not a directory")
  if is_run_directory(out):
    which = (
      "is the run's work directory" if out.resolve() == workdir.resolve() else "holds a txf run"
    )
    raise ConfigError(
      f"out: {out} {which} (its config.json would be replaced); export to a directory of its own"
    )


def export_run(workdir: str | os.PathLike, out: str | os.PathLike) -> Export:
  """Writes the latest checkpoint of the txf run in `workdir` as a Hugging
  Face model directory `out`: config.json and model.safetensors
  (txf.interop.save_pretrained: GPT-2 for a decoder, BERT for an encoder, T5
  for an encoder-decoder), the run's tokenizer as tokenizer.json with
  tokenizer_config.json where it has that form
  (txf.data.tokenizers.hf_tokenizer_files), and generation_config.json with
  its special ids. Nothing is written when the model does not map.

  Raises:
    ConfigError: `workdir` holds no run or checkpoint, or `out` is a run's
      directory (see `check_out`).
    CheckpointError: the model fields its architecture cannot hold, all of
      them in one line (see txf.interop.hf_config.require).
  """
  workdir, out = epath.Path(workdir), epath.Path(out)
  if read_run_config(workdir) is None:
    raise ConfigError(f"workdir: {workdir} holds no run ({workdir / CONFIG} does not exist)")
  check_out(workdir, out)
  trained = load_trained(workdir)
  pretrained = trained.pretrained
  try:
    tokenizer_files: dict[str, str] = hf_tokenizer_files(trained.tokenizer)
    no_tokenizer = None
  except ValueError as error:
    tokenizer_files, no_tokenizer = {}, str(error)
  token_ids = {key: value for key, value in pretrained.token_ids.items() if value is not None}
  interop.save_pretrained(pretrained.config, pretrained.params, out, token_ids=token_ids)
  architecture = json.loads((out / CONFIG).read_text())["architectures"][0]
  generation: dict[str, Any] = {k: v for k, v in token_ids.items() if k != "pad_token_id"}
  files = {GENERATION_CONFIG: json.dumps(generation, indent=2, sort_keys=True) + "\n"}
  files.update(tokenizer_files)
  for name, text in files.items():
    (out / name).write_text(text)
  return Export(
    directory=out,
    architecture=architecture,
    step=trained.step,
    files=(CONFIG, SAFETENSORS, *files),
    no_tokenizer=no_tokenizer,
  )
