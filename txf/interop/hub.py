"""Model names from the Hugging Face Hub: `gpt2`, `openai-community/gpt2`.

  directory = resolve_model("gpt2")   # ~/.cache/huggingface/hub/models--openai-community--gpt2/...

A local directory is used as it is. Anything else of the form `name` or
`org/name` is looked up in the Hub's cache, as huggingface_hub lays it out:
`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`, holding
`models--{org}--{name}/refs/main` (a commit hash) and
`models--{org}--{name}/snapshots/{hash}/` (the files). The Hub keeps the old
unqualified names (gpt2, bert-base-uncased, t5-small) under their organisations
(openai-community/gpt2, ...), so a name without '/' also matches a cached
`models--*--{name}`. A name not cached is downloaded when huggingface_hub is
installed and HF_HUB_OFFLINE is not set; otherwise the error says how to
fetch it. The layout is read here, not through huggingface_hub, because
huggingface_hub is optional: a cache filled by another machine or by
`hf download` is read without it.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re

from txf.interop.rules import CheckpointError

# A Hub repository id: `name` or `org/name` (letters, digits, '-', '_', '.').
_REPO_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")
# The files txf reads from a model repository (weights, configs, tokenizer,
# sentence-transformers' pooling): not the other frameworks' weights.
DOWNLOAD_PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt")
_TRUE = ("1", "true", "yes", "on")


def hub_cache() -> pathlib.Path:
  """The Hub's cache directory, as huggingface_hub picks it."""
  if os.environ.get("HF_HUB_CACHE"):
    return pathlib.Path(os.environ["HF_HUB_CACHE"]).expanduser()
  home = os.environ.get("HF_HOME") or os.path.join("~", ".cache", "huggingface")
  return pathlib.Path(home).expanduser() / "hub"


def _fetch_hint(name: str) -> str:
  """How to fetch `name` (huggingface_hub's command is `hf` since its 1.0)."""
  hint = f"fetch it with `hf download {name}`"
  if importlib.util.find_spec("huggingface_hub") is None:
    hint += " (pip install huggingface_hub)"
  return hint


def _cached_repos(name: str) -> list[pathlib.Path]:
  """The cache's repository directories for `name`: its own (as
  huggingface_hub, which reads only that one, the only one where it is
  there), else for a name without '/' those of any organisation with that
  repository name."""
  cache = hub_cache()
  own = cache / ("models--" + name.replace("/", "--"))
  if own.is_dir():
    return [own]
  if "/" not in name and cache.is_dir():
    return sorted(path for path in cache.glob(f"models--*--{name}") if path.is_dir())
  return []


def _snapshot(repo: pathlib.Path, name: str) -> pathlib.Path:
  """The snapshot directory refs/main names in the cached `repo` (found for
  `name`; the hint to fetch it names the repository, an organisation's for
  an unqualified name)."""
  ref = repo / "refs" / "main"
  hint = _fetch_hint(_repo_id(repo))
  if not ref.is_file():
    raise CheckpointError(f"model {name}: {repo} has no refs/main: {hint}")
  snapshot = repo / "snapshots" / ref.read_text().strip()
  if not snapshot.is_dir():
    raise CheckpointError(
      f"model {name}: {ref} names snapshot {snapshot.name!r}, which is not in {repo}/snapshots: "
      f"{hint}"
    )
  return snapshot


def _repo_id(repo: pathlib.Path) -> str:
  return repo.name.removeprefix("models--").replace("--", "/")


def _download(name: str) -> str:
  """`name` fetched into the cache by huggingface_hub (its files txf reads)."""
  from huggingface_hub import snapshot_download  # noqa: PLC0415 (optional)

  try:
    return snapshot_download(repo_id=name, allow_patterns=list(DOWNLOAD_PATTERNS))
  except Exception as error:  # noqa: BLE001 (any failure to fetch is one line)
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise CheckpointError(
      f"model {name}: not a directory, not in {hub_cache()}, and the Hugging Face Hub did not "
      f"give it ({reason}): {_fetch_hint(name)} where the Hub can be reached"
    ) from None


def resolve_model(name_or_path: str) -> str:
  """The directory of a model given as a directory or a Hub name (see the
  module docstring). A URL, an existing path or a string that is no Hub name
  is returned as it is (its reader says what is wrong with it).

  Raises:
    CheckpointError: one line, for a name cached ambiguously or incompletely,
      one that cannot be downloaded, or one not cached where downloading is
      off (HF_HUB_OFFLINE, or huggingface_hub not installed), saying how to
      fetch it.
  """
  if "://" in name_or_path or os.path.exists(name_or_path):
    return name_or_path
  if not _REPO_ID.fullmatch(name_or_path) or name_or_path.startswith("."):
    return name_or_path
  repos = _cached_repos(name_or_path)
  if len(repos) > 1:
    names = ", ".join(_repo_id(repo) for repo in repos)
    raise CheckpointError(f"model {name_or_path}: several cached models match ({names}): name one")
  if repos:
    return str(_snapshot(repos[0], name_or_path))
  offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE
  if not offline and importlib.util.find_spec("huggingface_hub") is not None:
    return _download(name_or_path)
  why = "HF_HUB_OFFLINE is set" if offline else "huggingface_hub is not installed"
  raise CheckpointError(
    f"model {name_or_path}: not a directory, and not in the Hugging Face cache {hub_cache()} "
    f"({why}): {_fetch_hint(name_or_path)}"
  )
