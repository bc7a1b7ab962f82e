"""Model names from the Hugging Face Hub (txf.interop.hub.resolve_model): a
cache laid out as huggingface_hub lays it out (refs/main, snapshots/<hash>/),
built in tmp_path from the fixtures of tests/fixtures/hf; no network
(HF_HUB_OFFLINE=1, conftest).
"""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import FIXTURES, REPO
from txf.configs import pretrained as pretrained_config
from txf.interop import CheckpointError, load_pretrained, resolve_model
from txf.interop.rules import flatten

HF_FIXTURES = FIXTURES / "hf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache, repo_id, fixture, commit=COMMIT):
  """`fixture` as the cache holds `repo_id` at `commit` (refs/main names it)."""
  repo = cache / ("models--" + repo_id.replace("/", "--"))
  shutil.copytree(HF_FIXTURES / fixture, repo / "snapshots" / commit)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(commit)
  return repo / "snapshots" / commit


@pytest.fixture
def cache(tmp_path, monkeypatch):
  """An empty Hub cache under HF_HOME (HF_HUB_CACHE unset)."""
  monkeypatch.delenv("HF_HUB_CACHE", raising=False)
  monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  path = tmp_path / "hf_home" / "hub"
  path.mkdir(parents=True)
  return path


def test_a_cached_name_loads_as_its_directory(cache):
  snapshot = cache_model(cache, "openai-community/gpt2", "gpt2")
  assert resolve_model("openai-community/gpt2") == str(snapshot)
  found = flatten(load_pretrained("openai-community/gpt2").params)
  expected = flatten(load_pretrained(HF_FIXTURES / "gpt2").params)
  assert found.keys() == expected.keys()
  for path, value in expected.items():
    np.testing.assert_array_equal(found[path], value, err_msg=path)


@pytest.mark.parametrize(
  "name,repo_id,fixture",
  [
    ("gpt2", "openai-community/gpt2", "gpt2"),
    ("bert-base-uncased", "google-bert/bert-base-uncased", "bert"),
    ("t5-small", "google-t5/t5-small", "t5"),
  ],
)
def test_a_legacy_name_is_its_organisations_repository(cache, name, repo_id, fixture):
  snapshot = cache_model(cache, repo_id, fixture)
  assert resolve_model(name) == str(snapshot)


def test_hf_hub_cache_is_read_before_hf_home(cache, tmp_path, monkeypatch):
  other = tmp_path / "other_cache"
  snapshot = cache_model(other, "openai-community/gpt2", "gpt2")
  monkeypatch.setenv("HF_HUB_CACHE", str(other))
  assert resolve_model("gpt2") == str(snapshot)


def test_a_legacy_name_of_several_organisations_is_refused_naming_them(cache):
  cache_model(cache, "openai-community/gpt2", "gpt2")
  cache_model(cache, "someone/gpt2", "gpt2")
  with pytest.raises(CheckpointError) as error:
    resolve_model("gpt2")
  assert str(error.value) == (
    "model gpt2: several cached models match (openai-community/gpt2, someone/gpt2): name one"
  )
  assert resolve_model("someone/gpt2").endswith(f"models--someone--gpt2/snapshots/{COMMIT}")


def test_a_name_cached_as_its_own_repository_is_read_before_any_organisations(cache):
  """huggingface_hub reads models--gpt2 for 'gpt2'; with an organisation's
  gpt2 cached too, txf refused both as ambiguous, and no name chose it."""
  own = cache_model(cache, "gpt2", "gpt2")
  cache_model(cache, "openai-community/gpt2", "gpt2")
  assert resolve_model("gpt2") == str(own)


def test_a_name_not_cached_says_how_to_fetch_it(cache):
  with pytest.raises(CheckpointError) as error:
    resolve_model("openai-community/gpt2")
  assert str(error.value) == (
    f"model openai-community/gpt2: not a directory, and not in the Hugging Face cache {cache} "
    "(HF_HUB_OFFLINE is set): fetch it with `hf download openai-community/gpt2`"
  )


def test_a_name_the_hub_does_not_give_says_how_to_fetch_it(cache, monkeypatch):
  """Online but unreachable (no network, a typo of a local path): the line
  said only what the Hub answered."""
  huggingface_hub = pytest.importorskip("huggingface_hub")

  def unreachable(**kwargs):
    raise OSError("ConnectError: [Errno -2] Name or service not known")

  monkeypatch.delenv("HF_HUB_OFFLINE")
  monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
  with pytest.raises(CheckpointError) as error:
    resolve_model("openai-community/gpt2")
  assert str(error.value) == (
    f"model openai-community/gpt2: not a directory, not in {cache}, and the Hugging Face Hub "
    "did not give it (ConnectError: [Errno -2] Name or service not known): fetch it with "
    "`hf download openai-community/gpt2` where the Hub can be reached"
  )


def test_refs_main_naming_a_missing_snapshot_is_one_line(cache):
  snapshot = cache_model(cache, "openai-community/gpt2", "gpt2")
  shutil.rmtree(snapshot)
  with pytest.raises(CheckpointError) as error:
    load_pretrained("gpt2")
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith(f"model gpt2: {snapshot.parent.parent / 'refs' / 'main'} names ")
  assert f"snapshot {COMMIT!r}, which is not in" in message
  # The repository found, not the name typed ('gpt2' would fetch another).
  assert message.endswith("`hf download openai-community/gpt2`")


def test_directories_urls_and_other_strings_are_left_as_they_are(cache, tmp_path, monkeypatch):
  cache_model(cache, "openai-community/gpt2", "gpt2")
  monkeypatch.chdir(tmp_path)
  (tmp_path / "gpt2").mkdir()  # a local directory wins over the cache
  for given in ("gpt2", str(HF_FIXTURES / "gpt2"), "gs://bucket/gpt2", "./missing", "/no/such"):
    assert resolve_model(given) == given


def test_the_pretrained_config_takes_a_name(cache):
  snapshot = cache_model(cache, "openai-community/gpt2", "gpt2")
  config = pretrained_config.get_config("gpt2")
  assert config.train.init_from == config.data.tokenizer_path == str(snapshot)
  assert config.data.task == "lm"


@pytest.mark.slow  # a subprocess (~5 s)
def test_generate_takes_a_name(cache):
  """txf-generate --model=gpt2 prints what --model=<the fixture> prints."""
  cache_model(cache, "openai-community/gpt2", "gpt2")

  def generate(model):
    command = [sys.executable, "-m", "experiments.generate", f"--model={model}", "--prompt=a"]
    return subprocess.run(
      [*command, "--max_new_tokens=3"], cwd=REPO, capture_output=True, text=True, timeout=120
    )

  by_name = generate("gpt2")
  assert by_name.returncode == 0, by_name.stderr
  assert by_name.stdout == generate(HF_FIXTURES / "gpt2").stdout
  missing = generate("openai-community/no-such-model")
  assert missing.returncode == 2
  assert missing.stderr.strip().startswith("model error: model openai-community/no-such-model: ")
  assert "`hf download openai-community/no-such-model`" in missing.stderr
