"""A trained txf run written as a Hugging Face model (txf-export); its
latest checkpoint is read the way txf.interop reads a Hugging Face directory
by txf.train.run_setup.load_trained (txf-generate, txf-embed and train.init_from
take either).

  export_run("runs/gpt2_tiny", "out/hf")    # config.json, model.safetensors, tokenizer.json

A run is read through txf.train.run_setup.load_trained (its config.json, the latest
checkpoint, its tokenizer; nothing in the run is written); a run of R > 1
seed replicas gives its first replica (seed `seed`). The export writes the
families txf.interop writes, chosen by the model's fields
(txf.interop.checkpoint.decoder_family): a decoder as GPT-2 (learned
positions), Llama (RoPE and RMSNorm: a gated feed-forward, any key/value
heads) or GPT-NeoX (RoPE and LayerNorm: an ungated one), an encoder as
BERT, an encoder-decoder as T5 -- when the architecture represents the model
exactly; otherwise it names every field that does not map
(CheckpointError) before anything is written. txf's default decoder
(configs/rope.py) is written as GPT-NeoX, its tied logits scaled by
d_model^-0.5 as an untied output matrix holding the scale
(txf.interop.decoder).

The export owns its output directory: it is written whole or not at all (a
temporary sibling, renamed into place), and it replaces only an empty
directory or an earlier export (recognised by the EXPORT_MARKER file each
export writes), never a directory holding files it did not write.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

from etils import epath

from txf import interop
from txf.data.tokenizers import HFTokenizer, hf_tokenizer_files
from txf.interop.tensors import CONFIG, SAFETENSORS
from txf.runconfig.run_config import ConfigError
from txf.rundir.resume import is_run_directory
from txf.rundir.workdir import WorkdirError, check_reachable, check_writable, run_path
from txf.storage import (
  holds_current_directory,
  is_local,
  remove_stale_temporaries,
  temporary_sibling,
  write_error,
  write_files,
)
from txf.train.run_setup import TrainedModel, check_holds_run, load_trained

GENERATION_CONFIG = "generation_config.json"
# Written into every export: an output directory holding it is an earlier
# export, which the next one may replace (its JSON names the run and step).
EXPORT_MARKER = ".txf-export"
# Every name an export may write (`export_files` and the marker): an earlier
# export is replaced whole only where it holds nothing else.
EXPORT_NAMES = frozenset(
  {
    CONFIG,
    SAFETENSORS,
    GENERATION_CONFIG,
    "tokenizer.json",
    *HFTokenizer.SPECIAL_FILES,
    EXPORT_MARKER,
  }
)


def reachable_directory(path: str | os.PathLike, name: str) -> epath.Path:
  """`path` (a local directory or a URL, argument `name`) as a path
  (txf.rundir.workdir.run_path), a URL looked at once (check_reachable), so
  that a bucket that cannot be reached is one line within REACH_TIMEOUT_S
  seconds rather than a minute of a client's retries.

  Raises:
    WorkdirError: a URL txf cannot use or reach.
  """
  directory = run_path(path, name)
  check_reachable(directory)
  return directory


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
  checkpoint's step, the files, why no tokenizer was written (None when
  one was), whether it replaced an earlier export there, and which seed
  replica of a run of several it wrote (TrainedModel.replica_read)."""

  directory: epath.Path
  architecture: str
  step: int
  files: tuple[str, ...]
  no_tokenizer: str | None
  replaced: bool = False
  replica: str | None = None


