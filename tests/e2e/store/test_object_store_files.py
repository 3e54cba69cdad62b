"""One file never makes a conversation's copy in the object store unusable (issue 44), against a
real SeaweedFS and real ``serve --transport http`` processes.

An empty file a run writes survives its write-back and a restore by a fresh server (its own
state directory, the same bucket), and later uploads and runs keep working; an accepted name
near 1,024 bytes is stored and restored; a file the server cannot read leaves every other file
stored and the index written, and the run's result names it; an index damaged in the store is
rebuilt from the owner's copy on its next write-back.
"""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import httpx2
import pytest

from mcp_sandbox.replicas.packs import SMALL
from mcp_test_helpers import auth_tokens, http_server, new_conversation, run_over_http, upload
from s3_helpers import delete_object, files, objects, parked, s3_env, store_url

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

ALICE = "alice-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"
NOBODY = 65534  # the server of deploy/Dockerfile is an unprivileged user too


def _config(directory: Path) -> Path:
    path = directory / f"files-{uuid.uuid4().hex[:8]}.toml"
    path.write_text(f'metrics_token = "{METRICS}"\n' + auth_tokens({"alice": ALICE}))
    path.chmod(0o644)
    return path


def _fresh(state: Path) -> Path:
    """A state directory of its own for a second server, with the first's secret (the same conversation keys)."""
    fresh = state.with_name("fresh")
    fresh.mkdir(mode=0o700)
    (fresh / "secret").write_bytes((state / "secret").read_bytes())
    (fresh / "secret").chmod(0o600)
    return fresh


def _stored(endpoint: str, url: str) -> dict[str, bytes]:
    return {name.split("/", 2)[2]: data for name, data in files(endpoint, url).items()}


def _server(
    state: Path,
    config: Path,
    endpoint: str,
    url: str,
    runtime: Path | None,
    program: Sequence[str] | None = None,
    **more: str,
) -> AbstractAsyncContextManager[str]:
    env = {**s3_env(endpoint), "MCP_SANDBOX_OBJECT_STORE_URL": url, **more}
    return http_server(state, "--config", str(config), env=env, runtime=runtime, program=program)


LISTING = """
import os
for base, _, names in sorted(os.walk('.')):
    for name in sorted(names):
        path = os.path.join(base, name)[2:]
        print(len(path.encode()), os.path.getsize(path))
"""


