"""The generated tables of a documentation page: each follows a marker line,
and a tool rewrites it from its source, or checks that it still matches."""

from __future__ import annotations

import pathlib
import re
import sys
from collections.abc import Callable


def rewrite_tables(
  text: str, marker: re.Pattern[str], table_for: Callable[[re.Match[str], list[str]], list[str]]
) -> str:
  """`text` with the table (the `|` lines) after each line matching `marker`
  replaced by table_for(match, the page's lines before the marker)."""
  lines = text.splitlines()
  out: list[str] = []
  i = 0
  while i < len(lines):
    out.append(lines[i])
    found = marker.match(lines[i])
    i += 1
    if not found:
      continue
    while i < len(lines) and lines[i].startswith("|"):  # the old table
      i += 1
    out += table_for(found, out[:-1])
  return "\n".join(out) + "\n"


def check_or_write(
  page: pathlib.Path, rewrite: Callable[[str], str], check: bool, what: str
) -> int:
  """Writes rewrite(page's text) to `page`; with `check`, writes nothing and
  returns 1 (saying that its `what` differ) if the page would change."""
  text = page.read_text()
  new = rewrite(text)
  if not check:
    page.write_text(new)
    return 0
  if new != text:
    print(f"{page}: {what} differ", file=sys.stderr)
    return 1
  return 0
