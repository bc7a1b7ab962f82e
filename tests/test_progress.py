"""txf.progress: the lines long work writes off a terminal (their times from
a fake clock), and the bar on one."""

import re
import sys
import threading
import time

import jax
import pytest

from txf import progress
from txf.progress import Progress, stage

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d "


class Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_lines_at_the_start_every_interval_and_the_end():
  lines, clock = [], Clock()
  with Progress("extrapolate 2x", total=48, unit="windows", log=lines.append, clock=clock) as bar:
    assert len(lines) == 1 and re.fullmatch(STAMP + "extrapolate 2x: 0/48 windows", lines[0])
    clock.now += 4
    bar.advance(8)  # 4 s < every_s: no line
    assert len(lines) == 1
    clock.now += 6
    bar.advance(12)  # 10 s in, 20 done: 2 a second, 28 left
    assert re.fullmatch(
      STAMP + r"extrapolate 2x: 20/48 windows \(42%\) \| 2 windows/s \| elapsed 10s \| eta 14s",
      lines[1],
    )
    clock.now += 3
    bar.advance(28)  # done: no line until the end
    assert len(lines) == 2
  assert re.fullmatch(
    STAMP + r"extrapolate 2x: 48/48 windows \(100%\) \| 3.69 windows/s \| elapsed 13s", lines[2]
  )
  assert bar.done == 48


def test_the_count_stops_at_the_total_and_an_error_writes_no_end_line():
  lines, clock = [], Clock()
  with pytest.raises(RuntimeError), Progress("heads", 3, log=lines.append, clock=clock) as bar:
    bar.advance(5)
    assert bar.done == 3
    raise RuntimeError("stop")
  assert len(lines) == 1  # the start line only


@pytest.mark.parametrize("total", [0, -1])
def test_a_total_that_is_not_positive_is_refused(total):
  with pytest.raises(ValueError, match="total must be positive"):
    Progress("x", total, log=print)


def test_a_stage_says_when_it_starts_and_how_long_it_took():
  lines, clock = [], Clock()
  with stage("compile train step (h100)", log=lines.append, clock=clock):
    clock.now += 44.71
  assert re.fullmatch(STAMP + r"compile train step \(h100\) \.\.\.", lines[0])
  assert re.fullmatch(STAMP + r"compile train step \(h100\): done in 44\.7s", lines[1])
  lines.clear()
  with pytest.raises(KeyError), stage("compile", log=lines.append, clock=clock):
    raise KeyError("x")
  assert len(lines) == 1


# The still-running lines come every EVERY (wall-clock) seconds in these tests;
# each line they write moves the fake clock on a minute, so beat k says k
# minutes whenever it comes.
EVERY = 0.02


def minutes_per_line(clock, beats_wanted=0):
  """A log that moves `clock` on 60 s a line, and an event set once
  `beats_wanted` still-running lines are in it."""
  lines, enough = [], threading.Event()

  def log(line):
    lines.append(line)
    clock.now += 60
    if sum("still running" in line for line in lines) >= beats_wanted:
      enough.set()

  return lines, log, enough


def new_thread(before):
  """The one thread the stage started since `before` (named for it: another
  test's leftover work may start threads of its own meanwhile, as orbax's
  and wandb's did in one CI run)."""
  started = set(threading.enumerate()) - before
  (thread,) = [thread for thread in started if thread.name.startswith("txf.progress: ")]
  return thread


def test_a_stage_off_a_terminal_says_it_is_still_running_until_it_ends():
  clock = Clock()
  lines, log, two_beats = minutes_per_line(clock, beats_wanted=2)
  before = set(threading.enumerate())
  with stage("compile", log=log, every_s=EVERY, clock=clock):
    thread = new_thread(before)
    assert thread.daemon and thread.is_alive()
    assert two_beats.wait(timeout=5), lines
  assert not thread.is_alive()
  # The start, the beats in order (two, or a third that came as the body ended), the end.
  beats = lines[1:-1]
  assert len(beats) >= 2
  for k, line in enumerate(beats, 1):
    assert re.fullmatch(STAMP + f"compile: still running, {k}m00s", line), line
  assert re.fullmatch(STAMP + r"compile \.\.\.", lines[0])
  assert re.fullmatch(STAMP + rf"compile: done in {60 * (len(beats) + 1)}\.0s", lines[-1])
  written = list(lines)
  time.sleep(3 * EVERY)
  assert lines == written  # nothing after the end line


def test_the_beats_keep_the_cadence_in_wall_clock_time():
  stamps, ready = [], threading.Event()

  def log(line):
    stamps.append(time.monotonic())
    if len(stamps) == 3:  # the start and two beats
      ready.set()

  with stage("compile", log=log, every_s=EVERY):
    assert ready.wait(timeout=5)
  gaps = [b - a for a, b in zip(stamps[:2], stamps[1:3], strict=True)]
  assert all(gap >= 0.9 * EVERY for gap in gaps), gaps


