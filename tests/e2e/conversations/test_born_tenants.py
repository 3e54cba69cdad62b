"""Each token tenant's new conversations are born of session-ready sandboxes of its own host uid, seen
through a real HTTP server with two tenants and neither of them ``default``.

A run says whether its interpreter is a session-ready sandbox's runner (``boot.py --ready=...``);
the host owner of the file it writes is the host uid it ran as; the metrics count the session-ready
sandboxes started (``mcp_sandbox_pool_starts_total{pool="ready"}``). As root only: where the server
is not root, every tenant runs as one uid and shares one pool.
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

from mcp_test_helpers import auth_tokens, http_server, new_conversation, run_over_http, upload

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.sandbox,
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="tenants get host uids of their own only from a root server"),
]

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef0000"
METRICS = "metrics-token-0123456789abcdef"
TOKENS = {"alice": ALICE, "bob": BOB}
_STARTS = 'mcp_sandbox_pool_starts_total{language="python",pool="ready"}'


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    config = module_state_dir.parent / f"born-{uuid.uuid4().hex[:8]}.toml"
    # One session-ready sandbox per uid (tenant_concurrent_runs 1); no warm pools beside them.
    config.write_text(
        textwrap.dedent(f"""
        pool_size = 0
        pool_min = 0
        session_ready = 2
        tenant_concurrent_runs = 1
        metrics_token = "{METRICS}"
        """)
        + auth_tokens(TOKENS)
    )
    async with http_server(module_state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
        yield url


async def _starts(base: str) -> float:
    async with httpx2.AsyncClient() as web:
        text = (await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})).text
    match = re.search(rf"^{re.escape(_STARTS)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match is not None else 0.0


async def _wait_starts(base: str, count: float) -> None:
    with anyio.fail_after(60):
        while await _starts(base) < count:  # noqa: ASYNC110 - a scrape has no event to wait on
            await anyio.sleep(0.1)


async def _first_run(base: str, state_dir: Path, tenant: str) -> tuple[bool, int, str]:
    """A new conversation's first run as ``tenant``, on a file it uploaded: born?, its host uid, the conversation."""
    conversation = new_conversation()
    uploaded = await upload(base, TOKENS[tenant], conversation, "given.txt", tenant.encode())
    assert uploaded.status_code == 201, uploaded.text
    marker = f"born-{uuid.uuid4().hex}"
    code = f"""
        import os
        born = b'--ready=' in open('/proc/self/cmdline', 'rb').read()
        print(born, open('/workspace/given.txt').read())
        open('/workspace/{marker}', 'w').write('x')
        kept = 21
    """
    first = await run_over_http(base, TOKENS[tenant], code, conversationId=conversation, timeout=30)
    assert (first["status"], first["session"]) == ("success", "new"), first
    born, given = first["stdout"].split()
    assert given == tenant  # its own upload, at /workspace
    second = await run_over_http(base, TOKENS[tenant], "print(kept * 2)", conversationId=conversation, timeout=30)
    assert (second["session"], second["stdout"]) == ("kept", "42\n"), second
    assert sorted(entry["name"] for entry in second["files"]) == sorted(["given.txt", marker])
    (written,) = [path / marker for path in (state_dir / "workspaces").iterdir() if (path / marker).exists()]
    return born == "True", written.stat().st_uid, conversation


def _assigned(state_dir: Path) -> dict[str, int]:
    return dict(json.loads((state_dir / "tenant-uids.json").read_text()))


async def test_each_token_tenants_new_conversations_are_born_as_its_own_uid_and_never_of_anothers(
    base: str, module_state_dir: Path
) -> None:
    starts = await _starts(base)

    born, uid, _ = await _first_run(base, module_state_dir, "bob")  # makes bob's pool: started from nothing
    assert (born, uid) == (False, _assigned(module_state_dir)["bob"])
    await _wait_starts(base, starts + 1)  # bob's ready sandbox is idle

    # Only bob's ready sandbox is idle: alice's first conversation run is not born of it.
    born, uid, alice_conversation = await _first_run(base, module_state_dir, "alice")
    assert (born, uid) == (False, _assigned(module_state_dir)["alice"])
    await _wait_starts(base, starts + 2)  # alice's, now (and bob's still idle: no third)

    for tenant in ("alice", "bob"):
        born, uid, _ = await _first_run(base, module_state_dir, tenant)
        assert (born, uid) == (True, _assigned(module_state_dir)[tenant])
    assert _assigned(module_state_dir)["alice"] != _assigned(module_state_dir)["bob"]

    # Alice's born session sees none of her other conversation's files, nor bob's.
    other = await run_over_http(
        base, ALICE, "import os\nprint(sorted(os.listdir('/workspace')))", conversationId=new_conversation()
    )
    assert other["stdout"] == "[]\n", other
    assert alice_conversation not in other["stdout"]
