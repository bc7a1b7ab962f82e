"""Flag parsing and error reporting shared by txf's commands (txf.commands:
the console scripts `txf-<command>`; `python -m experiments.<command>` in a checkout):
every error a user can cause on the command line is one line on stderr and
exit status 2; a failure while running (a full disk, a diverged run) is one
line and exit status 1. `--help` (and --helpfull) exits 0; Ctrl-C (SIGINT)
where the command cannot save is one line, `interrupted`, and exit status
130, and a SIGTERM one line, `terminated`, and exit status 143 (txf-run and
txf-sweep save first and exit 0), each at once while the command starts and
otherwise once the file being written is removed; a reader that closes the
command's output (`txf-compile --help | head -5`) ends it quietly with exit
status 141 (128 + SIGPIPE, as a shell reports a command a closed pipe
stops)."""

from __future__ import annotations

import _thread
import ast
import contextlib
import functools
import os
import pathlib
import re
import select
import signal
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import ml_collections
from absl import app, flags
from etils import epath
from ml_collections import config_flags

from txf.configs import (
  DIRECTORY as CONFIG_DIRECTORY,
  SettingError,
  load as load_config,
  names as config_names,
  resolve as resolve_config,
)
from txf.storage import os_reason


class ConfigFileError(Exception):
  """The config file cannot be loaded. Not a ValueError: absl would wrap it
  into a multi-line flag error."""


class ConfigFileParser(flags.ArgumentParser):
  """Parses --config=file.py[:arg] like ml_collections' own parser (get_config(arg),
  then lock), but every way a config file can fail to load (missing, syntax
  error, get_config raising or exiting, returning something other than a
  ConfigDict) is a one-line ConfigFileError. `loaded` is then the file
  loaded, resolved (':arg' appended where given)."""

  loaded: str | None = None

  def parse(self, argument):
    file, *arg = argument.split(":", 1)
    resolved = resolve_config(file)  # --config=rope: the config txf ships by that name
    if resolved is None:
      what = "not a file" if pathlib.Path(file).exists() else "no such config file"
      names = config_names()
      runs = [name for name in names if not name.startswith("sweeps/")]
      sweeps = [name for name in names if name.startswith("sweeps/")]
      raise ConfigFileError(
        f"{file}: {what} (nor the name of a config txf ships: runs {', '.join(runs)}; "
        f"sweeps {', '.join(sweeps)})"
      )
    file = str(resolved.resolve())
    try:
      config = load_config(file, *arg)
    except SyntaxError as error:  # in the config, or in a module it imports
      raise ConfigFileError(f"{error.filename or file}:{error.lineno}: {error.msg}") from error
    except SettingError as error:
      raise ConfigFileError(f"{file}: {error}") from None
    except SystemExit as error:  # sys.exit() in the user's code: nothing would run
      raise ConfigFileError(f"{file}: exited (sys.exit({error.code!r})) while loading") from None
    except Exception as error:  # the user's code
      if _interrupted(error):  # a Ctrl-C in an extension's import comes back as ImportError
        raise KeyboardInterrupt from error
      first_line = (str(error).splitlines() or [""])[0]
      # txf's own errors (a GridError of make_grid) are lines written to be
      # read alone; another's type says what its message is of (KeyError: 'x').
      own = type(error).__module__.startswith("txf.")
      kind = "" if own else f"{type(error).__name__}: "
      raise ConfigFileError(f"{file}: {kind}{first_line}") from error
    if not isinstance(config, ml_collections.ConfigDict):
      raise ConfigFileError(
        f"{file}: get_config() returned {type(config).__name__}, not a ConfigDict"
      )
    config.lock()
    self.loaded = file + "".join(f":{a}" for a in arg)
    return config

  def flag_type(self):
    return "config object"


def _interrupted(error: BaseException) -> bool:
  """Whether a KeyboardInterrupt is among `error`'s causes or contexts."""
  seen = set()
  while error is not None and id(error) not in seen:
    if isinstance(error, KeyboardInterrupt):
      return True
    seen.add(id(error))
    error = error.__cause__ or error.__context__
  return False


