"""What a session writes after its run answered reaches the object store, against a real SeaweedFS.

Real ``serve --transport http`` processes: the idle write-back takes it to the store, keeps it on
the server's disk while the store is down and catches up once it is back, and the server writes
it back when it stops.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import http_server, new_conversation, poll, run_over_http
from s3_helpers import bucket, store_url

from .stores import ALICE, store_config, store_env, workspace_files

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


# A run that leaves a thread behind, writing a file some seconds after the run has answered.
_LATE_WRITER = """
import threading, time
def later():
    time.sleep(4)
    with open('late.txt.part', 'w') as out:
        out.write('written after the answer')
    __import__('os').rename('late.txt.part', 'late.txt')
threading.Thread(target=later, daemon=True).start()
print('started')
"""


async def test_what_a_session_writes_after_its_run_answered_reaches_the_store_while_idle(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = store_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1s")
    async with http_server(
        state_dir, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime
    ) as base:
        data = await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        assert data["stdout"] == "started\n"
        assert "late.txt" not in workspace_files(s3_endpoint, url)  # not written yet when the run answered
        # No further call: the idle write-back takes it to the store.
        with anyio.fail_after(60):
            await poll(lambda: "late.txt" in workspace_files(s3_endpoint, url), interval=0.25)
        assert workspace_files(s3_endpoint, url)["late.txt"] == b"written after the answer"


async def test_idle_write_backs_outlive_a_store_that_is_down_and_catch_up_once_it_is_back(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    name = f"idle-{uuid.uuid4().hex[:12]}"
    bucket(s3_endpoint, name, exists=True)
    url, conversation = f"s3://{name}/p", new_conversation()
    env = store_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1s")
    log = tmp_path / "server.log"
    config = str(store_config(tmp_path))
    async with http_server(state_dir, "--config", config, env=env, runtime=sandbox_runtime, log_path=log) as base:
        await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        bucket(s3_endpoint, name, exists=False)  # the store refuses every write-back from now on
        with anyio.fail_after(60):
            await poll(lambda: "idle write-back to the object store failed" in log.read_text(errors="replace"))
        # The server goes on serving, and the file waits on its disk for the store.
        assert (await run_over_http(base, ALICE, "print(6 * 7)"))["stdout"] == "42\n"
        bucket(s3_endpoint, name, exists=True)
        with anyio.fail_after(60):
            await poll(lambda: "late.txt" in workspace_files(s3_endpoint, url), interval=0.25)
    assert workspace_files(s3_endpoint, url)["late.txt"] == b"written after the answer"


async def test_what_a_session_wrote_since_the_last_write_back_is_stored_when_the_server_stops(
    tmp_path: Path, state_dir: Path, s3_endpoint: str, sandbox_runtime: Path | None
) -> None:
    url, conversation = store_url(), new_conversation()
    env = store_env(s3_endpoint, url, MCP_SANDBOX_WRITE_BACK_INTERVAL="1h")  # no pass before the stop
    async with http_server(
        state_dir, "--config", str(store_config(tmp_path)), env=env, runtime=sandbox_runtime
    ) as base:
        await run_over_http(base, ALICE, _LATE_WRITER, conversationId=conversation)
        with anyio.fail_after(60):
            await poll(lambda: any((state_dir / "workspaces").glob("*/late.txt")), interval=0.25)
        assert "late.txt" not in workspace_files(s3_endpoint, url)
    # SIGTERM: the sessions are closed, then what they left is written back before the server exits.
    assert workspace_files(s3_endpoint, url)["late.txt"] == b"written after the answer"
