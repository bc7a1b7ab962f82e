"""Experiment trackers: writers that get a run's config, metrics and samples
beside metrics.jsonl and TensorBoard (txf.rundir.metrics.MetricsWriter fans
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
         preemption continues the same wandb run; wandb ignores rows at
         steps at or below its run's last, so the steps trained again after
         a resume from an earlier checkpoint keep the first session's
         values there. Before anything is
         written, the run checks that wandb will not stop for a login
         (offline, or an API key found) and that the kept id is one.
         Metrics are logged under `metric_tag`'s names (train/loss,
         eval/loss, perf/tokens_per_sec, ...); the samples are one table,
         eval/samples, of (step, sample) rows, logged again at each sample.

Only process 0 tracks. Each name is an entry of `TRACKERS` (a
`TrackerKind`: how to start the tracker, its start-up check, the package it
needs); another tracker is one class with the `Tracker` methods
(txf.runconfig.tracking), registered from user code with `txf.register.tracker`.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

from etils import epath

from txf.choices import require_method_signatures
from txf.extras import install_hint
from txf.runconfig.run_config import ConfigError
from txf.runconfig.tracker_kinds import TRACKERS, TrackerKind
from txf.runconfig.tracking import TRACKER_ARGUMENTS, Tracker, metric_tag
from txf.rundir.metrics import read_samples
from txf.storage import is_local, read_text, write_file

WANDB_ID_FILE = "wandb_run_id.txt"
WANDB_SAMPLES = "eval/samples"  # the wandb table of the samples
# What wandb takes as a run id: none of / \ # ? % : nor whitespace.
_WANDB_RUN_ID = re.compile(r"[^/\\#?%:\s]{1,128}")


class WandbTracker:
  """Weights & Biases (see the module docstring)."""

  def __init__(self, workdir: epath.Path):
    import wandb  # noqa: PLC0415 (an optional dependency, imported when named)

    self._wandb = wandb
    self._workdir = workdir
    run_id = _wandb_run_id(workdir)
    if not run_id:
      run_id = uuid.uuid4().hex[:12]  # wandb ids: letters and digits
      write_file(workdir / WANDB_ID_FILE, run_id + "\n")  # before init: a crash keeps the id
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


# txf's trackers, in the registry train.trackers reads
# (txf.runconfig.tracker_kinds, which imports this module when first read).
TRACKERS.register(
  "wandb",
  TrackerKind(WandbTracker, check=_check_wandb, package="wandb", install=install_hint("wandb")),
  provider=WandbTracker,
)


def check_trackers(names: tuple[str, ...], workdir: epath.Path) -> None:
  """That each named tracker can start in `workdir` (a login, a readable run
  id): call before anything is written, on process 0.

  Raises:
    ValueError: naming what is missing.
  """
  for name in names:
    check = TRACKERS[name].check
    if check is not None:
      check(workdir)


def _start(name: str, workdir: epath.Path) -> Tracker:
  """The tracker `name` started for the run in `workdir`.

  Raises:
    ImportError: naming the package to install, where its package is missing.
    ConfigError: naming the methods the started tracker lacks (a registered
      function's: a class's are checked at registration), before the run
      writes anything through it.
  """
  kind = TRACKERS[name]
  try:
    tracker = kind.start(workdir)
  except ImportError as error:
    if kind.package is None:  # not the package it declares: the error as it is
      raise
    raise ImportError(f"{TRACKERS.field}: {kind.needs(name)}") from error
  try:
    require_method_signatures(TRACKERS.field, name, tracker, TRACKER_ARGUMENTS)
  except ValueError as error:
    # Known only once a registered function has made it, after the run
    # opened its checkpoint directory: still the config's error (one line,
    # exit 2), before anything is written through it.
    raise ConfigError(str(error)) from None
  return tracker


def make_trackers(names: tuple[str, ...], workdir: epath.Path) -> tuple[Tracker, ...]:
  """The named trackers for the run in `workdir` (call on process 0 only);
  a failure to start one closes those started and raises."""
  trackers: list[Tracker] = []
  try:
    for name in names:
      trackers.append(_start(name, workdir))
  except BaseException:
    for tracker in trackers:
      tracker.close()
    raise
  return tuple(trackers)
