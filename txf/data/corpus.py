"""The built-in corpus: the Python standard library's own `.py` sources.

It needs no download and exists wherever Python runs. The files are listed
under `sysconfig.get_paths()['stdlib']` (skipping site-packages,
dist-packages and __pycache__) and assigned to a split by a stable hash of
their relative path: about 90% train, 5% validation, 5% test. A split is
read in the order of that hash, so a `max_bytes` prefix is a uniform sample
of the split rather than the alphabetically first packages.

The corpus differs slightly across Python versions (files are added, removed
and edited), so `corpus_description()` records the version; compare numbers
only between runs on the same version.
"""

import functools
import hashlib
import os
import pathlib
import platform
import sysconfig
from collections.abc import Iterable

SPLITS = ("train", "validation", "test")
# Upper bounds of each split's share of the hash range [0, 100).
_SPLIT_PERCENT = {"train": 90, "validation": 95, "test": 100}
_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


def stdlib_root() -> pathlib.Path:
  return pathlib.Path(sysconfig.get_paths()["stdlib"])


def corpus_description() -> str:
  return (
    f"Python {platform.python_version()} standard library .py sources "
    f"({stdlib_root()}), split by a SHA-256 hash of the relative path"
  )


@functools.cache
def corpus_fingerprint(root: str | None = None) -> dict[str, int | str]:
  """What the corpus is, for a run's record: the Python version, the number
  of .py files and their bytes (all splits), and a SHA-256 of their relative
  paths and contents (in `hash_order`), the same wherever the corpus is.

  Args:
    root: directory to read instead of the standard library (for tests).
  """
  base = pathlib.Path(root) if root is not None else stdlib_root()
  digest, total = hashlib.sha256(), 0
  paths = hash_order(p for split in SPLITS for p in corpus_files(split, base))
  for path in paths:
    data = (base / path).read_bytes()
    total += len(data)
    for part in (path.encode("utf-8"), data):
      digest.update(len(part).to_bytes(8, "big") + part)
  return dict(
    python=platform.python_version(), files=len(paths), bytes=total, sha256=digest.hexdigest()
  )


def _check_split(split: str) -> None:
  if split not in SPLITS:
    raise ValueError(f"split={split!r} is unknown; expected one of {SPLITS}")


def _hash_key(relative_path: str) -> bytes:
  return hashlib.sha256(relative_path.encode("utf-8")).digest()


def _split_of(relative_path: str) -> str:
  bucket = int.from_bytes(_hash_key(relative_path)[:8], "big") % 100
  return next(s for s in SPLITS if bucket < _SPLIT_PERCENT[s])


def hash_order(relative_paths: Iterable[str]) -> list[str]:
  """The paths in the order of a SHA-256 hash of each: an order unrelated to
  names or folders, the same on every machine."""
  return sorted(relative_paths, key=_hash_key)


def corpus_files(split: str, root: str | os.PathLike | None = None) -> list[str]:
  """Relative POSIX paths of the split's files, in reading order.

  Args:
    split: 'train', 'validation' or 'test'.
    root: directory to read instead of the standard library (for tests).
  """
  _check_split(split)
  paths = _python_files(pathlib.Path(root)) if root is not None else _stdlib_python_files()
  return hash_order(p for p in paths if _split_of(p) == split)


@functools.cache
def _stdlib_python_files() -> tuple[str, ...]:
  """The standard library's .py files, walked once per process: a run lists
  them for each split and again for its record's fingerprint (six walks,
  about 0.3 s of every run's start)."""
  return _python_files(stdlib_root())


def _python_files(root: pathlib.Path) -> tuple[str, ...]:
  """Relative POSIX paths of the .py files under `root`."""
  paths = []
  for directory, subdirs, files in os.walk(root):
    # Pruning in place stops os.walk from descending into installed packages.
    subdirs[:] = [d for d in subdirs if d not in _SKIPPED_DIRS]
    for name in files:
      if name.endswith(".py"):
        paths.append((pathlib.Path(directory) / name).relative_to(root).as_posix())
  return tuple(paths)


def load_corpus(
  split: str, *, max_bytes: int | None, root: str | os.PathLike | None = None
) -> list[str]:
  """Returns the split's non-empty documents, at most `max_bytes` in all.

  Files are read in `corpus_files` order until `max_bytes` is reached; the
  last one is cut to fit. Bytes that are not UTF-8 (a few test files use
  other encodings on purpose) decode to U+FFFD.

  Args:
    split: 'train', 'validation' or 'test'.
    max_bytes: cap on the bytes read, or None for the whole split.
    root: directory to read instead of the standard library (for tests).

  Raises:
    ValueError: unknown split, max_bytes < 1, or a split with no text.
  """
  _check_split(split)
  if max_bytes is not None and max_bytes < 1:
    raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}")
  root = pathlib.Path(root) if root is not None else stdlib_root()
  budget = max_bytes  # bytes still to read; None: no cap
  documents = []
  for path in corpus_files(split, root):
    if budget == 0:
      break
    data = (root / path).read_bytes()
    if budget is not None:
      data = data[:budget]
      budget -= len(data)
    if data:
      documents.append(data.decode("utf-8", errors="replace"))
  if not documents:
    raise ValueError(f"split={split!r} of the corpus at {root} holds no text")
  return documents
