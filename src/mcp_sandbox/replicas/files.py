"""Files among replicas: an upload stored by the replica running its conversation; the copy downloads read.

A conversation's live session runs on the replica holding its lease (:mod:`.leases`):
an upload that lands on another replica is sent to it as an ``upload_file`` call (the upload
route acts on the router's decision), so the session sees the file at once, and the owner
enforces the quota. A replica's local copy of a conversation it does not hold may be left from
an earlier lease and stale, so its downloads read the object store, which has every
acknowledged file.
"""

from __future__ import annotations

import base64
from typing import Any

import mcp_types as types

from mcp_sandbox.replicas.forward import Forwarded, Router
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.refusals import refusal_of

__all__ = ["local_is_current", "stored_by_owner", "upload_arguments"]


def local_is_current(mirror: Mirror | None, router: Router | None, key: str) -> bool:
    """Whether this server's copy of conversation ``key`` is the one to serve: always for one server;
    among replicas, only while this one holds its lease."""
    return mirror is None or router is None or router.leases.holds(key)


def upload_arguments(conversation: str, filename: str, content: bytes) -> dict[str, Any]:
    """The ``upload_file`` call that stores ``content`` through the replica that runs ``conversation``
    (the route's size limit bounds it)."""
    return {"conversationId": conversation, "filename": filename, "content": base64.b64encode(content).decode()}


def stored_by_owner(forwarded: Forwarded) -> dict[str, Any]:
    """The owner's listing (name, size, url) of the file its ``upload_file`` stored.

    Raises:
        WorkspaceError: the owner refused it (its message says why; a QuotaExceededError or a
            DiskFullError when it was one, so the HTTP status is the owner's own).
    """
    result = forwarded.result
    if result.is_error or result.structured_content is None:
        text = " ".join(block.text for block in result.content if isinstance(block, types.TextContent))
        raise refusal_of(result.meta, text or "the replica running this conversation refused the upload")
    stored = result.structured_content
    return {"name": stored["name"], "size": stored["size"], "url": stored.get("url")}
