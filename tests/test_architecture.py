"""The package's shape is checked, not hoped for: layers, no import cycles, sizes.

The layer contract itself is import-linter's (pyproject.toml, `[tool.importlinter]`); grimp, the
graph library it is built on, sees every import statement of a module, function-local and
TYPE_CHECKING ones included, so a cycle cannot hide inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "indextts_train"


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((m for m in edges if m not in index or m in on_stack), None)
            if nxt is None:
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
                        found.append(sorted(component))
            elif nxt in index:
                low[node] = min(low[node], index[nxt])
            else:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
    return found


def test_no_import_cycles_function_local_imports_included() -> None:
    graph = grimp.build_graph("indextts_train", include_external_packages=False)
    assert _cycles(graph) == []


def test_cycle_finder_finds_a_cycle() -> None:
    """The check above can fail: a two-module cycle added to a copy of the graph is found."""
    graph = grimp.build_graph("indextts_train", include_external_packages=False)
    graph.add_import(importer="indextts_train.errors", imported="indextts_train.cli")
    assert any("indextts_train.errors" in c and "indextts_train.cli" in c for c in _cycles(graph))


def test_layer_contract_holds() -> None:
    assert lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True) == 0


def test_top_level_is_small_and_modules_are_in_layers() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    packages = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())
    # cli, cli_flags, demo (uses train and prepare, which are independent), distributed, errors + dunders
    assert len(top) <= 7, top
    assert len(packages) >= 5, packages
    for name in packages:  # each layer says what lives there and what it may import
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text()))
        assert doc and "Imports" in doc, name


def test_modules_and_functions_stay_readable() -> None:
    """No module over 500 lines, no function over 60 (complexity 12 is ruff's C901 in pyproject)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 500:
            too_long.append(f"{path.relative_to(ROOT)}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert too_long == []
