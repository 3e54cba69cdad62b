"""Files among replicas: an upload stored by the replica running its conversation; the copy downloads read.

A conversation's live session runs on the replica holding its lease (:mod:`mcp_sandbox.replicas`):
an upload that lands on another replica is sent to it as an ``upload_file`` call, so the session
sees the file at once, and the owner enforces the quota. A replica's local copy of a
conversation it does not hold may be left from an earlier lease and stale, so its downloads read
the object store, which has every acknowledged file.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import mcp_types as types

from mcp_sandbox.replicas.refusals import refusal_of
from mcp_sandbox.server.service import Service

__all__ = ["forward_upload", "local_is_current"]

Store = Callable[[str, str, str, AsyncIterator[bytes]], Awaitable[dict[str, Any]]]


def local_is_current(service: Service, key: str) -> bool:
    """Whether this server's copy of conversation ``key`` is the one to serve: always for one server;
    among replicas, only while this one holds its lease."""
    router = service.router
    return service.mirror is None or router is None or router.leases.holds(key)


async def forward_upload(
    service: Service, store: Store, tenant: str, conversation: str, filename: str, stream: AsyncIterator[bytes]
) -> dict[str, Any]:
    """Store one file through the replica that runs ``conversation`` (its ``upload_file``): its
    listing (name, size, url). The body is read whole first (the route's size limit bounds it);
    ``store`` stores it here if this replica takes the lease meanwhile (the owner went away).

    Raises:
        WorkspaceError: the owner refused it (its message says why; a QuotaExceededError or a
            DiskFullError when it was one, so the HTTP status is the owner's own).
    """
    router = service.router
    if router is None:
        raise RuntimeError("an upload is forwarded only among replicas")
    content = b"".join([chunk async for chunk in stream])
    encoded = base64.b64encode(content).decode()
    arguments = {"conversationId": conversation, "filename": filename, "content": encoded}

    async def here() -> types.CallToolResult:
        async def once() -> AsyncIterator[bytes]:
            yield content

        stored = await store(tenant, conversation, filename, once())
        return types.CallToolResult(content=[], structured_content=stored)

    key = service.workspaces.key(tenant, conversation)
    result = await router.call("upload_file", arguments, tenant, key, here)
    if result.is_error or result.structured_content is None:
        text = " ".join(block.text for block in result.content if isinstance(block, types.TextContent))
        raise refusal_of(result.meta, text or "the replica running this conversation refused the upload")
    stored = result.structured_content
    return {"name": stored["name"], "size": stored["size"], "url": stored.get("url")}