def test_a_stage_that_ends_before_the_first_beat_writes_none():
  clock = Clock()
  lines, log, _ = minutes_per_line(clock)
  before = set(threading.enumerate())
  with stage("compile", log=log, every_s=1.0, clock=clock):
    thread = new_thread(before)
    time.sleep(EVERY)
    ending = time.monotonic()
  assert time.monotonic() - ending < 0.5  # left at once, not at the next beat
  assert not thread.is_alive()
  assert len(lines) == 2 and re.fullmatch(STAMP + r"compile: done in 60\.0s", lines[1])


def test_a_stage_that_raises_stops_its_thread():
  clock = Clock()
  lines, log, one_beat = minutes_per_line(clock, beats_wanted=1)
  before = set(threading.enumerate())
  with pytest.raises(KeyError), stage("compile", log=log, every_s=EVERY, clock=clock):
    thread = new_thread(before)
    assert one_beat.wait(timeout=5), lines
    raise KeyError("x")
  assert not thread.is_alive()
  assert all("still running" in line for line in lines[1:])  # no end line
  written = list(lines)
  time.sleep(3 * EVERY)
  assert lines == written


def test_on_a_terminal_a_stage_writes_no_beats(capsys, monkeypatch):
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  with stage("compile", every_s=EVERY):
    time.sleep(3 * EVERY)
  err = capsys.readouterr().err
  assert "compile: done in" in err
  assert "still running" not in err and not re.search(STAMP, err)


def test_on_a_terminal_a_stages_spinner_shows_the_time_elapsed(monkeypatch):
  """The docs' 'a spinner with the elapsed time': it showed its text alone,
  so a five-minute compile looked the same at every second of it."""
  import io

  import rich.console

  screen, terminal = io.StringIO(), rich.console.Console
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  monkeypatch.setattr(
    rich.console,
    "Console",
    lambda stderr: terminal(file=screen, force_terminal=True, width=80, stderr=stderr),
  )
  seconds = iter(range(0, 10_000, 61))  # a clock 61 s on at every reading: no sleep
  with stage("compile: the train step", clock=lambda: next(seconds)):
    pass
  drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())  # colours, cursor moves
  elapsed = re.findall(r"compile: the train step \.\.\. +(\d+:\d\d:\d\d)", drawn)
  assert elapsed and elapsed[-1] != "0:00:00", drawn
  assert re.search(r"compile: the train step: done in \d+\.\ds$", drawn.rstrip())


@pytest.mark.parametrize("every_s", [0, -1.0])
def test_a_cadence_that_is_not_positive_is_refused(every_s):
  with pytest.raises(ValueError, match="every_s must be positive"), stage("x", every_s=every_s):
    pass


def test_off_a_terminal_lines_go_to_stderr(capsys):
  with Progress("points", 2, unit="points") as bar:
    bar.advance(2)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and re.fullmatch(STAMP + "points: 0/2 points", err[0])
  assert re.fullmatch(
    STAMP + r"points: 2/2 points \(100%\) \| \S+ points/s \| elapsed \d+s", err[1]
  )


def test_on_a_terminal_a_bar_is_drawn_instead_of_lines(capsys, monkeypatch):
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  with Progress("points", 3, unit="points") as bar:
    bar.advance(3)
  err = capsys.readouterr().err
  assert "points" in err and "3/3" in err
  assert not re.search(STAMP, err)  # a bar, not lines


def test_timestamped_puts_the_time_first():
  import datetime

  at = datetime.datetime(2026, 11, 29, 6, 20, 1)
  assert progress.timestamped("x", at) == "2026-11-29 06:20:01 x"


def test_say_stamps_a_line_off_a_terminal_and_not_on_one(capsys, monkeypatch):
  # A training run's and a sweep's lines in a log file said nothing of when.
  progress.say("step 10/20 | loss 2.0")
  assert re.fullmatch(STAMP + r"step 10/20 \| loss 2\.0\n", capsys.readouterr().out)
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  progress.say("step 20/20 | loss 1.0")
  assert capsys.readouterr().out == "step 20/20 | loss 1.0\n"


def test_a_terminal_bar_is_drawn_only_where_stdout_and_stderr_are_terminals(capsys, monkeypatch):
  # A training run's steps: a bar beneath its lines on a terminal, nothing
  # more in a log file (its stamped lines say where it is).
  computed = jax.numpy.ones(())
  with progress.terminal_bar("train", 40, unit="steps", done=10) as dispatched:
    dispatched(20, computed)
  assert capsys.readouterr() == ("", "")
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  with progress.terminal_bar("train", 40, unit="steps", done=10) as dispatched:
    dispatched(30, jax.block_until_ready(computed))
    err, deadline = "", time.monotonic() + 5.0
    while "30/40" not in err and time.monotonic() < deadline:
      time.sleep(0.05)
      err += capsys.readouterr().err
  err += capsys.readouterr().err
  assert "train" in err and "30/40" in err and "steps" in err


