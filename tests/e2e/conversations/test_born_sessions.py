"""A conversation's first run born of a session-ready sandbox, through the tools (in memory and over real stdio).

The run's code says whether its interpreter is a session-ready sandbox's runner (``boot.py
--ready=...``): the tests call until one is, so they cannot pass on sessions started from nothing.
"""

from __future__ import annotations

import base64
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_test_helpers import CALL_BOUND, memory_client, run_python, stdio_client, structured

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

_PARENT = "import os\nprint(b'--ready=' in open('/proc/self/cmdline', 'rb').read(), flush=True)\n"
_BORN_BOUND = 60.0  # the session-ready sandbox starts with the first conversation's run


@contextlib.asynccontextmanager
async def _stdio(state_dir: Path, runtime: Path | None) -> AsyncIterator[Client]:
    async with stdio_client(state_dir, runtime) as client:
        yield client


CLIENTS: dict[str, Callable[[Path, Path | None], contextlib.AbstractAsyncContextManager[Client]]] = {
    "memory": memory_client,
    "stdio": _stdio,
}


@pytest.fixture(params=sorted(CLIENTS))
async def client(
    request: pytest.FixtureRequest, state_dir: Path, sandbox_runtime: Path | None
) -> AsyncIterator[Client]:
    async with CLIENTS[request.param](state_dir, sandbox_runtime) as client:
        yield client


async def _born_run(client: Client, conversation: str, code: str) -> dict[str, Any]:
    """The first run of a new session of ``conversation`` (``reset``), once one is born of a session-ready sandbox."""
    deadline = time.monotonic() + _BORN_BOUND
    while True:
        data = structured(
            await run_python(client, {"code": _PARENT + code, "conversationId": conversation, "reset": True})
        )
        assert data["status"] == "success", data
        head, _, rest = data["stdout"].partition("\n")
        if head == "True":
            return {**data, "stdout": rest}
        assert time.monotonic() < deadline, "no session was born of a session-ready sandbox"
        await anyio.sleep(0.2)


async def test_a_conversations_first_run_born_of_a_ready_sandbox_sees_its_uploads_and_keeps_its_variables(
    client: Client,
) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    with anyio.fail_after(CALL_BOUND):
        stored = await client.call_tool(
            "upload_file",
            {
                "conversationId": conversation,
                "filename": "in/data.txt",
                "content": base64.b64encode(b"uploaded").decode(),
            },
        )
    assert not stored.is_error

    first = await _born_run(
        client,
        conversation,
        "print(open('/workspace/in/data.txt').read())\nopen('out.txt', 'w').write('written')\nx = 21",
    )
    second = structured(await run_python(client, {"code": "print(x * 2)", "conversationId": conversation}))
    other = structured(
        await run_python(
            client, {"code": "import os\nprint(os.listdir('/workspace'))", "conversationId": f"o-{uuid.uuid4().hex}"}
        )
    )

    assert (first["session"], first["stdout"]) == ("new", "uploaded\n")
    assert (second["session"], second["stdout"]) == ("kept", "42\n")
    assert sorted((entry["name"], entry["size"]) for entry in second["files"]) == [("in/data.txt", 8), ("out.txt", 7)]
    assert other["stdout"] == "[]\n"  # another conversation sees none of it
