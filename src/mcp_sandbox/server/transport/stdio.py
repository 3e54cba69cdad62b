"""MCP over this process's stdin and stdout, from the client's first byte.

The CLI answered ``initialize`` before even the SDK was imported (:mod:`.stdio_early`); the
server's own answer to it is dropped here (:class:`_WithoutEarlyAnswer`). When the wire is a
pipe or a socket it is read and written on the event loop (:mod:`.stdio_wire`).
"""

from __future__ import annotations

import io
import logging
from types import TracebackType
from typing import TYPE_CHECKING, cast

import anyio
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCError, JSONRPCResponse

from mcp_sandbox.server.transport.stdio_early import EarlyStdio
from mcp_sandbox.server.transport.stdio_wire import WireLines, WireWriter, loop_native

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import WriteStream

__all__ = ["serve_stdio"]

logger = logging.getLogger(__name__)


class _WithoutEarlyAnswer:
    """The stream to the client, less the server's own answer to the ``initialize`` answered early.

    That request reaches the server like any other, so its session is initialized as before; its
    answer (the first one with that id) is dropped, after checking it is the one already given.
    What was answered early is known before the server reads anything (``EarlyStdio.stdin``).
    """

    def __init__(self, inner: WriteStream[SessionMessage], early: EarlyStdio) -> None:
        self._inner = inner
        self._early = early
        self._dropped = False

    async def send(self, item: SessionMessage, /) -> None:
        message, answered = item.message, self._early.answered
        if (
            not self._dropped
            and answered is not None
            and isinstance(message, JSONRPCResponse | JSONRPCError)
            and type(message.id) is type(answered[0])
            and message.id == answered[0]
        ):
            self._dropped = True
            # The wire form stdio_server writes.
            own = message.model_dump_json(by_alias=True, exclude_unset=True).encode() + b"\n"
            if own != answered[1]:
                logger.error("the early answer to initialize was %r, the SDK's is %r", answered[1], own)
            return
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WithoutEarlyAnswer:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


async def serve_stdio(server: Server, early: EarlyStdio | None = None) -> None:
    """Serve MCP over this process's stdin/stdout until the client closes them.

    With ``early`` (:func:`~mcp_sandbox.server.transport.stdio_early.begin` took the wire at start), the
    SDK's transport reads and writes the wire ``early`` holds, from the client's first byte.
    """
    if early is None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        return
    stdin: anyio.AsyncFile[str]
    stdout: anyio.AsyncFile[str]
    wire_in, wire_out = early.wire
    if loop_native(wire_in) and loop_native(wire_out):
        # Read and written on the event loop: no worker thread per line (see stdio_wire).
        stdin = cast("anyio.AsyncFile[str]", WireLines(wire_in, early.taken))
        stdout = cast("anyio.AsyncFile[str]", WireWriter(wire_out))
    else:
        # Text layers as the SDK's own stdio_server() builds them over fd 0 and 1.
        stdin = anyio.wrap_file(io.TextIOWrapper(early.stdin(), encoding="utf-8", errors="replace"))
        stdout = anyio.wrap_file(io.TextIOWrapper(early.stdout(), encoding="utf-8"))
    try:
        async with stdio_server(stdin, stdout) as (read_stream, write_stream):
            out = _WithoutEarlyAnswer(write_stream, early)
            await server.run(read_stream, out, server.create_initialization_options())
    finally:
        early.release()
