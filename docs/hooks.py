"""MkDocs hooks (mkdocs.yml `hooks:`): text the site writes from the code.

A page holding the marker `<!-- txf:resume-rules -->` (docs/running.md) gets
there the rules for resuming a run, written from the lists
`txf.rundir.resume.check_resumable` checks (`RESUME_SECTIONS`,
`FREE_MODEL_FIELDS`, `FREE_DATA_FIELDS`) and from the sections and fields of configs/base.py, so
the page cannot drift from the code. tests/test_docs.py checks the text.

A link to a file exclude_docs leaves out of the site (docs/data/...) is dead
on the built site; MkDocs says so at INFO only, so this says it as a warning,
which fails `mkdocs build --strict`.
"""

from __future__ import annotations

import logging
import pathlib
import posixpath
import re
import sys
from collections.abc import Callable

RESUME_RULES_MARKER = "<!-- txf:resume-rules -->"
# A Markdown link's or image's relative target: ](path), up to a '#' or title.
_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:|#|/)([^)\s#]+)")
log = logging.getLogger("mkdocs.hooks.txf")  # under `mkdocs`: --strict counts its warnings
ROOT = pathlib.Path(__file__).resolve().parents[1]


def _names(names) -> str:
  """`a`, `b` and `c`."""
  quoted = [f"`{name}`" for name in names]
  return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def resume_rules() -> str:
  """The resume rules as a Markdown paragraph, from the code's field lists."""
  if str(ROOT) not in sys.path:  # `mkdocs` run from a checkout that is not installed
    sys.path.insert(0, str(ROOT))
  # Imported here: only a page with the marker pays for loading jax.
  import ml_collections

  from txf.configs import base
  from txf.rundir.resume import (
    DATA_ORDER_FIELDS,
    FREE_DATA_FIELDS,
    FREE_MODEL_FIELDS,
    RESUME_SECTIONS,
  )

  config = base.get_config()
  sections = [name for name in config if isinstance(config[name], ml_collections.ConfigDict)]
  kept = []
  for name in RESUME_SECTIONS:
    if name == "data":
      defining = [field for field in config.data if field not in FREE_DATA_FIELDS]
      kept.append(
        f"the `data` fields that define the data stream and tokenizer (every `data` "
        f"field except {_names(FREE_DATA_FIELDS)}: {_names(defining)})"
      )
    elif name == "model":
      kept.append(
        f"the `model` section except how the model computes, not its parameters "
        f"({_names(FREE_MODEL_FIELDS)}; `max_len` only where the position encoding owns "
        f"no learned table of that many rows)"
      )
    elif name in sections:
      kept.append(f"the `{name}` section")
    else:
      kept.append(f"`{name}`")
  free_sections = [name for name in sections if name not in RESUME_SECTIONS]
  plain = [name for name in free_sections if name != "train"]
  text = (
    f"A resumed run must keep what its checkpoints depend on: {', '.join(kept[:-1])} "
    f"and {kept[-1]}; changing one stops the run before any compute, naming the field "
    f"(`txf.rundir.resume.check_resumable`). The `data` fields "
    f"{_names(FREE_DATA_FIELDS)} may change"
  )
  if plain:
    text += f", and so may the {_names(plain)} section{'s' if len(plain) > 1 else ''}"
  if "train" in free_sections:
    text += (
      ", and `train`, except a change that reshapes the optimizer state the "
      "checkpoints hold (e.g. `train.grad_clip_norm=0` drops the clipping's state), "
      "which is refused naming the field (`txf.rundir.resume.check_optimizer_state`)"
    )
  held = [name for name in RESUME_SECTIONS if name != "data"]
  return text + (
    f". A run that stopped before its first checkpoint (a model too large for the "
    f"device, say) holds only its `data` fields but the data order's "
    f"({_names(DATA_ORDER_FIELDS)}): {_names(held)} may change there."
  )


def excluded_links(markdown: str, page: str, excluded: Callable[[str], bool]) -> list[str]:
  """The relative link targets of `markdown` (the page at docs/`page`) whose
  file, a path under docs/, is `excluded` from the site."""
  where = posixpath.dirname(page)
  return [
    target
    for target in _LINK.findall(markdown)
    if excluded(posixpath.normpath(posixpath.join(where, target)))
  ]


def on_page_markdown(markdown: str, **kwargs) -> str:
  """MkDocs event: replaces the resume-rules marker with the rules, and
  warns of each link to a file excluded from the site."""
  if RESUME_RULES_MARKER in markdown:
    markdown = markdown.replace(RESUME_RULES_MARKER, resume_rules())
  page, files = kwargs.get("page"), kwargs.get("files")
  if page is not None and files is not None:
    excluded = lambda path: (
      (file := files.get_file_from_path(path)) is not None and (file.inclusion.is_excluded())
    )
    for target in excluded_links(markdown, page.file.src_uri, excluded):
      log.warning(f"{page.file.src_uri} links to {target}, which is not on the built site")
  return markdown
