"""Code mode's default between tenants (issue 35, item 9): with several tenants, an entry that names
neither `per_tenant` nor `tenants` runs one process per tenant; one process is shared only when the
entry says so (`per_tenant = false`). Two tenants over HTTP ask the fixture server for its pid.
"""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from downstream import make_git_repo, servers_config, write_servers_config
from mcp_test_helpers import auth_tokens, http_server, mcp_sandbox_cli, run_over_http

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
CODE = "print((await mcp_own.pid())['result'], (await mcp_common.pid())['result'])"


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    directory = module_state_dir.parent / f"sharing-{uuid.uuid4().hex[:8]}"
    fixture = servers_config(directory, git_repo=make_git_repo(directory / "repo"), include=["fixture"])
    entry = fixture["mcpServers"]["fixture"]
    servers_file = write_servers_config(directory / "servers.json", {"mcpServers": {"own": entry, "common": entry}})
    toml = directory / "config.toml"
    toml.write_text(
        textwrap.dedent(f"""
        servers_config = "{servers_file}"
        pool_preload = []
        [servers.common]
        per_tenant = false
        """)
        + auth_tokens({"alice": ALICE}, {"bob": BOB})
    )
    return toml


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def test_tenants_get_a_process_each_unless_the_entry_says_they_share_one(base: str) -> None:
    seen = {}
    for name, token in (("alice", ALICE), ("bob", BOB)):
        result = await run_over_http(base, token, CODE, servers=["own", "common"])
        assert result["status"] == "success", result
        seen[name] = result["stdout"].split()
    assert seen["alice"][0] != seen["bob"][0]  # said nothing, two tenants: a process each
    assert seen["alice"][1] == seen["bob"][1]  # per_tenant = false: one process, shared
    again = await run_over_http(base, ALICE, CODE, servers=["own", "common"])
    assert again["stdout"].split() == seen["alice"]  # each tenant keeps its own process


def test_doctor_says_which_servers_are_shared_and_which_are_per_tenant_by_default(
    module_state_dir: Path, sandbox_runtime: Path | None, config: Path
) -> None:
    settings = {"MCP_SANDBOX_CONFIG": str(config), "MCP_SANDBOX_DISCOVER_SERVERS": "false"}
    done = mcp_sandbox_cli("doctor", state_dir=module_state_dir, runtime=sandbox_runtime, env=settings)
    assert "  own: every tenant; one process per tenant when the server has several (per_tenant not set)\n" in (
        done.stdout
    ), done.stdout + done.stderr
    assert "  common: every tenant; one process shared" in done.stdout
