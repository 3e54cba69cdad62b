"""Attacks on the one way in for workspace changes (issue 43), through a real HTTP server with two tenants.

Uploads race born sessions' adoptions of a conversation of a few thousand entries: no file of it
may ever show in another conversation (the other tenant's: ``tenant_uid_range = "off"`` makes the
two share a uid, and so a session-ready pool), and it keeps every file. Concurrent forks over the
tenant's disk budget with run caps of 1 + 1: those refused leave no copy and no disk use. A sparse
file stays sparse in a fork.
"""

from __future__ import annotations

import random
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_test_helpers import auth_tokens, bearer_web, http_server, new_conversation, run_over_http

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
TOKENS = {"alice": ALICE, "bob": BOB}
ENTRIES = 2000  # top-level folders of the raced conversation: adoption moves them one by one
RACE_SECONDS = 10.0
BUDGET = 20 << 20  # tenant_workspaces_bytes
SOURCE = 8 << 20  # a fork's source: one fork fits beside it, a second does not
_BORN = "print(b'--ready=' in open('/proc/self/cmdline', 'rb').read())"


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / f"gate-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(
        textwrap.dedent(f"""
        pool_size = 0
        pool_min = 0
        session_ready = 2
        tenant_uid_range = "off"
        tenant_concurrent_runs = 1
        tenant_queued_runs = 1
        tenant_workspaces_bytes = {BUDGET}
        """)
        + auth_tokens(TOKENS)
    )
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def _run(base: str, token: str, code: str, **arguments: Any) -> dict[str, Any]:
    return await run_over_http(base, token, code, timeout=30, **arguments)


async def test_uploads_racing_born_sessions_never_show_a_conversations_files_elsewhere_nor_lose_one(
    base: str,
) -> None:
    source = new_conversation()
    made = await _run(
        base,
        ALICE,
        f"""
        import os
        for i in range({ENTRIES}):
            os.mkdir(f'/workspace/d{{i}}')
            open(f'/workspace/d{{i}}/f', 'w').write(str(i))
        """,
        conversationId=source,
    )
    assert made["status"] == "success", made
    uploaded: list[str] = []
    others: list[tuple[str, dict[str, Any]]] = []
    born: list[bool] = []  # each reset run: born of a session-ready sandbox (adopting the conversation)?
    start = time.monotonic()

    def racing() -> bool:  # RACE_SECONDS, and on until two resets were born (a loaded machine), within a bound
        spent = time.monotonic() - start
        return spent < RACE_SECONDS or (sum(born) < 2 and spent < 3 * RACE_SECONDS)

    async def uploads(worker: int) -> None:
        async with bearer_web(ALICE) as web:
            for count in range(10_000):
                if not racing():
                    return
                name = f"d{random.randrange(ENTRIES)}/u{worker}-{count}"
                answer = await web.post(
                    f"{base}/upload", params={"conversationId": source, "filename": name}, content=b"u"
                )
                if answer.status_code == 201:
                    uploaded.append(name)

    async def resets() -> None:  # each a born session's adoption of the raced conversation, where one is idle
        while racing():
            data = await _run(base, ALICE, _BORN, conversationId=source, reset=True)
            assert data["status"] == "success", data
            born.append(data["stdout"] == "True\n")

    async def newcomers() -> None:  # new conversations of the other tenant: born of the same pool
        while racing():
            conversation = new_conversation()
            data = await _run(
                base, BOB, "import os\nprint(sorted(os.listdir('/workspace')))", conversationId=conversation
            )
            others.append((conversation, data))

    with anyio.fail_after(3 * RACE_SECONDS + 120):
        async with anyio.create_task_group() as group:
            for worker in range(4):
                group.start_soon(uploads, worker)
            group.start_soon(resets)
            group.start_soon(newcomers)

    assert uploaded and others and any(born), (len(uploaded), len(others), born)
    for conversation, data in others:
        assert data["stdout"] == "[]\n", (conversation, data["stdout"][:200])
        assert data["files"] == [], conversation
    check = await _run(
        base,
        ALICE,
        f"""
        import os
        lost = [i for i in range({ENTRIES}) if open(f'/workspace/d{{i}}/f').read() != str(i)]
        print(len(lost))
        """,
        conversationId=source,
    )
    assert (check["status"], check["stdout"]) == ("success", "0\n"), check
    names = {entry["name"] for entry in check["files"]}
    assert set(uploaded) <= names


def _disk(state_dir: Path) -> tuple[set[str], int]:
    """The conversation directories on disk, and the bytes their files take (st_size)."""
    root = state_dir / "workspaces"
    keys = {entry.name for entry in root.iterdir() if len(entry.name) == 64}
    used = sum(path.stat().st_size for key in keys for path in (root / key).rglob("*") if path.is_file())
    return keys, used


async def test_concurrent_forks_past_the_tenants_budget_refused_leave_no_copy(
    base: str, module_state_dir: Path
) -> None:
    source = new_conversation()
    made = await _run(base, BOB, f"open('/workspace/big', 'wb').write(b'x' * {SOURCE})", conversationId=source)
    assert made["status"] == "success", made
    before, used_before = _disk(module_state_dir)
    results: list[dict[str, Any]] = []

    async def fork() -> None:
        results.append(await _run(base, BOB, "pass", conversationId=new_conversation(), forkFrom=source))

    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            for _ in range(16):
                group.start_soon(fork)

    forked = [data for data in results if data["status"] == "success"]
    refused = [data for data in results if data["status"] != "success"]
    assert len(forked) <= 1 and len(refused) >= 15, [data.get("error") for data in results]
    assert all("fork" not in data or data["fork"]["files"] == 0 for data in refused)
    after, used_after = _disk(module_state_dir)
    assert len(after - before) == len(forked)  # a refused fork made no conversation
    assert used_after - used_before == SOURCE * len(forked)
    assert used_after <= BUDGET + used_before - SOURCE
    assert not [entry for entry in (module_state_dir / "workspaces").iterdir() if entry.name.startswith(".fork-")]


async def test_a_sparse_file_stays_sparse_in_a_fork(base: str) -> None:
    source = new_conversation()
    code = "f = open('/workspace/sparse', 'wb'); f.seek(4 << 20); f.write(b'end'); f.close()"
    made = await _run(base, ALICE, code, conversationId=source)
    assert made["status"] == "success", made
    look = "import os\ninfo = os.stat('/workspace/sparse')\nprint(info.st_size, info.st_blocks * 512)"
    held = await _run(base, ALICE, look, conversationId=source)
    size, blocks = map(int, held["stdout"].split())
    assert size == (4 << 20) + 3 and blocks < 1 << 20, held["stdout"]  # sparse where the test runs

    forked = await _run(base, ALICE, look, conversationId=new_conversation(), forkFrom=source)
    assert forked["status"] == "success", forked
    size, blocks = map(int, forked["stdout"].split())
    assert size == (4 << 20) + 3 and blocks < 1 << 20, forked["stdout"]