def loaded_config_file() -> str | None:
  """The config file --config loaded, resolved (see ConfigFileParser)."""
  return getattr(flags.FLAGS["config"].parser, "loaded", None)


def config_purpose(path: pathlib.Path) -> str:
  """A config file's purpose: its docstring's first paragraph, on one line,
  read without importing it."""
  doc = ast.get_docstring(ast.parse(path.read_text()))
  return " ".join(doc.strip().split("\n\n")[0].split()) if doc else ""


HELP_WIDTH = 100


def config_files_help(directory: pathlib.Path) -> str:
  """The config files in `directory` (not below it), one entry each: the name
  `--config=` takes from anywhere (rope, sweeps/pe_ln) and its docstring's
  first paragraph, wrapped to HELP_WIDTH columns."""
  files = sorted(f for f in directory.glob("*.py") if f.name != "__init__.py")
  names = [f.relative_to(CONFIG_DIRECTORY).with_suffix("").as_posix() for f in files]
  width = max(map(len, names), default=0) + 4
  return "\n".join(
    textwrap.fill(
      config_purpose(f),
      HELP_WIDTH,
      initial_indent=f"  {name:<{width - 2}}",
      subsequent_indent=" " * width,
      break_on_hyphens=False,
    )
    for name, f in zip(names, files)
  )


def default_workdir(root: str, config_path: str) -> epath.Path:
  """root/<config file stem>, or root/<stem>_<arg> for --config=file.py:arg."""
  stem = pathlib.PurePath(config_path.split(":")[0]).stem
  arg = config_path.partition(":")[2]
  return epath.Path(root) / (f"{stem}_{arg}" if arg else stem)


def define_config_flag(help_text: str):
  """The required --config flag, parsed by ConfigFileParser, and a key flag of
  the calling command (listed by --help, not only --helpfull)."""
  holder = config_flags.DEFINE_config_file("config", None, help_text, lock_config=True)
  flags.FLAGS["config"].parser = ConfigFileParser()
  flags.mark_flag_as_required("config")
  caller = sys._getframe(1).f_globals["__name__"]
  flags.FLAGS.register_key_flag_for_module(caller, flags.FLAGS["config"])
  return holder


SWEEP_SECTIONS = ("base", "grid")


def is_sweep_config(config: Any) -> bool:
  """Whether `config` is a sweep config (sections base and grid, txf.sweep.grid)
  rather than a run config."""
  return hasattr(config, "keys") and all(section in config for section in SWEEP_SECTIONS)


def require_config_kind(kind: str) -> None:
  """Exits 2 with one line when --config is a sweep config given to a command
  that runs one config (`kind` 'run') or a run config given to the sweep
  (`kind` 'sweep')."""
  config = flags.FLAGS["config"].value
  file = config_flags.get_config_filename(flags.FLAGS["config"])
  if kind == "run" and is_sweep_config(config):
    fail(
      "config",
      f"{file}: a sweep config (sections base, grid), not a run config: "
      f"run it with txf-sweep --config={file} (python -m experiments.sweep in a checkout)",
    )
  if kind == "sweep" and not is_sweep_config(config):
    fail(
      "config",
      f"{file}: not a sweep config (it has no base and grid sections; a run config?): "
      f"run a run config with txf-run --config={file} (python -m experiments.run in a checkout)",
    )


def progress(line: str) -> None:
  """A command's progress line: on stderr, so that stdout holds only its
  result (a table another program may read)."""
  print(line, file=sys.stderr, flush=True)


def fail(kind: str, message: Any, status: int = 2) -> NoReturn:
  """One line `<kind> error: ...` on stderr, exit `status` (2: the user's input)."""
  print(f"{kind} error: {message}", file=sys.stderr)
  sys.exit(status)


