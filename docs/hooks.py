"""MkDocs hooks (mkdocs.yml `hooks:`): text the site writes from the code.

A page holding the marker `<!-- txf:resume-rules -->` (docs/running.md) gets
there the rules for resuming a run, written from the lists
`txf.train.resume.check_resumable` checks (`RESUME_SECTIONS`,
`FREE_DATA_FIELDS`) and from the sections and fields of configs/base.py, so
the page cannot drift from the code. tests/test_docs.py checks the text.
"""

from __future__ import annotations

import pathlib
import sys

RESUME_RULES_MARKER = "<!-- txf:resume-rules -->"
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
  from txf.train.resume import FREE_DATA_FIELDS, RESUME_SECTIONS

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
    elif name in sections:
      kept.append(f"the `{name}` section")
    else:
      kept.append(f"`{name}`")
  free_sections = [name for name in sections if name not in RESUME_SECTIONS]
  plain = [name for name in free_sections if name != "train"]
  text = (
    f"A resumed run must keep what its checkpoints depend on: {', '.join(kept[:-1])} "
    f"and {kept[-1]}; changing one stops the run before any compute, naming the field "
    f"(`txf.train.resume.check_resumable`). The `data` fields "
    f"{_names(FREE_DATA_FIELDS)} may change"
  )
  if plain:
    text += f", and so may the {_names(plain)} section{'s' if len(plain) > 1 else ''}"
  if "train" in free_sections:
    text += (
      ", and `train`, except a change that reshapes the optimizer state the "
      "checkpoints hold (e.g. `train.grad_clip_norm=0` drops the clipping's state), "
      "which is refused naming the field (`txf.train.setup.check_optimizer_state`)"
    )
  return text + "."


def on_page_markdown(markdown: str, **kwargs) -> str:
  """MkDocs event: replaces the resume-rules marker with the rules."""
  if RESUME_RULES_MARKER in markdown:
    markdown = markdown.replace(RESUME_RULES_MARKER, resume_rules())
  return markdown
