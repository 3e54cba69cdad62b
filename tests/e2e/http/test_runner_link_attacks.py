"""Attacks on the earlier runner's permanent links (issue 43, items 2 and 4), through HTTP.

Whoever saw one old link ``/files/{digest}/{name}`` knows the digest: a file the conversation
writes later, or an imported file changed since (same size, mtime set back), must not be served
by it, while an untouched imported file still is. A server with no runner data has no such
route, and a burst of unauthenticated misses on the route is summed in the audit log, not
written a line each (else anyone reaching the port rotates every tenant's records away).
"""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path

import anyio
import httpx2
import pytest

from mcp_test_helpers import CALL_BOUND, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "runner-token-0123456789abcdef"
SECRET = "the-runners-file-secret"
MISSES = 3000

# Sandboxed code: a new file, and the imported note rewritten in place to the same size with its
# mtime set back (an identity of size and mtime alone would still take it for the imported one).
_TAMPER = """
import os
open('/data/later.txt', 'w').write('written after the import')
st = os.stat('/data/sub/note.txt')
with open('/data/sub/note.txt', 'r+') as f:
    f.write('NESTED')
os.utime('/data/sub/note.txt', ns=(st.st_atime_ns, st.st_mtime_ns))
print('done')
"""


def _audit(state: Path) -> list[dict[str, object]]:
    lines: list[dict[str, object]] = []
    for path in sorted((state / "logs").glob("audit.jsonl*")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


async def test_old_links_serve_the_imported_files_only_and_their_misses_are_summed(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    root = tmp_path / "sandbox-root"
    conversation = f"session-{uuid.uuid4().hex[:8]}"
    digest = hashlib.sha256((conversation + SECRET).encode()).hexdigest()
    (root / digest / "sub").mkdir(parents=True)
    (root / digest / "data.csv").write_bytes(b"name,age\nAlice,30\n")
    (root / digest / "sub" / "note.txt").write_bytes(b"nested")
    env = {"MCP_API_TOKEN": TOKEN, "SANDBOX_ROOT": str(root), "FILE_SECRET": SECRET}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "run_code",
            "arguments": {"conversationId": conversation, "language": "python", "code": _TAMPER},
        },
    }
    async with (
        http_server(state_dir, env=env, runtime=sandbox_runtime) as base,
        httpx2.AsyncClient(base_url=base, timeout=CALL_BOUND) as web,
    ):
        with anyio.fail_after(CALL_BOUND * 3):
            ran = await web.post("/mcp", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
            assert ran.status_code == 200 and "done" in ran.text, ran.text
            later = await web.get(f"/files/{digest}/later.txt")
            changed = await web.get(f"/files/{digest}/sub/note.txt")
            untouched = await web.get(f"/files/{digest}/data.csv")
        assert later.status_code == 404, later.text
        assert changed.status_code == 404, changed.text
        assert (untouched.status_code, untouched.content) == (200, b"name,age\nAlice,30\n")

        before = len(_audit(state_dir))
        sent = 0

        async def miss(worker: int) -> None:
            nonlocal sent
            for index in range(worker, MISSES, 20):
                assert (await web.get(f"/files/{index:064x}/x.txt")).status_code == 404
                sent += 1

        with anyio.fail_after(CALL_BOUND * 2):
            async with anyio.create_task_group() as group:
                for worker in range(20):
                    group.start_soon(miss, worker)
        assert sent == MISSES
        written = _audit(state_dir)[before:]
        assert len(written) <= 3, written[:5]  # the burst's first refusal, perhaps a summary


async def test_a_server_without_runner_data_has_no_old_links(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with (
        http_server(state_dir, env={"MCP_API_TOKEN": TOKEN}, runtime=sandbox_runtime) as base,
        httpx2.AsyncClient(base_url=base, timeout=CALL_BOUND) as web,
    ):
        with anyio.fail_after(CALL_BOUND):
            answers = [(await web.get(f"/files/{index:064x}/data.csv")).status_code for index in range(50)]
    assert set(answers) == {404}
    assert not [line for line in _audit(state_dir) if str(line["event"]).startswith("download")]
