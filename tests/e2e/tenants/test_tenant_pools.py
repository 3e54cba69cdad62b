"""Each token tenant's runs are served warm by sandboxes of its own host uid, seen through a real HTTP
server with two tenants and neither of them ``default``: the metrics count the warm runs (hits)
and every uid's warm sandboxes, the host's ``/proc/<pid>/status`` shows each run's uid, and an idle
warm sandbox of alice's uid (or of the default uid) never serves bob.

As root only: where the server is not root, every tenant runs as one uid and shares one pool.
"""

from __future__ import annotations

import json
import os
import re
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx2
import pytest

from mcp_test_helpers import auth_tokens, host_processes, host_uid, http_server, poll, run_over_http

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server"),
]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
METRICS = "metrics-token-0123456789abcdef"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / f"pools-{uuid.uuid4().hex[:8]}.toml"
    # One warm sandbox per uid (tenant_concurrent_runs 1); the default uid's is there to be (wrongly) taken.
    config.write_text(
        textwrap.dedent(f"""
        pool_size = 1
        pool_min = 1
        pool_preload = []
        tenant_concurrent_runs = 1
        metrics_token = "{METRICS}"
        """)
        + auth_tokens({"alice": ALICE, "bob": BOB})
    )
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def _metric(base: str, line: str) -> float:
    async with httpx2.AsyncClient() as web:
        text = (await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})).text
    match = re.search(rf"^{re.escape(line)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match is not None else 0.0


async def _idle(base: str) -> float:
    return await _metric(base, "mcp_sandbox_warm_pool_idle")


async def _hits(base: str) -> float:
    return await _metric(base, 'mcp_sandbox_warm_pool_runs_total{result="hit"}')


async def _run(base: str, token: str) -> int:
    """A run of ``token``'s tenant without a conversation; the host uid its child had."""
    marker = f"pool-{uuid.uuid4().hex}"
    code = f"""
        import subprocess
        subprocess.run(["/bin/sh", "-c", "sleep 2; true", {marker!r}], check=True)
    """
    seen: list[int] = []

    async def run() -> None:
        result = await run_over_http(base, token, code, timeout=30)
        assert result["exitCode"] == 0, result

    async def look() -> None:
        await poll(lambda: bool(host_processes(marker)))
        seen.append(host_uid(host_processes(marker)[0]))

    with anyio.fail_after(90):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            group.start_soon(look)
    return seen[0]


async def _wait_idle(base: str, count: int) -> None:
    with anyio.fail_after(60):
        while await _idle(base) < count:  # noqa: ASYNC110 - a scrape has no event to wait on
            await anyio.sleep(0.1)


async def test_each_tenants_runs_are_served_warm_as_its_own_uid_and_never_by_anothers(
    base: str, module_state_dir: Path
) -> None:
    await _wait_idle(base, 1)  # the default uid's
    alice_first = await _run(base, ALICE)  # cold: her uid's pool is made now
    await _wait_idle(base, 2)
    hits = await _hits(base)

    alice_warm = await _run(base, ALICE)
    assert await _hits(base) == hits + 1  # served warm

    # Idle: the default uid's sandbox and alice's. Bob's first run takes neither.
    bob_first = await _run(base, BOB)
    assert await _hits(base) == hits + 1
    await _wait_idle(base, 3)
    bob_warm = await _run(base, BOB)
    assert await _hits(base) == hits + 2

    assigned = json.loads((module_state_dir / "tenant-uids.json").read_text())
    assert alice_first == alice_warm == assigned["alice"]
    assert bob_first == bob_warm == assigned["bob"] != assigned["alice"]
