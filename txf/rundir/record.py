"""A run's record: what each start of a run trained with, in the work
directory's run_record.json -- a JSON list, one object per start (a resumed
run appends one), rewritten atomically:

  start, end     UTC timestamps (ISO 8601); end is null until that start
                 ends (stays null when it crashed) and `ended` says how:
                 'finished', 'preempted' (SIGTERM), 'interrupted' (Ctrl-C)
                 or the error's type
  start_step     the step it continued from (0: a fresh start)
  argv           the command line (sys.argv)
  config_file    the config file the run was loaded from, resolved
                 ('/.../txf/configs/rope.py'; ':arg' appended where given);
                 null when not loaded from a file (a config built in Python)
  git            {'commit', 'dirty'} of the txf checkout it ran from; null
                 outside a git checkout (or without git)
  environment    Python, jax/jaxlib/flax/optax/orbax versions, devices and
                 their kind, process count (txf.hardware.environment)
  data           {'name', 'sha256', ...}: the data source described (for the
                 built-in corpus its Python version, files and bytes; for
                 text files their count, the bytes the splits read and a
                 hash of those; for a TFDS dataset the prepared version it
                 reads, 'tfds_version') and a hash of that description
  config         the fully resolved config: the checked RunConfig's fields,
                 derived ones filled in (model.vocab_size, head_dim, d_ff, ...)
  tokenizer      {'kind', 'sha256'}: data.tokenizer (null for a generated
                 task's own) and the SHA-256 of the files that define its ids
                 (the sentencepiece model, the HF tokenizer files; null for
                 txf's byte and symbol tokenizers); a run started from this
                 one (train.init_from) is refused when its tokenizer differs
  choices        {field: {'name', 'module', 'function', 'builtin', 'path'}}
                 for every registered choice the run uses (model.family,
                 head, position, norm, activation, init; data.name,
                 data.tokenizer; train.decay): the
                 function or class that provided it (txf.choices) and, for
                 user code, the directory its package was imported from.
                 A later command on the run (load_run, a resume) imports
                 that module or refuses naming it (`check_choices`)

config.json is the run's config as it trains (txf.rundir.resume; the same
`config` as here); this file is only written. Runs written before it have
none and load and resume as before.
A start reads only the record's last entry and encodes only its own, so a
long record costs a copy of its text, not a parse (RunRecord).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import importlib
import json
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from typing import Any

from etils import epath

from txf import hardware
from txf.choices import Registry
from txf.data.spec import GENERATED, TASKS, TEXT, TOKENIZERS
from txf.layers.model_config import ACTIVATIONS, FAMILIES, HEADS, INITS, NORMS
from txf.layers.positions import ENCODINGS
from txf.progress import say
from txf.runconfig.optim import DECAYS
from txf.runconfig.run_config import RunConfig, to_json
from txf.runconfig.tracker_kinds import TRACKERS
from txf.storage import parse_json, read_text, write_error, write_file

RECORD_FILE = "run_record.json"
_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "txf")


def _now() -> str:
  return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _git(directory: pathlib.Path, *args: str) -> str:
  return subprocess.run(
    ["git", "-C", str(directory), *args], capture_output=True, text=True, check=True, timeout=10
  ).stdout.strip()


@functools.cache
def git_state(package_dir: str | None = None) -> dict[str, Any] | None:
  """{'commit': sha, 'dirty': bool} of the git checkout that holds the txf
  package (`package_dir`: another package directory, for tests); None when
  it is not in one (an installed txf) or git is missing or fails."""
  directory = pathlib.Path(package_dir or pathlib.Path(__file__).parents[1]).resolve()
  try:
    top = pathlib.Path(_git(directory, "rev-parse", "--show-toplevel")).resolve()
    if top / directory.name != directory:  # not the checkout's own package
      return None
    commit = _git(directory, "rev-parse", "HEAD")
    dirty = bool(_git(directory, "status", "--porcelain", "--untracked-files=no"))
  except (OSError, subprocess.SubprocessError):
    return None
  return dict(commit=commit, dirty=dirty)


def environment() -> dict[str, Any]:
  """hardware.environment() with the versions of every package a run uses."""
  env = hardware.environment(_PACKAGES)
  env.pop("date", None)  # each entry has its own start and end
  return env


def data_description(run: RunConfig) -> dict[str, Any]:
  """The run's data described as cheaply as is stable, with a SHA-256 of it."""
  from txf.data import tfds_source  # noqa: PLC0415 (imports the data pipeline's modules)
  from txf.data.spec import text_source  # noqa: PLC0415
  from txf.data.text import TFDSSource  # noqa: PLC0415

  spec = dataclasses.asdict(run.data)
  description: dict[str, Any] = dict(name=run.data.name, fields=spec)
  text = text_source(run.data.name)
  fingerprint = None if text is None else text.fingerprint(run.data)
  if fingerprint is not None:
    description["corpus"] = fingerprint
  if isinstance(text, TFDSSource):
    description["tfds_version"] = tfds_source.resolved_version(run.data)
  description["sha256"] = hashlib.sha256(
    json.dumps(description, sort_keys=True, default=repr).encode("utf-8")
  ).hexdigest()
  return description


