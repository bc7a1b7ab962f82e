"""The user documents against the code they describe."""

import pathlib
import re

from txf.train.setup import FREE_DATA_FIELDS, RESUME_SECTIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def resume_paragraph() -> str:
  text = (ROOT / "README.md").read_text()
  start = text.index("A resumed run must keep what its checkpoints depend on")
  return text[start:text.index("\n\n", start)]


def test_the_readme_resume_rules_name_the_fields_the_code_checks():
  paragraph = " ".join(resume_paragraph().split())
  for section in RESUME_SECTIONS:  # what a resumed run must keep
    assert f"`{section}`" in paragraph, section
  kept_free = paragraph[paragraph.index("every `data` field except") + len("every `data`"):]
  kept_free = kept_free[:kept_free.index(")")]
  assert set(re.findall(r"`(\w+)`", kept_free)) == set(FREE_DATA_FIELDS)


def test_user_documents_link_only_inside_the_repository():
  for path in USER_DOCS:
    for target in re.findall(r"\]\(([^)#]+)", path.read_text()):
      if not target.startswith(("http://", "https://")):
        assert (path.parent / target).resolve().is_relative_to(ROOT), (path.name, target)
        assert (path.parent / target).exists(), (path.name, target)
    assert "../shared" not in path.read_text(), path.name
