"""The proxy's plain-HTTP pieces: a refusal and its answer, the head a forwarded request gets.

A refusal before the tunnel (or of a plain request) is an HTTP answer whose body and
``X-Egress-Rule`` header name the rule that refused.
"""

from __future__ import annotations

import contextlib

import anyio
from anyio.abc import ByteStream

from mcp_sandbox.egress.patterns import Refusal

__all__ = ["Refused", "answer", "forwarded_head", "printable"]


class Refused(Exception):
    """A connection refused with ``status`` (403 unless said) because of ``refusal``."""

    def __init__(self, refusal: Refusal, status: int = 403) -> None:
        super().__init__(refusal.message)
        self.refusal, self.status = refusal, status


def printable(text: str) -> bool:
    """Whether ``text`` is printable ASCII (spaces allowed)."""
    return all(0x20 < ord(char) < 0x7F for char in text.replace(" ", "!"))


_HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "host", "te", "upgrade"}
)


def forwarded_head(method: str, path: str, query: str, netloc: str, headers: list[str]) -> bytes:
    """The request as the origin gets it: origin-form target, its Host, no hop-by-hop headers, one request only.

    Raises:
        Refused: a header line is malformed (folded, no colon, control characters).
    """
    kept: list[str] = []
    for line in headers:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or line[0] in " \t":
            raise Refused(Refusal("request", "a malformed header line"), 400)
        if any((ord(char) < 0x20 and char != "\t") or ord(char) == 0x7F for char in line):
            raise Refused(Refusal("request", "a header holds a control character"), 400)
        if name.lower() not in _HOP_HEADERS:
            kept.append(f"{name}:{value}")
    target = path + (f"?{query}" if query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {netloc}", *kept, "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


async def answer(client: ByteStream, refused: Refused, host: str, port: int) -> None:
    """Answer ``refused`` with its status, a body naming the rule, and ``X-Egress-Rule``."""
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[refused.status]
    rule = refused.refusal.rule
    body = f"mcp-sandbox egress proxy refused {host}:{port}: {refused.refusal.message} (rule: {rule})\n"
    data = body.encode("ascii", errors="replace")
    head = (
        f"HTTP/1.1 {refused.status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nX-Egress-Rule: {refused.refusal.rule}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await client.send(head.encode("ascii") + data)
