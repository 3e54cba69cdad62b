"""A downstream MCP server of our own, for behaviours the reference servers lack.

Run over stdio with the server's venv: `.venv/bin/python tests/downstream/fixture_server.py`.
Every tool is deterministic except `pid` (it tells a restarted server apart) and `sleep`.
"""

from __future__ import annotations

import base64
import os
import struct
import zlib
from typing import Literal, TypedDict

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, EmbeddedResource, ImageContent, TextContent, TextResourceContents

RESOURCE_URI = "fixture://notes/hello.txt"
RESOURCE_TEXT = "hello from an embedded resource\n"
CRASH_EXIT_CODE = 3


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def tiny_png() -> bytes:
    """A valid 1x1 opaque red PNG (8-bit RGB), built here rather than shipped as a binary file."""
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)  # width, height, depth, RGB, no interlace
    scanline = b"\x00\xff\x00\x00"  # filter type 0, then one red pixel
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(scanline))
        + _png_chunk(b"IEND", b"")
    )


class Weather(TypedDict):
    city: str
    temperature: float
    units: Literal["c", "f"]


def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


def add(a: int, b: int) -> int:
    """Add two integers (structured output: {"result": a + b})."""
    return a + b


def weather(city: str, units: Literal["c", "f"] = "c") -> Weather:
    """A made-up but deterministic temperature for a city."""
    celsius = float(len(city) * 3 % 35)
    temperature = celsius if units == "c" else celsius * 9 / 5 + 32
    return Weather(city=city, temperature=temperature, units=units)


def fail(message: str) -> CallToolResult:
    """Always fail: a tool error (isError true) whose only text is exactly `message`."""
    # Returned, not raised: a raised ToolError's text gets an "Error executing tool" prefix.
    return CallToolResult(content=[TextContent(text=message)], is_error=True)


def big(mebibytes: float) -> str:
    """A text result of `mebibytes` MiB of ASCII (so characters and bytes agree)."""
    return "x" * int(mebibytes * (1 << 20))


async def sleep(seconds: float) -> str:
    """Sleep, then say how long; a cancelled call stops sleeping."""
    await anyio.sleep(seconds)
    return f"slept {seconds}"


class _Barrier:
    """Counts calls in flight, so a test can prove calls overlap without timing them."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0  # the most calls in flight at once since the last time none were
        self._changed: anyio.Event | None = None  # created inside the event loop, on first use

    def bump(self, delta: int) -> None:
        self.in_flight += delta
        self.peak = max(self.peak, self.in_flight) if self.in_flight else 0
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()


_barrier = _Barrier()


async def rendezvous(parties: int, seconds: float = 30.0) -> int:
    """Return once `parties` calls of this tool are in flight at the same time (or after
    `seconds`); the result is how many were in flight at the highest point seen."""
    _barrier.bump(+1)
    try:
        with anyio.move_on_after(seconds):
            while _barrier.peak < parties:
                await _barrier.changed()
        return _barrier.peak
    finally:
        _barrier.bump(-1)


def image() -> ImageContent:
    """A tiny valid PNG."""
    return ImageContent(data=base64.b64encode(tiny_png()).decode("ascii"), mime_type="image/png")


def resource() -> EmbeddedResource:
    """An embedded text resource."""
    contents = TextResourceContents(uri=RESOURCE_URI, mime_type="text/plain", text=RESOURCE_TEXT)
    return EmbeddedResource(resource=contents)


def pid() -> int:
    """This server's process id, so a test can tell a restarted server."""
    return os.getpid()


def crash() -> str:
    """Exit the process mid-call, without answering."""
    os._exit(CRASH_EXIT_CODE)


# The protocol's stdout, saved before the SDK moves fd 1 aside, so `garble` can break the framing.
_wire: int | None = None


def garble(kind: Literal["invalid-utf8", "huge-line"], mebibytes: float = 50) -> str:
    """Write what breaks the framing onto the protocol stream, then answer normally.

    `invalid-utf8`: a line holding bytes that are not UTF-8; `huge-line`: one line of
    `mebibytes` MiB with no newline until its end.
    """
    if _wire is None:
        raise RuntimeError("garble works only when the server runs over stdio")
    if kind == "invalid-utf8":
        data = b'{"jsonrpc": "2.0", "method": "notifications/message", "params": {"data": "\xff\xfe"}}\n'
    else:
        data = b"x" * int(mebibytes * (1 << 20)) + b"\n"
    with os.fdopen(os.dup(_wire), "wb") as wire:
        wire.write(data)
    return "garbled"


def get_forecast_v2(city: str, days: int = 1) -> str:
    """A made-up forecast for the next `days` days."""
    return f"{city}: sunny for {days} day(s)"


def class_(name: str) -> str:
    """A tool named after a Python keyword."""
    return f"class {name}"


def trace_context(ctx: Context) -> dict[str, str]:
    """The W3C trace context (`traceparent`, `tracestate`) this call's `_meta` carried."""
    meta = ctx.request_context.meta or {}
    return {key: str(value) for key, value in dict(meta).items() if key in ("traceparent", "tracestate")}


def build_server() -> MCPServer:
    """The fixture server; `Client(build_server())` talks to it in process."""
    server = MCPServer("fixture", instructions="Test fixture: deterministic tools with edge-case shapes and names.")
    server.add_tool(echo, structured_output=False)
    server.add_tool(add)
    server.add_tool(weather)
    server.add_tool(fail, structured_output=False)
    server.add_tool(big, structured_output=False)
    server.add_tool(sleep, structured_output=False)
    server.add_tool(rendezvous)
    server.add_tool(image)
    server.add_tool(resource)
    server.add_tool(pid)
    server.add_tool(crash, structured_output=False)
    server.add_tool(garble, structured_output=False)
    server.add_tool(trace_context)
    # Names that are not Python identifiers, for code that turns tool names into functions.
    server.add_tool(get_forecast_v2, name="get-forecast.v2")
    server.add_tool(class_, name="class", structured_output=False)
    return server


if __name__ == "__main__":
    _wire = os.dup(1)
    build_server().run()
