"""No import cycles between the package's modules.

The layers themselves are import-linter's contracts in pyproject.toml (``lint-imports``, run by
``make lint`` and ``make test``); a layers contract compares whole layers, so two modules of one
layer (a backend and its probe, say) can still import each other. This
test finds those cycles: the strongly connected components of grimp's module graph. Imports inside
functions and under ``TYPE_CHECKING`` count: they hide a cycle from the interpreter, not from the
design.
"""

from __future__ import annotations

from collections.abc import Mapping, Set

import grimp


def _edges(graph: grimp.ImportGraph) -> dict[str, Set[str]]:
    return {module: graph.find_modules_directly_imported_by(module) for module in sorted(graph.modules)}


def _cycles(edges: Mapping[str, Set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = lowlink[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(edges.get(module, ())):
            if imported not in index:
                visit(imported)
                lowlink[module] = min(lowlink[module], lowlink[imported])
            elif imported in on_stack:
                lowlink[module] = min(lowlink[module], index[imported])
        if lowlink[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


def _describe(cycle: list[str], graph: grimp.ImportGraph) -> str:
    """The cycle's modules, then each import between them with its line."""
    members = set(cycle)
    imports = [
        f"{importer}:{detail['line_number']}  {detail['line_contents']}"
        for importer in cycle
        for imported in sorted(graph.find_modules_directly_imported_by(importer) & members)
        for detail in graph.get_import_details(importer=importer, imported=imported)
    ]
    return "\n    ".join([" <-> ".join(cycle), *imports])


def test_the_cycle_finder_finds_a_cycle_and_ignores_a_chain() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set[str]()}

    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    graph = grimp.build_graph("mcp_sandbox", cache_dir=None)

    cycles = _cycles(_edges(graph))

    assert not cycles, "import cycles:\n" + "\n".join(f"  {_describe(cycle, graph)}" for cycle in cycles)