def refuse_empty(*holders: flags.FlagHolder) -> None:
  """Path flags given empty (`--workdir=`, `$UNSET_VARIABLE`) are a flag
  error naming the flag: txf-run's and txf-sweep's took it for their
  default directory (resuming whatever run was there), other commands for
  the current directory."""
  for holder in holders:
    flags.register_validator(
      holder.name,
      lambda value: value is None or bool(value.strip()),
      message="empty; name a directory",
    )


def check_output_file(name: str, path: str | None) -> None:
  """An output file flag's value (`--json`, `--hlo`), checked before the
  work that writes it, not after: its directory exists and takes a file,
  and the path is a regular file or none (a device or a pipe, which the
  atomic write would replace, is not). One line naming flag `name`, exit 2."""
  from txf.rundir.workdir import WorkdirError, check_writable
  from txf.storage import is_replaceable

  if path is None:
    return
  local = pathlib.Path(path)
  if not path:
    fail("flag", f"{name}: {path}: an empty path")
  if local.is_dir():
    fail("flag", f"{name}: {path}: is a directory")
  if not local.parent.is_dir():
    fail("flag", f"{name}: {path}: no directory {local.parent}")
  try:
    replaceable = is_replaceable(local)
  except OSError as error:  # a link loop, no permission to look
    fail("flag", f"{name}: {path}: {error.strerror or error}")
  if not replaceable:
    fail("flag", f"{name}: {path}: not a regular file; name a file to write")
  try:
    check_writable(local.parent)
  except WorkdirError as error:
    fail("flag", f"{name}: {path}: {error}")


@contextlib.contextmanager
def run_errors():
  """Reports the errors of training, evaluating or reading a run as one line
  on stderr and an exit status: the user's input (config, work directory, a
  checkpoint that does not restore) 2; a diverged run or an output that
  cannot be written (a full disk) 1."""
  # Here, not at the top: importing txf loads jax, which --help need not wait for.
  from txf.runconfig.run_config import ConfigError
  from txf.rundir.checkpoint import CheckpointWriteError, RestoreError
  from txf.rundir.workdir import WorkdirError
  from txf.storage import WriteError
  from txf.train.loop import TrainingDiverged

  try:
    yield
  except ConfigError as error:
    fail("config", error)
  except WorkdirError as error:
    fail("workdir", error)
  except RestoreError as error:
    # After a failed restore, tensorstore may still finish a future on a
    # closed event loop and print a traceback at exit: leave at once.
    exit_now(2, f"checkpoint error: {' '.join(str(error).split())}")
  except TrainingDiverged as error:
    print(f"diverged: {error}", file=sys.stderr)
    sys.exit(1)
  except CheckpointWriteError as error:
    # orbax's threads may still wait for the failed save's commit and keep
    # the interpreter from ever exiting: leave without waiting for them.
    exit_now(1, f"checkpoint error: {error}")
  except WriteError as error:
    exit_now(1, f"write error: {error}")


