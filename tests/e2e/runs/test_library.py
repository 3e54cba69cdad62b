"""A tenant's library: saved tools and memories that later runs use, per tenant, persistent, bounded.

A real ``serve --transport http`` with two tenants; sandboxed code saves and loads through the
host (plain JSON-RPC calls of ``run_python``); the server is restarted on the same state
directory to show the library persists.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from mcp_test_helpers import auth_tokens, bearer_web, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"


def config(state_dir: Path) -> Path:
    path = state_dir.parent / "library.toml"
    path.write_text("library_bytes = 4096\nlibrary_entries = 5\n" + auth_tokens({"alice": ALICE}, {"bob": BOB}))
    return path


async def run(base: str, token: str, code: str, conversation: str | None = None) -> dict[str, Any]:
    arguments: dict[str, Any] = {"code": textwrap.dedent(code)}
    if conversation is not None:
        arguments["conversationId"] = conversation
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_python", "arguments": arguments}}
    async with bearer_web(token) as web:
        reply = await web.post(f"{base}/mcp", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()["result"]
    data: dict[str, Any] = {**result["structuredContent"], "text": result["content"][0]["text"]}
    return data


SAVE = """
def double(x):
    '''Twice x.'''
    return 2 * x

print(save_tool(double))
save_memory("config", {"region": "north", "limit": 3})
"""

USE = """
print(saved.double(21), load_memory("config"), list_memories(), list_saved_tools())
"""


async def test_saved_tools_and_memories_serve_later_runs_of_their_tenant_only_and_persist(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    args = ("--config", str(config(state_dir)))
    async with http_server(state_dir, *args, runtime=sandbox_runtime) as base:
        saved = await run(base, ALICE, SAVE)
        used = await run(base, ALICE, USE)
        other = await run(base, BOB, "print(load_memory('config', 'none'), list_memories(), list_saved_tools())")
        missing = await run(base, BOB, "saved.double(1)")
    assert saved["status"] == "success", repr(saved)[:2000]
    assert "saved.double" in saved["stdout"]
    assert used["stdout"] == (
        "42 {'region': 'north', 'limit': 3} ['config'] "
        "[{'name': 'double', 'language': 'python', 'description': 'Twice x.'}]\n"
    ), used
    assert other["stdout"] == "none [] []\n"
    assert missing["status"] == "error"
    assert "AttributeError" in missing["stderr"]

    async with http_server(state_dir, *args, runtime=sandbox_runtime) as base:  # a restart
        again = await run(base, ALICE, "print(saved.double(5), load_memory('config')['region'])")
    assert again["stdout"] == "10 north\n"


async def test_the_library_quota_refuses_a_write_and_keeps_what_was_there(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with http_server(state_dir, "--config", str(config(state_dir)), runtime=sandbox_runtime) as base:
        await run(base, ALICE, "save_memory('small', 1)")
        too_big = await run(
            base,
            ALICE,
            """
            from mcp import runtime
            try:
                save_memory("big", "x" * 5000)
            except runtime.MCPError as error:
                print(error.kind, "library_bytes" in str(error))
            for n in range(10):
                try:
                    save_memory(f"k{n}", n)
                except runtime.MCPError as error:
                    print(n, error.kind, "library_entries" in str(error))
                    break
            print(load_memory("small"), load_memory("big", "absent"))
            """,
        )
    assert too_big["stdout"].splitlines() == ["denied True", "4 denied True", "1 absent"], too_big


async def test_sandboxed_code_cannot_write_the_library_or_save_what_is_not_json(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with http_server(state_dir, "--config", str(config(state_dir)), runtime=sandbox_runtime) as base:
        data = await run(
            base,
            ALICE,
            f"""
            import os
            from mcp import runtime
            print(os.path.exists({str(state_dir / "library")!r}))
            for bad in (lambda: save_memory("../escape", 1), lambda: save_memory("k", object()),
                        lambda: runtime.save_tool(print)):
                try:
                    bad()
                except (runtime.MCPError, TypeError) as error:
                    print(type(error).__name__)
            """,
        )
    assert data["stdout"].splitlines() == ["False", "MCPError", "TypeError", "TypeError"], data


async def run_ts(base: str, token: str, code: str) -> dict[str, Any]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "run_code", "arguments": {"code": code, "language": "typescript"}},
    }
    async with bearer_web(token) as web:
        reply = await web.post(f"{base}/mcp", json=body)
    assert reply.status_code == 200, reply.text
    result = reply.json()["result"]
    data: dict[str, Any] = {**result["structuredContent"], "text": result["content"][0]["text"]}
    return data


async def test_typescript_saves_and_uses_the_same_library_and_search_tools_lists_saved_tools(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with http_server(state_dir, "--config", str(config(state_dir)), runtime=sandbox_runtime) as base:
        saved = await run_ts(
            base,
            ALICE,
            """
            function triple(x: number): number { return 3 * x; }
            console.log(await mcp.runtime.saveTool(triple, { description: "Three times x" }));
            await mcp.runtime.saveMemory("ts", { n: 1 });
            """,
        )
        used = await run_ts(
            base, ALICE, 'console.log(await mcp.saved.triple(4), JSON.stringify(await mcp.runtime.loadMemory("ts")));'
        )
        from_python = await run(
            base,
            ALICE,
            """
            from mcp import runtime
            print(load_memory("ts"), [hit["tool"] for hit in runtime.search_tools("three times")])
            """,
        )
        bob = await run_ts(base, BOB, "console.log(await mcp.runtime.loadMemory('ts', 'none'));")
    assert saved["status"] == "success", repr(saved)[:2000]
    assert used["stdout"] == '12 {"n":1}\n', used
    assert from_python["stdout"] == "{'n': 1} ['triple']\n", from_python
    assert bob["stdout"] == "none\n"


READ_VIEW = """
import json, os
view = "/tools/_library"
print(sorted(os.listdir(view + "/tools")), json.load(open(view + "/memories/config.json")))
print("def double" in open(view + "/tools/double.py").read())
try:
    open(view + "/memories/config.json", "w").write("{}")
except OSError as error:
    print("read-only", type(error).__name__)
"""


@pytest.mark.parametrize("conversation", [None, "c-view"], ids=["warm or fresh", "session"])
async def test_runs_read_their_tenants_library_as_read_only_files_and_no_other_tenants(
    state_dir: Path, sandbox_runtime: Path | None, conversation: str | None
) -> None:
    async with http_server(state_dir, "--config", str(config(state_dir)), runtime=sandbox_runtime) as base:
        assert (await run(base, ALICE, SAVE))["status"] == "success"
        read = await run(base, ALICE, READ_VIEW, conversation)
        # Bob's runs, in the warm sandboxes Alice's used too: no library, no copy of hers.
        bob = await run(
            base,
            BOB,
            "import os; print(os.path.exists('/tools/_library'), os.path.isdir('/tools') and os.listdir('/tools'))",
            conversation,
        )
    assert read["stdout"].splitlines() == [
        "['double.py'] {'region': 'north', 'limit': 3}",
        "True",
        "read-only OSError",
    ], read
    assert bob["stdout"] in ("False False\n", "False []\n"), bob
