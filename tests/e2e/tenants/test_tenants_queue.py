"""A full queue over HTTP (issue 35, item 10): one tenant's long runs fill the only slot and the
whole queue; another tenant's first run still queues, in the place of the first tenant's newest.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, auth_tokens, http_server, run_over_http

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
METRICS = "metrics-token-0123456789abcdef"


@pytest.fixture(scope="module")
def config(module_state_dir: Path) -> Path:
    path = module_state_dir.parent / f"queue-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(
        textwrap.dedent(f"""
        pool_size = 1
        pool_min = 1
        pool_preload = []
        max_concurrent_runs = 1
        max_queued_runs = 2
        tenant_concurrent_runs = 1
        tenant_queued_runs = 4
        queue_timeout = "120s"
        metrics_token = "{METRICS}"
        """)
        + auth_tokens({"alice": ALICE, "bob": BOB})
    )
    return path


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None, config: Path) -> AsyncIterator[str]:
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def _queued(web: httpx2.AsyncClient, base: str) -> float:
    text = (await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})).text
    match = re.search(r"^mcp_sandbox_queue_length (\S+)$", text, re.MULTILINE)
    assert match is not None, text
    return float(match.group(1))


async def test_a_tenant_with_nothing_queued_takes_the_newest_place_of_the_tenant_filling_the_queue(
    base: str,
) -> None:
    results: dict[str, dict[str, Any]] = {}

    async def run(label: str, token: str, code: str) -> None:
        results[label] = await run_over_http(base, token, code)

    async with anyio.create_task_group() as group, httpx2.AsyncClient(timeout=CALL_BOUND) as web:
        for index in range(3):  # one runs, two fill the queue
            group.start_soon(run, f"alice{index}", ALICE, f"import time; time.sleep(3); print({index})")
            with anyio.fail_after(CALL_BOUND):
                while await _queued(web, base) < index:  # noqa: ASYNC110 - a gauge has no event to wait on
                    await anyio.sleep(0.05)
        group.start_soon(run, "bob", BOB, "print(6 * 7)")
    assert results["bob"]["status"] == "success" and results["bob"]["stdout"] == "42\n", results["bob"]
    refused = [label for label, result in results.items() if result["status"] != "success"]
    assert refused == ["alice2"], results
    assert results["alice2"]["error"].startswith("busy:"), results["alice2"]
    assert "the most this server accepts" in results["alice2"]["error"]
    assert [results[f"alice{index}"]["stdout"] for index in range(2)] == ["0\n", "1\n"]
