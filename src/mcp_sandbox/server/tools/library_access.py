"""A run's requests about its tenant's library (saved tools, memories), answered beside code mode's.

The run also sees its tenant's library as files, read-only, at ``/tools/_library`` (a snapshot
taken as it starts; see :meth:`~mcp_sandbox.workspace.library.Library.view`).

:class:`LibraryAccess` wraps the run's :class:`~mcp_sandbox.engine.ToolAccess`: requests whose
``op`` is a library one are answered here, for the tenant the run belongs to (never one the
sandbox names); every other request goes to the wrapped access unchanged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.to_thread

from mcp_sandbox.engine.result import ToolAccess
from mcp_sandbox.errors import QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.protocol import Call, Failure, Reply
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.workspace.library import Library

__all__ = ["LIBRARY_MOUNT", "LIBRARY_OPS", "LibraryAccess", "refresh_library"]

logger = logging.getLogger(__name__)

LIBRARY_MOUNT = f"{TOOLS_MOUNT}/_library"  # "_": no server's alias starts with one

LIBRARY_OPS = frozenset(
    {
        "save_tool",
        "load_tool",
        "list_saved_tools",
        "delete_tool",
        "save_memory",
        "load_memory",
        "list_memories",
        "delete_memory",
    }
)


async def refresh_library(library: Library, tenant: str) -> None:
    """Take in the other replicas' changes to the tenant's library; where the store cannot be
    read, the run goes on with this replica's copy (logged)."""
    try:
        await anyio.to_thread.run_sync(library.refresh, tenant)
    except WorkspaceError as exc:
        logger.warning("the library could not be refreshed from the object store: %s", exc)


def _text(body: dict[str, Any], name: str, default: str | None = None) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise ValidationError(name, "must be a string")
    return value


@dataclass
class LibraryAccess:
    """``inner``, plus the library of ``tenant`` (and ``view``, its snapshot for this run, if any)."""

    inner: ToolAccess
    library: Library
    tenant: str
    view: Path | None = None

    @property
    def mounts(self) -> tuple[Mount, ...]:
        if self.view is None:
            return self.inner.mounts
        return (*self.inner.mounts, Mount(self.view, LIBRARY_MOUNT))

    @property
    def servers(self) -> tuple[str, ...]:
        return self.inner.servers

    async def handle(self, call: Call) -> Reply:
        op = call.request.get("op")
        if op == "search_tools":
            return await self._search(call)
        if op not in LIBRARY_OPS:
            return await self.inner.handle(call)
        try:
            result = await anyio.to_thread.run_sync(self._answer, str(op), call.request)
        except ValidationError as exc:
            return Reply(call.id, error=Failure("invalid", str(exc)))
        except QuotaExceededError as exc:
            return Reply(call.id, error=Failure("denied", str(exc)))
        except WorkspaceError as exc:  # a full disk: said without the library's path
            return Reply(call.id, error=Failure("unavailable", str(exc)))
        return Reply(call.id, result)

    async def _search(self, call: Call) -> Reply:
        """The downstream servers' tools for the query, then the tenant's saved tools that match."""
        reply = await self.inner.handle(call)
        query, limit = call.request.get("query"), call.request.get("limit", 10)
        if (
            not reply.ok
            or not isinstance(query, str)
            or not isinstance(reply.result, list)
            or not isinstance(limit, int)
        ):
            return reply
        tools = await anyio.to_thread.run_sync(self.library.search, self.tenant, query, limit)
        hits = [
            {"server": "saved", "tool": t.name, "python_name": t.name, "doc": t.doc(), "server_alias": "saved",
             "description": t.description, "language": t.language}
            for t in tools
        ]  # fmt: skip
        return Reply(call.id, [*reply.result, *hits])

    def _answer(self, op: str, body: dict[str, Any]) -> Any:
        library, tenant = self.library, self.tenant
        if op == "save_tool":
            return library.save_tool(
                tenant,
                _text(body, "name"),
                _text(body, "source"),
                _text(body, "language"),
                _text(body, "description", ""),
            ).summary()
        if op == "load_tool":
            tool = library.tool(tenant, _text(body, "name"))
            return None if tool is None else {**tool.summary(), "source": tool.source}
        if op == "list_saved_tools":
            return [tool.summary() for tool in library.tools(tenant)]
        if op == "delete_tool":
            return library.delete(tenant, "tools", _text(body, "name"))
        if op == "save_memory":
            library.save_memory(tenant, _text(body, "key"), body.get("value"))
            return None
        if op == "load_memory":
            found, value = library.load_memory(tenant, _text(body, "key"))
            return {"found": found, "value": value}
        if op == "list_memories":
            return library.memories(tenant)
        return library.delete(tenant, "memories", _text(body, "key"))
