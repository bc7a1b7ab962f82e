"""docs/design.md's "Dependencies point one way" table against the code: every
`txf.<package>` import in a package's modules (at module level or inside a
function) is one the table allows, and no txf module imports itself through
others (an import cycle, however deep, at module level or inside a function)."""

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import REPO

# Top-level modules every package may use (the table's preamble says so).
SHARED = {"checks", "choices", "extras", "fields", "hardware", "progress", "storage"}


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
      # txf.configs itself is the config loader, which every package may use
      # (its config files, txf.configs.<name>, are above them all).
      if parts[0] == "txf" and len(parts) > 1 and parts != ["txf", "configs"]:
        yield node.lineno, parts[1]


def test_the_config_loader_imports_nothing_from_txf():
  assert list(txf_imports(REPO / "txf" / "configs" / "__init__.py")) == []


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


def module_names(root: Path, package: str) -> dict[str, Path]:
  """{dotted module name: its file} of every module of `package` under `root`."""
  names = {}
  for path in (root / package).rglob("*.py"):
    parts = path.relative_to(root).with_suffix("").parts
    names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return names


def _type_checking_only(node: ast.AST) -> bool:
  return isinstance(node, ast.If) and ast.unparse(node.test) in (
    "TYPE_CHECKING",
    "typing.TYPE_CHECKING",
  )


def _executed_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
  """The import statements of `tree` that run (at module level or when a
  function is called): an `if TYPE_CHECKING:` block only names types."""
  for node in ast.iter_child_nodes(tree):
    if isinstance(node, ast.Import | ast.ImportFrom):
      yield node
    elif not _type_checking_only(node):
      yield from _executed_imports(node)


def import_graph(root: Path, package: str = "txf") -> dict[str, set[str]]:
  """{module: the modules of `package` it imports (relative imports resolved)}."""
  modules = module_names(root, package)

  def module_of(name: str) -> str | None:
    while name and name not in modules:
      name = name.rpartition(".")[0]
    return name or None

  graph = {}
  for name, path in modules.items():
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    imported = set()
    for node in _executed_imports(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
      else:
        base = node.module or ""
        if node.level:
          parent = here.split(".")[: len(here.split(".")) - node.level + 1]
          base = ".".join(parent + ([node.module] if node.module else []))
        # `from a import b` imports module a.b where there is one, else a's name b.
        targets = [
          f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
          for alias in node.names
        ]
      imported |= {module_of(target) for target in targets} - {None, name}
    graph[name] = imported
  return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """Each import cycle of `graph` once: a strongly connected component of more
  than one module, sorted (Tarjan's algorithm, iteratively)."""
  index, low, on_stack, stack, cycles = {}, {}, set(), [], []
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = len(index)
    stack.append(root)
    on_stack.add(root)
    while work:
      node, successors = work[-1]
      successor = next(successors, None)
      if successor is not None:
        if successor not in index:
          index[successor] = low[successor] = len(index)
          stack.append(successor)
          on_stack.add(successor)
          work.append((successor, iter(sorted(graph.get(successor, ())))))
        elif successor in on_stack:
          low[node] = min(low[node], index[successor])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          cycles.append(sorted(component))
  return cycles


def test_no_txf_module_imports_itself_through_others():
  assert import_cycles(import_graph(REPO)) == []


def test_a_planted_cycle_is_found_also_inside_a_function(tmp_path):
  package = tmp_path / "pkg"
  (package / "sub").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "sub" / "__init__.py").write_text("")
  (package / "a.py").write_text("from pkg.sub import b\n")
  (package / "sub" / "b.py").write_text("def f():\n  from ..c import g\n")
  (package / "c.py").write_text("import pkg.a\ndef g(): ...\n")
  (package / "d.py").write_text(
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from pkg import a\n"
  )
  (package / "e.py").write_text("from pkg import d\n")
  graph = import_graph(tmp_path, "pkg")
  assert graph["pkg.sub.b"] == {"pkg.c"} and graph["pkg.d"] == set()
  assert import_cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
  (package / "c.py").write_text("def g(): ...\n")
  assert import_cycles(import_graph(tmp_path, "pkg")) == []
