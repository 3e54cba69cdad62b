"""The earlier code runner's permanent links, recorded in the object store so every replica serves them.

A link ``/files/{digest}/…`` of the earlier runner names a directory by the digest of its
conversation; once that data is adopted into a conversation, ``prefix/runner-links/<digest>``
holds the conversation's key (written by :meth:`.Mirror.record_link`), and
``runner-links/<digest>.names`` which of its files were adopted
(:mod:`~mcp_sandbox.workspace.runner_names`), so a replica serving a link from the store serves
the imported files only, as the adopting one does.
"""

from __future__ import annotations

import io
import re

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace import WorkspaceStore
from mcp_sandbox.workspace.runner_names import ImportedNames

__all__ = ["link_name", "linked", "linked_names", "record_names"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")  # the earlier runner's name of a conversation's directory


def link_name(digest: str) -> str:
    """The object naming the conversation of the runner's links ``/files/{digest}/…``.

    Raises:
        WorkspaceError: ``digest`` is not of its form.
    """
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
        objects.get(link_name(digest), into)
    except FileNotFoundError:
        return None
    key = into.getvalue().decode("ascii", errors="replace")
    workspaces.directory(key)  # checks the key's form
    return key


def record_names(objects: ObjectStore, digest: str, names: ImportedNames) -> None:
    """Store the files adopted from ``digest``.

    Raises:
        WorkspaceError: the store refused, or ``digest`` is not of its form.
    """
    objects.put(f"{link_name(digest)}.names", names.to_json())


def linked_names(objects: ObjectStore, digest: str) -> ImportedNames | None:
    """The files adopted from ``digest``; None when none were recorded (the links serve nothing).

    Raises:
        WorkspaceError: the store refused, or ``digest`` is not of its form.
    """
    into = io.BytesIO()
    try:
        objects.get(f"{link_name(digest)}.names", into)
    except FileNotFoundError:
        return None
    try:
        return ImportedNames.from_json(into.getvalue())
    except ValueError:
        return None
