"""The early answer to ``initialize`` is the SDK's very answer, byte for byte, or none at all.

``server/transport/stdio_early.py`` answers a stdio client's first ``initialize`` before the SDK is
imported, from constants written in it. Here every answer it gives is compared with what the SDK
itself writes for the same line, through the SDK's own stdio transport and our real server
object; the lines it must leave to the SDK (which refuses or reads them differently) get none.
"""

from __future__ import annotations

import io
import json
from typing import Any

import anyio
import mcp_types.version
import pytest
from mcp.server.stdio import stdio_server

from mcp_sandbox import __version__
from mcp_sandbox.server.mcp_server import Opening, mcp_server
from mcp_sandbox.server.transport.stdio_early import (
    CAPABILITIES,
    HANDSHAKE_PROTOCOL_VERSIONS,
    INSTRUCTIONS,
    LATEST_HANDSHAKE_VERSION,
    SERVER_NAME,
    early_answer,
)

pytestmark = pytest.mark.anyio


async def sdk_answers(*lines: bytes) -> list[bytes]:
    """What our server, through the SDK's stdio transport, writes for ``lines``."""
    received = io.StringIO("".join(line.decode("utf-8", errors="replace") + "\n" for line in lines))
    written = io.StringIO()
    server = mcp_server(Opening())
    with anyio.fail_after(10):
        async with stdio_server(anyio.wrap_file(received), anyio.wrap_file(written)) as (read, write):
            await server.run(read, write, server.create_initialization_options())
    return [line.encode() + b"\n" for line in written.getvalue().split("\n") if line]


def initialize(request_id: Any = 1, **params: Any) -> dict[str, Any]:
    fields = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "client", "version": "1"}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": {**fields, **params}}


def line(message: Any) -> bytes:
    return json.dumps(message).encode()


CLAUDE_CODE_LIKE = initialize(
    0,
    protocolVersion="2025-06-18",
    capabilities={"roots": {"listChanged": True}, "sampling": {}, "elicitation": {"form": {}}},
    clientInfo={"name": "claude-code", "version": "2.1.0", "title": "Claude Code"},
)

# The first line of the official TypeScript SDK's client, as the MCP Inspector CLI 2.12.0 sends it.
INSPECTOR_CLI = (
    b'{"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{"listChanged":true},'
    b'"extensions":{"io.modelcontextprotocol/tasks":{},"io.modelcontextprotocol/skills":{}}},'
    b'"clientInfo":{"name":"inspector-cli","version":"2.12.0"}},"jsonrpc":"2.0","id":0}'
)

ANSWERED = {
    "the TypeScript SDK's client": INSPECTOR_CLI,
    **{f"version {v}": line(initialize(protocolVersion=v)) for v in HANDSHAKE_PROTOCOL_VERSIONS},
    "the stateless revision, answered with the latest handshake": line(initialize(protocolVersion="2026-07-28")),
    "an unknown version": line(initialize(protocolVersion="1999-01-01")),
    "a client's usual capabilities": line(CLAUDE_CODE_LIKE),
    "every capability the SDK knows": line(
        initialize(
            capabilities={
                "experimental": {"x": {"y": 1}},
                "roots": {},
                "sampling": {"context": {}, "tools": {}},
                "tasks": {"cancel": {}, "list": {}, "requests": {"sampling": {"createMessage": {}}}},
                "somethingNew": 5,
            }
        )
    ),
    "a string id with escapes": line(initialize('a\u001f\u00e9\u2028/\\"x')),
    "a negative id": line(initialize(-7)),
    "a large id": line(initialize(2**53 - 1)),
    "spaces and a CRLF ending": b'{ "jsonrpc" : "2.0", "id": 3, "method": "initialize", "params": '
    + json.dumps(initialize()["params"], indent=1).replace("\n", " ").encode()
    + b"}\r",
}