def _out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's out-of-memory error (a jax.errors.JaxRuntimeError,
  matched by name: --help does not load jax)."""
  return type(error).__name__ in ("JaxRuntimeError", "XlaRuntimeError") and str(error).startswith(
    "RESOURCE_EXHAUSTED"
  )


def exit_now(status: int, line: str | None) -> NoReturn:
  """Prints `line` (if any) on stderr and exits without waiting for background threads."""
  if line is not None:
    print(line, file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def unknown_field(error: Exception, argv: list[str]) -> str | None:
  """`section.field` of the --config override that ml_collections could not
  find (AttributeError(KeyError(msg))), with its hint; None if none matches."""
  cause = error
  while isinstance(cause, BaseException) and cause.args:
    cause = cause.args[0]
  message = str(cause)
  found = re.search(r"'([^']+)'", message)
  paths = [
    arg.lstrip("-").split("=", 1)[0] for arg in argv[1:] if arg.lstrip("-").startswith("config.")
  ]
  field = next(
    (p.partition(".")[2] for p in paths if found and found.group(1) in p.split(".")[1:]), None
  )
  if field is None:
    return None
  # Here, not at the top: importing txf loads jax, which --help need not wait for.
  from txf.layers.model_config import MOVED_TO_OPTIONS

  section, _, name = field.partition(".")
  if section == "model" and name in MOVED_TO_OPTIONS:
    return f"{field}: moved to model.options.{name}"
  hint = message.partition("\n")[2]
  return f"{field}: unknown field" + (f" ({hint})" if hint else "")


INTERRUPTED_STATUS = 130  # 128 + SIGINT: what a shell reports for a command Ctrl-C stopped
CLOSED_OUTPUT_STATUS = 141  # 128 + SIGPIPE: what it reports for one a closed pipe stopped
TERMINATED_STATUS = 143  # 128 + SIGTERM: what it reports for one a SIGTERM stopped
_STARTUP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Terminated(BaseException):
  """A SIGTERM that reached a command with no handler of its own for it
  (txf-run and txf-sweep save first): raised in the main thread, so that a
  file being written is cleaned up as after a Ctrl-C (`txf.storage`), then
  reported as `terminated`, exit 143. Not an Exception: nothing that
  handles errors takes it for one."""


def _raise_terminated(signum, frame) -> NoReturn:
  raise Terminated


def _exit_at_once(stderr: int, signum: int, frame) -> NoReturn:
  """The handler of SIGINT and SIGTERM while a command starts (its flags,
  its config's imports, jax's start): `interrupted` or `terminated` on the
  process's stderr (`stderr`, a copy of descriptor 2: `start_jax` points 2
  elsewhere meanwhile) and the exit status at once. Nothing is written yet,
  and a KeyboardInterrupt raised inside an extension's import (jaxlib's) can
  crash the interpreter or come back as an ImportError."""
  os.write(stderr, b"interrupted\n" if signum == signal.SIGINT else b"terminated\n")
  os._exit(128 + signum)


# While a command starts: the `started()` of `_exits_at_once_while_starting`.
_STARTING: list[Callable[[tuple[int, ...]], None]] = []
# How long after a signal was lost in a garbage collection it is delivered again.
REDELIVERY_DELAY_S = 0.005


def command_started(*, kept: tuple[int, ...] = ()) -> None:
  """Ends the command's start: from here on a Ctrl-C is a KeyboardInterrupt
  and a SIGTERM `Terminated` (until the command installs handlers of its
  own: txf-run's and txf-sweep's save), and neither is lost where Python
  cannot raise it (`_signals_redelivered`). `run_command` calls it as `main`
  begins, after `start_jax` where it starts jax; a command that starts jax
  itself (starts_jax=False) calls it once it has, before anything it could
  leave half-written (txf-run: before its PreemptionGuard). `kept`: signals
  whose handler something installed meanwhile, outside Python, which owns
  them (jax.distributed's preemption service SIGTERM: Python's own record
  still names the start's handler, so they are named here)."""
  while _STARTING:
    _STARTING.pop()(kept)
  if not getattr(sys.unraisablehook, "redelivers_signals", False):
    sys.unraisablehook = _signals_redelivered(sys.unraisablehook)


def _signals_redelivered(unraisablehook):
  """`unraisablehook`, except that a KeyboardInterrupt or `Terminated` (a
  Ctrl-C's or a SIGTERM's handler raising) that Python could not raise is
  not printed and dropped but its signal delivered again to the main
  thread, whose handler then runs as for the first. Python runs a signal's
  handler at the next line of Python it runs: during a garbage collection,
  that is jax's callback (`_xla_gc_callback`, called at every collection)
  or an object's finalizer, where an exception is unraisable ("Exception
  ignored in"), and the command went on. Delivered from another thread a
  moment later (`REDELIVERY_DELAY_S`): the main thread has left the
  collection by then (if not, it lands here again, and again a moment
  later); from this hook, still inside it, the handler would run here."""

  def hook(unraisable) -> None:
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
      signum = signal.SIGINT
    elif issubclass(unraisable.exc_type, Terminated):
      signum = signal.SIGTERM
    else:
      unraisablehook(unraisable)
      return
    redelivery = threading.Timer(REDELIVERY_DELAY_S, _thread.interrupt_main, (signum,))
    redelivery.daemon = True
    try:
      redelivery.start()
    except RuntimeError:  # no new thread while the interpreter exits: nothing left to stop
      unraisablehook(unraisable)

  hook.redelivers_signals = True
  return hook


@contextlib.contextmanager
def _exits_at_once_while_starting():
  """SIGINT and SIGTERM end the command at once (`_exit_at_once`) until
  `command_started()`; the handlers before it are put back on leaving. A
  signal the command was started ignoring (a background job's SIGINT) stays
  ignored; off the main thread (run_command from Python) nothing changes."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  stderr = os.dup(2)
  handler = functools.partial(_exit_at_once, stderr)
  # None: a handler not set from Python, which signal.signal cannot put back.
  previous = {
    signum: signal.SIG_DFL if signal.getsignal(signum) is None else signal.getsignal(signum)
    for signum in _STARTUP_SIGNALS
  }
  for signum, before in previous.items():
    if before != signal.SIG_IGN:
      signal.signal(signum, handler)

  def started(kept: tuple[int, ...]) -> None:
    for signum, before in previous.items():
      if before == signal.SIG_IGN or signum in kept:
        continue
      default_term = signum == signal.SIGTERM and before == signal.SIG_DFL
      signal.signal(signum, _raise_terminated if default_term else before)

  _STARTING.append(started)
  try:
    yield
  finally:
    _STARTING.clear()
    for signum, before in previous.items():
      signal.signal(signum, before)
    os.close(stderr)


def run_command(
  main: Callable[[list[str]], None],
  *,
  arguments: str | None = None,
  required: bool = True,
  starts_jax: bool = True,
) -> None:
  """absl's `app.run(main)` for a command of experiments/: its flags parsed by
  `parse_flags`, so every command reports a bad flag, a missing required one
  and a stray or missing positional argument alike (one line, exit 2); a
  Ctrl-C that reaches it (while a config loads, at startup, a second one
  in a run) is one line, `interrupted`, and exit 130, a SIGTERM the command
  does not handle itself `terminated` and exit 143 (each at once until
  `command_started`: `_exits_at_once_while_starting`); XLA's out-of-memory
  error is one line, `out of memory: ...`, and exit 1 (txf-run refuses a
  model or sample far past the device's memory before any compute, exit 2:
  txf.train.run_setup.check_memory); a closed stdout ends it quietly (exit 141),
  one that cannot be written (a full disk) in one line, `write error: stdout:
  ...`, exit 1.

  Args:
    main: the command; it receives argv (the program name, then the
      positional arguments).
    arguments: what the positional arguments are (e.g. 'the texts to embed');
      None: the command takes none.
    required: at least one positional argument must be given.
    starts_jax: jax's backends are started (`start_jax`, without their
      plugins' noise) after the flags are parsed and before `main`; False
      for a command that must set jax up first and then calls `start_jax`
      itself (txf-run: jax.distributed) or that chooses its own platforms
      (txf-compile), and then `command_started`.
  """
  # absl's --help prints the main module's docstring and key flags: the
  # command's, also when a thin entry point (experiments/<command>.py, a
  # console script) runs it.
  command = sys.modules[main.__module__]
  sys.modules["__main__"].__doc__ = command.__doc__
  for flag in flags.FLAGS.get_key_flags_for_module(command):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  parse = functools.partial(parse_flags, arguments=arguments, required=required)
  try:
    with _exits_at_once_while_starting():
      app.run(_once_started(main) if starts_jax else main, flags_parser=parse)
  except KeyboardInterrupt:
    # Background threads (a checkpoint's writers) must not hold the exit.
    exit_now(INTERRUPTED_STATUS, "interrupted")
  except Terminated:
    exit_now(TERMINATED_STATUS, "terminated")
  except RuntimeError as error:
    if not _out_of_memory(error):
      raise
    # What did not fit is named by XLA; the run's outputs are closed by now
    # (a run's checkpointer waits for its saves as the error passes it).
    exit_now(1, f"out of memory: {str(error).strip().splitlines()[0]}")
  except BrokenPipeError:
    if not _stdout_closed():  # a pipe or socket of the command's own
      raise
    # What is still buffered for stdout would report the closed pipe again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    exit_now(CLOSED_OUTPUT_STATUS, None)
  except OSError:
    reason = _stdout_unwritable()
    if reason is None:  # not stdout's: a write the command's own files report
      raise
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    exit_now(1, f"write error: stdout: {reason}")


def _once_started(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """`main`, run after `start_jax` and `command_started`."""

  @functools.wraps(main)
  def run_main(argv: list[str]) -> None:
    start_jax()
    command_started()
    main(argv)

  return run_main


def _stdout_unwritable() -> str | None:
  """The OS's reason stdout cannot be written (a full disk, /dev/full), or
  None where it can: what is buffered for it is flushed, and an empty write
  tried (a write that failed may have dropped what it held)."""
  try:
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), b"")
  except OSError as error:
    return os_reason(error)
  return None


def _stdout_closed() -> bool:
  """Whether the reader of stdout has gone (a pipe's read end closed)."""
  poller = select.poll()
  poller.register(sys.stdout.fileno(), select.POLLOUT)
  return any(events & select.POLLERR for _, events in poller.poll(0))


def start_jax() -> str:
  """Starts jax's backends (the devices the command computes on) and returns
  the line that says which: `platform: gpu (8 devices: NVIDIA H100 80GB
  HBM3)`, `platform: cpu (1 device)`.

  What jax's platform plugins print meanwhile is held back: one installed
  for hardware this machine does not have (txf's tpu and gpu-compile
  extras: libtpu, jax's CUDA plugin) prints tracebacks and warnings as it
  looks for its device, and jax goes on without it. That text is printed
  after all, on stderr as it was, where it may say something: when jax
  fails to start (JAX_PLATFORMS names a platform that does not start) or
  when it falls back to the CPU on a machine that has a GPU or TPU. A
  plugin that finds its device is used, as jax would anyway. Call it
  before anything else starts the backends (after jax.distributed's
  initialisation, which must come first).
  """
  import jax

  devices, held_back = _holding_back_stderr(jax.devices)
  backend = jax.default_backend()
  if backend == "cpu" and _accelerator_present():
    print(held_back, end="", file=sys.stderr, flush=True)
  count = f"{len(devices)} device{'s' if len(devices) != 1 else ''}"
  kind = "" if backend == "cpu" else f": {devices[0].device_kind}"
  processes = f", {jax.process_count()} processes" if jax.process_count() > 1 else ""
  return f"platform: {backend} ({count}{kind}{processes})"


def _holding_back_stderr(action: Callable[[], Any]) -> tuple[Any, str]:
  """`action()` and what it wrote to stderr meanwhile (file descriptor 2:
  Python's writes and native code's); if it raises, that text is written to
  stderr before the exception goes on."""
  with tempfile.TemporaryFile() as held:
    try:
      with _stderr_to(held.fileno()):
        result = action()
    except BaseException:
      print(_text(held), end="", file=sys.stderr, flush=True)
      raise
    return result, _text(held)


@contextlib.contextmanager
def _stderr_to(descriptor: int):
  """Points file descriptor 2 at `descriptor` meanwhile."""
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(descriptor, 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def _text(file) -> str:
  file.seek(0)
  return file.read().decode(errors="replace")


def _accelerator_present() -> bool:
  """Whether this machine has an NVIDIA GPU or a Google TPU, as jax judges
  (from the PCI devices) when it suggests a missing plugin."""
  try:
    from jax._src import hardware_utils

    return (
      hardware_utils.has_visible_nvidia_gpu()
      or hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    )
  except Exception:  # a jax without them: say what the plugins said
    return True


def parse_flags(
  argv: list[str], *, arguments: str | None = None, required: bool = True
) -> list[str]:
  """absl's flag parsing, with every error the user can cause as one line and
  exit status 2 instead of a traceback or a page of usage; `arguments` and
  `required` as in `run_command`."""
  rest = _parse(argv)
  if arguments is None and len(rest) > 1:
    fail("flag", f"unexpected arguments: {' '.join(rest[1:])} (this command takes only flags)")
  if arguments is not None and required and len(rest) == 1:
    fail("flag", f"missing {arguments}")
  return rest


def _given_config(argv: list[str]) -> Any:
  """The config that --config in `argv` names, or None (none given, or one
  that does not load)."""
  for arg in argv[1:]:
    if arg.startswith("--config="):
      try:
        return ConfigFileParser().parse(arg.partition("=")[2])
      except ConfigFileError:
        return None
  return None


def _none_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
  """`argv` without its `--config.FIELD=None` overrides, and their fields
  (those no later override of the same field replaces). ml_collections
  parses an override by its field's type: None reached a str field as the
  text 'None' (attention_impl: "'None' is not one of (None, ...)") and an
  int field as a flag error, so a config's value could not be unset."""
  kept, fields = [], []
  i = 0
  while i < len(argv):
    name, equals, value = argv[i].partition("=")
    spaced = not equals and argv[i + 1 : i + 2] == ["None"]  # --config.FIELD None
    if i and name.startswith("--config.") and (value == "None" or spaced):
      later = argv[i + 1 + spaced :]
      if not any(arg == name or arg.startswith(f"{name}=") for arg in later):
        fields.append(name.removeprefix("--config."))
      i += 1 + spaced
      continue
    kept.append(argv[i])
    i += 1
  return kept, fields


def _set_none(config: Any, field: str) -> None:
  """Sets the dotted `field` of `config` to None (a KeyError, as an
  override's, where it has no such field)."""
  *sections, name = field.split(".")
  for section in sections:
    config = config[section]
  if name not in config:
    raise KeyError(f"'{name}'")
  config[name] = None


def _parse(argv: list[str]) -> list[str]:
  """flags.FLAGS(argv), `--config.FIELD=None` setting the field to None,
  its errors as `fail` lines."""
  try:
    kept, none_fields = _none_overrides(argv)
    rest = flags.FLAGS(kept)
    for field in none_fields:
      _set_none(flags.FLAGS["config"].value, field)
    return rest
  except SystemExit as done:
    # absl's help flags (--help, --helpfull, ...), the only ones that exit
    # here, print the usage and exit 1: help asked for is a success.
    sys.exit(0 if done.code == 1 else done.code)
  except ConfigFileError as error:
    fail("config", error)
  except ValueError as error:  # ml_collections: an override path it cannot parse ('a.b\\.c')
    fail("flag", str(error).strip().splitlines()[0])
  except flags.Error as error:  # --config.train.steps=abc, --no_such_flag, a missing --workdir
    if missing := re.search(r"Flag --(\w+) must have a value other than None", str(error)):
      name = missing.group(1)
      fail("flag", f"--{name} is required ({flags.FLAGS[name].help})")
    fail("flag", str(error).strip().splitlines()[0])
  except (AttributeError, KeyError) as error:  # ml_collections: no such field
    message = unknown_field(error, argv)
    if message is None:  # not an override's field: some other bug, keep the traceback
      raise
    if is_sweep_config(_given_config(argv)):
      if message.startswith("grid."):
        field = message.split(":", 1)[0].removeprefix("grid.")
        message += (
          f" (a sweep's grid: narrow or replace it with --grid={field}=VALUE,VALUE,... "
          "and take a field out with --grid=FIELD=)"
        )
      else:
        message += (
          " (a sweep config: set a field of its base run config with "
          "--config.base.<section>.<field>=VALUE)"
        )
    fail("config", message)
