"""The built-in corpus: deterministic, disjoint, non-empty splits."""

import pathlib
import platform

import pytest

from txf.data import corpus_description, corpus_files, load_corpus
from txf.data.corpus import SPLITS, stdlib_root


def test_splits_are_disjoint_cover_the_stdlib_and_mostly_train():
  files = {split: corpus_files(split) for split in SPLITS}
  union = set().union(*files.values())
  assert sum(map(len, files.values())) == len(union)  # disjoint
  expected = {
    path.relative_to(stdlib_root()).as_posix()
    for path in stdlib_root().rglob("*.py")
    if not {"site-packages", "dist-packages"} & set(path.parts)
  }
  assert union == expected
  assert all(files.values())
  assert 0.8 < len(files["train"]) / len(union) < 0.97
  assert corpus_files("validation") == files["validation"]  # deterministic


def test_load_corpus_is_deterministic_and_capped():
  first = load_corpus("train", max_bytes=50_000)
  assert first == load_corpus("train", max_bytes=50_000)
  assert first and all(first)
  size = sum(len(doc.encode("utf-8")) for doc in first)
  # U+FFFD (3 bytes) may stand for one undecodable byte, hence the slack.
  assert 50_000 - 100 < size < 50_000 * 1.01
  # A larger cap reads the same files first.
  larger = load_corpus("train", max_bytes=100_000)
  assert larger[: len(first) - 1] == first[:-1]
  assert load_corpus("test", max_bytes=50_000) != first


def test_description_names_python_version():
  assert platform.python_version() in corpus_description()


def _write(root: pathlib.Path, files: dict[str, str]):
  for name, text in files.items():
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_custom_root_skips_installed_packages_and_pycache(tmp_path):
  _write(tmp_path, {f"m{i}.py": f"x = {i:02d}\n" for i in range(60)})
  _write(
    tmp_path,
    {
      "site-packages/pkg/big.py": "y = 1\n",
      "dist-packages/other.py": "z = 2\n",
      "__pycache__/m0.py": "w = 3\n",
      "notes.txt": "not python\n",
    },
  )
  names = [p for split in SPLITS for p in corpus_files(split, tmp_path)]
  assert sorted(names) == sorted(f"m{i}.py" for i in range(60))
  train = load_corpus("train", max_bytes=None, root=tmp_path)
  assert len(train) == len(corpus_files("train", tmp_path))
  capped = load_corpus("train", max_bytes=10, root=tmp_path)
  assert sum(map(len, capped)) == 10 and len(capped) == 2  # 7 + 3 bytes


def test_empty_split_raises(tmp_path):
  _write(tmp_path, {"only.py": "pass\n"})
  empty = [s for s in SPLITS if not corpus_files(s, tmp_path)]
  assert len(empty) == 2
  with pytest.raises(ValueError, match="holds no text"):
    load_corpus(empty[0], max_bytes=None, root=tmp_path)


@pytest.mark.parametrize(
  "kwargs, field",
  [
    (dict(split="dev", max_bytes=10), "split"),
    (dict(split="train", max_bytes=0), "max_bytes"),
  ],
)
def test_bad_arguments(kwargs, field):
  with pytest.raises(ValueError, match=field):
    load_corpus(kwargs.pop("split"), **kwargs)
