"""The answer to a stdio client's ``initialize``, written before the MCP SDK is imported.

Clients start their servers on every launch and wait for this answer, and importing the SDK (its
pydantic models) takes longer than the whole budget for it (bench/startup.py). So ``serve`` over
stdio starts here, on the standard library alone: :func:`begin` takes stdin and stdout; a
thread reads the client's first line while the main thread imports the SDK and, when it is an
``initialize`` the SDK would accept, writes the SDK's own answer at once (:func:`early_answer`);
the SDK's stdio transport then serves the wire from its first byte, and the server's own answer
to that request is dropped (``transport/stdio.py``).

Not the SDK's pieces: they import pydantic (the cost this saves), and the SDK's own claim of
fd 0 reads through a fresh buffer, which would lose the bytes read here.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = [
    "CAPABILITIES",
    "HANDSHAKE_PROTOCOL_VERSIONS",
    "INSTRUCTIONS",
    "LATEST_HANDSHAKE_VERSION",
    "SERVER_NAME",
    "EarlyStdio",
    "begin",
    "early_answer",
]

SERVER_NAME = "mcp-sandbox"
INSTRUCTIONS = (
    "mcp-sandbox runs untrusted code in an OS-level sandbox. Use run_python (or run_code) to compute, "
    "parse, or transform data; print what you need to read back. Pass a conversationId to keep files "
    "in /workspace and variables between runs."
)
# The SDK's (mcp_types.version): the versions the initialize handshake negotiates, the latest of
# them answered to any other.
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_HANDSHAKE_VERSION = HANDSHAKE_PROTOCOL_VERSIONS[-1]
# What the SDK's Server advertises for our handlers (tools and resources, no change notifications),
# and the tasks mcp_server.py adds (server/tasks).
CAPABILITIES: dict[str, Any] = {
    "resources": {"listChanged": False, "subscribe": False},
    "tasks": {"cancel": {}, "list": {}, "requests": {"tools": {"call": {}}}},
    "tools": {"listChanged": False},
}

_FIRST_LINE_LIMIT = 1 << 20  # a longer first line is no initialize of a real client: leave it to the SDK
_LARGEST_EXACT_ID = 1 << 53  # integer ids every JSON stack reads alike


Check = Callable[[object], bool]


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _is_bool(value: object) -> bool:
    return isinstance(value, bool)


def _is_object(value: object) -> bool:
    return isinstance(value, dict)


def _fields(required: tuple[str, ...] = (), **known: Check) -> Check:
    """An object with ``required`` keys, whose ``known`` keys (when present) pass their checks.
    Other keys are ignored, as the SDK's models ignore them."""

    def check(value: object) -> bool:
        return (
            isinstance(value, dict)
            and all(key in value for key in required)
            and all(key not in value or valid(value[key]) for key, valid in known.items())
        )

    return check


def _map_of(valid: Check) -> Check:
    return lambda value: isinstance(value, dict) and all(valid(item) for item in value.values())


# The SDK's ClientCapabilities and Implementation (2025-11-25 surface), narrowed: null where a
# value may be absent, and client icons, are left to the SDK.
_CLIENT_CAPABILITIES = _fields(
    elicitation=_fields(form=_is_object, url=_is_object),
    experimental=_map_of(_is_object),
    roots=_fields(listChanged=_is_bool),
    sampling=_fields(context=_is_object, tools=_is_object),
    tasks=_fields(
        cancel=_is_object,
        list=_is_object,
        requests=_fields(elicitation=_fields(create=_is_object), sampling=_fields(createMessage=_is_object)),
    ),
)
_CLIENT_INFO = _fields(("name", "version"), name=_is_str, version=_is_str, title=_is_str, description=_is_str)
_CLIENT_INFO_KEYS = {"name", "version", "title", "description", "websiteUrl"}


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key appears twice")  # parsers differ on which one wins
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _request_id(message: dict[str, Any]) -> int | str | None:
    """The id of ``message`` if it is one the answer can echo exactly."""
    value = message.get("id")
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and -_LARGEST_EXACT_ID < value < _LARGEST_EXACT_ID:
        return value
    if isinstance(value, str):
        return value
    return None


