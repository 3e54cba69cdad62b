"""The earlier code runner's answers (``output_mode = "runner"``), in memory on the backend test double.

Its users' scripts parse the text of ``run_code`` and ``upload_file`` as that runner's JSON and
pass ``environment`` as an object of names to values; what they read is the server's rendering,
which tests/e2e/clients/test_env_aliases.py also reaches through the earlier runner's settings.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from doubles.sandbox import PlainProcessBackend
from mcp_test_helpers import CALL_BOUND, memory_client, text

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
async def client(module_state_dir: Path) -> AsyncIterator[Client]:
    backend = PlainProcessBackend()
    runtime = Path(sys.prefix)
    async with memory_client(
        module_state_dir, runtime, backend=backend, prestart_size=0, output_mode="runner"
    ) as client:
        yield client


async def _call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool(tool, arguments)
    return json.loads(text(result)), result.structured_content or {}, bool(result.is_error)


async def test_a_run_is_the_runners_json_with_its_output_and_files_and_the_environment_object_is_taken(
    client: Client,
) -> None:
    code = "import os\nopen('out.txt', 'w').write('x')\nprint(os.environ['GREETING'])"
    arguments = {"code": code, "language": "python", "conversationId": "runner-1", "environment": {"GREETING": "hi"}}

    shown, data, is_error = await _call(client, "run_code", arguments)

    assert shown == {"success": True, "output": "hi\n", "files": [{"name": "out.txt", "url": None}]}
    assert (data["status"], data["stdout"], is_error) == ("success", "hi\n", False)  # this server's fields stay


async def test_a_failed_run_is_the_runners_error_with_the_traceback_as_its_reason(client: Client) -> None:
    shown, data, is_error = await _call(client, "run_code", {"code": "raise ValueError('boom')", "language": "python"})

    assert (shown["success"], is_error, data["status"]) == (False, True, "error")
    assert shown["error"].endswith("ValueError: boom")
    assert shown["output"] == data["stderr"]


async def test_a_refused_run_is_the_runners_error_naming_the_argument(client: Client) -> None:
    shown, data, _ = await _call(client, "run_code", {"code": "", "language": "python"})

    assert shown["success"] is False and shown["error"].startswith("code:")
    assert data["status"] == "validation_error"


async def test_an_upload_is_the_runners_message_and_file_and_a_refused_one_its_error(client: Client) -> None:
    content = base64.b64encode(b"12345").decode()
    stored, data, _ = await _call(
        client, "upload_file", {"conversationId": "runner-2", "filename": "a.txt", "content": content}
    )
    refused, nothing, is_error = await _call(
        client, "upload_file", {"conversationId": "runner-2", "filename": "../a", "content": ""}
    )

    assert stored == {
        "success": True,
        "message": "File a.txt uploaded successfully (5 bytes)",
        "file": {"name": "a.txt", "url": None},
    }
    assert (data["name"], data["size"]) == ("a.txt", 5)
    assert is_error and refused["success"] is False and refused["error"].startswith("filename:")
    assert nothing == {}
