"""The host/sandbox frame protocol as the host speaks it: the one module the host imports it from.

The frames (:class:`Ready`, :class:`Exec`, :class:`Done`, :class:`Call`, :class:`Reply`,
:class:`Error`, :class:`Display`, :class:`Exited`, :class:`Verdict`) and their codec are defined once, by the
Python runtime (``runners/python/mcp_sandbox_runtime/frames.py`` and ``wire.py``), which runs
inside the sandbox without this package; the host takes them from here, with what else the
runtime and the host must agree on (where the stubs are, the helper manual). The readers here
raise :class:`mcp_sandbox.errors.FrameError`, the host's one FrameError: the runtime's own
error is translated at this boundary and never reaches the rest of the host.
"""

from __future__ import annotations

from typing import Any

from mcp_sandbox.errors import FrameError
from mcp_sandbox.runners.python.mcp_sandbox_runtime import TOOLS_MOUNT
from mcp_sandbox.runners.python.mcp_sandbox_runtime import frames as _frames
from mcp_sandbox.runners.python.mcp_sandbox_runtime.frames import (
    DEFAULT_MAX_FRAME,
    HEADER,
    MAGIC,
    PROTOCOL_VERSION,
    Call,
    Display,
    Done,
    Error,
    Exec,
    Exited,
    Failure,
    Forked,
    Frame,
    Kind,
    Ready,
    Reply,
    Verdict,
    encode,
    pack,
)
from mcp_sandbox.runners.python.mcp_sandbox_runtime.manual import CAPABILITIES, CAPABILITIES_URI

__all__ = [
    "CAPABILITIES",
    "CAPABILITIES_URI",
    "DEFAULT_MAX_FRAME",
    "HEADER",
    "MAGIC",
    "PROTOCOL_VERSION",
    "TOOLS_MOUNT",
    "Call",
    "Display",
    "Done",
    "Error",
    "Exec",
    "Exited",
    "Failure",
    "Forked",
    "Frame",
    "FrameError",
    "FrameParser",
    "Kind",
    "Ready",
    "Reply",
    "Verdict",
    "decode",
    "decode_body",
    "encode",
    "pack",
]


def decode_body(payload: bytes) -> dict[str, Any]:
    """A frame's body: a JSON object.

    Raises:
        FrameError: the body is not UTF-8 JSON or not an object.
    """
    try:
        return _frames.decode_body(payload)
    except _frames.FrameError as exc:
        raise FrameError(str(exc)) from exc


def decode(kind: Kind, body: dict[str, Any]) -> Frame:
    """The typed frame of ``kind`` with ``body``.

    Raises:
        FrameError: a field is missing or of the wrong type.
    """
    try:
        return _frames.decode(kind, body)
    except _frames.FrameError as exc:
        raise FrameError(str(exc)) from exc


class FrameParser(_frames.FrameParser):
    """The runtime's incremental reader (frames out of a byte stream fed in pieces), raising the host's FrameError."""

    def next(self) -> tuple[Kind, dict[str, Any]] | None:
        try:
            return super().next()
        except _frames.FrameError as exc:
            raise FrameError(str(exc)) from exc

    def next_payload(self) -> tuple[Kind, bytes] | None:
        try:
            return super().next_payload()
        except _frames.FrameError as exc:
            raise FrameError(str(exc)) from exc

    def check_end(self) -> None:
        try:
            super().check_end()
        except _frames.FrameError as exc:
            raise FrameError(str(exc)) from exc
