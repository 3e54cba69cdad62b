"""The MCP tools' handlers, and the one place where errors become tool results."""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from mcp_sandbox.engine import ExecutionRequest, ExecutionResult, OutputListener
from mcp_sandbox.errors import BusyError, QuotaExceededError, SandboxError, ValidationError, WorkspaceError
from mcp_sandbox.events import FileStored, RunFinished
from mcp_sandbox.runners import LANGUAGES
from mcp_sandbox.server.arguments import (
    CallContext,
    ListRunnersArguments,
    RunArguments,
    RunCodeArguments,
    RunPythonArguments,
    SearchToolsArguments,
    UploadFileArguments,
    output_mode,
    parse,
)
from mcp_sandbox.server.auth import tenant_of
from mcp_sandbox.server.library_access import LibraryAccess
from mcp_sandbox.server.progress import progress_listener
from mcp_sandbox.server.render import render
from mcp_sandbox.server.runner_info import describe_runners
from mcp_sandbox.server.schemas import (
    list_runners_tool,
    run_code_tool,
    run_python_tool,
    search_tools_tool,
    upload_file_tool,
)
from mcp_sandbox.server.service import Service
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import ExecutionRecord, FileEntry, derive_key, load_secret
from mcp_sandbox.workspace.library import Library

__all__ = ["ToolHandlers"]

logger = logging.getLogger(__name__)


def _output_bytes(result: ExecutionResult) -> tuple[int, int]:
    """The sizes of the run's stdout and stderr in bytes (for the history and the events)."""
    return (
        len(result.stdout.encode("utf-8", errors="surrogatepass")),
        len(result.stderr.encode("utf-8", errors="surrogatepass")),
    )


def _error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


