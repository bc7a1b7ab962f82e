"""Experiment trackers: writers that get a run's config, metrics and samples
beside metrics.jsonl and TensorBoard (txf.train.metrics.MetricsWriter fans
out to them).

A run names its trackers in the config field `train.trackers` (a string,
names separated by commas, or a list of names; empty: none):

  wandb  Weights & Biases (the wandb extra, txf.extras; imported only
         when named). The project is $WANDB_PROJECT (default 'txf'), the run's
         name the work directory's; wandb's own settings (WANDB_MODE=offline,
         WANDB_ENTITY, ...) apply. wandb's files go to the work directory's
         wandb/ (WANDB_DIR's, where it is set or the work directory is not
         local). The wandb run id is kept in the
         work directory (wandb_run_id.txt), so a run restarted after a
         preemption continues the same wandb run. Before anything is
         written, the run checks that wandb will not stop for a login
         (offline, or an API key found) and that the kept id is one.
         Metrics are logged under `metric_tag`'s names (train/loss,
         eval/loss, perf/tokens_per_sec, ...); the samples are one table,
         eval/samples, of (step, sample) rows, logged again at each sample.

Only process 0 tracks. Another tracker is one class with the `Tracker`
methods, a name in `TRACKERS` and its start-up check in `CHECKS`.
"""

from __future__ import annotations

import importlib.util
import os
import re
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from etils import epath

from txf.extras import install_hint
from txf.train.workdir import is_local, read_text, replace_text

WANDB_ID_FILE = "wandb_run_id.txt"
WANDB_SAMPLES = "eval/samples"  # the wandb table of the samples
# Metrics of the hardware's speed, not of the model: grouped under perf/.
PERF_METRICS = frozenset({"tokens_per_sec", "steps_per_sec", "step_time", "mfu"})
METRIC_GROUPS = ("train", "eval", "perf")
# What wandb takes as a run id: none of / \ # ? % : nor whitespace.
_WANDB_RUN_ID = re.compile(r"[^/\\#?%:\s]{1,128}")


def metric_tag(name: str) -> str:
  """The name a dashboard (TensorBoard, wandb) shows a metrics.jsonl field
  under, grouped by what it measures: 'eval_<x>' -> 'eval/<x>' (eval_loss ->
  eval/loss, eval_loss/0 -> eval/loss/0), throughput -> 'perf/<name>'
  (tokens_per_sec, steps_per_sec, step_time, mfu), any other -> 'train/<name>'
  (loss, loss_std, accuracy, grad_norm, learning_rate). A name already in a
  group ('eval/...') is kept."""
  if name.split("/", 1)[0] in METRIC_GROUPS:
    return name
  if name.startswith("eval_"):
    return "eval/" + name.removeprefix("eval_")
  return ("perf/" if name in PERF_METRICS else "train/") + name


class Tracker(Protocol):
  """What MetricsWriter and the loop call on a tracker."""

  def log_config(self, config: Mapping[str, Any]) -> None:
    """The run's resolved config (nested dicts of JSON values)."""

  def log_metrics(self, step: int, scalars: Mapping[str, int | float]) -> None:
    """One metrics row (as metrics.jsonl holds it, without step and time)."""

  def log_sample(self, step: int, text: str) -> None:
    """Text sampled at an evaluation."""

  def log_summary(self, metrics: Mapping[str, int | float]) -> None:
    """The run's final metrics."""

  def close(self) -> None:
    """Finishes the tracker's run (uploads what is pending)."""


class WandbTracker:
  """Weights & Biases (see the module docstring)."""

  def __init__(self, workdir: epath.Path):
    import wandb  # noqa: PLC0415 (an optional dependency, imported when named)

    self._wandb = wandb
    self._workdir = workdir
    run_id = _wandb_run_id(workdir)
    if not run_id:
      run_id = uuid.uuid4().hex[:12]  # wandb ids: letters and digits
      replace_text(workdir / WANDB_ID_FILE, run_id + "\n")  # before init: a crash keeps the id
    self.run_id = run_id
    # (step, text) of the samples table; read from samples.txt at the first sample.
    self._samples: list[tuple[int, str]] | None = None
    self._run = wandb.init(
      project=os.environ.get("WANDB_PROJECT", "txf"),
      id=run_id,
      name=workdir.name,
      resume="allow",
      dir=wandb_dir(workdir),
    )

  def log_config(self, config: Mapping[str, Any]) -> None:
    self._run.config.update(dict(config), allow_val_change=True)

  def log_metrics(self, step: int, scalars: Mapping[str, int | float]) -> None:
    # wandb drops (with a warning) rows at steps below its last, which a run
    # resumed from an earlier checkpoint trains again.
    self._run.log({metric_tag(name): value for name, value in scalars.items()}, step=step)

  def log_sample(self, step: int, text: str) -> None:
    if self._samples is None:  # a resumed run's table starts with the samples kept before
      from txf.train.metrics import read_samples  # noqa: PLC0415 (metrics imports this module)

      self._samples = [(s, t) for s, t in read_samples(self._workdir) if s < step]
    self._samples.append((step, text))
    # A wandb Table is immutable once logged: each sample logs the whole table again.
    table = self._wandb.Table(columns=["step", "sample"], data=[list(row) for row in self._samples])
    self._run.log({WANDB_SAMPLES: table}, step=step)

  def log_summary(self, metrics: Mapping[str, int | float]) -> None:
    self._run.summary.update({metric_tag(name): value for name, value in metrics.items()})

  def close(self) -> None:
    self._run.finish()


