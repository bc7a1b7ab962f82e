"""Your own text: UTF-8 files as a corpus (data.name='files:PATH_OR_GLOB').

PATH_OR_GLOB is one file, a directory (every file below it, at any depth),
or a glob pattern of '*', '?' and '[...]', each matching within one folder
level (e.g. 'data/wikitext-2-raw/*.raw', 'gs://bucket/books/*/*.txt'; '**'
is refused by epath, since on object storage it could cost thousands of
requests: name the directory instead). Paths go through `etils.epath`, so
any file system it reads works (local, gs:// with the `gcs` extra). Files
and folders whose name starts with '.' are skipped.

The split into train / validation / test is deterministic:

  3 or more files  whole files, in the order of a SHA-256 hash of each one's
                   path relative to the root (the directory, or the
                   pattern's folder before its first wildcard): the last
                   ceil(5%) of them are test, the ceil(5%) before those
                   validation, the rest train, so every split holds at least
                   one file. It does not depend on where the corpus lies,
                   but adding files may move others between splits (unlike
                   the built-in corpus, whose hash buckets would leave a
                   small corpus's validation split empty). Each split is
                   read in hash order.
  1 or 2 files     by position: each file's first 90% of characters train,
                   the next 5% validation, the last 5% test, each cut moved
                   forward to just after a newline, so no line is split.

A split holds at most `max_bytes` of UTF-8 text (data.max_corpus_bytes): its
files are read in order until the budget is spent, the last one cut. Every
problem is a ValueError naming the path, raised while the data are loaded
(before any compute): an empty pattern, a path or pattern that matches no
file, a file that cannot be read or is not UTF-8 (with the byte offset), and
a split left without text (a file of one line split by position, or
held-out files that are empty).

A corpus that comes with its own splits is not kept apart: WikiText-2's
wiki.train.raw, wiki.valid.raw and wiki.test.raw through one glob are three
files assigned by hash. Point at wiki.train.raw instead (split by position).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os

from etils import epath

from txf.data import corpus

# Up to this many files, each is split by position; from one more, whole
# files are.
MAX_FILES_SPLIT_BY_POSITION = 2
# Split by position: where validation and test start, as fractions of a text.
POSITION_CUTS = {"validation": 0.90, "test": 0.95}
# Whole files: the share of them (rounded up) in validation and in test.
HELD_OUT_FILE_FRACTION = 0.05
_WILDCARDS = "*?["


def _root_and_pattern(path_or_glob: str) -> tuple[epath.Path, str | None]:
  """(root, glob pattern relative to it), or (path, None) without wildcards."""
  first = min((i for i, c in enumerate(path_or_glob) if c in _WILDCARDS), default=None)
  if first is None:
    return epath.Path(path_or_glob), None
  slash = path_or_glob.rfind("/", 0, first)
  root = "." if slash < 0 else path_or_glob[:slash] or "/"
  return epath.Path(root), path_or_glob[slash + 1 :]


def _visible(relative: str) -> bool:
  return not any(part.startswith(".") for part in relative.split("/"))


@dataclasses.dataclass(frozen=True)
class TextFiles:
  """The files data.name='files:PATH_OR_GLOB' names, found once.

  Attributes:
    source: PATH_OR_GLOB as given.
    root: the folder relative paths are taken from.
    relative_paths: the files' paths relative to root (POSIX), sorted.
  """

  source: str
  root: epath.Path
  relative_paths: tuple[str, ...]

  @classmethod
  def find(cls, path_or_glob: str) -> TextFiles:
    """Lists the files of `path_or_glob` (nothing is read yet).

    Raises:
      ValueError: naming the path, for an empty one or one matching no file.
    """
    if not isinstance(path_or_glob, str) or not path_or_glob.strip():
      raise ValueError(
        f"data.name: 'files:' names no path; expected 'files:PATH_OR_GLOB', got {path_or_glob!r}"
      )
    root, pattern = _root_and_pattern(path_or_glob)
    try:
      if pattern is None and root.is_file():
        return cls(path_or_glob, root.parent, (root.name,))
      if pattern is None and not root.is_dir():
        raise ValueError(f"data.name: files:{path_or_glob}: no such file or directory")
      if pattern is None:
        found = []
        for folder, subfolders, names in root.walk():
          subfolders[:] = [d for d in subfolders if not d.startswith(".")]  # prunes the walk
          found += [folder / name for name in names]
      else:
        if "**" in pattern:
          raise ValueError(
            f"data.name: files:{path_or_glob}: '**' is not supported; name the "
            "directory to read every file below it"
          )
        if not root.is_dir():
          raise ValueError(f"data.name: files:{path_or_glob}: no such directory {root}")
        found = [p for p in root.glob(pattern) if p.is_file()]
    except OSError as error:
      raise ValueError(f"data.name: files:{path_or_glob}: cannot be listed ({error})") from None
    relative = sorted({p.relative_to(root).as_posix() for p in found})
    relative = tuple(p for p in relative if _visible(p))
    if not relative:
      raise ValueError(f"data.name: files:{path_or_glob}: matches no file")
    return cls(path_or_glob, root, relative)

  def _read(self, relative: str) -> str:
    path = self.root / relative
    try:
      data = path.read_bytes()
    except OSError as error:
      raise ValueError(f"data.name: {path}: cannot be read ({error})") from None
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError as error:
      raise ValueError(
        f"data.name: {path}: is not UTF-8 text (byte {error.start}: {error.reason})"
      ) from None

  @property
  def split_by_position(self) -> bool:
    return len(self.relative_paths) <= MAX_FILES_SPLIT_BY_POSITION

  def split_files(self, split: str) -> list[str]:
    """Whole-file split: the relative paths of `split`, in reading order."""
    ordered = corpus.hash_order(self.relative_paths)
    held_out = math.ceil(HELD_OUT_FILE_FRACTION * len(ordered))
    first_test = len(ordered) - held_out
    first_validation = first_test - held_out
    return {
      "train": ordered[:first_validation],
      "validation": ordered[first_validation:first_test],
      "test": ordered[first_test:],
    }[split]

  def _part(self, relative: str, split: str) -> str:
    """The split's share of one file split by position (module docstring)."""
    text = self._read(relative)
    cut = lambda fraction: _after_newline(text, int(fraction * len(text)))
    start = 0 if split == "train" else cut(POSITION_CUTS[split])
    end = {
      "train": cut(POSITION_CUTS["validation"]),
      "validation": cut(POSITION_CUTS["test"]),
      "test": len(text),
    }[split]
    return text[start:end]

  def load(self, split: str, *, max_bytes: int | None) -> list[str]:
    """The split's documents (one per file: whole, or its part), at most
    `max_bytes` of UTF-8 in all (None: no cap).

    Raises:
      ValueError: naming the path, for an unknown split, a file that cannot
        be read or is not UTF-8, or a split without text.
    """
    if split not in corpus.SPLITS:
      raise ValueError(f"split={split!r} is unknown; expected one of {corpus.SPLITS}")
    if max_bytes is not None and max_bytes < 1:
      raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}")
    if self.split_by_position:
      texts = (self._part(p, split) for p in self.relative_paths)
    else:
      texts = (self._read(p) for p in self.split_files(split))
    documents, budget = [], max_bytes
    for text in texts:
      if budget == 0:
        break
      if budget is not None:
        data = text.encode("utf-8")[:budget]
        budget -= len(data)
        # A cut inside a character drops its first bytes, not the document.
        text = data.decode("utf-8", errors="ignore")
      if text:
        documents.append(text)
    if not documents:
      hint = (
        "a file of one line, or a few, leaves it empty"
        if self.split_by_position
        else "its files are empty"
      )
      raise ValueError(
        f"data.name: files:{self.source}: the {split} split holds no text "
        f"({self._split_rule()}; {hint})"
      )
    return documents

  def _split_rule(self) -> str:
    files = ", ".join(os.fspath(self.root / p) for p in self.relative_paths)
    if self.split_by_position:
      return f"{files} split by position at line ends"
    return (
      f"{len(self.relative_paths)} files under {self.root}, whole, by a hash of their "
      "relative paths"
    )

  def description(self) -> str:
    return f"UTF-8 text files:{self.source}: {self._split_rule()}"

  def fingerprint(self, *, max_bytes: int | None) -> dict[str, int | str]:
    """What a run reads, for its record: the number of files, the UTF-8 bytes
    its three splits hold (at most `max_bytes` each, as `load` reads them)
    and a SHA-256 of the files' relative paths and of each split's documents,
    so it follows the contents as well as the names, the same wherever the
    files lie. A split that cannot be loaded (a run reading it fails on its
    own) is hashed as a marker."""
    digest, total = hashlib.sha256(), 0

    def update(part: bytes) -> None:
      digest.update(len(part).to_bytes(8, "big") + part)

    for relative in self.relative_paths:
      update(relative.encode("utf-8"))
    for split in corpus.SPLITS:
      update(split.encode("utf-8"))
      try:
        documents = self.load(split, max_bytes=max_bytes)
      except ValueError:
        update(b"<no text>")
        continue
      for document in documents:
        data = document.encode("utf-8")
        total += len(data)
        update(data)
    return dict(files=len(self.relative_paths), bytes=total, sha256=digest.hexdigest())


def _after_newline(text: str, index: int) -> int:
  """The index just after the first newline at or after `index` (len(text) if none)."""
  newline = text.find("\n", index)
  return len(text) if newline < 0 else newline + 1