def tokenizer_description(run: RunConfig, workdir: str | epath.PathLike) -> dict[str, Any]:
  """{'kind': data.tokenizer, 'sha256': the tokenizer's (Tokenizer.sha256)}
  of the run in `workdir` (its sentencepiece model is there by now)."""
  from txf.data import make_tokenizer  # noqa: PLC0415 (the data pipeline's modules)

  return dict(kind=run.data.tokenizer, sha256=make_tokenizer(run.data, workdir).sha256)


def recorded_tokenizer(workdir: str | epath.PathLike) -> dict[str, Any] | None:
  """The `tokenizer` of the run's last record entry; None for a run
  recorded before it was, or without a readable record."""
  tokenizer = _last_entry(workdir).get("tokenizer")
  return tokenizer if isinstance(tokenizer, dict) else None


def check_recorded_tokenizer(workdir: str | epath.PathLike, sha256: str | None, field: str) -> None:
  """Refuses a tokenizer whose contents (`sha256`, Tokenizer.sha256) differ
  from those the run in `workdir` recorded (`recorded_tokenizer`; nothing to
  compare for a run recorded before it was): the ids its weights were
  trained on would differ (an edited tokenizer.json, a sentencepiece model
  trained again on another corpus).

  Raises:
    ValueError: one line starting with `field`, naming both hashes.
  """
  recorded = recorded_tokenizer(workdir)
  if recorded is None or recorded.get("sha256") == sha256:
    return
  raise ValueError(
    f"{field}: the tokenizer's contents (sha256 {sha256}) differ from those {workdir} "
    f"trained with ({recorded.get('sha256')}): its ids would differ"
  )


# The config fields of one name whose choices user code registers
# (txf.register), besides data.name's two registries.
_REGISTRIES: dict[str, Registry[Any]] = {
  "model.family": FAMILIES,
  "model.head": HEADS,
  "model.position": ENCODINGS,
  "model.norm": NORMS,
  "model.activation": ACTIVATIONS,
  "model.init": INITS,
  "data.tokenizer": TOKENIZERS,
  "data.task": TASKS,
  "train.decay": DECAYS,
}
CHOICE_FIELDS = (*_REGISTRIES, "data.name")
# train.trackers names several: each recorded as train.trackers[i].
_TRACKERS_FIELD = "train.trackers"


def _registry_entry(field: str, name: Any) -> tuple[Registry[Any], str] | None:
  """(the registry, the entry's name) that `field` = `name` reads
  ('files:GLOB' is TEXT's 'files'); None for a name none holds."""
  if not isinstance(name, str):
    return None
  if field == "data.name":
    registry, name = (GENERATED, name) if name in GENERATED else (TEXT, name.partition(":")[0])
  elif field.startswith(f"{_TRACKERS_FIELD}["):
    registry = TRACKERS
  elif field in _REGISTRIES:
    registry = _REGISTRIES[field]
  else:  # a field a later txf records that this one does not know
    return None
  return (registry, name) if name in registry else None


