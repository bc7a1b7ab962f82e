"""txf.progress: the lines long work writes off a terminal (their times from
a fake clock), and the bar on one."""

import re
import sys

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
