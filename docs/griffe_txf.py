"""A griffe extension for the API reference (mkdocs.yml loads it).

txf's docstrings are written to be read as plain text: code examples, file
lists and tables are indented blocks under a line ending with ":" or after
a blank line, and a few use reStructuredText roles (:func:`name`). Markdown
would run an indented block into the paragraph before it, so this turns
each such block into a fenced code block and each role into inline code,
before mkdocstrings parses the docstring. Google-style sections (Args:,
Returns:, Raises:, ...) are left to the parser, with two of txf's habits
there put in its form (see `_section_line`).

A config section's field declared with its doc (`d_model: int =
documented("width of the residual stream", default=128)`, txf.fields: every
ModelConfig, DataSpec and TrainConfig field) gets that doc as its docstring,
and another class attribute documented by a trailing comment (`x: int = 0  #
why`) that comment, so the reference lists the fields with their docs.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from typing import Any

import griffe

_SECTION = re.compile(
  r"^(Args|Arguments|Attributes|Parameters|Other Parameters|Returns|Yields|Receives|Raises|"
  r"Warns|Examples?|Notes?|Warnings?|Methods|Functions|Classes|Modules):\s*$"
)
_ROLE = re.compile(r":(?:func|class|mod|meth|attr|obj|data|exc):`~?([^`]+)`")
_RAISES_ITEM = re.compile(r"^(\s+)([A-Z]\w*(?:\.\w+)*)( (?!\S*:))")


def _indented(line: str) -> bool:
  return line.startswith(" ") and bool(line.strip())


def _opens_block(previous: list[str]) -> bool:
  """An indented line starts a block after a blank line or a line ending with ':'."""
  return not previous or not previous[-1].strip() or previous[-1].rstrip().endswith(":")


def _section_line(line: str, section: str, indent: int) -> str:
  """A line of a Google section as the parser wants it: continuation lines
  indented twice the items' indent (txf aligns some under a brace), and a
  Raises item as `Error: why` (txf writes some as `Error why`)."""
  width = len(line) - len(line.lstrip())
  if indent < width < 2 * indent:
    return " " * (2 * indent) + line.lstrip()
  if section == "Raises" and width == indent:
    return _RAISES_ITEM.sub(r"\1\2:\3", line)
  return line


def fence_indented_blocks(text: str) -> str:
  """`text` with its indented blocks outside Google sections fenced as code."""
  lines = _ROLE.sub(r"`\1`", text).split("\n")
  out: list[str] = []
  i, section, indent = 0, None, 0
  while i < len(lines):
    line = lines[i]
    header = _SECTION.match(line)
    if header:
      section, indent = header.group(1), 0
    elif section and line.strip() and not line[0].isspace():
      section = None  # a line back at the margin ends the section
    elif section and line.strip():
      indent = indent or len(line) - len(line.lstrip())
      line = _section_line(line, section, indent)
    if section or not (_indented(line) and _opens_block(out)):
      out.append(line)
      i += 1
      continue
    block = []
    while i < len(lines) and (
      _indented(lines[i])
      or (not lines[i].strip() and i + 1 < len(lines) and _indented(lines[i + 1]))
    ):
      block.append(lines[i])
      i += 1
    last = max((n for n, text in enumerate(out) if text.strip()), default=None)
    if last is not None and out[last].rstrip().endswith("::"):  # reStructuredText's marker
      out[last] = out[last].rstrip()[:-1]
    if out and out[-1].strip():
      out.append("")
    code = textwrap.dedent("\n".join(block)).replace("``", "")  # inline-code marks
    out += ["```text", *code.split("\n"), "```"]
    if i < len(lines) and lines[i].strip():
      out.append("")
  return "\n".join(out)


def trailing_comment(lines: list[str]) -> str | None:
  """The first comment of source `lines` that follows code on its line."""
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
  except (tokenize.TokenError, SyntaxError):
    return None
  for token in tokens:
    if token.type == tokenize.COMMENT and lines[token.start[0] - 1][: token.start[1]].strip():
      # Markdown would read `4*d_model, or 8/3*d_model` as emphasis.
      return token.string.lstrip("#").strip().replace("*", "\\*")
  return None


def declared_doc(lines: list[str]) -> str | None:
  """The doc of a field declared as `name: type = documented("doc", ...)`."""
  try:
    tree = ast.parse(textwrap.dedent("\n".join(lines)))
  except SyntaxError:
    return None
  for node in ast.walk(tree):
    if (
      isinstance(node, ast.Call)
      and isinstance(node.func, ast.Name)
      and node.func.id == "documented"
      and node.args
      and isinstance(node.args[0], ast.Constant)
    ):
      return str(node.args[0].value).replace("*", "\\*")
  return None


class IndentedBlocks(griffe.Extension):
  """Applies `fence_indented_blocks` to every docstring griffe loads, and
  gives a class attribute without a docstring its declared doc or its
  trailing comment."""

  def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
    if obj.docstring is not None:
      obj.docstring.value = fence_indented_blocks(obj.docstring.value)

  def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
    for member in cls.members.values():
      if member.is_alias or not member.is_attribute or member.docstring is not None:
        continue
      doc = declared_doc(member.lines) or trailing_comment(member.lines)
      if doc:
        member.docstring = griffe.Docstring(doc, parent=member)