def early_answer(line: bytes, version: str) -> tuple[int | str, bytes] | None:
    """The request id and the SDK's very answer (a JSON line) when ``line`` (the client's first,
    without its newline) is an ``initialize`` the SDK would accept; None for anything else.

    ``version`` is the server's (serverInfo.version). The protocol version is negotiated the SDK's
    way: the client's when the handshake supports it, else the latest handshake version.

    Whatever this is not sure the SDK answers the same way (another method first, malformed or
    unusual JSON, params the SDK might refuse or read differently) it leaves alone: the SDK
    answers or refuses it as before. The constants are the SDK's and our server's; the tests pin
    them and every early answer against what the SDK itself answers
    (tests/server/transport/test_stdio_early.py).
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    if b"\r" in line:  # the SDK's text reader ends lines at a lone CR too
        return None
    try:
        message = json.loads(line.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
        json.dumps(message, ensure_ascii=False).encode("utf-8")  # lone surrogates: left to the SDK
    except ValueError:  # UnicodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(message, dict) or set(message) != {"jsonrpc", "id", "method", "params"}:
        return None
    request_id = _request_id(message)
    params = message["params"]
    if (
        message["jsonrpc"] != "2.0"
        or message["method"] != "initialize"
        or request_id is None
        or not isinstance(params, dict)
        or set(params) != {"protocolVersion", "capabilities", "clientInfo"}
        or not isinstance(params["protocolVersion"], str)
        or not _CLIENT_CAPABILITIES(params["capabilities"])
        or not _CLIENT_INFO(params["clientInfo"])
        or not set(params["clientInfo"]) <= _CLIENT_INFO_KEYS
        or "websiteUrl" in params["clientInfo"]  # the SDK checks it is a URL
    ):
        return None
    requested = params["protocolVersion"]
    result = {
        "capabilities": CAPABILITIES,
        "instructions": INSTRUCTIONS,
        "protocolVersion": requested if requested in HANDSHAKE_PROTOCOL_VERSIONS else LATEST_HANDSHAKE_VERSION,
        "serverInfo": {"name": SERVER_NAME, "version": version},
    }
    answer = {"jsonrpc": "2.0", "id": request_id, "result": result}
    return request_id, json.dumps(answer, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"


def _take(fd: int, diversion: Callable[[], int]) -> int:
    """Move the wire on ``fd`` to a private descriptor (returned) and point ``fd`` at ``diversion``."""
    private = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
        aside = diversion()
        try:
            os.dup2(aside, fd)
        finally:
            os.close(aside)
    except OSError:
        os.close(private)
        raise
    return private


class EarlyStdio:
    """This process's stdio wire, taken by :func:`begin`, and the early answer given on it."""

    def __init__(self, wire_in: int, wire_out: int, version: str) -> None:
        self._in = wire_in
        self._out = wire_out
        self._version = version
        self._read = bytearray()  # everything read so far; the SDK's reader gets it first
        self._done = threading.Event()
        self.answered: tuple[int | str, bytes] | None = None
        """The request id and the line of the early answer, once :meth:`wait` returned; None if none."""

    def _first_line(self) -> None:
        try:
            while b"\n" not in self._read and len(self._read) < _FIRST_LINE_LIMIT:
                chunk = os.read(self._in, 65536)
                if not chunk:
                    return  # the client closed stdin: the SDK's reader meets the end as before
                self._read += chunk
            line, newline, _ = bytes(self._read).partition(b"\n")
            answer = early_answer(line, self._version) if newline else None
            if answer is not None:
                written = memoryview(answer[1])
                while written:
                    written = written[os.write(self._out, written) :]
                self.answered = answer
        except OSError:
            return  # a broken wire: the SDK's transport meets it and ends as before
        finally:
            self._done.set()

    def wait(self) -> None:
        """Block until the first line is read and answered (or left to the SDK)."""
        self._done.wait()

    @property
    def wire(self) -> tuple[int, int]:
        """The private descriptors of the wire: from the client, to the client."""
        return self._in, self._out

    def taken(self) -> bytes:
        """Block until the first line is read and answered; return (once) what was read of the wire.

        For a reader of the wire itself, which then reads on from there (instead of :meth:`stdin`).
        """
        self._done.wait()
        read = bytes(self._read)
        self._read.clear()
        return read

    def stdin(self) -> io.BufferedReader:
        """The client's bytes from the first: what was read here, then the rest of the wire."""
        return io.BufferedReader(_Replay(self._done, self._read, self._in))

    def stdout(self) -> io.BufferedWriter:
        """The wire to the client (after the early answer)."""
        return os.fdopen(self._out, "wb", closefd=False)

    def release(self) -> None:
        """Give fd 0 and 1 back their wire, as the SDK's transport does when it ends."""
        for fd, private in ((0, self._in), (1, self._out)):
            try:
                os.dup2(private, fd)
            except OSError:
                pass


class _Replay(io.RawIOBase):
    """Reads what :class:`EarlyStdio` read, then the wire itself (only once that thread is done,
    so the two never read the wire at once)."""

    def __init__(self, done: threading.Event, read: bytearray, wire: int) -> None:
        super().__init__()
        self._done = done
        self._read = read
        self._wire = wire

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._done.wait()
        if self._read:
            size = min(len(buffer), len(self._read))
            buffer[:size] = self._read[:size]
            del self._read[:size]
            return size
        return os.readv(self._wire, [buffer])


def begin(version: str) -> EarlyStdio | None:
    """Take stdin and stdout and answer the client's ``initialize`` as soon as it arrives.

    The wire is taken as the SDK's stdio transport takes it: it moves to private descriptors,
    fd 0 then reads ``/dev/null`` and fd 1 writes to stderr, so nothing a child process prints
    can corrupt the protocol stream. :meth:`EarlyStdio.stdin` later replays what the thread read,
    so the SDK parses the ``initialize`` itself and its session reaches its initialized state
    exactly as before.

    ``version`` is the server's (serverInfo.version). None when the descriptors cannot be taken
    (then the SDK's stdio transport serves as it would without this module).
    """
    try:
        wire_in = _take(0, lambda: os.open(os.devnull, os.O_RDONLY))
    except OSError:
        return None
    try:
        wire_out = _take(1, lambda: os.dup(2))
    except OSError:
        os.dup2(wire_in, 0)
        os.close(wire_in)
        return None
    early = EarlyStdio(wire_in, wire_out, version)
    threading.Thread(target=early._first_line, name="mcp-sandbox-early-initialize", daemon=True).start()
    return early
