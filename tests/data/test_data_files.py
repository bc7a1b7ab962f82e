"""The text-files source (data.name='files:PATH_OR_GLOB', txf/data/files.py):
which files it finds, deterministic splits, errors naming the path, batches."""

import hashlib
import os
import re
import shutil

import numpy as np
import pytest

from txf.data import ByteTokenizer, make_dataset
from txf.data.files import POSITION_CUTS, TextFiles
from txf.data.lm import token_stream
from txf.data.spec import parse_data
from txf.runconfig.run_config import ConfigError, parse
from txf.train import loop

SPLITS = ("train", "validation", "test")
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


def _text(seed: int, lines: int) -> str:
  """Lines of 1-12 words, a different text per seed."""
  rng = np.random.default_rng(seed)
  return "".join(
    " ".join(rng.choice(WORDS, rng.integers(1, 13))) + f" {seed}.\n" for _ in range(lines)
  )


def _write(root, files):
  for name, content in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
      path.write_bytes(content)
    else:
      path.write_text(content, encoding="utf-8")


def _config(source, **overrides):
  fields = dict(
    name=f"files:{source}",
    task="lm",
    tokenizer="bytes",
    seq_len=15,
    batch_size=4,
    max_corpus_bytes=1_000_000,
  )
  return parse_data({**fields, **overrides})


@pytest.fixture
def tree(tmp_path):
  """60 files in nested folders, plus hidden ones that must be skipped."""
  root = tmp_path / "corpus"
  files = {f"part{i % 3}/doc{i:02d}.txt": _text(i, 5) for i in range(60)}
  _write(
    root,
    {
      **files,
      ".hidden.txt": "secret\n",
      ".git/objects/x": "blob\n",
      "part0/.notes.txt": "private\n",
    },
  )
  return root, files


# ---------------------------------------------------------------------------
# Splits.


def position_parts(text):
  """The train / validation / test parts of a text split by position, computed
  from the text: cut just after the first newline at or past 90% and 95% of
  its characters."""
  cut = lambda fraction: text.index("\n", int(fraction * len(text))) + 1
  first, second = cut(POSITION_CUTS["validation"]), cut(POSITION_CUTS["test"])
  assert 0 < first < second < len(text)
  return [text[:first], text[first:second], text[second:]]


def test_one_or_two_files_split_by_position_at_line_ends(tmp_path):
  texts = {"book.txt": _text(0, 400), "notes.txt": _text(1, 300)}
  _write(tmp_path, texts)
  parts = [TextFiles.find(str(tmp_path / "book.txt")).load(s, max_bytes=None) for s in SPLITS]
  assert [[part] for part in position_parts(texts["book.txt"])] == parts
  # The same split again, found through a glob that matches only that file.
  again = TextFiles.find(str(tmp_path / "b*.txt"))
  assert [again.load(s, max_bytes=None) for s in SPLITS] == parts
  # Two files: each one's parts, in name order.
  both = TextFiles.find(str(tmp_path))
  assert [both.load(s, max_bytes=None) for s in SPLITS] == [
    list(part) for part in zip(*(position_parts(texts[n]) for n in sorted(texts)))
  ]


def test_three_or_more_files_split_whole_by_relative_path_hash(tree, tmp_path):
  root, files = tree
  found = TextFiles.find(str(root))
  assert found.relative_paths == tuple(sorted(files))  # hidden files and folders skipped
  by_split = {s: found.load(s, max_bytes=None) for s in SPLITS}
  documents = [doc for docs in by_split.values() for doc in docs]
  # Disjoint and covering: every file's text exactly once, whole.
  assert sorted(documents) == sorted(files.values())
  # 60 files: ceil(5%) = 3 held out for each of validation and test, the
  # last ones in the order of the paths' SHA-256.
  ordered = [
    files[p] for p in sorted(files, key=lambda p: hashlib.sha256(p.encode("utf-8")).digest())
  ]
  assert by_split == {"train": ordered[:54], "validation": ordered[54:57], "test": ordered[57:]}
  # Deterministic, and independent of where the tree lies.
  moved = tmp_path / "elsewhere" / "copy"
  shutil.copytree(root, moved)
  assert {s: TextFiles.find(str(moved)).load(s, max_bytes=None) for s in SPLITS} == by_split


def test_glob_matches_files_within_one_level(tree):
  root, files = tree
  found = TextFiles.find(str(root / "part1" / "doc?[0-4].txt"))
  assert found.root == root / "part1"
  assert found.relative_paths == tuple(
    sorted(
      name.split("/")[1] for name in files if name.startswith("part1/") and name[-5] in "01234"
    )
  )
  assert TextFiles.find(str(root / "*" / "*.txt")).relative_paths == tuple(sorted(files))


def test_relative_glob_is_taken_from_the_working_directory(tree, monkeypatch):
  root, files = tree
  monkeypatch.chdir(root / "part2")
  found = TextFiles.find("*.txt")
  assert found.relative_paths == tuple(
    sorted(n.split("/")[1] for n in files if n.startswith("part2/"))
  )


def test_max_bytes_caps_each_split_without_splitting_a_character(tmp_path):
  text = "".join(f"é line {i}\n" for i in range(1000))  # 2-byte characters
  _write(tmp_path, {"book.txt": text})
  found = TextFiles.find(str(tmp_path / "book.txt"))
  (train,) = found.load("train", max_bytes=101)
  assert len(train.encode("utf-8")) <= 101 and text.startswith(train)
  assert len(train.encode("utf-8")) >= 99  # at most one cut character dropped