def check_out(workdir: epath.Path, out: epath.Path) -> bool:
  """Refuses an output directory the export does not own: a URL (an object
  store has no directory to rename into place), a symbolic link, the
  current directory or one above it, a file, a run's directory (its
  config.json would be replaced), a directory holding files no export
  wrote, or one that cannot be written (`out` where it exists, a read-only
  mount included, and the nearest directory above it that does). Creates
  nothing: a refused export leaves no directory behind.

  Returns:
    Whether `out` holds an earlier export (which the export replaces).

  Raises:
    ConfigError: naming `out` and the reason.
  """
  if not is_local(out):
    raise ConfigError(
      f"out: {out}: txf-export writes a local directory; export to one, then copy it "
      "(gcloud storage cp -r)"
    )
  local = pathlib.Path(out)
  if local.is_symlink():
    # Replacing it would replace the link, leaving the export it names as it was.
    raise ConfigError(
      f"out: {out} is a symbolic link (to {local.resolve()}); export to that directory itself"
    )
  if holds_current_directory(local):  # `out` is absolute and normal (export_run)
    raise ConfigError(
      f"out: {out} holds the current directory, which the export would replace; "
      "export to a directory of its own (--out=export)"
    )
  if out.exists() and not out.is_dir():
    raise ConfigError(f"out: {out} exists and is not a directory")
  if is_run_directory(out):
    which = (
      "is the run's work directory" if out.resolve() == workdir.resolve() else "holds a txf run"
    )
    raise ConfigError(
      f"out: {out} {which} (its config.json would be replaced); export to a directory of its own"
    )
  mount = os.path.ismount(out)  # a volume: written into (write_directory)
  found = sorted(path.name for path in out.iterdir()) if out.exists() else []
  if mount:  # a freshly formatted volume's: not a file of the user's
    found = [name for name in found if name != "lost+found"]
  # Replacing an earlier export removes what it holds: a file of the user's
  # put beside one is as much not the export's as a directory of their own.
  foreign = found if EXPORT_MARKER not in found else sorted(set(found) - EXPORT_NAMES)
  if foreign:
    shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
    raise ConfigError(
      f"out: {out} holds files txf-export did not write ({shown}); export to a new or "
      "empty directory"
    )
  # Where the export is staged (out's parent, made by the write if missing)
  # and `out` itself: each probed where it exists, so nothing is created. A
  # mount point is written into: its parent (often read-only) is not used.
  existing = [path for path in (out, *out.parents) if path.exists()]
  probed = existing[:2] if existing[0] == out and not mount else existing[:1]
  try:
    for directory in probed:
      check_writable(directory)
  except WorkdirError as error:
    raise ConfigError(f"out: {error}") from None
  return bool(found)


def export_files(trained: TrainedModel) -> tuple[dict[str, bytes], str | None]:
  """The files of `trained`'s export (name -> contents: see `export_run`)
  and why it has no tokenizer (None when it has one).

  Raises:
    CheckpointError: the model fields its architecture cannot hold, or a
      decoder trained for a task that is not a causal LM
      (`TrainedModel.check_runs_causally`).
  """
  try:
    trained.check_runs_causally()
  except ValueError as error:
    raise interop.CheckpointError(str(error)) from None
  pretrained = trained.pretrained
  try:
    tokenizer_files: dict[str, str] = hf_tokenizer_files(trained.tokenizer)
    no_tokenizer = None
  except ValueError as error:
    tokenizer_files, no_tokenizer = {}, str(error)
  token_ids = {key: value for key, value in pretrained.token_ids.items() if value is not None}
  files = interop.pretrained_files(pretrained.config, pretrained.params, token_ids=token_ids)
  generation: dict[str, Any] = {k: v for k, v in token_ids.items() if k != "pad_token_id"}
  texts = {GENERATION_CONFIG: json.dumps(generation, indent=2, sort_keys=True) + "\n"}
  texts.update(tokenizer_files)
  files.update({name: text.encode("utf-8") for name, text in texts.items()})
  return files, no_tokenizer


