"""The host side of code mode: the downstream servers, their clients, stubs and search, for the server's life.

:class:`Mediator` lives as long as the server: the discovered servers, their client pool, the
generated stubs and the search index. For each run it opens a :class:`~.run_access.RunAccess`
(the engine's ``ToolAccess``) that binds the stubs of the run's servers under ``/tools`` and
answers the sandbox's requests; the host decides, whatever the sandbox sends. Downstream
credentials (env, headers) never leave the host: the sandbox sees names, schemas and results.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread

from mcp_sandbox.bridge.clients import ClientPool, open_client_pool
from mcp_sandbox.bridge.discovery import Discovery, ServerSpec, discover, for_tenants
from mcp_sandbox.bridge.run_access import RunAccess, Stubs
from mcp_sandbox.config import CodeModeSettings
from mcp_sandbox.errors import DownstreamError, ValidationError
from mcp_sandbox.events import EventHub
from mcp_sandbox.sandbox.policy import TOOLS_MOUNT, Mount
from mcp_sandbox.state import StateLayout

# The SDK's types, the stub and typings generators and the search index are imported where a
# downstream server is used (see .clients): a run or a server without one never needs them.
if TYPE_CHECKING:
    from mcp_sandbox.bridge.search import ToolIndex
    from mcp_sandbox.bridge.stubs import ToolDoc

__all__ = ["Mediator", "open_mediator"]

logger = logging.getLogger(__name__)


class Mediator:
    """Downstream servers, their clients, stubs and search, for the server's lifetime."""

    def __init__(
        self,
        code_mode: CodeModeSettings,
        layout: StateLayout,
        discovery: Discovery,
        pool: ClientPool,
        events: EventHub | None = None,
    ) -> None:
        """``code_mode``: a run's caps on its tool calls; ``layout``: the server's state directory, where
        the stubs are written."""
        self.code_mode = code_mode
        self.layout = layout
        self.discovery = discovery
        self.pool = pool
        self.events = events if events is not None else EventHub()
        self._stubs: dict[str, Stubs] = {}

    @property
    def servers(self) -> dict[str, ServerSpec]:
        """Every discovered server, by alias."""
        return dict(self.discovery.servers)

    def reload_policies(self, fresh: Discovery) -> list[str]:
        """Take the tool allow- and deny-lists of the servers in ``fresh`` (a new discovery); return what changed.

        Only the policies of servers already known change (their clients keep running, runs keep
        their sessions); a server added to or removed from the configuration needs a restart and
        is reported so.
        """
        notes: list[str] = []
        servers = dict(self.discovery.servers)
        for alias, spec in servers.items():
            new = fresh.servers.get(alias)
            if new is None:
                notes.append(f"{spec.name}: removed from the configuration; it stays until a restart")
                continue
            if (new.allow_tools, new.deny_tools) != (spec.allow_tools, spec.deny_tools):
                servers[alias] = dataclasses.replace(spec, allow_tools=new.allow_tools, deny_tools=new.deny_tools)
                self._stubs.pop(alias, None)  # regenerated with the new policy at the next run
                notes.append(f"{spec.name}: tool allow/deny lists reloaded")
        notes += [
            f"{new.name}: new in the configuration; it needs a restart"
            for a, new in fresh.servers.items()
            if a not in servers
        ]
        self.discovery = dataclasses.replace(self.discovery, servers=servers)
        return notes

    async def reload(self, code_mode: CodeModeSettings, config_file: Path | None) -> list[str]:
        """Discover the downstream servers anew, the config files (``config_file`` too) read again, and
        take their tool allow- and deny-lists (:meth:`reload_policies`: SIGHUP); return what changed."""
        fresh = await anyio.to_thread.run_sync(discover, code_mode, config_file)
        return self.reload_policies(fresh)

    def known_tool(self, alias: str, name: str) -> str | None:
        """The listed tool of ``alias`` called ``name`` (or by its Python name), if its stubs are made."""
        stubs = self._stubs.get(alias)
        docs = stubs.docs if stubs is not None else []
        return next((doc.name for doc in docs if name in (doc.name, doc.python_name)), None)

    def resolve(self, name: str) -> ServerSpec | None:
        """The server called ``name`` (its alias or its configured name)."""
        return self.discovery.by_name(name)

    def aliases(self, names: Sequence[str], tenant: str | None = None) -> tuple[str, ...]:
        """The aliases of the servers called ``names`` (aliases or configured names), deduplicated.

        With ``tenant``, a server not open to that tenant is as unknown as one never configured.

        Raises:
            ValidationError: a name is not a configured server (argument ``servers``).
        """
        aliases: list[str] = []
        for name in names:
            spec = self.resolve(name)
            if spec is not None and tenant is not None and not spec.serves(tenant):
                spec = None
            if spec is None:
                known = (
                    ", ".join(spec.name for spec in self.servers.values() if tenant is None or spec.serves(tenant))
                    or "none are configured"
                )
                raise ValidationError("servers", f"unknown server {name!r} (available: {known})")
            aliases.append(spec.alias)
        return tuple(dict.fromkeys(aliases))

    async def stubs(self, alias: str) -> Stubs:
        """The docs and the stub directory of ``alias``, regenerated when its tool list changes.

        Raises:
            DownstreamError: the server could not be started.
        """
        spec = self.servers[alias]
        tools = await self.pool.tools(alias)
        cached = self._stubs.get(alias)
        if cached is not None and cached.tools is tools:
            return cached
        from mcp_sandbox.bridge.stubs import render_package, tool_docs
        from mcp_sandbox.bridge.typings import render_typings

        permitted = [tool for tool in tools if spec.permits(tool.name)]
        docs = tool_docs(alias, permitted)
        files = render_package(alias, spec.name, None, docs)
        files["index.d.ts"] = render_typings(alias, spec.name, None, docs)  # for TypeScript/JavaScript
        directory = await anyio.to_thread.run_sync(self._write, alias, files)
        stubs = Stubs(tools, docs, directory)
        self._stubs[alias] = stubs
        return stubs

    def _write(self, alias: str, files: dict[str, str]) -> Path:
        from mcp_sandbox.bridge.stub_tree import write_tree

        return write_tree(self.layout.prepare_stubs(), files, prefix=alias)

    async def unavailable_stubs(self, spec: ServerSpec, reason: str) -> Path:
        """A stub package with no tools whose docstring says why the server is unavailable."""
        from mcp_sandbox.bridge.stubs import render_package
        from mcp_sandbox.bridge.typings import render_typings

        note = f"UNAVAILABLE in this run: {reason}"
        files = render_package(spec.alias, spec.name, note, [])
        files["index.d.ts"] = render_typings(spec.alias, spec.name, note, [])
        return await anyio.to_thread.run_sync(self._write, spec.alias, files)

    async def docs(self, alias: str) -> list[ToolDoc]:
        return (await self.stubs(alias)).docs

    async def index(self) -> tuple[ToolIndex, dict[str, str]]:
        """A search index over every server's tools, and the servers that could not be listed."""
        from mcp_sandbox.bridge.search import ToolIndex

        docs: list[ToolDoc] = []
        failures: dict[str, str] = {}
        listed = await self.pool.all_tools()
        for alias, tools in listed.items():
            if isinstance(tools, DownstreamError):
                failures[self.servers[alias].name] = tools.message
                continue
            docs.extend((await self.stubs(alias)).docs)
        return ToolIndex(docs), failures

    async def search(self, query: str, detail: str, limit: int) -> tuple[list[tuple[ToolDoc, str]], dict[str, str]]:
        """The best ``limit`` tools for ``query``, each rendered at ``detail``; and the failures."""
        from mcp_sandbox.bridge.search import render

        index, failures = await self.index()
        return [(doc, render(doc, cast(Any, detail))) for doc, _ in index.search(query, limit=limit)], failures

    async def open_run(
        self, servers: Sequence[str], *, tenant: str | None = None, conversation: str | None = None
    ) -> RunAccess:
        """What a run of ``tenant`` that may call ``servers`` (aliases) sees: stubs bound under /tools, a gate.

        The run sees only the servers open to ``tenant`` (None: all), and calls a ``per_tenant``
        server's instance of that tenant.

        ``tenant`` and ``conversation`` (the workspace key) label the run's tool-call events.

        A server that cannot be started still gets a (toolless) stub package, whose docstring
        says why; calling it raises ``MCPError`` inside the sandbox.
        """
        allowed = {alias: self.servers[alias] for alias in servers}
        if not allowed:  # most runs: nothing to prepare
            return RunAccess(self, allowed, (), tenant=tenant, conversation=conversation)
        directories: dict[str, Path] = {}

        async def prepare(spec: ServerSpec) -> None:
            try:
                directories[spec.alias] = (await self.stubs(spec.alias)).directory
            except DownstreamError as exc:
                directories[spec.alias] = await self.unavailable_stubs(spec, exc.message)

        async with anyio.create_task_group() as group:  # servers start concurrently
            for spec in allowed.values():
                group.start_soon(prepare, spec)
        mounts = [Mount(directories[alias], f"{TOOLS_MOUNT}/{alias}") for alias in allowed]
        return RunAccess(self, allowed, tuple(mounts), tenant=tenant, conversation=conversation)


@contextlib.asynccontextmanager
async def open_mediator(
    code_mode: CodeModeSettings,
    discovery: Discovery,
    events: EventHub | None,
    layout: StateLayout,
    tenants: int = 1,
) -> AsyncIterator[Mediator]:
    """Keep the clients of the downstream servers ``discovery`` found for this context.

    ``layout``: the server's state directory (the servers' logs and stubs); ``tenants``: how many tenants the
    server serves, for which each server's ``per_tenant`` is decided (:func:`.discovery.for_tenants`).
    """
    discovery = for_tenants(discovery, tenants)
    async with open_client_pool(
        discovery.servers,
        connect_timeout=code_mode.connect_timeout,
        call_timeout=code_mode.tool_timeout,
        log_dir=layout.logs,
        max_message_bytes=code_mode.max_tool_result_bytes,
    ) as pool:
        yield Mediator(code_mode, layout, discovery, pool, events)
