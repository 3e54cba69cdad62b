"""No import cycles among the modules of the engine and of the in-sandbox runtimes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = {
    # package directory -> the name its modules import each other by
    "mcp_sandbox/engine": "mcp_sandbox.engine",
    "mcp_sandbox/runners/python/mcp_sandbox_runtime": "mcp_sandbox_runtime",
}


def _imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports, at any depth of its code (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package if node.level else (node.module or "")
            if node.level and node.module:
                base = f"{package}.{node.module}"
            if base == package:  # `from . import a, b`
                found.update(f"{package}.{alias.name}" for alias in node.names)
            else:
                found.add(base)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name.startswith(package + ".")}


@pytest.mark.parametrize("directory", sorted(PACKAGES))
def test_the_modules_of_a_package_import_each_other_without_a_cycle(directory: str) -> None:
    package = PACKAGES[directory]
    graph = {
        f"{package}.{path.stem}": _imports(path, package)
        for path in (SRC / directory).glob("*.py")
        if path.stem != "__init__"
    }
    graph = {module: {name for name in names if name in graph} for module, names in graph.items()}
    assert len(graph) > 3

    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"import cycle: {' -> '.join([*path[path.index(module) :], module])}"
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
