"""Code mode between tenants (issue 21, item 8): a hostile tenant over HTTP against the real
npm `memory` server and our fixture server, configured per tenant in the TOML file.

Here `memory` runs one process per tenant (its file named after the tenant) and `fixture` is open
to alice alone, sharing its process among those it names; what an entry that says neither gets is
test_tenants_code_mode_sharing.py's.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from downstream import make_git_repo, require_installed, servers_config, write_servers_config
from mcp_test_helpers import CALL_BOUND, auth_tokens, http_server, mcp_sandbox_cli, run_over_http, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    require_installed()
    directory = module_state_dir.parent / f"tenants-code-{uuid.uuid4().hex[:8]}"
    servers = servers_config(directory, git_repo=make_git_repo(directory / "repo"), include=["memory", "fixture"])
    servers["mcpServers"]["memory"]["env"]["MEMORY_FILE_PATH"] = str(directory / "memory-{tenant}.jsonl")
    servers_file = write_servers_config(directory / "servers.json", servers)
    toml = directory / "config.toml"
    toml.write_text(
        textwrap.dedent(f"""
        servers_config = "{servers_file}"
        pool_preload = []
        [servers.memory]
        per_tenant = true
        [servers.fixture]
        tenants = ["alice"]
        """)
        + auth_tokens({"alice": ALICE}, {"bob": BOB})
    )
    return toml


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


def test_doctor_says_which_downstream_servers_tenants_share(
    module_state_dir: Path, sandbox_runtime: Path | None, config: Path
) -> None:
    settings = {"MCP_SANDBOX_CONFIG": str(config), "MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    done = mcp_sandbox_cli("doctor", state_dir=module_state_dir, runtime=sandbox_runtime, env=settings)
    assert "  memory: every tenant; one process per tenant\n" in done.stdout, done.stdout + done.stderr
    assert "  fixture: tenants alice; one process shared" in done.stdout


async def run(base: str, token: str, code: str, servers: list[str]) -> dict[str, Any]:
    return await run_over_http(base, token, code, servers=servers)


async def test_a_tenant_can_neither_read_nor_delete_what_another_stored_in_a_per_tenant_server(base: str) -> None:
    stored = await run(
        base,
        ALICE,
        """
        await mcp_memory.create_entities(entities=[
            {"name": "alice-secret", "entityType": "note", "observations": ["the launch code is 0000"]}])
        print("stored")
        """,
        ["memory"],
    )
    assert stored["stdout"] == "stored\n", stored
    attack = await run(
        base,
        BOB,
        """
        graph = await mcp_memory.read_graph()
        print(sorted(entity["name"] for entity in graph["entities"]))
        await mcp_memory.delete_entities(entityNames=["alice-secret"])
        """,
        ["memory"],
    )
    assert attack["status"] == "success", attack
    assert attack["stdout"] == "[]\n"
    after = await run(
        base,
        ALICE,
        """
        graph = await mcp_memory.read_graph()
        print([entity["observations"] for entity in graph["entities"] if entity["name"] == "alice-secret"])
        """,
        ["memory"],
    )
    assert after["stdout"] == "[['the launch code is 0000']]\n", after


async def test_a_server_open_to_one_tenant_does_not_exist_for_another(base: str) -> None:
    assert (await run(base, ALICE, "print(await mcp_fixture.add(a=40, b=2))", ["fixture"]))["status"] == "success"
    named = await run(base, BOB, "print(1)", ["fixture"])
    assert named["status"] == "validation_error"
    assert named["error"].startswith("servers:")
    sideways = await run(
        base,
        BOB,
        """
        from mcp.runtime import MCPError
        try:
            await mcp.runtime.call_tool("fixture", "add", {"a": 1, "b": 2})
        except MCPError as error:
            print(error.kind)
        print(list(mcp.runtime.discovered_servers()))
        """,
        ["memory"],
    )
    assert sideways["stdout"] == "denied\n['memory']\n", sideways


async def test_search_tools_finds_a_server_only_for_the_tenants_it_is_open_to(base: str) -> None:
    found: dict[str, set[str]] = {}
    for name, token in (("alice", ALICE), ("bob", BOB)):
        async with (
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as web,
            Client(streamable_http_client(f"{base}/mcp", http_client=web), read_timeout_seconds=CALL_BOUND) as client,
        ):
            result = await client.call_tool("search_tools", {"query": "add two integers", "limit": 50})
        found[name] = {hit["server"] for hit in structured(result)["results"]}
    assert "fixture" in found["alice"]
    assert "fixture" not in found["bob"]
