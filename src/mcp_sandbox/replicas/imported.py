"""The earlier runner's adopted files, by name and hash, in the object store: what its links may serve.

:meth:`Mirror.record_link <mcp_sandbox.replicas.mirror.Mirror.record_link>` tells every replica
which conversation the links ``/files/{digest}/…`` are; this record, at
``runner-links/{digest}.names``, tells which of its files they are (:mod:`~mcp_sandbox.workspace.runner_names`),
so a replica serving a link from the store serves the imported files only, as the adopting one does.
"""

from __future__ import annotations

import io
import re

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore
from mcp_sandbox.workspace.runner_names import ImportedNames

__all__ = ["linked_names", "record_names"]

_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


def _name(digest: str) -> str:
    if not _DIGEST_RE.match(digest):
        raise WorkspaceError("not a link of the earlier runner")
    return f"runner-links/{digest}.names"


def record_names(objects: ObjectStore, digest: str, names: ImportedNames) -> None:
    """Store the files adopted from ``digest``.

    Raises:
        WorkspaceError: the store refused, or ``digest`` is not of its form.
    """
    objects.put(_name(digest), names.to_json())


def linked_names(objects: ObjectStore, digest: str) -> ImportedNames | None:
    """The files adopted from ``digest``; None when none were recorded (the links serve nothing).

    Raises:
        WorkspaceError: the store refused, or ``digest`` is not of its form.
    """
    into = io.BytesIO()
    try:
        objects.get(_name(digest), into)
    except FileNotFoundError:
        return None
    try:
        return ImportedNames.from_json(into.getvalue())
    except ValueError:
        return None
