"""Each component takes the pieces of the settings it reads; only start-up takes ``Settings`` whole.

Start-up is where a ``Settings`` is turned into pieces and shared objects: the command line, doctor,
the HTTP service's ``serve``, ``open_service`` and its openers (which give ``Service`` the pieces its
tools and routes read), ``engine.startup``, and the setup, install and tasks commands. Everywhere
else, an annotation naming ``Settings`` (an argument, a field, a return) is a component reaching for
all of it, and so is a read of ``.settings`` through what holds the whole object (the service a tool
or route is given, the loader's ``Config``): give it the piece instead (``config/``'s pieces, or
``EngineSettings``).
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import mcp_sandbox
from mcp_sandbox.server.service import Service

_PACKAGE = Path(mcp_sandbox.__file__).parent
_START_UP = {
    "cli.py",
    "doctor.py",
    "engine/startup.py",
    "install/command.py",
    "install/readiness.py",
    "provision/command.py",
    "server/app.py",
    "server/openers.py",
    "server/service.py",
    "server/tasks/command.py",
}


def _annotations(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            yield from (argument.annotation for argument in every if argument and argument.annotation)
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


# The names the objects holding the whole Settings go by: the service a tool or route is given
# (``service``, ``self._service``) and the loader's ``config``.
_WHOLE_HOLDERS = frozenset({"service", "config"})


def _whole_reads(tree: ast.AST) -> Iterator[int]:
    """The lines reading ``.settings`` of a holder of the whole ``Settings`` (``service.settings.limits``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "settings" and isinstance(node.ctx, ast.Load):
            holder = node.value
            name = holder.id if isinstance(holder, ast.Name) else getattr(holder, "attr", None)
            if isinstance(name, str) and name.lstrip("_") in _WHOLE_HOLDERS:
                yield node.lineno


def _names_settings(annotation: ast.expr) -> bool:
    return any(
        (isinstance(node, ast.Name) and node.id == "Settings")
        or (isinstance(node, ast.Attribute) and node.attr == "Settings")
        or (isinstance(node, ast.Constant) and isinstance(node.value, str) and "Settings" in node.value.split("|"))
        for node in ast.walk(annotation)
    )


def _takers() -> list[str]:
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE).as_posix()
        if relative.startswith("config/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{relative}:{a.lineno}" for a in _annotations(tree) if _names_settings(a)]
    return found


def _readers() -> list[str]:
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        relative = path.relative_to(_PACKAGE).as_posix()
        if not relative.startswith("config/") and relative not in _START_UP:
            found += [f"{relative}:{line}" for line in _whole_reads(ast.parse(path.read_text(encoding="utf-8")))]
    return found


def test_no_tool_or_route_reads_the_whole_settings_through_what_holds_it() -> None:
    assert _readers() == []


def test_the_service_holds_the_pieces_its_tools_read_not_the_whole_settings() -> None:
    fields = dataclasses.fields(Service)
    assert [field.name for field in fields if _names_settings(ast.parse(str(field.type), mode="eval").body)] == []


def test_no_component_outside_start_up_takes_the_whole_settings() -> None:
    assert [place for place in _takers() if place.partition(":")[0] not in _START_UP] == []


def test_the_start_up_list_names_only_modules_that_take_the_whole_settings() -> None:
    takers = {place.partition(":")[0] for place in _takers()}
    assert _START_UP <= takers, f"no longer start-up, drop from the list: {sorted(_START_UP - takers)}"
