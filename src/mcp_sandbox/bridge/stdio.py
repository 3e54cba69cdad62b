"""The stdio transport to a downstream server: newline-delimited JSON-RPC, framing checked.

The SDK's stdio client decodes the server's stdout as strict UTF-8 in its reader task: one byte
that is not UTF-8 raises there, the reader then drains the pipe (shielded) for as long as the
server lives, and the session never learns that the connection is dead, so every later call
times out. It also rebuilds its line buffer on every chunk, so one line of tens of megabytes
takes longer to read than a call may take. This transport reads bytes, splits lines in linear
time, refuses a message over ``max_message_bytes`` or one that is not UTF-8, and then ends the
connection the way a crash does: the session's pending requests fail at once with "connection
closed", and ``on_break`` has been told why, so the pool can say it and start the server again.
A line that is UTF-8 but not JSON-RPC is handed to the session as an error value, as the SDK does.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, Process

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams
    from mcp.shared.message import SessionMessage

__all__ = ["stdio_transport"]

# After its stdin closes, how long a server has to exit before its process group is killed.
EXIT_GRACE = 2.0


class _FramingBroken(Exception):
    """The server's stdout stopped being newline-delimited UTF-8 JSON within the size cap."""


def _split(buffer: bytearray, scanned: int, max_message_bytes: int) -> tuple[list[bytes], int]:
    """Take the complete lines off the front of ``buffer``; return them and how far it was scanned.

    Raises:
        _FramingBroken: a line is over ``max_message_bytes``, or not UTF-8.
    """
    lines: list[bytes] = []
    start = 0
    while (end := buffer.find(b"\n", scanned)) >= 0:
        lines.append(bytes(buffer[start:end]))
        start = scanned = end + 1
    del buffer[:start]
    scanned = len(buffer)
    if scanned > max_message_bytes or any(len(line) > max_message_bytes for line in lines):
        raise _FramingBroken(f"it sent a message over {max_message_bytes} bytes (the limit on one tool result)")
    for line in lines:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _FramingBroken(f"it sent a message that is not valid UTF-8 (byte {exc.start} of the line)") from None
    return lines, scanned


def _parse(line: bytes) -> SessionMessage | Exception:
    import mcp_types as types
    from mcp.shared.message import SessionMessage

    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # not JSON-RPC: the session reports it and the connection goes on
        return exc


async def _discard(stdout: ByteReceiveStream) -> None:
    """Read and drop what is left, so a server blocked on a full pipe can see its stdin close."""
    with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        while True:
            await stdout.receive()


async def _stop(process: Process) -> None:
    """Close stdin, give the server ``EXIT_GRACE`` to exit, then kill its process group and wait
    (bounded) until its leader is reaped."""
    from mcp.os.posix.utilities import terminate_posix_process_tree

    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdin.aclose()
    with anyio.move_on_after(EXIT_GRACE):
        # Polled, not process.wait(): a child that inherited the pipes would make that block.
        while process.returncode is None:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    if process.returncode is None:
        await terminate_posix_process_tree(process, EXIT_GRACE)
        # It returns once the group is signalled or gone, before asyncio has seen the leader
        # exit: waited for, so the process is reaped and never collected as "still running".
        with anyio.move_on_after(EXIT_GRACE):
            while process.returncode is None:  # noqa: ASYNC110
                await anyio.sleep(0.01)
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await process.stdout.aclose()


@contextlib.asynccontextmanager
async def stdio_transport(
    command: str,
    args: list[str],
    env: dict[str, str],
    cwd: Path | None,
    *,
    errlog: TextIO = sys.stderr,
    max_message_bytes: int,
    on_break: Callable[[str], None],
) -> AsyncIterator[TransportStreams]:
    """Start ``command`` in a session of its own and speak JSON-RPC lines over its stdin and stdout.

    Leaving the context stops the server within about ``3 * EXIT_GRACE`` seconds, shielded.

    Raises:
        OSError: the command could not be started.
    """
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(
        [command, *args], env=get_default_environment() | env, stderr=errlog, cwd=cwd, start_new_session=True
    )
    assert process.stdin is not None and process.stdout is not None
    stdin, stdout = process.stdin, process.stdout
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        buffer = bytearray()
        scanned = 0
        async with to_session:
            try:
                async for chunk in stdout:
                    buffer += chunk
                    lines, scanned = _split(buffer, scanned, max_message_bytes)
                    for line in lines:
                        if line.strip():
                            await to_session.send(_parse(line))
            except _FramingBroken as exc:
                on_break(str(exc))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass  # the session or our own shutdown closed a stream under the read
        await _discard(stdout)

    async def write() -> None:
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await to_session.aclose()  # the server stopped reading: the session sees the end

    async with anyio.create_task_group() as group:
        group.start_soon(read)
        group.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                await _stop(process)
            group.cancel_scope.cancel()