class ToolHandlers:
    """``tools/list`` and ``tools/call`` for the server."""

    def __init__(self, service: Service) -> None:
        self._service = service
        # One context for the schemas listed and the calls validated: they cannot disagree.
        self._egress = service.egress
        self._context = context = CallContext(
            max_timeout=service.settings.max_timeout, languages=LANGUAGES, network=self._egress.anywhere()
        )
        names = [spec.alias for spec in service.bridge.servers.values()]
        self._tools = [
            run_python_tool(context, names),
            run_code_tool(context),
            upload_file_tool(context),
            list_runners_tool(context),
        ]
        if service.bridge.servers:
            self._tools.append(search_tools_tool(context))
        self._runners: list[dict[str, Any]] | None = None
        settings = service.settings
        self._library = Library(
            StateLayout.of(settings).root / "library",
            derive_key(load_secret(settings.state_dir), "library"),
            settings.library_bytes,
            settings.library_entries,
            StateLayout.of(settings).root / "library-views",
        )

    @property
    def tools(self) -> list[types.Tool]:
        return list(self._tools)

    async def list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tenant = tenant_of(getattr(ctx, "request", None))
        name = params.name
        if name in ("run_python", "run_code"):
            async with progress_listener(ctx) as listener:
                return await self._run(self._default_conversation(params.arguments), name, tenant, listener)
        if name == "upload_file":
            return await self._upload(self._default_conversation(params.arguments), tenant)
        if name == "list_runners":
            return await self._list_runners(params.arguments, tenant)
        if name == "search_tools" and any(tool.name == name for tool in self._tools):
            return await self._search_tools(params.arguments, tenant)
        # A protocol error, as the spec has it: the model asked for a tool that is not listed.
        available = ", ".join(tool.name for tool in self._tools)
        raise MCPError(INVALID_PARAMS, f"unknown tool {name!r} (available: {available})")

    def _default_conversation(self, raw: dict[str, Any] | None) -> dict[str, Any] | None:
        """``raw`` with ``stdio_conversation`` as its ``conversationId`` when it names none (stdio only)."""
        default = self._service.settings.stdio_conversation
        if self._service.http or default is None or not isinstance(raw, dict) or raw.get("conversationId") is not None:
            return raw
        return {**raw, "conversationId": default}

    async def _run(
        self, raw: dict[str, Any] | None, tool: str, tenant: str, listener: OutputListener | None
    ) -> types.CallToolResult:
        # The conversation is marked in use from its first touch to its last listing: retention
        # never deletes a workspace between the two.
        with contextlib.ExitStack() as held:
            return await self._run_holding(raw, tool, tenant, listener, held)

    def _emit_run(
        self,
        tenant: str,
        key: str | None,
        language: str,
        started: float,
        result: ExecutionResult,
        files_bytes: int,
        output_bytes: tuple[int, int],
        *,
        busy: bool,
    ) -> None:
        self._service.events.emit(
            RunFinished(
                tenant=tenant,
                conversation=key,
                language=language,
                backend=self._service.engine.backend.name,
                status="busy" if busy else result.status,
                duration=time.perf_counter() - started,
                warm=result.warm,
                limits=result.limits,
                exit_code=result.exit_code,
                stdout_bytes=output_bytes[0],
                stderr_bytes=output_bytes[1],
                files_bytes=files_bytes,
            )
        )

    async def _run_holding(
        self,
        raw: dict[str, Any] | None,
        tool: str,
        tenant: str,
        listener: OutputListener | None,
        held: contextlib.ExitStack,
    ) -> types.CallToolResult:
        service = self._service
        mode = output_mode(raw, service.settings)
        started = time.time()
        clock = time.perf_counter()
        key: str | None = None
        language = "python"
        busy = False
        try:
            held.enter_context(service.lifecycle.run())
            model = RunCodeArguments if tool == "run_code" else RunPythonArguments
            arguments: RunArguments = parse(model, raw, self._context)
            if isinstance(arguments, RunCodeArguments):
                language, environment = arguments.language, arguments.variables()
            else:
                environment = {}
            if arguments.conversation is not None:
                key = service.workspaces.key(tenant, arguments.conversation)
            # An empty library (the common case) has no view: known without a worker thread's round trip.
            view = None if self._library.empty(tenant) else await anyio.to_thread.run_sync(self._library.view, tenant)
            aliases = service.bridge.aliases(arguments.servers, tenant)
            access = LibraryAccess(
                await service.bridge.open_run(aliases, tenant=tenant, conversation=key), self._library, tenant, view
            )
            workspace = None
            if key is not None:
                held.enter_context(service.using(key))
                workspace = await service.touch(key, tenant)
                if (base := service.file_base_url(key)) is not None:
                    environment["FILE_BASE_URL"] = base
            request = ExecutionRequest(
                code=arguments.code,
                timeout=service.settings.timeout if arguments.timeout is None else arguments.timeout,
                language=language,
                environment=environment,
                workspace=workspace,
                tools=access,
                session=key,
                reset=arguments.reset,
                on_output=listener,
                egress=self._egress.grant(tenant, arguments.network, arguments.conversation),
                tenant=tenant,
            )
            result = await service.engine.execute(request)
        except ValidationError as exc:
            result = ExecutionResult.invalid(str(exc))
        except BusyError as exc:
            busy = True
            result = ExecutionResult(status="error", exit_code=None, error=f"busy: {exc}")
        except SandboxError as exc:
            logger.error("%s failed in the sandbox layer: %s", tool, exc)
            result = ExecutionResult(status="error", exit_code=None, error=f"sandbox failure: {exc}")
        data = result.structured()
        files_bytes = 0
        if key is not None:
            entries = await service.refresh_files(key)
            files_bytes = sum(entry.size for entry in entries)
            data["files"] = [self._file(key, entry) for entry in entries]
            if (warning := self._over_quota(entries)) is not None:
                data["warning"] = warning
        output_bytes = _output_bytes(result)  # 1 MiB of output is worth encoding once
        self._record(tenant, key, language, started, result, files_bytes, output_bytes)
        self._emit_run(tenant, key, language, clock, result, files_bytes, output_bytes, busy=busy)
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=render(result, mode, data))]
        content += [
            types.ImageContent(type="image", data=base64.b64encode(image.data).decode(), mime_type=image.mime)
            for image in result.images
        ]
        return types.CallToolResult(content=content, structured_content=data, is_error=result.status != "success")

    def _file(self, key: str, entry: FileEntry) -> dict[str, Any]:
        return {"name": entry.name, "size": entry.size, "url": self._service.file_url(key, entry.name)}

    def _over_quota(self, entries: list[FileEntry]) -> str | None:
        settings = self._service.settings
        used = sum(entry.size for entry in entries)
        if used <= settings.quota_bytes and len(entries) <= settings.quota_files:
            return None
        return (
            f"the conversation's workspace is over its quota ({used} of {settings.quota_bytes} bytes, "
            f"{len(entries)} of {settings.quota_files} files): uploads are refused until files are deleted"
        )

    def _record(
        self,
        tenant: str,
        key: str | None,
        language: str,
        started: float,
        result: ExecutionResult,
        files_bytes: int,
        output_bytes: tuple[int, int],
    ) -> None:
        record = ExecutionRecord(
            tenant=tenant,
            conversation=key,
            language=language,
            started_at=started,
            duration_ms=result.duration_ms,
            status=result.status,
            exit_code=result.exit_code,
            stdout_bytes=output_bytes[0],
            stderr_bytes=output_bytes[1],
            files_bytes=files_bytes,
        )
        self._service.record_soon(record)  # after the answer: the history is not the caller's wait

    async def _upload(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        service = self._service
        started = time.perf_counter()
        key: str | None = None
        try:
            arguments = parse(UploadFileArguments, raw, self._context)
            key = service.workspaces.key(tenant, arguments.conversation)
            with service.using(key):
                await service.touch(key, tenant)
                entry = await anyio.to_thread.run_sync(
                    service.workspaces.write_file, key, arguments.filename, iter([arguments.content])
                )
                await service.refresh_files(key)
        except (ValidationError, QuotaExceededError, WorkspaceError) as exc:
            outcome = {ValidationError: "invalid", QuotaExceededError: "quota"}.get(type(exc), "refused")
            service.events.emit(FileStored(tenant, key, "tool", outcome, 0, time.perf_counter() - started))
            return _error_result(str(exc))
        service.events.emit(FileStored(tenant, key, "tool", "ok", entry.size, time.perf_counter() - started))
        data = self._file(key, entry)
        text = f"stored /workspace/{entry.name} ({entry.size} bytes)"
        if data["url"] is not None:
            text += f"; download: {data['url']}"
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], structured_content=data)

    async def _list_runners(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        try:
            parse(ListRunnersArguments, raw, self._context)
        except ValidationError as exc:
            return _error_result(str(exc))
        if self._runners is None:
            self._runners = await anyio.to_thread.run_sync(describe_runners, self._service.settings)
        lines = []
        for runner in self._runners:
            packages = ", ".join(f"{p['name']} {p['version']}" for p in runner["packages"]) or "none"
            lines.append(f"{runner['language']}: {runner['runtime']} {runner['version']}; packages: {packages}")
        network = self._egress.summary(tenant)
        lines.append(f"network (run with network: true or a list of these): {network}")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="\n".join(lines))],
            structured_content={
                "runners": self._runners,
                "network": {"available": self._egress.available(tenant), "reaches": network},
            },
        )

    async def _search_tools(self, raw: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        bridge = self._service.bridge
        try:
            arguments = parse(SearchToolsArguments, raw, self._context)
        except ValidationError as exc:
            return _error_result(str(exc))
        query, detail = arguments.query, arguments.detail
        hits, unavailable = await bridge.search(query, detail, arguments.limit)
        servers = bridge.servers
        # A server not open to this tenant does not exist for it.
        hits = [(doc, text) for doc, text in hits if servers[doc.server].serves(tenant)]
        open_names = {spec.name for spec in servers.values() if spec.serves(tenant)}
        unavailable = {name: why for name, why in unavailable.items() if name in open_names}
        results = [{"server": servers[doc.server].name, "tool": doc.name, "doc": text} for doc, text in hits]
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
