"""``tools/list`` and ``tools/call``: the tools this server lists, each call sent to its handler.

Running code is :mod:`.run`'s (``run_python``, ``run_code``); the other tools are answered here.
Errors become tool results in these two modules only.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS

from mcp_sandbox.engine import OutputListener
from mcp_sandbox.errors import BusyError, QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.events import FileStored
from mcp_sandbox.replicas.forward import FORWARDED_TOOLS, Forwarded
from mcp_sandbox.replicas.refusals import refusal_meta
from mcp_sandbox.runners import LANGUAGES
from mcp_sandbox.server.auth.tokens import tenant_of
from mcp_sandbox.server.lifecycle import STOPPED_MESSAGE
from mcp_sandbox.server.service import Service
from mcp_sandbox.server.tasks.extension import ExtensionMethods
from mcp_sandbox.server.tasks.runtime import RunLost
from mcp_sandbox.server.tasks.wire import TaskMethods, idempotency_key
from mcp_sandbox.server.tools.arguments import (
    CallContext,
    ListRunnersArguments,
    SearchToolsArguments,
    UploadFileArguments,
)
from mcp_sandbox.server.tools.library_access import refresh_library
from mcp_sandbox.server.tools.parsing import parse
from mcp_sandbox.server.tools.progress import progress_listener
from mcp_sandbox.server.tools.remote_views import VIEW_KEY, RemoteViews, ViewIds, ViewUnreachable, watched_hop
from mcp_sandbox.server.tools.resources import RESOURCE_NOT_FOUND, read_resource
from mcp_sandbox.server.tools.run import RunTool, listed_file
from mcp_sandbox.server.tools.run_views import (
    OPENED,
    VIEW_URI,
    RunViews,
    UnknownView,
    stop_request,
    view_meta,
)
from mcp_sandbox.server.tools.runner_info import describe_runners
from mcp_sandbox.server.tools.runner_shape import runner_error, runner_upload
from mcp_sandbox.server.tools.schemas import (
    list_runners_tool,
    run_code_tool,
    run_python_tool,
    search_tools_tool,
    upload_file_tool,
)
from mcp_sandbox.workspace import derive_key, load_secret
from mcp_sandbox.workspace.library import Library

__all__ = ["ToolHandlers"]


def _unreachable(view_id: str) -> str:
    return (
        f"run {view_id!r} ran on another replica, which does not answer (stopped, died or stuck):"
        " its view went with it; the run's result, once answered, stays as the client got it"
    )


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


_T = TypeVar("_T")


class ToolHandlers:
    """``tools/list`` and ``tools/call`` for the server."""

    def __init__(self, service: Service) -> None:
        self._service = service
        # One context for the schemas listed and the calls validated: they cannot disagree.
        self._egress = service.egress
        self._context = context = CallContext(
            max_timeout=service.limits.max_timeout, languages=LANGUAGES, network=self._egress.anywhere()
        )
        names = [spec.alias for spec in service.mediator.servers.values()]
        self._tools = [
            run_python_tool(context, names),
            run_code_tool(context),
            upload_file_tool(context),
            list_runners_tool(context),
        ]
        if service.mediator.servers:
            self._tools.append(search_tools_tool(context))
        self._runners: list[dict[str, Any]] | None = None
        self._library = Library(
            service.workspaces.layout.root / "library",
            derive_key(service.secret or load_secret(service.paths.state_dir), "library"),
            service.workspace_settings.library_bytes,
            service.workspace_settings.library_entries,
            service.workspaces.layout.root / "library-views",
            sync=service.mirror,
        )
        # With replicas a view's id names the replica holding it; the others ask that one.
        router = service.router
        ids = None if router is None else ViewIds(derive_key(service.secret, VIEW_KEY), router.me)
        self.views = RunViews(mint=None if ids is None else ids.mint)
        self._remote = None if ids is None or router is None else RemoteViews(ids, router.ask)
        self._run = RunTool(service, context, self._egress, self._library, self.views)
        assert service.tasks is not None, "open_service opens the tasks"
        self.tasks = TaskMethods(service.tasks, self._call_as)
        self.extension = ExtensionMethods(self.tasks, service.tasks, service.admission.task_after)

    async def ready(self) -> ToolHandlers:
        """These handlers (open already: the same interface as a service still opening)."""
        return self

    @property
    def tools(self) -> list[types.Tool]:
        return list(self._tools)

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    def input_schema(self, name: str) -> dict[str, Any] | None:
        """``name``'s input schema as ``tools/list`` lists it (the same for every caller), or None."""
        return next((tool.input_schema for tool in self._tools if tool.name == name), None)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult | dict[str, Any]:
        """The call's result; a ``CreateTaskResult`` of the 2026-07-28 tasks extension when the
        client declared it and the run outlasted ``task_after`` (:mod:`..tasks.extension`)."""
        if self.extension.applies(ctx, params.name):
            return await self._viewed(ctx, lambda: self.extension.call(ctx, params.name, params.arguments))
        raw_params = getattr(ctx, "params", None)
        if (view_id := stop_request(raw_params if isinstance(raw_params, dict) else None)) is not None:
            return await self._stop(tenant_of(getattr(ctx, "request", None)), view_id)
        if (key := idempotency_key(raw_params if isinstance(raw_params, dict) else None)) is not None:
            return await self.tasks.call_once(ctx, params.name, params.arguments, key)
        return await self._route(ctx, tenant_of(getattr(ctx, "request", None)), params.name, params.arguments)

    async def call_as_task(self, ctx: Any) -> dict[str, Any] | None:
        """:meth:`.TaskMethods.call_as_task`, a run's task linking the run's view in its ``_meta``."""
        return await self._viewed(ctx, lambda: self.tasks.call_as_task(ctx))

    async def _viewed(self, ctx: Any, start: Callable[[], Awaitable[_T]]) -> _T:
        """``start()``'s answer to a run tool's call; a task it answers with links the run's view (a
        result links it already: the run tool takes the view opened here)."""
        params = ctx.params if isinstance(ctx.params, dict) else {}
        name = params.get("name")
        if name not in ("run_python", "run_code"):
            return await start()
        raw = params.get("arguments")
        view = self.views.open(
            tenant_of(getattr(ctx, "request", None)), str(name), raw if isinstance(raw, dict) else None
        )
        opened = OPENED.set(view)  # the task's run starts in a copy of this context, and takes it
        try:
            answer = await start()
        finally:
            OPENED.reset(opened)
        if isinstance(answer, dict):
            answer["_meta"] = {**answer.get("_meta", {}), **view_meta(view)}
        return answer

    async def _stop(self, tenant: str, view_id: str) -> types.CallToolResult:
        """A run view's Stop: end the tenant's run ``view_id``, here or on the replica holding it (runs nothing)."""
        try:
            stopping = self.views.stop(tenant, view_id)
        except UnknownView:  # another tenant's id reads exactly like one never made
            holder = None if self._remote is None else self._remote.elsewhere(tenant, view_id)
            if self._remote is None or holder is None:
                return _error_result(f"unknown run {view_id!r}")
            try:
                stopping = await self._remote.stop(holder, tenant, view_id)
            except UnknownView:
                return _error_result(f"unknown run {view_id!r}")
            except ViewUnreachable:
                return _error_result(_unreachable(view_id))
        text = "stopping the run" if stopping else "the run had already ended"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
        """The manual, a run's view or its state, for the caller's tenant (see :mod:`.resources`); a view
        another replica holds is asked of it."""
        tenant = tenant_of(getattr(ctx, "request", None))
        try:
            return await read_resource(ctx, params, self.views, tenant)
        except MCPError as exc:
            uri = str(params.uri)
            view_id = uri.removeprefix(VIEW_URI + "/").partition("/")[0] if uri.startswith(VIEW_URI + "/") else ""
            holder = None if self._remote is None or not view_id else self._remote.elsewhere(tenant, view_id)
            if self._remote is None or holder is None or exc.code != RESOURCE_NOT_FOUND:
                raise
            try:
                return await self._remote.read(holder, tenant, view_id, uri)
            except ViewUnreachable:
                raise MCPError(INTERNAL_ERROR, _unreachable(view_id)) from None

    async def _call_as(
        self, tenant: str, name: str, raw: dict[str, Any] | None, listener: OutputListener | None
    ) -> types.CallToolResult:
        """A call run as a task: as ``tools/call`` routes it, nobody waiting on its progress
        notifications (its output told to ``listener``).

        Raises:
            RunLost: the server stopped the run (a shutdown): the task is failed, not completed.
        """
        result = await self._route(None, tenant, name, raw, listener)
        data = result.structured_content if isinstance(result.structured_content, dict) else {}
        if data.get("error") == STOPPED_MESSAGE and self._service.lifecycle.draining:
            raise RunLost(STOPPED_MESSAGE)
        return result

    async def _route(
        self, ctx: Any, tenant: str, name: str, raw: dict[str, Any] | None, listener: OutputListener | None = None
    ) -> types.CallToolResult:
        # Run by the replica that holds the conversation's lease (a draining one refuses, as one server does).
        router = self._service.router if name in FORWARDED_TOOLS and not self._service.lifecycle.draining else None
        if router is None or (key := self._replica_key(raw, tenant)) is None:
            return await self._local(ctx, name, raw, tenant, listener)
        # A fork runs on the replica of its source, whose interpreter holds the variables it carries;
        # there the new conversation is claimed in turn.
        source = self._replica_key(raw, tenant, "forkFrom")
        claimed = [source, key] if source is not None and source != key else [key]
        opened = OPENED.get()  # a task's view, opened before its run was placed
        view = opened if opened is not None and opened.tenant == tenant and name in ("run_python", "run_code") else None
        try:
            with contextlib.ExitStack() as leases:
                for conversation in claimed:
                    leases.enter_context(router.calling(conversation))  # kept until the call ends
                    where = await watched_hop(
                        self.views, view, functools.partial(router.route, conversation, name, raw, tenant)
                    )
                    if isinstance(where, Forwarded):
                        return where.result
                return await self._local(ctx, name, raw, tenant, listener)
        except WorkspaceError as exc:
            return _error_result(str(exc))

    async def forwarded(self, name: str, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        """A call another replica forwarded here (no progress is reported).

        Raises:
            Moved: another replica holds the conversation's lease.
        """
        router = self._service.router
        key = self._replica_key(raw, tenant)
        if router is None or key is None:
            return await self._local(None, name, raw, tenant)
        try:
            with router.calling(key):
                await router.accept(key, self._service.lifecycle.draining)  # else Moved: the caller claims again
                return await self._local(None, name, raw, tenant)
        except WorkspaceError as exc:
            return _error_result(str(exc))

    def _replica_key(self, raw: dict[str, Any] | None, tenant: str, argument: str = "conversationId") -> str | None:
        """The key of the conversation ``argument`` names, whose lease the call is claimed under; None
        when it names none."""
        conversation = raw.get(argument) if isinstance(raw, dict) else None
        if not isinstance(conversation, str):
            return None
        return self._service.workspaces.key(tenant, conversation)

    async def _local(
        self, ctx: Any, name: str, raw: dict[str, Any] | None, tenant: str, watch: OutputListener | None = None
    ) -> types.CallToolResult:
        if name in ("run_python", "run_code"):
            async with progress_listener(ctx) as listener:
                return await self._run(self._default_conversation(raw), name, tenant, listener or watch)
        if name == "upload_file":
            return await self._upload(self._default_conversation(raw), tenant)
        if name == "list_runners":
            return await self._list_runners(raw, tenant)
        if name == "search_tools" and any(tool.name == name for tool in self._tools):
            return await self._search_tools(raw, tenant)
        # A protocol error, as the spec has it: the model asked for a tool that is not listed.
        available = ", ".join(tool.name for tool in self._tools)
        raise MCPError(INVALID_PARAMS, f"unknown tool {name!r} (available: {available})")

    def _default_conversation(self, raw: dict[str, Any] | None) -> dict[str, Any] | None:
        """``raw`` with ``stdio_conversation`` as its ``conversationId`` when it names none (stdio only)."""
        default = self._service.migration.stdio_conversation
        if self._service.http or default is None or not isinstance(raw, dict) or raw.get("conversationId") is not None:
            return raw
        return {**raw, "conversationId": default}

    async def _upload(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        service = self._service
        started = time.perf_counter()
        key: str | None = None
        try:
            service.lifecycle.refuse_when_draining()
            arguments = parse(UploadFileArguments, raw, self._context)
            key = service.workspaces.key(tenant, arguments.conversation)
            with service.using(key):
                fence = service.storage.fence(key)  # the lease this call runs under (see workspace/fencing.py)
                limits = service.workspace_settings
                admit = service.metadata.admitting(key, fence, limits.quota_bytes, limits.quota_files)
                await service.storage.touch(key, tenant, arguments.conversation)
                entry = await service.storage.write_file(key, arguments.filename, arguments.content, admit)
                await service.storage.refresh_files(key, fence)
                # In the object store before it is acknowledged.
                if entry.name in await service.storage.write_back(key, fence):
                    raise WorkspaceError(f"{entry.name}: the object store did not take the file; upload it again")
        except (ValidationError, QuotaExceededError, WorkspaceError, BusyError) as exc:
            outcome = {ValidationError: "invalid", QuotaExceededError: "quota"}.get(type(exc), "refused")
            service.events.emit(FileStored(tenant, key, "tool", outcome, 0, time.perf_counter() - started))
            runner = service.output_mode == "runner"
            refused = _error_result(runner_error(str(exc)) if runner else str(exc))
            refused.meta = refusal_meta(exc)  # a forwarded HTTP upload answers the same status
            return refused
        service.events.emit(FileStored(tenant, key, "tool", "ok", entry.size, time.perf_counter() - started))
        data = listed_file(service, key, entry)
        text = f"stored /workspace/{entry.name} ({entry.size} bytes)"
        if data["url"] is not None:
            text += f"; download: {data['url']}"
        if service.output_mode == "runner":
            text = runner_upload(data)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=data)

    async def _list_runners(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        try:
            parse(ListRunnersArguments, raw, self._context)
        except ValidationError as exc:
            return _error_result(str(exc))
        if self._runners is None:
            self._runners = await anyio.to_thread.run_sync(describe_runners, self._service.paths, self._service.sandbox)
        lines = []
        for runner in self._runners:
            packages = ", ".join(f"{p['name']} {p['version']}" for p in runner["packages"]) or "none"
            lines.append(f"{runner['language']}: {runner['runtime']} {runner['version']}; packages: {packages}")
        network = self._egress.summary(tenant)
        lines.append(f"network (run with network: true or a list of these): {network}")
        secrets = self._egress.secret_names(tenant)
        if secrets:  # names only: the values stay with the proxy
            lines.append(f"secrets (added by the proxy to HTTPS requests to their hosts): {', '.join(secrets)}")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="\n".join(lines))],
            structured_content={
                "runners": self._runners,
                "network": {"available": self._egress.available(tenant), "reaches": network, "secrets": secrets},
            },
        )

    async def _search_tools(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        mediator = self._service.mediator
        try:
            arguments = parse(SearchToolsArguments, raw, self._context)
        except ValidationError as exc:
            return _error_result(str(exc))
        query, detail = arguments.query, arguments.detail
        hits, unavailable = await mediator.search(query, detail, arguments.limit)
        servers = mediator.servers
        # A server not open to this tenant does not exist for it.
        hits = [(doc, text) for doc, text in hits if servers[doc.server].serves(tenant)]
        open_names = {spec.name for spec in servers.values() if spec.serves(tenant)}
        unavailable = {name: why for name, why in unavailable.items() if name in open_names}
        results = [{"server": servers[doc.server].name, "tool": doc.name, "doc": text} for doc, text in hits]
        if self._service.mirror is not None:  # saved through another replica
            await refresh_library(self._library, tenant)
        saved = await anyio.to_thread.run_sync(self._library.search, tenant, query, arguments.limit)
        results += [{"server": "saved", "tool": tool.name, "doc": tool.doc()} for tool in saved]
        lines = [hit["doc"] for hit in results] or [f"no tool matches {query!r}"]
        lines.extend(f"(server {name} is unavailable: {reason})" for name, reason in unavailable.items())
        structured: dict[str, Any] = {"results": results}
        if unavailable:
            structured["unavailable"] = unavailable
        separator = "\n\n" if detail == "full" else "\n"
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=separator.join(lines))], structured_content=structured
        )
