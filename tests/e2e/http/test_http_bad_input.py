"""Malformed requests to a real HTTP server get an error that names what was wrong.

Issue 34, finding 6: a JSON-RPC request with an object `id` was dropped with 202, a 100,000-deep
body got HTTP 500, `/upload` stored names that were not UTF-8 (as replacement characters), and
malformed tool arguments, JSON-RPC envelopes and multipart bodies were refused without naming
the problem ("Invalid request parameters", a dump of a model's errors, "Invalid multipart data.").
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from mcp_test_helpers import bearer_web, http_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

TOKEN = "bad-input-token-0123456789abcdef"
PLAIN = {"Content-Type": "application/json", "Accept": "application/json"}


@pytest.fixture(scope="module")
async def base(module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[str]:
    async with http_server(module_state_dir, env={"MCP_SANDBOX_TOKEN": TOKEN}, runtime=sandbox_runtime) as url:
        yield url


async def post(base: str, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx2.Response:
    async with bearer_web(TOKEN) as web:
        return await web.post(f"{base}{path}", content=body, headers=PLAIN if headers is None else headers)


def jsonrpc_error(response: httpx2.Response, status: int = 400) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


async def test_a_request_with_an_object_id_is_refused_naming_the_id(base: str) -> None:
    response = await post(base, "/mcp", b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}')
    error = jsonrpc_error(response)
    assert error["code"] == -32600
    assert 'id must be a string, an integer or null, not {"a": 1}' in error["message"]


async def test_a_request_with_an_object_id_in_a_session_is_refused_too(base: str) -> None:
    headers = {**PLAIN, "Mcp-Session-Id": "0" * 32}
    response = await post(base, "/mcp", b'{"jsonrpc": "2.0", "id": [1], "method": "tools/list"}', headers)
    assert jsonrpc_error(response)["code"] == -32600


async def test_a_body_nested_a_hundred_thousand_deep_is_a_parse_error_not_a_500(base: str) -> None:
    depth = 100_000
    response = await post(base, "/mcp", b"[" * depth + b"]" * depth)
    error = jsonrpc_error(response)
    assert error["code"] == -32700
    assert "nested too deeply" in error["message"]
    deep_params = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"a": ' + b"[" * depth
    assert jsonrpc_error(await post(base, "/mcp", deep_params + b"]" * depth + b"}}"))["code"] == -32700


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (b'{"jsonrpc": "2.0", "id": 1}', "method is missing"),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}', 'jsonrpc must be "2.0"'),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}', "params must be an object"),
        (b'"tools/list"', "must be a JSON object, not str"),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]', "batches are not supported"),
    ],
)
async def test_a_malformed_jsonrpc_envelope_is_refused_naming_the_field(base: str, body: bytes, named: str) -> None:
    error = jsonrpc_error(await post(base, "/mcp", body))
    assert error["code"] == -32600
    assert named in error["message"]
    assert "validation error" not in error["message"].lower()


@pytest.mark.parametrize(
    ("params", "named"),
    [
        (b'{"name": "run_python", "arguments": "print(1)"}', "params.arguments"),
        (b'{"arguments": {"code": "print(1)"}}', "params.name"),
    ],
)
async def test_malformed_tool_call_params_are_refused_naming_the_field(base: str, params: bytes, named: str) -> None:
    body = b'{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": ' + params + b"}"
    error = jsonrpc_error(await post(base, "/mcp", body), status=200)
    assert error["code"] == -32602
    assert error["message"].startswith(f"tools/call: {named}:")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("conversationId=bad-input&filename=%FF%FE.txt", "filename"),
        ("conversationId=c%FF1&filename=a.txt", "conversationId"),
    ],
)
async def test_an_upload_name_that_is_not_utf8_is_refused_naming_the_field(base: str, query: str, field: str) -> None:
    response = await post(base, f"/upload?{query}", b"hello", {"Content-Type": "application/octet-stream"})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith(f"{field}: is not valid UTF-8")


async def test_an_upload_without_a_conversation_id_says_it_is_required(base: str) -> None:
    response = await post(base, "/upload?filename=a.txt", b"hello", {"Content-Type": "application/octet-stream"})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("conversationId: is required")


@pytest.mark.parametrize("content_type", ["multipart/form-data", "multipart/form-data; boundary=xyz"])
async def test_a_body_that_is_not_multipart_is_refused_as_json_naming_the_body(base: str, content_type: str) -> None:
    response = await post(base, "/upload", b"garbage", {"Content-Type": content_type})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("body: not valid multipart/form-data")