async def test_an_empty_file_a_run_writes_is_stored_restored_by_a_fresh_server_and_later_writes_work(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation, config = store_url(), new_conversation(), _config(state_dir.parent)
    async with _server(state_dir, config, s3_endpoint, url, sandbox_runtime) as base:
        # What a full disk leaves behind: a file opened, then ENOSPC before a byte was written.
        done = await run_over_http(base, ALICE, "open('empty.txt', 'w').close()", conversationId=conversation)
        assert "warning" not in done
        assert (await upload(base, ALICE, conversation, "up.txt", b"uploaded")).status_code == 201
        done = await run_over_http(base, ALICE, "open('later.txt', 'w').write('later')", conversationId=conversation)
        assert "warning" not in done
    expected = {"empty.txt": b"", "up.txt": b"uploaded", "later.txt": b"later"}
    assert _stored(s3_endpoint, url) == expected
    assert len(parked(s3_endpoint, url)) == 1  # the stop parked the idle session there, beside its files

    fresh = _fresh(state_dir)
    async with _server(fresh, config, s3_endpoint, url, sandbox_runtime) as base:
        code = "import os; print(sorted((n, os.path.getsize(n)) for n in os.listdir()))"
        done = await run_over_http(base, ALICE, code, conversationId=conversation)
        assert done["stdout"] == "[('empty.txt', 0), ('later.txt', 5), ('up.txt', 8)]\n"
        assert (await upload(base, ALICE, conversation, "again.txt", b"again")).status_code == 201
    assert _stored(s3_endpoint, url) == {**expected, "again.txt": b"again"}


async def test_large_files_under_names_of_946_and_1024_bytes_are_stored_and_restored(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation, config = store_url(), new_conversation(), _config(state_dir.parent)
    directory = "/".join(["d" * 200] * 4)  # 803 bytes: components of at most 255 bytes
    names = [f"{directory}/{'f' * (length - 808)}.bin" for length in (946, 1024)]
    assert [len(name.encode()) for name in names] == [946, 1024]
    body = b"L" * (SMALL + 1)  # an object of its own, were its key short enough
    async with _server(state_dir, config, s3_endpoint, url, sandbox_runtime) as base:
        for name in names:
            assert (await upload(base, ALICE, conversation, name, body)).status_code == 201
    assert _stored(s3_endpoint, url) == dict.fromkeys(names, body)

    async with _server(_fresh(state_dir), config, s3_endpoint, url, sandbox_runtime) as base:
        done = await run_over_http(base, ALICE, LISTING, conversationId=conversation)
        assert done["stdout"] == f"946 {SMALL + 1}\n1024 {SMALL + 1}\n"


async def test_a_file_the_server_cannot_read_is_named_unsaved_and_every_other_file_is_stored(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    # A server that is not root (the container's) cannot read a file its run made mode 000.
    if os.geteuid() != 0:
        pytest.skip("needs root to start the server as another, unprivileged user")
    url, conversation, config = store_url(), new_conversation(), _config(state_dir.parent)
    os.chmod(state_dir.parent, 0o755)
    os.mkdir(state_dir, 0o700)
    os.chown(state_dir, NOBODY, NOBODY)
    program = [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        sys.executable,
        "-m",
        "mcp_sandbox",
    ]
    code = """
    import os
    open('kept.txt', 'w').write('kept')
    open('closed.txt', 'w').write('closed')
    os.chmod('closed.txt', 0)
    open('big.bin', 'wb').write(b'B' * (1 << 20))
    """
    # Not root: this host's cgroup v1 limits are root's only (what is tested here is the store).
    weaker = {"MCP_SANDBOX_ACCEPT_WEAKER_ISOLATION": "1"}
    async with _server(state_dir, config, s3_endpoint, url, sandbox_runtime, program, **weaker) as base:
        done = await run_over_http(base, ALICE, textwrap.dedent(code), conversationId=conversation)
        assert done["status"] == "success"
        assert "/workspace/closed.txt" in done["warning"]
        assert "kept.txt" not in done["warning"]
        assert _stored(s3_endpoint, url) == {"kept.txt": b"kept", "big.bin": b"B" * (1 << 20)}
        async with httpx2.AsyncClient() as web:
            scraped = (await web.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS}"})).text
        assert 'mcp_sandbox_unsaved_files_total{stage="write_back"} 1.0' in scraped

        done = await run_over_http(base, ALICE, "import os; os.chmod('closed.txt', 0o600)", conversationId=conversation)
        assert "warning" not in done  # readable again: the next write-back stores it
        assert _stored(s3_endpoint, url)["closed.txt"] == b"closed"


async def test_an_index_naming_a_deleted_pack_is_rebuilt_by_the_owners_next_write_back(
    state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation, config = store_url(), new_conversation(), _config(state_dir.parent)
    async with _server(state_dir, config, s3_endpoint, url, sandbox_runtime) as base:
        await run_over_http(base, ALICE, "open('a.txt', 'w').write('alpha')", conversationId=conversation)
        (pack,) = [name for name in objects(s3_endpoint, url) if "/.mcp-sandbox-packs/" in name and "index" not in name]
        delete_object(s3_endpoint, url, pack)  # behind the server's back
        done = await run_over_http(base, ALICE, "open('b.txt', 'w').write('beta')", conversationId=conversation)
        assert "warning" not in done
    assert _stored(s3_endpoint, url) == {"a.txt": b"alpha", "b.txt": b"beta"}

    async with _server(_fresh(state_dir), config, s3_endpoint, url, sandbox_runtime) as base:
        code = "import os; print(sorted((n, open(n).read()) for n in os.listdir()))"
        done = await run_over_http(base, ALICE, code, conversationId=conversation)
        assert done["stdout"] == "[('a.txt', 'alpha'), ('b.txt', 'beta')]\n"