class Marker:
  """A dispatched unit's output, finished when the test says."""

  def __init__(self):
    self.ready = False

  def is_ready(self):
    return self.ready

  def is_deleted(self):
    return False


class RecordingBar:
  """rich.progress.Progress as terminal_bar uses it, recording each count shown."""

  def __init__(self):
    self.shown = []

  def __enter__(self):
    return self

  def __exit__(self, *exc_info):
    return False

  def add_task(self, what, *, total, completed):
    self.shown.append(completed)
    return 0

  def update(self, task, *, completed):
    self.shown.append(completed)


def shown_within(bar, count, seconds=5.0):
  """Waits (up to `seconds`) for the bar's poll thread to show `count`."""
  deadline = time.monotonic() + seconds
  while bar.shown[-1] != count and time.monotonic() < deadline:
    time.sleep(0.01)
  return bar.shown[-1]


def test_a_terminal_bar_shows_the_last_step_the_device_finished_not_the_last_queued(
  monkeypatch,
):
  # The train bar counted dispatches: it ran ahead of the device (32 steps of 40).
  monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  monkeypatch.setattr(progress, "BAR_EVERY_S", 0.01)
  bar = RecordingBar()
  monkeypatch.setattr(progress, "_rich_bar", lambda unit, transient: bar)
  markers = {done: Marker() for done in (11, 12, 13, 14)}
  with progress.terminal_bar("train", 40, unit="steps", done=10) as dispatched:
    for done, marker in markers.items():
      dispatched(done, marker)
    markers[12].ready = True  # finished out of order: 11 holds it back
    time.sleep(0.1)
    assert bar.shown == [10]
    markers[11].ready = True
    assert shown_within(bar, 12) == 12
    time.sleep(0.1)
    assert bar.shown[-1] == 12  # 13 and 14 are still queued
    markers[13].ready = markers[14].ready = True
    assert shown_within(bar, 14) == 14
    dispatched(15, jax.block_until_ready(jax.numpy.ones(())))  # a jax.Array's own is_ready
    assert shown_within(bar, 15) == 15
    deleted = jax.numpy.ones(())
    deleted.delete()  # donated since: asking it is_ready() would raise
    dispatched(16, deleted)
    assert shown_within(bar, 16) == 16
  assert bar.shown == sorted(bar.shown) and set(bar.shown) <= {10, 12, 13, 14, 15, 16}
  count = len(bar.shown)
  time.sleep(0.05)
  assert len(bar.shown) == count  # the poll thread ended with the bar


def test_say_writes_nothing_where_stdout_is_closed(monkeypatch):
  # A process started with its stdout closed has sys.stdout None: print
  # writes nothing there, and every log default is say.
  monkeypatch.setattr(sys, "stdout", None)
  progress.say("step 1/2")


def test_work_that_times_itself_writes_lines_even_on_a_terminal(capsys, monkeypatch):
  # A bar's refresh thread took the interpreter during the textbook's timed calls.
  monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
  with Progress("tokens", 3, unit="tokens", bar=False) as count:
    count.advance(3)
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and all(re.match(STAMP + "tokens: ", line) for line in err)


def test_an_hour_long_line_pads_its_minutes_to_two_digits():
  """Past an hour the elapsed time reads hours and two-digit minutes (1h02m,
  not 1h2m, which reads as one hour twenty at a glance and breaks columns)."""
  lines, clock = [], Clock()
  with Progress("train", total=2, log=lines.append, clock=clock) as bar:
    clock.now += 3720  # 1 h 2 min
    bar.advance(1)
  hours, minutes = divmod(3720 // 60, 60)
  assert re.search(rf"\| elapsed {hours}h{minutes:02d}m \|", lines[1]), lines[1]


def test_reaching_the_total_after_an_interval_writes_only_the_end_line():
  """The last advance, though every_s have passed, writes no interval line:
  the end line follows at once and would repeat it."""
  lines, clock = [], Clock()
  with Progress("heads", total=4, log=lines.append, clock=clock, every_s=10) as bar:
    clock.now += 11
    bar.advance(4)
  assert len(lines) == 2 and re.match(STAMP + r"heads: 4/4 \(100%\)", lines[1]), lines


def test_the_interval_counts_from_the_last_line_written():
  """After an interval line, the next comes every_s later, not at every
  advance: the clock of the last line moves on with each line written."""
  lines, clock = [], Clock()
  with Progress("heads", total=100, log=lines.append, clock=clock, every_s=10) as bar:
    clock.now += 10
    bar.advance(1)
    assert len(lines) == 2
    for _ in range(5):
      clock.now += 0.1
      bar.advance(1)
    assert len(lines) == 2, lines
    clock.now += 10
    bar.advance(1)
    assert len(lines) == 3
