"""The earlier code runner's permanent links, recorded in the object store so every replica serves them.

A link ``/files/{digest}/…`` of the earlier runner names a directory by the digest of its
conversation; once that data is adopted into a conversation, ``prefix/runner-links/<digest>``
holds the conversation's key.
"""

from __future__ import annotations

import io
import re

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.mirror import Mirror
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import WorkspaceStore

__all__ = ["linked", "record_link"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")  # the earlier runner's name of a conversation's directory


def record_link(mirror: Mirror, digest: str, key: str) -> None:
    """Write back conversation ``key`` (the earlier runner's data just adopted into it) and record
    that the runner's links ``/files/{digest}/…`` are its files, so every replica serves them.

    Raises:
        WorkspaceError: ``digest`` or ``key`` is not of its form, or the store refused.
    """
    mirror.write_back(key)
    mirror.objects.put(_link(digest), key.encode("ascii"))


def _link(digest: str) -> str:
    if not _DIGEST_RE.match(digest):
        raise WorkspaceError("not a link of the earlier runner")
    return f"runner-links/{digest}"


def linked(objects: ObjectStore, workspaces: WorkspaceStore, digest: str) -> str | None:
    """The conversation whose files the runner's links ``/files/{digest}/…`` are, if one was recorded.

    Raises:
        WorkspaceError: ``digest`` is not of its form, the store refused, or holds no key there.
    """
    into = io.BytesIO()
    try:
        objects.get(_link(digest), into)
    except FileNotFoundError:
        return None
    key = into.getvalue().decode("ascii", errors="replace")
    workspaces.directory(key)  # checks the key's form
    return key