LEFT_TO_THE_SDK = {
    "missing params": line({"jsonrpc": "2.0", "id": 1, "method": "initialize"}),
    "null params": line({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": None}),
    "no clientInfo": line({**initialize(), "params": {"protocolVersion": "2025-06-18", "capabilities": {}}}),
    "a number as version": line(initialize(protocolVersion=20250618)),
    "capabilities not an object": line(initialize(capabilities=[])),
    "roots not an object": line(initialize(capabilities={"roots": 5})),
    "listChanged a string": line(initialize(capabilities={"roots": {"listChanged": "yes"}})),
    "experimental not objects": line(initialize(capabilities={"experimental": {"x": 1}})),
    "a nested task capability not an object": line(
        initialize(capabilities={"tasks": {"requests": {"elicitation": {"create": True}}}})
    ),
    "null capability": line(initialize(capabilities={"roots": None})),
    "clientInfo without version": line(initialize(clientInfo={"name": "c"})),
    "clientInfo name a number": line(initialize(clientInfo={"name": 1, "version": "1"})),
    "client icons": line(initialize(clientInfo={"name": "c", "version": "1", "icons": [{"src": "x"}]})),
    "a websiteUrl": line(initialize(clientInfo={"name": "c", "version": "1", "websiteUrl": "not a url"})),
    "params _meta": line(initialize(_meta={"progressToken": 1})),
    "a float id": line(initialize(1.0)),
    "a boolean id": line(initialize(True)),
    "a null id": line(initialize(None)),
    "an id too large to read alike": line(initialize(2**64)),
    "a second jsonrpc version": line({**initialize(), "jsonrpc": "1.0"}),
    "an extra member": line({**initialize(), "extra": 1}),
    "a notification first": line({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    "another request first": line({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    "ping first": line({"jsonrpc": "2.0", "id": 1, "method": "ping"}),
    "not JSON": b'{"jsonrpc": "2.0", "id": 1, "method": "initialize"',
    "an array": line([initialize()]),
    "NaN": line(initialize()).replace(b'"1"}', b'"1", "x": NaN}'),
    "a duplicate key": line(initialize()).replace(b'{"jsonrpc"', b'{"id": 9, "jsonrpc"'),
    "a lone surrogate": line(initialize("\ud800")),
    "invalid UTF-8": line(initialize("x")).replace(b'"x"', b'"\xff"'),
    "a lone CR inside": line(initialize()).replace(b", ", b",\r", 1),
    "a byte order mark": b"\xef\xbb\xbf" + line(initialize()),
    "empty": b"",
}


async def test_the_constants_are_the_sdks() -> None:
    options = mcp_server(Opening()).create_initialization_options()
    (answer,) = await sdk_answers(line(initialize()))

    assert HANDSHAKE_PROTOCOL_VERSIONS == mcp_types.version.HANDSHAKE_PROTOCOL_VERSIONS
    assert LATEST_HANDSHAKE_VERSION == mcp_types.version.LATEST_HANDSHAKE_VERSION
    assert CAPABILITIES == json.loads(answer)["result"]["capabilities"]
    assert (options.server_name, options.server_version, options.instructions) == (
        SERVER_NAME,
        __version__,
        INSTRUCTIONS,
    )


@pytest.mark.parametrize("first", ANSWERED.values(), ids=ANSWERED.keys())
async def test_an_initialize_the_sdk_accepts_is_answered_early_exactly_as_the_sdk_answers(first: bytes) -> None:
    answered = early_answer(first, __version__)

    assert answered is not None
    (sdk,) = await sdk_answers(first)
    assert answered[1] == sdk
    assert answered[0] == json.loads(sdk)["id"]


@pytest.mark.parametrize("first", LEFT_TO_THE_SDK.values(), ids=LEFT_TO_THE_SDK.keys())
async def test_anything_else_is_left_to_the_sdk(first: bytes) -> None:
    assert early_answer(first, __version__) is None


async def test_the_cases_left_to_the_sdk_include_ones_it_refuses() -> None:
    """Not a vacuous list: the SDK refuses the missing and mistyped ones, and does not read a float
    id as a request at all."""
    for name in ("missing params", "roots not an object", "clientInfo without version", "capabilities not an object"):
        (answer,) = await sdk_answers(LEFT_TO_THE_SDK[name])
        assert "error" in json.loads(answer), name
    assert await sdk_answers(LEFT_TO_THE_SDK["a float id"]) == []


async def test_a_second_initialize_is_the_sdks_to_answer() -> None:
    """The SDK answers every initialize; only the first is answered early, then dropped from its output."""
    first, second = line(initialize(1, protocolVersion="2025-06-18")), line(initialize(2, protocolVersion="2024-11-05"))

    answers = await sdk_answers(first, second)

    answered = early_answer(first, __version__)
    assert answered is not None
    assert answers[0] == answered[1]
    assert json.loads(answers[1])["result"]["protocolVersion"] == "2024-11-05"
