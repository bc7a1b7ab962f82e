"""Where a run's records go: files appended in the caller's thread, each
append one write to the OS, for the metrics writer (txf.rundir.metrics).

  LocalLines / ObjectLines  text lines on a local disk / on object storage
                            (gs://: no append, so rewritten whole, at most
                            once a second)
  EventFile                 a TensorBoard event file on a local disk
  MirroredTensorBoard       event files written locally and copied to object
                            storage (at most once a minute)

A failed write raises WriteError naming the file and the reason, and a local
append that fails is cut off again, so no file keeps half a record.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import struct
import tempfile
import time
import uuid

from etils import epath
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary
from tensorboardX.record_writer import masked_crc32c

from txf.storage import WriteError, is_local, write_error


class LocalFile:
  """Appends bytes to a local file, each append one write to the OS (nothing
  is buffered in the process: a run killed at any point keeps every record
  written). An append that fails is cut off again, so the file never ends in
  part of a record, and raises WriteError naming the file."""

  def __init__(self, path: epath.Path, *, exclusive: bool = False):
    self.path = path
    try:
      # Unbuffered: every append reaches the OS at once, or fails at once.
      self._file = open(path, "xb" if exclusive else "ab", buffering=0)
      self._size = os.fstat(self._file.fileno()).st_size
    except OSError as error:
      raise write_error(path, error) from error

  def append(self, data: bytes) -> None:
    try:
      view = memoryview(data)
      while view:
        view = view[self._file.write(view) :]
    except OSError as error:
      with contextlib.suppress(OSError):
        os.ftruncate(self._file.fileno(), self._size)
      raise write_error(self.path, error) from error
    self._size += len(data)

  def flush(self) -> None:
    pass  # every append is written already

  def close(self) -> None:
    self._file.close()


class LocalLines:
  """Appends text (whole lines) to a local file (see LocalFile)."""

  def __init__(self, path: epath.Path):
    self._file = LocalFile(path)

  def append(self, text: str) -> None:
    self._file.append(text.encode("utf-8"))

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


class ObjectLines:
  """Appends text to an object (gs://...): object stores have no append, so
  the text is kept in memory and the whole object rewritten -- at each
  append unless the last upload was under `interval` seconds ago (Cloud
  Storage takes about one update of an object per second), and at flush and
  close. Rows are few (one per log step), so the rewrite stays small."""

  def __init__(self, path: epath.Path, interval: float = 1.0):
    self._path, self._interval = path, interval
    data = read_bytes(path)
    self._chunks = [data + b"\n" if data and not data.endswith(b"\n") else data]
    self._pending, self._uploaded = False, -math.inf

  def append(self, text: str) -> None:
    self._chunks.append(text.encode("utf-8"))
    self._pending = True
    if time.monotonic() - self._uploaded >= self._interval:
      self.flush()

  def flush(self) -> None:
    if self._pending:
      try:
        self._path.write_bytes(b"".join(self._chunks))
      # Remote file systems raise their own types (gcsfs's HttpError, ...).
      except Exception as error:
        raise write_error(self._path, error) from error
      self._pending, self._uploaded = False, time.monotonic()

  def close(self) -> None:
    self.flush()


def lines_sink(path: epath.Path) -> LocalLines | ObjectLines:
  return LocalLines(path) if is_local(path) else ObjectLines(path)


def tfrecord(data: bytes) -> bytes:
  """`data` framed as one TFRecord: length, its CRC, data, its CRC."""
  header = struct.pack("<Q", len(data))
  return (
    header
    + struct.pack("<I", masked_crc32c(header))
    + data
    + struct.pack("<I", masked_crc32c(data))
  )


class EventFile:
  """A TensorBoard event file in a local `directory`, written in the caller's
  thread (see LocalFile): one Event per `add_summary` call (a row's
  scalars, a sample's text, the hyperparameters).

  The file is named as TensorBoard expects (events.out.tfevents.<time>.<host>,
  then `suffix`; a new name if that one exists) and starts as tensorboardX's
  do: the file version, then, for a resumed run, a SessionLog START at
  `purge_step`, which tells TensorBoard to hide the events logged at and
  after it by the previous session.
  """

  def __init__(self, directory: epath.Path, purge_step: int | None, suffix: str = ""):
    try:
      directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
      raise write_error(directory, error) from error
    name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}{suffix}"
    path, n = directory / name, 1
    while True:
      try:
        self._file = LocalFile(path, exclusive=True)
        break
      except WriteError:
        if not path.exists():
          raise
        n += 1  # two sessions within one second
        path = directory / f"{name}.{n}"
    self.path = path
    try:
      self._add(Event(wall_time=time.time(), file_version="brain.Event:2"))
      if purge_step is not None:
        self._add(
          Event(
            wall_time=time.time(), step=purge_step, session_log=SessionLog(status=SessionLog.START)
          )
        )
    except BaseException:
      self.close()
      raise

  def _add(self, event: Event) -> None:
    self._file.append(tfrecord(event.SerializeToString()))

  def add_summary(self, step: int, summary: Summary) -> None:
    self._add(Event(wall_time=time.time(), step=step, summary=summary))

  def flush(self) -> None:
    pass  # every event is written already

  def close(self) -> None:
    self._file.close()


class MirroredTensorBoard:
  """TensorBoard event files for a work directory on object storage.

  Object stores have no append: the events are written to a local temporary
  directory and its files copied into `target` at flush and close, and on
  `add_summary` at most every `interval` seconds. A copy replaces the whole
  file; event files of scalars stay small.
  """

  def __init__(self, target: epath.Path, purge_step: int | None, interval: float = 60.0):
    self._target, self._interval = target, interval
    self._local = tempfile.TemporaryDirectory(prefix="txf-tb-")
    # Event files are named by the second they start in: a unique suffix
    # keeps a quick restart (on another machine) from overwriting the
    # previous session's copy.
    self._events = EventFile(
      epath.Path(self._local.name), purge_step, suffix=f".{uuid.uuid4().hex[:8]}"
    )
    self._copied = time.monotonic()

  def add_summary(self, step: int, summary: Summary) -> None:
    self._events.add_summary(step, summary)
    if time.monotonic() - self._copied >= self._interval:
      self.flush()

  def flush(self) -> None:
    file = self._events.path
    try:
      (self._target / file.name).write_bytes(file.read_bytes())
    # Remote file systems raise their own types (gcsfs's HttpError, ...).
    except Exception as error:
      raise write_error(self._target / file.name, error) from error
    self._copied = time.monotonic()

  def close(self) -> None:
    try:
      self._events.close()
      self.flush()
    finally:
      self._local.cleanup()


def tensorboard(directory: epath.Path, purge_step: int | None) -> EventFile | MirroredTensorBoard:
  if is_local(directory):
    return EventFile(directory, purge_step)
  return MirroredTensorBoard(directory, purge_step)


def read_events(directory: epath.Path) -> list[Event]:
  """Every Event of the event files in `directory` (none if it does not
  exist), file by file; a file's records end at the first one that is cut
  off or fails its checksum (a crash mid-write)."""
  events = []
  paths = sorted(directory.glob("events.out.tfevents.*")) if directory.exists() else []
  for path in paths:
    data, pos = path.read_bytes(), 0
    while pos + 12 <= len(data):
      header = data[pos : pos + 8]
      (length,) = struct.unpack("<Q", header)
      payload = data[pos + 12 : pos + 12 + length]
      crc = data[pos + 12 + length : pos + 16 + length]
      if len(crc) < 4 or struct.unpack("<I", crc)[0] != masked_crc32c(payload):
        break
      events.append(Event.FromString(payload))
      pos += 16 + length
  return events


def read_bytes(path: epath.Path) -> bytes:
  """The bytes of `path` (b'' if there is none): read as bytes, so that a
  line that is not UTF-8 is one unreadable row, not an unreadable file."""
  return path.read_bytes() if path.exists() else b""


def writing(path: epath.Path, action):
  """Runs `action()`, raising WriteError naming `path` if it fails."""
  try:
    return action()
  except WriteError:
    raise
  # Remote file systems raise their own types (gcsfs's HttpError, ...).
  except Exception as error:
    raise write_error(path, error) from error


def terminate_partial_last_line(path: epath.Path) -> None:
  """Ends a row of a local file cut off by a crash, so appended rows start
  on a new line."""
  if not path.exists() or path.stat().length == 0:
    return
  with open(path, "rb") as f:
    f.seek(-1, os.SEEK_END)
    ended = f.read(1) == b"\n"
  if not ended:
    file = LocalFile(path)
    try:
      file.append(b"\n")
    finally:
      file.close()


def append_bytes(path: epath.Path, data: bytes) -> None:
  """Appends `data` to `path`; an object (no append) is rewritten whole."""
  if is_local(path):
    file = LocalFile(path)
    try:
      file.append(data)
    finally:
      file.close()
  else:
    writing(path, lambda: path.write_bytes(read_bytes(path) + data))