def write_directory(out: str | os.PathLike, files: Mapping[str, bytes]) -> None:
  """Writes `files` (name -> contents) as the local directory `out`, whole or
  not at all: into a temporary sibling (txf.storage.temporary_sibling:
  .NAME.<host>-<pid>-<hex>.tmp; a killed export's is removed by the next), which then takes
  the place of `out` (an existing `out` is moved aside, then removed), so
  `out` ends up holding exactly `files`. A failure leaves `out` as it was
  and no temporary behind.

  Raises:
    WriteError: '<path>: <reason>' (a full disk, ...).
  """
  out = epath.Path(out)
  if os.path.ismount(out):  # a volume: it cannot be renamed over (EBUSY)
    _write_into_mount(out, files)
    return
  # A killed export's staged model (as large as the model) is removed by the next.
  remove_stale_temporaries(out.parent, held=False)
  staging = temporary_sibling(out)
  try:
    writing = out  # named in the error as the file it becomes
    try:
      staging.mkdir(parents=True)
      # The directory is the temporary: its files need none of their own.
      for name, data in files.items():
        writing = out / name
        (staging / name).write_bytes(data)
    except OSError as error:
      raise write_error(writing, error) from error
    _move_into_place(staging, out)
  finally:
    shutil.rmtree(staging, ignore_errors=True)


def _write_into_mount(out: epath.Path, files: Mapping[str, bytes]) -> None:
  """`files` written into `out`, a mount point (a container's volume), as one
  set (txf.storage.write_files: every file staged beside its place before
  any is renamed) rather than as a directory renamed into place; an earlier
  export's files that `files` do not hold are removed after."""
  write_files({out / name: data for name, data in files.items()})
  for name in EXPORT_NAMES - set(files):
    (out / name).unlink(missing_ok=True)


def _move_into_place(directory: epath.Path, out: epath.Path) -> None:
  """Renames `directory` to `out`, replacing an `out` there (put back if the
  rename fails)."""
  aside = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.old")
  try:
    if out.exists():
      out.rename(aside)
    directory.rename(out)
  except BaseException as error:  # a failed rename, or a Ctrl-C between the two
    if aside.exists() and not out.exists():
      aside.rename(out)
    if isinstance(error, OSError):
      raise write_error(out, error) from error
    raise
  shutil.rmtree(aside, ignore_errors=True)


def export_run(workdir: str | os.PathLike, out: str | os.PathLike) -> Export:
  """Writes the latest checkpoint of the txf run in `workdir` (local or a
  URL) as a Hugging Face model directory `out` (local): config.json and
  model.safetensors (txf.interop.pretrained_files: GPT-2, Llama or GPT-NeoX
  for a decoder, by its fields; BERT for an encoder, T5 for an
  encoder-decoder), the run's tokenizer as
  tokenizer.json with tokenizer_config.json where it has that form
  (txf.data.tokenizers.hf_tokenizer_files), generation_config.json with its
  special ids, and EXPORT_MARKER. `out` is written whole or not at all
  (`write_directory`); an earlier export there is replaced. Nothing is
  written when the model does not map.

  Raises:
    WorkdirError: `workdir` is a URL txf cannot use or reach.
    ConfigError: `workdir` holds no run or checkpoint, or `out` is empty or
      not the export's to write (see `check_out`) -- before any compute.
    CheckpointError: the model fields its architecture cannot hold, all of
      them in one line (see txf.interop.hf_config.require).
    WriteError: a file could not be written (a full disk); `out` is as it was.
  """
  workdir = reachable_directory(workdir, "workdir")
  if not os.fspath(out):
    raise ConfigError("out: empty; name the directory to export into")
  out = run_path(out, "out")
  if is_local(out):
    # '.' and 'X/..' name no directory to stage beside (the export is
    # written into a sibling of its name, then renamed into place).
    out = epath.Path(os.path.abspath(out))
  check_holds_run(workdir)
  replaced = check_out(workdir, out)
  trained = load_trained(workdir)
  files, no_tokenizer = export_files(trained)
  marker = {"workdir": os.fspath(workdir), "step": trained.step}
  files[EXPORT_MARKER] = (json.dumps(marker) + "\n").encode("utf-8")
  write_directory(out, files)
  architecture = json.loads(files[CONFIG])["architectures"][0]
  return Export(
    directory=out,
    architecture=architecture,
    step=trained.step,
    files=tuple(name for name in files if name != EXPORT_MARKER),
    no_tokenizer=no_tokenizer,
    replaced=replaced,
    replica=trained.replica_read,
  )
