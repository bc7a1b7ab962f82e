"""docs/design.md's "Dependencies point one way" table against the code: every
`txf.<package>` import in a package's modules (at module level or inside a
function) is one the table allows."""

import ast
import re

import pytest

from conftest import REPO

# Top-level modules every package may use (the table's preamble says so).
SHARED = {"checks", "extras", "fields", "registry"}


def allowed_imports():
  """{package: the txf packages its row names}; rows saying "everything" are left out."""
  design = (REPO / "docs" / "design.md").read_text()
  section = design.split("## Dependencies point one way")[1].split("\n## ")[0]
  table = {}
  for row in re.finditer(r"^\| `(\w+)` \| (.*) \|$", section, re.MULTILINE):
    package, cell = row.groups()
    if not cell.startswith("everything"):
      names = re.findall(r"`([\w.]+)`", cell)
      table[package] = {name.split(".")[1] if name.startswith("txf.") else name for name in names}
  return table


def txf_imports(path):
  """(line, package) of each `txf.<package>` a module imports."""
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      modules = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      # `from txf import ops` imports the package named after `import`.
      modules = [f"txf.{a.name}" for a in node.names] if node.module == "txf" else [node.module]
    else:
      continue
    for module in modules:
      parts = module.split(".")
      if parts[0] == "txf" and len(parts) > 1:
        yield node.lineno, parts[1]


def test_the_table_names_every_package_and_each_row_parses():
  table = allowed_imports()
  packages = {p.name for p in (REPO / "txf").iterdir() if (p / "__init__.py").exists()}
  # commands' row says "everything above"; every other package has a row.
  assert set(table) == packages - {"commands"}
  assert table["ops"] == set() and table["layers"] == {"ops"}


@pytest.mark.parametrize("package", sorted(allowed_imports()))
def test_each_package_imports_only_what_the_design_allows(package):
  allowed = allowed_imports()[package] | SHARED | {package}
  stray = [
    f"{path.relative_to(REPO)}:{line} imports txf.{used}"
    for path in sorted((REPO / "txf" / package).rglob("*.py"))
    for line, used in txf_imports(path)
    if used not in allowed
  ]
  assert not stray, stray
