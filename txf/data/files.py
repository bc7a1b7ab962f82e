"""Your own text: UTF-8 files as a corpus (data.name='files:PATH_OR_GLOB').

PATH_OR_GLOB is one file, a directory (every file below it, at any depth),
or a glob pattern of '*', '?' and '[...]', each matching within one folder
level (e.g. 'data/wikitext-2-raw/*.raw', 'gs://bucket/books/*/*.txt'; '**'
is refused by epath, since on object storage it could cost thousands of
requests: name the directory instead). Paths go through `etils.epath`, so
any file system it reads works (local, gs:// with the `gcs` extra). Files
and folders whose name starts with '.' are skipped.

The split into train / validation / test is deterministic:

  several files  each file goes whole to one split by a SHA-256 hash of its
                 path relative to the root (the directory, or the pattern's
                 folder before its first wildcard): about 90% / 5% / 5%, as
                 the built-in corpus (`txf.data.corpus.split_paths`). The
                 split does not depend on where the corpus lies or on the
                 other files, and a split is read in the order of that hash.
  one file       by position: its first 90% of characters train, the next
                 5% validation, the last 5% test, each cut moved forward to
                 just after a newline, so no line is split.

A split holds at most `max_bytes` of UTF-8 text (data.max_corpus_bytes): its
files are read in order until the budget is spent, the last one cut. Every
problem is a ValueError naming the path, raised while the data are loaded
(before any compute): an empty pattern, a path or pattern that matches no
file, a file that cannot be read or is not UTF-8 (with the byte offset), and
a split left without text (e.g. a handful of files, none of which hashes to
validation: point at one file, or at more files).
"""

from __future__ import annotations

import dataclasses

from etils import epath

from txf.data import corpus

# One-file split: where validation and test start, as fractions of the text.
ONE_FILE_CUTS = {'validation': 0.90, 'test': 0.95}
_WILDCARDS = '*?['


def _root_and_pattern(path_or_glob: str) -> tuple[epath.Path, str | None]:
  """(root, glob pattern relative to it), or (path, None) without wildcards."""
  first = min((i for i, c in enumerate(path_or_glob) if c in _WILDCARDS), default=None)
  if first is None:
    return epath.Path(path_or_glob), None
  slash = path_or_glob.rfind('/', 0, first)
  root = '.' if slash < 0 else path_or_glob[:slash] or '/'
  return epath.Path(root), path_or_glob[slash + 1:]


def _visible(relative: str) -> bool:
  return not any(part.startswith('.') for part in relative.split('/'))


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
      raise ValueError(f"data.name: 'files:' names no path; expected "
                       f"'files:PATH_OR_GLOB', got {path_or_glob!r}")
    root, pattern = _root_and_pattern(path_or_glob)
    try:
      if pattern is None and root.is_file():
        return cls(path_or_glob, root.parent, (root.name,))
      if pattern is None and not root.is_dir():
        raise ValueError(f'data.name: files:{path_or_glob}: no such file or directory')
      if pattern is None:
        found = []
        for folder, subfolders, names in root.walk():
          subfolders[:] = [d for d in subfolders if not d.startswith('.')]  # prunes the walk
          found += [folder / name for name in names]
      else:
        if '**' in pattern:
          raise ValueError(f"data.name: files:{path_or_glob}: '**' is not supported; name the "
                           "directory to read every file below it")
        if not root.is_dir():
          raise ValueError(f'data.name: files:{path_or_glob}: no such directory {root}')
        found = [p for p in root.glob(pattern) if p.is_file()]
    except OSError as error:
      raise ValueError(f'data.name: files:{path_or_glob}: cannot be listed ({error})') from None
    relative = sorted({p.relative_to(root).as_posix() for p in found})
    relative = tuple(p for p in relative if _visible(p))
    if not relative:
      raise ValueError(f'data.name: files:{path_or_glob}: matches no file')
    return cls(path_or_glob, root, relative)

  def _read(self, relative: str) -> str:
    path = self.root / relative
    try:
      data = path.read_bytes()
    except OSError as error:
      raise ValueError(f'data.name: {path}: cannot be read ({error})') from None
    try:
      return data.decode('utf-8')
    except UnicodeDecodeError as error:
      raise ValueError(f'data.name: {path}: is not UTF-8 text (byte {error.start}: '
                       f'{error.reason})') from None

  def _one_file_part(self, split: str) -> str:
    """The split's share of the only file (module docstring)."""
    text = self._read(self.relative_paths[0])
    cut = lambda fraction: _after_newline(text, int(fraction * len(text)))
    start = 0 if split == 'train' else cut(ONE_FILE_CUTS[split])
    end = {'train': cut(ONE_FILE_CUTS['validation']), 'validation': cut(ONE_FILE_CUTS['test']),
           'test': len(text)}[split]
    return text[start:end]

  def load(self, split: str, *, max_bytes: int | None) -> list[str]:
    """The split's documents (one per file, or the one file's part), at most
    `max_bytes` of UTF-8 in all (None: no cap).

    Raises:
      ValueError: naming the path, for an unknown split, a file that cannot
        be read or is not UTF-8, or a split without text.
    """
    if split not in corpus.SPLITS:
      raise ValueError(f'split={split!r} is unknown; expected one of {corpus.SPLITS}')
    if max_bytes is not None and max_bytes < 1:
      raise ValueError(f'max_bytes must be >= 1 or None, got {max_bytes}')
    if len(self.relative_paths) == 1:
      texts = [self._one_file_part(split)]
    else:
      texts = (self._read(p) for p in corpus.split_paths(self.relative_paths, split))
    documents, budget = [], max_bytes
    for text in texts:
      if budget == 0:
        break
      if budget is not None:
        data = text.encode('utf-8')[:budget]
        budget -= len(data)
        # A cut inside a character drops its first bytes, not the document.
        text = data.decode('utf-8', errors='ignore')
      if text:
        documents.append(text)
    if not documents:
      hint = ('a file of one line, or of a few, leaves it empty' if len(self.relative_paths) == 1
              else 'point at more files, or at one file to split it by position')
      raise ValueError(f'data.name: files:{self.source}: the {split} split holds no text '
                       f'({self._split_rule()}; {hint})')
    return documents

  def _split_rule(self) -> str:
    if len(self.relative_paths) == 1:
      return f'{self.root / self.relative_paths[0]} is split by position at line ends'
    return (f'{len(self.relative_paths)} files under {self.root}, each in one split by a '
            'hash of its relative path')

  def description(self) -> str:
    return f'UTF-8 text files:{self.source}: {self._split_rule()}'


def _after_newline(text: str, index: int) -> int:
  """The index just after the first newline at or after `index` (len(text) if none)."""
  newline = text.find('\n', index)
  return len(text) if newline < 0 else newline + 1
