"""Where long work stands: a bar in a terminal, timestamped lines otherwise.

Every piece of work that can take more than a few seconds (a length's
windows, a compile, a sweep's points, the heads an analysis ablates) says
where it is while it runs:

  with Progress("extrapolate: length 256", total=48, unit="windows") as progress:
    for batch in batches:
      ...
      progress.advance(len(batch))

  with stage("compile train step (h100)"):
    compiled = lowered.compile()

On a terminal (stderr is one, and no `log` is given) a Progress is a rich bar
with the count, rate, elapsed time and ETA, and a stage a spinner with its
elapsed time. Otherwise (CI, a log file, a caller's `log`) each is plain lines,
each stamped with the wall-clock time: one when the work starts, one at most
every `every_s` seconds while it runs, and one when it ends, e.g.

  2026-11-29 06:20:01 extrapolate: length 256: 0/48 windows
  2026-11-29 06:20:11 extrapolate: length 256: 20/48 windows (42%) | 2 windows/s | elapsed 10s |
    eta 14s (one line)
  2026-11-29 06:20:25 extrapolate: length 256: 48/48 windows (100%) | 2 windows/s | elapsed 24s

A stage has no count to write as it goes, and its work (a compile) does not
call back, so a thread writes that it is still running, e.g.

  2026-11-29 06:20:01 compile train step (h100) ...
  2026-11-29 06:21:01 compile train step (h100): still running, 1m00s
  2026-11-29 06:21:45 compile train step (h100): done in 104.2s

Work that prints lines of its own as it goes (a training run's steps and
evaluations) writes them with `say`, which stamps each off a terminal, and
draws a `terminal_bar` beneath them on one:

  with terminal_bar("train", total=steps, unit="steps", done=start) as dispatched:
    for step in ...:
      state, metrics = train_step(state, batch)
      dispatched(step + 1, metrics["loss"])  # shown once the device has run it
      say(f"step {step + 1}/{steps} | loss ...")

rich is installed with flax, which txf depends on.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

# How often a line is written while work runs, when stderr is no terminal.
EVERY_S = 10.0
# How often a stage says it is still running there. Its lines carry no count,
# only that the process is alive: one a minute keeps a log of a 6-minute
# compile from reading as a hang without filling it.
STAGE_EVERY_S = 60.0
# How often a terminal bar of device work asks which units have finished.
BAR_EVERY_S = 0.2

Log = Callable[[str], Any]


def _stderr(line: str) -> None:
  # One write, not print's two (the line, then its newline): a stage's thread
  # writes while other code may, and two lines must not share one.
  sys.stderr.write(line + "\n")
  sys.stderr.flush()


def timestamped(line: str, now: datetime.datetime | None = None) -> str:
  """`line` after the local wall-clock time, '2026-11-29 06:20:01 <line>'."""
  now = now or datetime.datetime.now()
  return f"{now:%Y-%m-%d %H:%M:%S} {line}"


def say(line: str) -> None:
  """Writes one line of a command's account of long work (a training run's
  steps, a sweep's points) to stdout: as it is on a terminal, timestamped
  otherwise (a log file's lines say when each was written)."""
  stdout = sys.stdout
  if stdout is None:  # closed when the process started (print writes nothing then)
    return
  on_terminal = getattr(stdout, "isatty", lambda: False)()
  stdout.write((line if on_terminal else timestamped(line)) + "\n")
  stdout.flush()


def _duration(seconds: float) -> str:
  """'45s', '7m05s', '1h02m'."""
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  if hours:
    return f"{hours}h{minutes:02d}m"
  return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def _on_terminal(log: Log | None) -> bool:
  return log is None and sys.stderr.isatty()


def _rich_bar(unit: str, *, transient: bool = False) -> Any:
  """A rich bar on stderr: description, bar, count of `unit`, elapsed, eta."""
  import rich.console  # noqa: PLC0415 (rich loads only where a bar is drawn)
  import rich.progress  # noqa: PLC0415

  return rich.progress.Progress(
    rich.progress.TextColumn("{task.description}"),
    rich.progress.BarColumn(),
    rich.progress.MofNCompleteColumn(),
    rich.progress.TextColumn(unit),
    rich.progress.TimeElapsedColumn(),
    rich.progress.TextColumn("eta"),
    rich.progress.TimeRemainingColumn(),
    console=rich.console.Console(stderr=True),
    transient=transient,
  )


@contextlib.contextmanager
def _every(seconds: float, call: Callable[[], None], *, name: str) -> Iterator[None]:
  """Calls `call` every `seconds` from a thread while the block runs; the
  thread is stopped and waited for as the block ends or raises, so no call
  follows it."""
  ended = threading.Event()

  def repeat() -> None:
    # wait() returns True at once when the block ends, False after `seconds`.
    while not ended.wait(seconds):
      call()

  # A daemon: a block that is never left (its own thread a daemon the
  # process exits under) must not keep the process alive.
  thread = threading.Thread(target=repeat, name=name, daemon=True)
  thread.start()
  try:
    yield
  finally:
    ended.set()
    thread.join()


@contextlib.contextmanager
def terminal_bar(
  what: str, total: int, *, unit: str = "", done: int = 0
) -> Iterator[Callable[[int, Any], None]]:
  """A bar of `total` `unit` of device work from `done`, drawn only on a
  terminal (stdout and stderr both one), for work that prints its own lines
  (`say`): they appear above it. Off a terminal nothing is drawn, those
  lines (stamped) say where the work is.

  Yields `dispatched(done, marker)`, called after dispatching unit `done`
  with an array its program writes (a jax.Array, not donated later). The bar shows the last
  unit whose marker is ready, asked every BAR_EVERY_S without waiting
  (`is_ready()`), not the last one queued: JAX dispatches asynchronously,
  and a training loop runs many steps ahead of its device (32 of 40 for the
  quickstart's model on a 2-core CPU).
  """
  if not (sys.stdout.isatty() and sys.stderr.isatty()):
    yield lambda done, marker: None
    return
  in_flight: collections.deque[tuple[int, Any]] = collections.deque()
  with _rich_bar(unit, transient=True) as bar:
    task = bar.add_task(what, total=total, completed=done)

    def show_finished() -> None:
      # The one consumer (the dispatching thread only appends): the head is
      # still there when popped.
      finished = None
      # A deleted marker (donated since) counts as finished: asking it
      # is_ready() raises (or, on jax 0.10.2, crashes).
      while in_flight and (in_flight[0][1].is_deleted() or in_flight[0][1].is_ready()):
        finished, _ = in_flight.popleft()
      if finished is not None:
        bar.update(task, completed=finished)

    with _every(BAR_EVERY_S, show_finished, name=f"txf.progress: {what} bar"):
      yield lambda done, marker: in_flight.append((done, marker))


class Progress:
  """Counts `total` units of work named `what` (see the module docstring).

  Args:
    what: what the work is, e.g. 'extrapolate: length 256'.
    total: how many units it has (> 0).
    unit: their name, e.g. 'windows'.
    log: where lines go (default: stderr, a bar there when it is a terminal).
    bar: False for lines even on a terminal: work that times itself (the
      textbook's timings) keeps a bar's refresh thread off the interpreter.
    every_s: seconds between lines while the work runs (lines only).
    clock: the monotonic clock (seconds), for tests.
  """

  def __init__(
    self,
    what: str,
    total: int,
    *,
    unit: str = "",
    log: Log | None = None,
    bar: bool = True,
    every_s: float = EVERY_S,
    clock: Callable[[], float] = time.monotonic,
  ):
    if total <= 0:
      raise ValueError(f"total must be positive, got {total}")
    self.what, self.total, self.unit = what, total, unit
    self.done = 0
    self._log = log or _stderr
    self._every_s, self._clock = every_s, clock
    self._bar: Any = _rich_bar(unit) if bar and _on_terminal(log) else None

  def __enter__(self) -> Progress:
    self._began = self._last = self._clock()
    if self._bar is not None:
      self._bar.start()
      self._task = self._bar.add_task(self.what, total=self.total)
    else:
      self._log(timestamped(self.line()))
    return self

  def advance(self, units: int = 1) -> None:
    """`units` more are done; a line is written if `every_s` have passed."""
    self.done = min(self.done + units, self.total)
    if self._bar is not None:
      self._bar.update(self._task, completed=self.done)
    elif self._clock() - self._last >= self._every_s and self.done < self.total:
      self._last = self._clock()
      self._log(timestamped(self.line()))

  def __exit__(self, *exc: object) -> None:
    if self._bar is not None:
      self._bar.stop()
    elif exc[0] is None:  # an error says so itself; its line would only repeat the last
      self._log(timestamped(self.line()))

  def line(self) -> str:
    """Where the work stands: '<what>: 20/48 windows (42%) | 2.0 windows/s |
    elapsed 10s | eta 14s' (no rate before a unit is done, no ETA at the end)."""
    unit = f" {self.unit}" if self.unit else ""
    line = f"{self.what}: {self.done}/{self.total}{unit}"
    elapsed = self._clock() - self._began
    if self.done == 0:
      return line
    line += f" ({100 * self.done / self.total:.0f}%)"
    if elapsed > 0:
      rate = self.done / elapsed
      line += f" | {rate:.3g} {self.unit or 'units'}/s"
    line += f" | elapsed {_duration(elapsed)}"
    if self.done < self.total and elapsed > 0:
      line += f" | eta {_duration((self.total - self.done) * elapsed / self.done)}"
    return line


@contextlib.contextmanager
def stage(
  what: str,
  *,
  log: Log | None = None,
  every_s: float = STAGE_EVERY_S,
  clock: Callable[[], float] = time.monotonic,
) -> Iterator[None]:
  """A piece of work of unknown length (a compile): '<what> ...' as it starts,
  '<what>: still running, 1m00s' every `every_s` seconds while it runs and
  '<what>: done in 44.7s' as it ends, timestamped (a spinner with the elapsed
  time on a terminal). An error writes no end line; it says so itself.

  The still-running lines come from a daemon thread (a `log` is called from
  it), which the stage stops and waits for as it ends or raises: none follows
  the end line. `clock` times the lines; the cadence is wall-clock seconds.
  """
  if every_s <= 0:  # the thread would write without pause
    raise ValueError(f"every_s must be positive, got {every_s}")
  began = clock()
  if _on_terminal(log):
    import rich.console  # noqa: PLC0415 (rich loads only where a spinner is drawn)
    import rich.progress  # noqa: PLC0415

    console = rich.console.Console(stderr=True)
    spinner = rich.progress.Progress(
      rich.progress.SpinnerColumn(),
      rich.progress.TextColumn("{task.description}"),
      rich.progress.TimeElapsedColumn(),  # a five-minute compile shows it moves
      console=console,
      transient=True,
      get_time=clock,  # the clock the end line reads
    )
    with spinner:
      spinner.add_task(f"{what} ...", total=None)
      yield
    console.print(f"{what}: done in {clock() - began:.1f}s")
    return
  write = log or _stderr
  write(timestamped(f"{what} ..."))

  def still_running() -> None:
    write(timestamped(f"{what}: still running, {_duration(clock() - began)}"))

  # A line being written as the stage ends comes before the end line.
  with _every(every_s, still_running, name=f"txf.progress: {what}"):
    yield
  write(timestamped(f"{what}: done in {clock() - began:.1f}s"))