# ---------------------------------------------------------------------------
# Errors name the path, before any compute.


@pytest.mark.parametrize("name", ["files:", "files:   "])
def test_empty_path_is_refused_by_the_config(name):
  with pytest.raises(ValueError, match=r"^data\.name='files:\s*' names no PATH_OR_GLOB"):
    _config("", name=name)


def test_path_or_glob_matching_nothing_is_named(tmp_path):
  _write(tmp_path, {"a.txt": "a\n", "sub/b.txt": "b\n"})
  for source, problem in (
    (tmp_path / "missing.txt", "no such file or directory"),
    (tmp_path / "*.md", "matches no file"),
    (tmp_path / "sub" / ".*", "matches no file"),
    (tmp_path / "nowhere" / "*.txt", f"no such directory {tmp_path}/nowhere"),
    (tmp_path / "**" / "*.txt", "'[*][*]' is not supported"),
  ):
    with pytest.raises(ValueError, match=f"^data.name: files:{re.escape(str(source))}: {problem}"):
      TextFiles.find(str(source))


def test_unreadable_and_non_utf8_files_are_named(tmp_path):
  _write(tmp_path / "latin", {"a.txt": _text(1, 3), "b.txt": b"caf\xe9\n"})
  with pytest.raises(
    ValueError,
    match=rf"^data\.name: {tmp_path}/latin/b\.txt: is not UTF-8 "
    r"text \(byte 3",
  ):
    for split in SPLITS:
      TextFiles.find(str(tmp_path / "latin")).load(split, max_bytes=None)
  _write(tmp_path / "broken", {"a.txt": _text(1, 3)})
  os.symlink(tmp_path / "gone.txt", tmp_path / "broken" / "link.txt")  # dangling
  with pytest.raises(
    ValueError,
    match=rf"^data\.name: {tmp_path}/broken/link\.txt: cannot "
    "be read",
  ):
    for split in SPLITS:
      TextFiles.find(str(tmp_path / "broken")).load(split, max_bytes=None)


def test_split_left_empty_is_named(tmp_path):
  _write(tmp_path, {"one_line.txt": "a single line of text\n"})
  source = tmp_path / "one_line.txt"
  with pytest.raises(
    ValueError, match=f"^data.name: files:{source}: the validation split holds no text"
  ):
    TextFiles.find(str(source)).load("validation", max_bytes=None)
  # Three files fill the three splits, but not with an empty file.
  _write(tmp_path / "three", {"a.txt": "a\n", "b.txt": "b\n", "c.txt": ""})
  found = TextFiles.find(str(tmp_path / "three"))
  assert sorted(found.split_files(s)[0] for s in SPLITS) == ["a.txt", "b.txt", "c.txt"]
  empty = next(s for s in SPLITS if found.split_files(s) == ["c.txt"])
  with pytest.raises(ValueError, match=f"the {empty} split holds no text.*files are empty"):
    found.load(empty, max_bytes=None)


def test_runner_stops_before_writing_anything(tmp_path):
  from conftest import tiny_config

  config = tiny_config("base")
  config.data.name = f"files:{tmp_path / 'nothing' / '*.txt'}"
  workdir = tmp_path / "run"
  with pytest.raises(ConfigError, match=r"^data\.name: files:.*nothing/\*\.txt: no such dir"):
    loop.run(parse(config), workdir, log=lambda line: None)
  assert not workdir.exists() or not any(workdir.iterdir())


# ---------------------------------------------------------------------------
# Batches: LM and MLM, bytes and sentencepiece.


def test_lm_batches_are_windows_of_the_split(tree):
  root, _ = tree
  found = TextFiles.find(str(root))
  validation = make_dataset(_config(root), "validation", seed=0)
  assert validation.description.startswith(f"UTF-8 text files:{root}: 60 files")
  expected = token_stream(found.load("validation", max_bytes=None), ByteTokenizer())
  batch = next(validation)
  windows = expected[: 4 * 16].reshape(4, 16)  # the first batch, in stream order
  np.testing.assert_array_equal(batch["inputs"], windows[:, :-1])
  np.testing.assert_array_equal(batch["targets"], windows[:, 1:])
  # Training rows are windows of the train split's stream (shuffled).
  stream = token_stream(found.load("train", max_bytes=None), ByteTokenizer())
  windows = {row.tobytes() for row in stream[: len(stream) // 16 * 16].reshape(-1, 16)}
  batch = next(make_dataset(_config(root), "train", seed=0))
  rows = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
  assert all(row.tobytes() in windows for row in rows)


def test_mlm_with_sentencepiece(tree, tmp_path):
  root, files = tree
  config = _config(
    root, task="mlm", tokenizer="sentencepiece", sp_vocab_size=300, mlm_probability=0.15
  )
  dataset = make_dataset(config, "train", seed=0, workdir=tmp_path / "run")
  assert (tmp_path / "run" / "sentencepiece_300.model").exists()
  batch = next(dataset)
  assert set(batch) == {"inputs", "targets", "weights"} and batch["inputs"].shape == (4, 15)
  assert 0 < batch["weights"].sum() < batch["weights"].size
  # The vocabulary was learned from these files: a line round-trips.
  line = files["part0/doc00.txt"].splitlines()[0]
  assert dataset.tokenizer.decode(dataset.tokenizer.encode(line)) == line
