"""A long run as a task through python-sdk 1.x's own client, whose request timeout is shorter than the run.

python-sdk 1.x ships a client of the 2025-11-25 Tasks design (``session.experimental``); 2.x does
not. It lives in a venv of its own (``make downstream``: .downstream/sdk1, never the project's
venv) and runs sdk1_task_call.py against a real ``serve --transport http`` with a token: its
blocking call times out, the same run as a task is polled to ``completed`` and its result read.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import anyio
import pytest

from mcp_test_helpers import CALL_BOUND, auth_tokens, http_server

from .venvs import downstream_python

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "sdk1-token-0123456789abcdef01"
SCRIPT = Path(__file__).with_name("sdk1_task_call.py")
REQUEST_TIMEOUT = 2  # seconds: the client's, shorter than the run


def sdk1_python() -> Path:
    return downstream_python("sdk1", "MCP_SANDBOX_TEST_SDK1_PYTHON", "python-sdk 1.x")


async def test_a_run_longer_than_the_clients_request_timeout_completes_as_a_task(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    python = sdk1_python()
    config = state_dir.parent / f"sdk1-{uuid.uuid4().hex[:8]}.toml"
    config.write_text(auth_tokens({"default": TOKEN}))
    code = f"import time; time.sleep({REQUEST_TIMEOUT * 2}); print('outlived the timeout')"
    with anyio.fail_after(CALL_BOUND * 2):
        async with http_server(state_dir, "--config", str(config), runtime=sandbox_runtime) as url:
            request = {"url": f"{url}/mcp", "token": TOKEN, "code": code, "timeout": REQUEST_TIMEOUT}
            done = await anyio.run_process(
                [str(python), "-W", "ignore::DeprecationWarning", str(SCRIPT), json.dumps(request)],
                check=False,
                stderr=subprocess.PIPE,
            )

    assert done.returncode == 0, done.stderr.decode(errors="replace")
    ran = json.loads(done.stdout)
    assert ran["blocking"] == "timed out"  # the call this client would have made without a task
    assert ran["seen"][0] == "working" and ran["seen"][-1] == "completed"
    assert ran["structured"]["stdout"] == "outlived the timeout\n"