def _choice(field: str, name: Any) -> dict[str, Any] | None:
  """The provenance (txf.choices.Registry.provenance) of `field` = `name`
  in this process; None where no registry holds the name."""
  found = _registry_entry(field, name)
  return None if found is None else found[0].provenance(found[1])


def _import_root(module: str) -> str | None:
  """The directory that imported module `module`'s top-level package was
  found in (what must be on the import path to import it again); None for
  a module not imported from a file."""
  file = getattr(sys.modules.get(module), "__file__", None)
  if not file:
    return None
  path = pathlib.Path(file).resolve()
  levels = module.count(".") + (path.name == "__init__.py")
  return str(path.parents[levels])


def registered_choices(run: RunConfig) -> dict[str, dict[str, Any]]:
  """{field: provenance, with 'path' (`_import_root`, null for txf's own)}
  of every registered choice `run` makes (CHOICE_FIELDS)."""
  chosen = {
    field: getattr(getattr(run, field.partition(".")[0]), field.partition(".")[2])
    for field in CHOICE_FIELDS
  }
  # A registered tracker is read with the config (its name checked), by
  # every later command too: its module is imported as the others'.
  chosen.update({f"{_TRACKERS_FIELD}[{i}]": name for i, name in enumerate(run.train.trackers)})
  choices = {}
  for field, name in chosen.items():
    choice = _choice(field, name)
    if choice is not None:
      choice["path"] = None if choice["builtin"] else _import_root(choice["module"])
      choices[field] = choice
  return choices


def _last_entry(workdir: str | epath.PathLike) -> dict[str, Any]:
  """The run's last record entry ({} for a run without a readable record:
  a start sets such a record aside, RunRecord)."""
  try:
    entries = read_record(workdir)
  except ValueError:
    return {}
  return entries[-1] if entries and isinstance(entries[-1], dict) else {}


def recorded_config(workdir: str | epath.PathLike) -> dict[str, Any] | None:
  """The `config` of the run's last record entry (None: no readable record,
  or an entry without one): the config that start trained with, as
  config.json held it."""
  config = _last_entry(workdir).get("config")
  return config if isinstance(config, dict) else None


def _recorded_choices(workdir: str | epath.PathLike) -> dict[str, Any]:
  """The `choices` of the run's last record entry ({} for a run recorded
  before they were)."""
  choices = _last_entry(workdir).get("choices")
  return choices if isinstance(choices, dict) else {}


def _described(choice: Mapping[str, Any]) -> str:
  """'module.function' of a provenance, or "txf's built-in (module)"."""
  if choice.get("builtin"):
    return f"txf's built-in ({choice.get('module')})"
  return f"{choice.get('module')}.{choice.get('function')}"


def _same(choice: Mapping[str, Any] | None, recorded: Mapping[str, Any]) -> bool:
  """Whether `choice` is the one `recorded`: the same function of the same
  module, or txf's built-in both times (a built-in may move within txf: a run
  recorded before txf.train was split names txf.train.tasks for `lm`)."""
  if choice is None:
    return False
  if choice["builtin"] and recorded.get("builtin") is True:
    return True
  return all(choice[key] == recorded.get(key) for key in ("module", "function"))


def _import_choice(field: str, recorded: Mapping[str, Any], workdir: str | epath.PathLike) -> None:
  """Imports the module that provided `recorded`, its recorded directory
  first on the import path (as the config file that first imported it had,
  txf.configs.load; nor writing bytecode beside it, for the same reason).

  Raises:
    ValueError: one line naming `field` and the module, when it does not import.
  """
  module, path = str(recorded.get("module")), recorded.get("path")
  if isinstance(path, str) and path not in sys.path:
    sys.path.insert(0, path)
  writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True
  try:
    importlib.import_module(module)
  except Exception as error:  # the user's module, or its absence
    first_line = (str(error).splitlines() or [""])[0]
    where = f" from {path}" if path else ""
    raise ValueError(
      f"{field}: the run in {workdir} trained with {_described(recorded)} as "
      f"{recorded.get('name')!r} (see {RECORD_FILE}), which does not import{where}: "
      f"{type(error).__name__}: {first_line}"
    ) from None
  finally:
    sys.dont_write_bytecode = writes_bytecode