def wandb_dir(workdir: epath.Path) -> str | None:
  """The directory wandb writes its wandb/ into: $WANDB_DIR where it is set,
  else the run's work directory when it is local (None, wandb's default:
  the current directory, for one on object storage)."""
  if os.environ.get("WANDB_DIR"):
    return os.environ["WANDB_DIR"]
  return os.fspath(workdir) if is_local(workdir) else None


def _wandb_run_id(workdir: epath.Path) -> str:
  """The wandb run id kept in `workdir` ('' if none is).

  Raises:
    ValueError: naming the file, when it holds no run id wandb takes.
  """
  path = workdir / WANDB_ID_FILE
  run_id = (read_text(path) or "").strip()
  if run_id and not _WANDB_RUN_ID.fullmatch(run_id):
    raise ValueError(
      f"{path}: not a wandb run id ({run_id[:40]!r}); delete the file to start a new wandb run"
    )
  return run_id


def _check_wandb(workdir: epath.Path) -> None:
  """That wandb can start a run in `workdir` without asking for anything:
  the run id kept there is one, and wandb runs offline or disabled
  (WANDB_MODE) or finds an API key (WANDB_API_KEY, ~/.netrc, its settings)
  -- without the network, as wandb.init would find it.

  Raises:
    ValueError: naming what is missing.
  """
  _wandb_run_id(workdir)
  try:  # wandb's own lookup, without prompting (wandb.login would ask the server who we are)
    from wandb.errors import Error  # noqa: PLC0415 (an optional dependency)
    from wandb.sdk import wandb_setup  # noqa: PLC0415
    from wandb.sdk.lib import wbauth  # noqa: PLC0415
  except ImportError:  # a wandb without that lookup: wandb.init says what is missing
    return
  settings = wandb_setup.singleton().settings
  if settings.mode in ("offline", "dryrun", "disabled"):
    return
  try:
    found = wbauth.authenticate_session(
      host=settings.base_url, source="txf", prompt=False, update_session=False
    )
  except TypeError:  # a wandb whose lookup takes other arguments: wandb.init says
    return
  except Error as error:  # e.g. a malformed WANDB_API_KEY
    raise ValueError(f"train.trackers: wandb: {' '.join(str(error).split())}") from None
  if found is None:
    raise ValueError(
      "train.trackers: wandb has no API key (none in WANDB_API_KEY, ~/.netrc or its "
      "settings): run `wandb login`, or set WANDB_MODE=offline to log offline"
    )


# name -> a tracker for a run's work directory.
TRACKERS: dict[str, Callable[[epath.Path], Tracker]] = {"wandb": WandbTracker}
# name -> its check that it can start in a work directory (before anything is written).
CHECKS: dict[str, Callable[[epath.Path], None]] = {"wandb": _check_wandb}
# name -> the package it needs (checked with the config, before anything is written).
PACKAGES = {"wandb": "wandb"}


def _installed(package: str) -> bool:
  try:
    return importlib.util.find_spec(package) is not None
  except (ImportError, ValueError, AttributeError):  # e.g. sys.modules[package] is None
    return False


def tracker_names(value: Any, field: str = "train.trackers") -> tuple[str, ...]:
  """The tracker names of a config's `train.trackers` ('wandb', 'a,b', a list
  of names; '' or None: none).

  Raises:
    ValueError: naming `field`, for an unknown name or a value of another type.
  """
  if value is None:
    return ()
  if isinstance(value, str):
    names = [name.strip() for name in value.split(",") if name.strip()]
  elif isinstance(value, list | tuple) and all(isinstance(name, str) for name in value):
    names = [name.strip() for name in value]
  else:
    raise ValueError(f"{field}: expected tracker names (a string or a list), got {value!r}")
  for name in names:
    if name not in TRACKERS:
      raise ValueError(f"{field}: unknown tracker {name!r} (known: {', '.join(sorted(TRACKERS))})")
  for name in names:
    package = PACKAGES.get(name)
    if package and not _installed(package):
      raise ValueError(f"{field}: {name!r} needs the {package} package: {install_hint(name)}")
  return tuple(dict.fromkeys(names))


def check_trackers(names: tuple[str, ...], workdir: epath.Path) -> None:
  """That each named tracker can start in `workdir` (a login, a readable run
  id): call before anything is written, on process 0.

  Raises:
    ValueError: naming what is missing.
  """
  for name in names:
    CHECKS[name](workdir)


def make_trackers(names: tuple[str, ...], workdir: epath.Path) -> tuple[Tracker, ...]:
  """The named trackers for the run in `workdir` (call on process 0 only);
  a failure to start one closes those started and raises."""
  trackers: list[Tracker] = []
  try:
    for name in names:
      try:
        trackers.append(TRACKERS[name](workdir))
      except ImportError as error:
        raise ImportError(
          f"train.trackers: {name!r} needs the {name} package: {install_hint(name)}"
        ) from error
  except BaseException:
    for tracker in trackers:
      tracker.close()
    raise
  return tuple(trackers)
