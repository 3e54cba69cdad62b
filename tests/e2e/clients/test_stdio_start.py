"""A real ``mcp-sandbox serve`` over stdio answers ``initialize`` before the MCP SDK is imported,
and hands the session to the SDK with nothing lost, added or answered twice.

Driven over raw pipes, to see every byte the server writes. To prove the answer comes before the
SDK is loaded, the server's ``import mcp`` is held back (a ``sitecustomize`` on its path blocks
that import on a FIFO) until the test has read the answer and seen the server blocked there.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from mcp_sandbox import __version__
from mcp_sandbox.server.transport.stdio_early import early_answer
from mcp_test_helpers import _server_env, poll

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

BOUND = 60.0
GATE = '''
import os, sys

class _HoldMcp:
    """Blocks ``import mcp`` until the test writes to the FIFO named by IMPORT_GATE."""

    def find_spec(self, name, path=None, target=None):
        if name == "mcp":
            sys.meta_path.remove(self)
            with open(os.environ["IMPORT_GATE"], "rb") as gate:
                gate.read(1)
        return None

sys.meta_path.insert(0, _HoldMcp())
'''


def message(request_id: Any, method: str, params: dict[str, Any] | None = None) -> bytes:
    body: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if request_id is not None:
        body["id"] = request_id
    if params is not None:
        body["params"] = params
    return json.dumps(body).encode() + b"\n"


def initialize(request_id: Any, version: str = "2025-06-18") -> bytes:
    params = {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}
    return message(request_id, "initialize", params)


INITIALIZED = message(None, "notifications/initialized")


class Served:
    """A running ``serve`` process: send lines, read its answers line by line."""

    def __init__(self, process: anyio.abc.Process, log: Any) -> None:
        assert process.stdin is not None and process.stdout is not None
        self.process = process
        self._log = log
        self._in = process.stdin
        self._out = BufferedByteReceiveStream(process.stdout)

    async def send(self, *lines: bytes) -> None:
        await self._in.send(b"".join(lines))

    async def close_stdin(self) -> None:
        await self._in.aclose()

    async def answer(self) -> bytes:
        """The next line the server writes; b"" at the end of its output."""
        with anyio.fail_after(BOUND):
            try:
                return await self._out.receive_until(b"\n", 1 << 20) + b"\n"
            except anyio.IncompleteRead:
                return b""

    async def answers_until(self, request_id: int) -> list[dict[str, Any]]:
        """Every answer up to and including the one to ``request_id``."""
        read: list[dict[str, Any]] = []
        while not read or read[-1].get("id") != request_id:
            line = await self.answer()
            assert line, f"the server ended before answering {request_id}: {read}"
            read.append(json.loads(line))
        return read

    async def exit_status(self) -> int:
        with anyio.fail_after(BOUND):
            return await self.process.wait()

    def stderr(self) -> str:
        self._log.seek(0)
        text: str = self._log.read().decode(errors="replace")
        return text


@asynccontextmanager
async def serve(state_dir: Path, runtime: Path | None, gate: Path | None = None, *args: str) -> AsyncIterator[Served]:
    env = _server_env(runtime, None)
    if gate is not None:
        (gate.parent / "sitecustomize.py").write_text(GATE)
        os.mkfifo(gate)
        env["IMPORT_GATE"] = str(gate)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(gate.parent), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir), *args]
    with tempfile.TemporaryFile() as log:
        async with await anyio.open_process(command, env=env, stderr=log) as process:
            try:
                yield Served(process, log)
            finally:
                if process.returncode is None:
                    process.kill()
                with anyio.fail_after(BOUND, shield=True):
                    await process.wait()


async def held_in_the_sdk_import(gate: Path) -> int:
    """Wait until the server blocks in ``import mcp`` (it holds the FIFO open); the writing end."""

    def reader_waiting() -> bool:
        try:
            writer.append(os.open(gate, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:  # ENXIO: nobody reads the FIFO yet
            return False
        return True

    writer: list[int] = []
    with anyio.fail_after(BOUND):
        await poll(reader_waiting)
    return writer[0]


def release(writer: int) -> None:
    os.write(writer, b"x")
    os.close(writer)


def expected(first: bytes) -> bytes:
    answered = early_answer(first.rstrip(b"\n"), __version__)
    assert answered is not None
    return answered[1]


async def test_initialize_is_answered_before_the_sdk_is_imported_and_the_session_goes_on(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    async with serve(state_dir, sandbox_runtime, gate) as server:
        await server.send(initialize(1))
        first = await server.answer()
        writer = await held_in_the_sdk_import(gate)  # answered, and the SDK still not imported
        release(writer)
        await server.send(INITIALIZED, message(2, "tools/list"))
        rest = await server.answers_until(2)

    assert first == expected(initialize(1))
    assert [answer["id"] for answer in rest] == [2]  # the SDK's own answer to 1 was dropped
    assert "run_python" in {tool["name"] for tool in rest[0]["result"]["tools"]}


async def test_stdin_closed_at_once_ends_the_server_quietly(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with serve(state_dir, sandbox_runtime) as server:
        await server.close_stdin()
        output = await server.answer()
        status = await server.exit_status()

    assert (output, status) == (b"", 0)


async def test_stdin_closed_while_the_sdk_imports_ends_the_server_after_the_one_answer(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    async with serve(state_dir, sandbox_runtime, gate) as server:
        await server.send(initialize(1))
        await server.close_stdin()
        first = await server.answer()
        release(await held_in_the_sdk_import(gate))
        after = await server.answer()
        status = await server.exit_status()

    assert first == expected(initialize(1))
    assert (after, status) == (b"", 0)


async def test_a_second_initialize_is_answered_by_the_sdk_once_and_the_first_only_early(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with serve(state_dir, sandbox_runtime) as server:
        await server.send(initialize(1), initialize(1, "2024-11-05"), initialize(2), INITIALIZED)
        await server.send(message(3, "tools/list"))
        answers = await server.answers_until(3)

    assert [answer["id"] for answer in answers] == [1, 1, 2, 3]
    assert [answer["result"].get("protocolVersion") for answer in answers[:3]] == [
        "2025-06-18",
        "2024-11-05",
        "2025-06-18",
    ]
    assert "tools" in answers[3]["result"]


async def test_a_notification_before_initialize_leaves_initialize_to_the_sdk(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    async with serve(state_dir, sandbox_runtime) as server:
        await server.send(INITIALIZED, initialize(1))
        first = await server.answer()
        await server.send(INITIALIZED, message(2, "tools/list"))
        rest = await server.answers_until(2)

    assert first == expected(initialize(1))  # the SDK's, which is the same
    assert [answer["id"] for answer in rest] == [2]


async def test_a_malformed_first_line_reaches_the_sdk_untouched(state_dir: Path, sandbox_runtime: Path | None) -> None:
    async with serve(state_dir, sandbox_runtime) as server:
        await server.send(b'{"jsonrpc": "2.0", "id": 1, "method": \n', initialize(1), INITIALIZED)
        await server.send(message(2, "tools/list"))
        answers = await server.answers_until(2)

    # The SDK answers the line it cannot parse as before (or not at all), then the session opens.
    assert [answer["id"] for answer in answers if answer.get("id") is not None] == [1, 2]
    assert "tools" in answers[-1]["result"]


async def test_a_service_that_cannot_open_ends_the_process_saying_why(
    state_dir: Path, sandbox_runtime: Path | None
) -> None:
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    in_a_file = state_dir.parent / "a-file"
    in_a_file.write_text("")
    async with serve(in_a_file / "state", sandbox_runtime) as server:
        await server.send(initialize(1))  # stdin stays open: the client waits
        first = await server.answer()
        status = await server.exit_status()
        after = await server.answer()
        said = server.stderr()

    assert first in (expected(initialize(1)), b"")  # answered early, unless it ended first
    assert (after, status) == (b"", 1)
    assert "NotADirectoryError" in said