def check_choices(workdir: str | epath.PathLike) -> None:
  """Makes each registered choice the run in `workdir` trained with, as its
  record names it (`registered_choices`), the one this process holds: a
  choice held from another module (a built-in where the run had user code,
  or the reverse) or not at all has the recorded module imported; a run
  recorded without choices, or a damaged entry (naming no module), is read
  as before. Called before its config.json
  is parsed (txf.rundir.resume.read_run_config), which reads the choices.

  Raises:
    ValueError: one line naming the field and the module, when that module
      does not import or still leaves the choice another's.
  """
  for field, recorded in _recorded_choices(workdir).items():
    # A damaged entry checks nothing, as a record that does not read (one
    # without its module was imported as module 'None', and refused so).
    if not isinstance(recorded, dict) or not isinstance(recorded.get("module"), str):
      continue
    name = recorded.get("name")
    if _same(_choice(field, name), recorded):
      continue
    _import_choice(field, recorded, workdir)
    now = _choice(field, name)
    if not _same(now, recorded):
      here = "not registered" if now is None else _described(now)
      raise ValueError(
        f"{field}: {name!r} is {here} here, not {_described(recorded)} that the run in "
        f"{workdir} trained with (see {RECORD_FILE})"
      )


def read_record(workdir: str | epath.PathLike) -> list[dict[str, Any]]:
  """The run's record ([] for a run without one).

  Raises:
    ValueError: naming the file, when it is not UTF-8 JSON, cannot be read
      or is not a list.
  """
  path = epath.Path(workdir) / RECORD_FILE
  text = read_text(path)
  return [] if text is None else _entries(text, path)


def _entries(text: str, path: epath.Path) -> list[dict[str, Any]]:
  """The entries of the record `text` read from `path` (ValueError naming it
  when it is not a JSON list)."""
  entries = parse_json(text, path)
  if not isinstance(entries, list):
    raise ValueError(f"{path}: not a run record (a JSON list)")
  return entries


def _entry_text(entry: dict[str, Any]) -> str:
  """`entry` laid out as json.dumps(entries, indent=1) lays out an entry of
  the list: each line one space in, so that an entry starts a line with ' {'
  (JSON strings hold no raw newline)."""
  return textwrap.indent(json.dumps(entry, indent=1), " ")


def _entries_before(text: str, path: epath.Path) -> tuple[str, dict[str, Any]]:
  """(the text of a record up to a new entry: '[' and its entries, each
  followed by ',', and its last entry ({} for none)) -- parsing only its
  last entry when the record is laid out as RunRecord writes it (a long
  record costs a copy, not a parse); else parsing it whole and writing it
  in that layout.

  Raises:
    ValueError: naming `path`, when it is not a record.
  """
  body = text.rstrip()
  last = body.rfind("\n {")
  if body.startswith("[\n {") and body.endswith("\n }\n]"):
    try:
      entry = json.loads(body[last:-2])
      if isinstance(entry, dict):
        return body[:-2] + ",\n", entry
    except json.JSONDecodeError:
      pass  # not as written here: parsed whole below
  entries = _entries(text, path)
  last_entry = entries[-1] if entries and isinstance(entries[-1], dict) else {}
  return "[\n" + "".join(_entry_text(entry) + ",\n" for entry in entries), last_entry


