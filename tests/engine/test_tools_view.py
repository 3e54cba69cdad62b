"""Code mode in sessions: each run may name other servers; /tools and ``mcp_<alias>`` follow the run.

The stubs are the real generated packages (``bridge.stubs``) under ``<state_dir>/stubs``; the
``ToolAccess`` is a small real implementation that answers every call of an allowed server
with its name and the tool's, and refuses the others, as the bridge's mediator does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types
import pytest

from mcp_sandbox.bridge.stub_tree import write_tree
from mcp_sandbox.bridge.stubs import render_package, tool_docs
from mcp_sandbox.engine import Engine
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import Call, Failure, Reply
from mcp_sandbox.sandbox.policy import Mount

from .conftest import RunningEngine
from .helpers import execute

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]


@dataclass
class StubAccess:
    """One run's access to fake servers: real stubs on disk, every call answered here."""

    mounts: tuple[Mount, ...]
    servers: tuple[str, ...]
    requests: list[dict[str, Any]] = field(default_factory=list)

    async def handle(self, call: Call) -> Reply:
        request = call.request
        self.requests.append(request)
        server = request.get("server")
        if server not in self.servers:
            return Reply(call.id, error=Failure("denied", f"{server!r} is not allowed in this run"))
        answer = {"server": server, "tool": request.get("tool")}
        return Reply(call.id, {"structuredContent": answer, "content": []})


def stubs(engine: Engine, **servers: list[str]) -> StubAccess:
    """Access to ``servers`` (alias -> tool names), with their stubs written where the bridge writes them."""
    root = engine.settings.paths.state_dir / "stubs"
    root.mkdir(mode=0o711, exist_ok=True)
    mounts = []
    for alias, names in servers.items():
        tools = [mcp_types.Tool(name=name, input_schema={"type": "object", "properties": {}}) for name in names]
        directory: Path = write_tree(root, render_package(alias, alias, None, tool_docs(alias, tools)), prefix=alias)
        mounts.append(Mount(directory, f"/tools/{alias}"))
    return StubAccess(tuple(mounts), tuple(servers))


async def test_consecutive_runs_of_a_session_see_the_stubs_and_names_of_their_own_servers(
    running_engine: RunningEngine,
) -> None:
    async with running_engine() as engine:
        first = await execute(
            engine,
            "print(mcp_alpha.hello_sync())\nsaved = mcp_alpha",
            session="s",
            tools=stubs(engine, alpha=["hello"]),
        )
        beta = stubs(engine, beta=["bye"])
        second = await execute(
            engine,
            """
            import os
            print(sorted(os.listdir('/tools')), 'mcp_alpha' in globals(), mcp_beta.bye_sync())
            try:
                saved.hello_sync()
            except mcp.runtime.MCPError as error:
                print(error.kind)
            """,
            session="s",
            tools=beta,
        )
        third = await execute(engine, "import os\nprint(os.listdir('/tools'), 'mcp_beta' in globals())", session="s")

    assert first.stdout == "{'server': 'alpha', 'tool': 'hello'}\n", first.stderr
    assert second.stdout == "['beta'] False {'server': 'beta', 'tool': 'bye'}\ndenied\n", second.stderr
    assert [request["server"] for request in beta.requests] == ["beta", "alpha"]  # mediated per run
    assert third.stdout == "[] False\n", third.stderr


async def test_a_server_whose_stubs_changed_between_runs_is_imported_anew(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        await execute(engine, "print(mcp_alpha.hello_sync())", session="s", tools=stubs(engine, alpha=["hello"]))
        second = await execute(
            engine, "print(mcp_alpha.added_sync())", session="s", tools=stubs(engine, alpha=["hello", "added"])
        )

    assert second.stdout == "{'server': 'alpha', 'tool': 'added'}\n", second.stderr


async def test_a_fresh_run_binds_its_servers_stubs_as_before(running_engine: RunningEngine) -> None:
    async with running_engine() as engine:
        result = await execute(engine, "print(await mcp_alpha.hello())", tools=stubs(engine, alpha=["hello"]))

    assert result.stdout == "{'server': 'alpha', 'tool': 'hello'}\n", result.stderr


async def test_stubs_outside_the_stub_root_are_shown_to_a_session_too(
    running_engine: RunningEngine, state_dir: Path
) -> None:
    async with running_engine() as engine:
        elsewhere = state_dir / "elsewhere"
        elsewhere.mkdir(mode=0o755)
        tools = [mcp_types.Tool(name="hello", input_schema={"type": "object", "properties": {}})]
        files = render_package("gamma", "gamma", None, tool_docs("gamma", tools))
        directory = write_tree(elsewhere, files, prefix="gamma")
        access = StubAccess((Mount(directory, "/tools/gamma"),), ("gamma",))
        result = await execute(engine, "print(mcp_gamma.hello_sync())", session="s", tools=access)

    assert result.stdout == "{'server': 'gamma', 'tool': 'hello'}\n", result.stderr