def _set_aside(path: epath.Path) -> epath.Path:
  """Renames `path` to the first free '<name>.corrupt', '<name>.corrupt.1', ..."""
  aside, n = path.with_name(f"{path.name}.corrupt"), 0
  while aside.exists():
    n += 1
    aside = path.with_name(f"{path.name}.corrupt.{n}")
  path.rename(aside)
  return aside


class RunRecord:
  """Appends this start of a run to the record (`start`) and fills its end
  (`end`); with `enabled=False` (other processes) nothing. Writes raise
  WriteError naming the file (txf.rundir.workdir).

  Only the new entry is encoded, and only the record's last entry parsed:
  the earlier entries are copied as they are. A record that does not read as
  one (not UTF-8 JSON, not a list, a directory) is renamed to
  run_record.json.corrupt (.1, ...) and `log` says so; the new record starts
  empty.
  """

  def __init__(self, workdir: str | epath.PathLike, *, enabled: bool = True, log=say):
    self._path = epath.Path(workdir) / RECORD_FILE
    self._enabled = enabled  # only process 0 writes
    self._log = log
    self._before = ""  # the record's text before this start's entry
    self._entry: dict[str, Any] | None = None
    # The step the run has trained to: its end_step where it ends on an error.
    self.step: int | None = None

  def _warn_if_corpus_changed(self, start_step: int, previous: Mapping[str, Any]) -> None:
    """A warning line when a resumed run's corpus (a `files:` file edited,
    another Python's standard library) is not the one its last start
    (`previous`, its entry) read: the run continues at the saved window
    count over the changed text."""
    if not start_step or self._entry is None:
      return
    before = previous.get("data")
    corpus = self._entry["data"].get("corpus")
    if not isinstance(before, dict) or "corpus" not in before or corpus is None:
      return
    if before["corpus"] != corpus:
      self._log(
        f"warning: data.name {self._entry['data']['name']!r}: the corpus differs from the "
        f"one the run read before step {start_step} ({RECORD_FILE}'s data.corpus); it "
        "continues at the saved window count over the changed text"
      )

  def start(self, run: RunConfig, start_step: int, config_file: str | None = None) -> None:
    """Appends this start's entry; `config_file`: the config file the run
    was loaded from (None: not from a file)."""
    self.step = start_step
    if not self._enabled:
      return
    previous: dict[str, Any] = {}  # the last start's entry
    try:
      text = read_text(self._path)
      self._before, previous = ("[\n", {}) if text is None else _entries_before(text, self._path)
    except ValueError as error:
      try:
        aside = _set_aside(self._path)
      except OSError as rename_error:
        raise write_error(self._path, rename_error) from rename_error
      self._log(f"{error}: moved to {aside.name}; the record starts again")
      self._before = "[\n"
    self._entry = dict(
      start=_now(),
      end=None,
      ended=None,
      start_step=start_step,
      end_step=None,  # every key from the start: a killed run's entry has them all
      argv=list(sys.argv),
      config_file=config_file,
      git=git_state(),
      environment=environment(),
      data=data_description(run),
      config=to_json(run),
      tokenizer=tokenizer_description(run, self._path.parent),
      choices=registered_choices(run),
    )
    self._warn_if_corpus_changed(start_step, previous)
    self._write()
    for field, choice in self._entry["choices"].items():
      # No file it came from: a config file's own module, a notebook's __main__.
      if not choice["builtin"] and choice["path"] is None:
        self._log(
          f"warning: {field} {choice['name']!r} comes from {choice['module']}, which later "
          "commands (txf-generate, txf-analyze, txf-export, txf-extrapolate) cannot "
          "import: register it in a module beside the config file and import that"
        )

  def end(self, how: str, end_step: int | None = None) -> None:
    """Fills this start's end: `how` it ended, at `end_step` (None: `step`,
    the step it trained to)."""
    if self._entry is None:
      return
    self._entry.update(end=_now(), ended=how, end_step=self.step if end_step is None else end_step)
    self._write()

  def _write(self) -> None:
    assert self._entry is not None
    write_file(self._path, self._before + _entry_text(self._entry) + "\n]\n")
