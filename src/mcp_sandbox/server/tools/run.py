"""``run_python`` and ``run_code``: from the call's arguments to a run, and from the run to the tool result.

A call goes through three steps: :meth:`RunTool.request` turns the arguments into the
:class:`~mcp_sandbox.engine.ExecutionRequest` the engine runs (the conversation's workspace,
code mode's servers and the tenant's library, the network granted); :func:`refused` turns an
error raised on the way into the result a model reads (the one place errors become run
results); :meth:`RunTool.answer` lists the workspace's files, warns over quota, emits the run's
one :class:`~mcp_sandbox.events.RunFinished` (metrics, audit log and history follow it) and
renders the result.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio.to_thread
import mcp_types as types

from mcp_sandbox import tracing
from mcp_sandbox.config import OutputMode, WorkspaceSettings
from mcp_sandbox.egress import TenantEgress
from mcp_sandbox.engine import ExecutionRequest, ExecutionResult, OutputListener
from mcp_sandbox.engine.engine import Prepare
from mcp_sandbox.errors import BusyError, LeaseLostError, SandboxError, ValidationError, WorkspaceError
from mcp_sandbox.events import RunFinished
from mcp_sandbox.replicas.forward import STATE_LOST_NOTE
from mcp_sandbox.server.lifecycle import STOPPED_MESSAGE
from mcp_sandbox.server.service import Service
from mcp_sandbox.server.tools.arguments import (
    CallContext,
    RunArguments,
    RunCodeArguments,
    RunPythonArguments,
)
from mcp_sandbox.server.tools.checkpointing import delete_checkpoint, restore_checkpoint, save_checkpoint
from mcp_sandbox.server.tools.forking import Fork, fork_conversation
from mcp_sandbox.server.tools.library_access import LibraryAccess, refresh_library
from mcp_sandbox.server.tools.parsing import output_mode, parse
from mcp_sandbox.server.tools.render import render
from mcp_sandbox.server.tools.run_views import STOPPED_FROM_VIEW, RunView, RunViews, listening, view_meta
from mcp_sandbox.workspace import FileEntry
from mcp_sandbox.workspace.library import Library

__all__ = ["RunTool", "listed_file", "over_quota", "refused"]

logger = logging.getLogger(__name__)

# The tool_results setting, as the runtimes inside read it (mcp_sandbox_runtime/api.py, mcp.ts).
TOOL_RESULTS_VARIABLE = "MCP_SANDBOX_TOOL_RESULTS"


@dataclass
class RunCall:
    """One run call as it goes: who asked, with which tool, since when, and what its request named."""

    tool: str
    tenant: str
    mode: OutputMode
    started_at: float = field(default_factory=time.time)
    clock: float = field(default_factory=time.perf_counter)
    key: str | None = None  # the conversation's workspace key, once the arguments name one
    language: str = "python"
    busy: bool = False  # refused for capacity (or draining)
    timeout_clamped: dict[str, float] | None = None  # {"requested", "used"} when above max_timeout
    fork: Fork | None = None  # forkFrom: the copy this call's conversation was made of
    prepare: Prepare | None = None  # forkFrom, a checkpoint: the copy, made once the run is admitted
    checkpoint: dict[str, Any] | None = None  # the checkpoint restored and saved: the result's ``checkpoint``


def refused(call: RunCall, exc: SandboxError) -> ExecutionResult:
    """The result of a run that could not run: invalid arguments, no capacity, a sandbox failure."""
    if isinstance(exc, ValidationError):
        return ExecutionResult.invalid(str(exc))
    if isinstance(exc, BusyError):
        call.busy = True
        return ExecutionResult(status="error", exit_code=None, error=f"busy: {exc}")
    logger.error("%s failed in the sandbox layer: %s", call.tool, exc)
    if isinstance(exc, WorkspaceError):  # written for the tenant: the workspace's problem, no path
        return ExecutionResult(status="error", exit_code=None, error=str(exc))
    return ExecutionResult(status="error", exit_code=None, error=f"sandbox failure: {exc}")


def listed_file(service: Service, key: str, entry: FileEntry) -> dict[str, Any]:
    """A file of the conversation as a result lists it: name, size and download URL (HTTP only)."""
    return {"name": entry.name, "size": entry.size, "url": service.file_url(key, entry.name)}


def over_quota(workspaces: WorkspaceSettings, entries: list[FileEntry]) -> str | None:
    """The warning for a workspace over its quota (``entries`` are its files), or None."""
    used = sum(entry.size for entry in entries)
    if used <= workspaces.quota_bytes and len(entries) <= workspaces.quota_files:
        return None
    return (
        f"the conversation's workspace is over its quota ({used} of {workspaces.quota_bytes} bytes, "
        f"{len(entries)} of {workspaces.quota_files} files): uploads are refused until files are deleted"
    )


def unsaved_warning(names: Sequence[str], shown: int = 10) -> str:
    """The warning naming files the object store did not take (the first ``shown`` of them)."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    listed = ", ".join(f"/workspace/{name}" for name in names[:shown])
    return f"Files not saved: {listed}{more} (the object store did not take them; they stay on this server)."


def _output_bytes(result: ExecutionResult) -> tuple[int, int]:
    """The sizes of the run's stdout and stderr in bytes."""
    return (
        len(result.stdout.encode("utf-8", errors="surrogatepass")),
        len(result.stderr.encode("utf-8", errors="surrogatepass")),
    )


class RunTool:
    """Runs code for ``run_python`` and ``run_code`` calls."""

    def __init__(
        self, service: Service, context: CallContext, egress: TenantEgress, library: Library, views: RunViews
    ) -> None:
        self._service = service
        self._context = context
        self._egress = egress
        self._library = library
        self._views = views

    async def __call__(
        self, raw: dict[str, Any] | None, tool: str, tenant: str, listener: OutputListener | None
    ) -> types.CallToolResult:
        service = self._service
        call = RunCall(tool, tenant, output_mode(raw, service.output_mode))
        view = self._views.open(tenant, tool, raw)
        # The conversation is marked in use from its first touch to its last listing: retention
        # never deletes a workspace between the two.
        with contextlib.ExitStack() as held:
            held.enter_context(self._views.ending(view))
            try:
                stop = held.enter_context(service.lifecycle.run())
                result = ExecutionResult(status="error", exit_code=None, error=STOPPED_MESSAGE)
                with stop:  # cancelled when the server stops with the run still going: it is answered so
                    request = await self.request(call, raw, listening(view, listener), held)
                    with view.scope:  # cancelled by the view's Stop
                        result = await service.engine.execute(request, call.prepare)
                    if view.scope.cancelled_caught:
                        lasted = int((time.perf_counter() - call.clock) * 1000)
                        result = ExecutionResult(
                            status="error", exit_code=None, error=STOPPED_FROM_VIEW, duration_ms=lasted
                        )
            except (ValidationError, BusyError, SandboxError) as exc:
                result = refused(call, exc)
            return await self.answer(call, result, view)

    async def request(
        self, call: RunCall, raw: dict[str, Any] | None, listener: OutputListener | None, held: contextlib.ExitStack
    ) -> ExecutionRequest:
        """The request for ``raw``, the call's arguments; the conversation is held in use on ``held``.

        Raises:
            ValidationError: the arguments are wrong (or name a server the tenant has not).
            SandboxError: a workspace or code mode's servers cannot serve the run.
        """
        service = self._service
        model = RunCodeArguments if call.tool == "run_code" else RunPythonArguments
        arguments: RunArguments = parse(model, raw, self._context)
        environment: dict[str, str] = {}
        if isinstance(arguments, RunCodeArguments):
            call.language, environment = arguments.language, arguments.variables()
        if arguments.conversation is not None:
            call.key = service.workspaces.key(call.tenant, arguments.conversation)
        if service.code_mode.tool_results == "raw":  # read by the runtime's tool calls
            environment[TOOL_RESULTS_VARIABLE] = "raw"
        tools = await self._tool_access(arguments.servers, call.tenant, call.key)
        timeout, asked = arguments.timeout_within(service.limits.timeout, self._context.max_timeout)
        if asked is not None:
            call.timeout_clamped = {"requested": asked, "used": timeout}
        workspace = None
        if call.key is not None:
            held.enter_context(service.using(call.key))
            if arguments.fork_from is not None:  # copied once the run is admitted (see _forking)
                held.enter_context(service.using(service.workspaces.key(call.tenant, arguments.fork_from)))
                fork = (arguments.fork_from, arguments.restore)
                call.prepare = self._forking(call, fork, arguments.conversation, timeout, held)
                workspace = service.workspaces.directory(call.key)
            else:
                workspace = await service.storage.touch(call.key, call.tenant, arguments.conversation)
                save = arguments.checkpoint if isinstance(arguments, RunPythonArguments) else None
                if arguments.restore is not None or save is not None:
                    call.prepare = self._checkpointing(call, arguments.restore, save, timeout)
            if (base := service.file_base_url(call.key)) is not None:
                environment["FILE_BASE_URL"] = base
        return ExecutionRequest(
            code=arguments.code,
            timeout=timeout,
            language=call.language,
            environment=environment,
            workspace=workspace,
            tools=tools,
            session=call.key,
            reset=arguments.reset is True,
            on_output=listener,
            egress=self._egress.grant(call.tenant, arguments.network, arguments.conversation),
            tenant=call.tenant,
        )

    def _forking(
        self,
        call: RunCall,
        fork: tuple[str, str | None],
        conversation: str | None,
        timeout: float,
        held: contextlib.ExitStack,
    ) -> Prepare:
        """What a fork's run does once admitted: copy the source (``fork``: its id, and the checkpoint
        of it to start from, if any), then make the new conversation's row."""
        service = self._service
        assert call.key is not None
        key = call.key
        source, checkpoint = fork

        async def prepare(request: ExecutionRequest) -> ExecutionRequest:
            python = call.language == "python"
            call.fork = await fork_conversation(
                service, call.tenant, source, key, held, python=python, wait=timeout, checkpoint=checkpoint
            )
            await service.storage.touch(key, call.tenant, conversation)
            return dataclasses.replace(request, fork_state=call.fork.state)

        return prepare

    def _checkpointing(self, call: RunCall, restore: str | None, save: str | None, timeout: float) -> Prepare:
        """What the run does once admitted: restore the checkpoint ``restore``, then save the
        conversation as ``save`` (or delete the checkpoint ``-<name>`` names), each when given,
        before the code runs."""
        service = self._service
        assert call.key is not None
        key = call.key

        async def prepare(request: ExecutionRequest) -> ExecutionRequest:
            call.checkpoint = {}
            if restore is not None:
                call.checkpoint["restored"] = await restore_checkpoint(service, call.tenant, key, restore, wait=timeout)
            if save is not None and save.startswith("-"):  # checkpoint: "-<name>" deletes one
                call.checkpoint["deleted"] = await delete_checkpoint(service, key, save[1:])
            elif save is not None:
                python = call.language == "python"
                saved = await save_checkpoint(service, call.tenant, key, save, python=python, wait=timeout)
                call.checkpoint["saved"] = saved
            return request

        return prepare

    async def _tool_access(self, servers: Sequence[str], tenant: str, key: str | None) -> LibraryAccess:
        """What the run may call: the code-mode servers it names, and its tenant's library."""
        if self._service.mirror is not None:  # the library as the other replicas left it
            await refresh_library(self._library, tenant)
        # An empty library (the common case) has no view: known without a worker thread's round trip.
        view = None if self._library.empty(tenant) else await anyio.to_thread.run_sync(self._library.view, tenant)
        mediator = self._service.mediator
        aliases = mediator.aliases(servers, tenant)
        access = await mediator.open_run(aliases, tenant=tenant, conversation=key)
        return LibraryAccess(access, self._library, tenant, view)

    async def answer(self, call: RunCall, result: ExecutionResult, view: RunView) -> types.CallToolResult:
        """The tool result for ``result``, after listing the workspace and emitting the run's event;
        ``view`` keeps it and the result links it."""
        service = self._service
        data = result.structured()
        if call.timeout_clamped is not None:
            data["timeoutClamped"] = call.timeout_clamped
        if call.fork is not None:
            data["fork"] = call.fork.report(result.forked)
        if call.checkpoint:
            data["checkpoint"] = call.checkpoint
        if result.status != "success" and (trace := tracing.trace_id()) is not None:
            data["traceId"] = trace  # the operator's way from a failed run to its trace
        lost = None
        if call.key is not None and data.get("session") in ("new", "resumed"):  # lost since the last run?
            lost = await _take_state_lost(service, call.key)
            if data["session"] == "resumed":  # parked, so no run came after: nothing was lost
                lost = None
            if lost is not None:
                data["stateLost"], data["stateLostReason"] = True, lost
        files_bytes = 0
        listed = call.key
        if listed is not None and result.status == "validation_error":
            # Refused before anything ran: a new conversation was never made, so it lists no files.
            if not await anyio.to_thread.run_sync(service.workspaces.directory(listed).is_dir):
                data["files"], listed = [], None
        if listed is not None:
            try:
                entries = await service.storage.refresh_files(listed)
            except LeaseLostError as exc:  # taken over meanwhile: what this run wrote here is not the conversation's
                entries = []
                data["warning"] = f"Files not saved: {exc}."
            else:
                if (warning := over_quota(service.workspace_settings, entries)) is not None:
                    data["warning"] = warning
                try:
                    unsaved = await service.storage.write_back(listed)  # the run's files in the store before the answer
                except WorkspaceError as exc:
                    data["warning"] = " ".join(filter(None, [data.get("warning"), f"Files not saved: {exc}."]))
                else:
                    if unsaved:
                        data["warning"] = " ".join(filter(None, [data.get("warning"), unsaved_warning(unsaved)]))
            files_bytes = sum(entry.size for entry in entries)
            data["files"] = [listed_file(service, listed, entry) for entry in entries]
        service.events.emit(self._finished(call, result, files_bytes))
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=render(result, call.mode, data))]
        if lost is not None:
            content.append(types.TextContent(type="text", text=f"({STATE_LOST_NOTE.format(reason=lost)})"))
        content += [
            types.ImageContent(type="image", data=base64.b64encode(image.data).decode(), mime_type=image.mime)
            for image in result.images
        ]
        answered = types.CallToolResult(
            content=content, structured_content=data, is_error=result.status != "success", _meta=view_meta(view)
        )
        self._views.finish(
            view, answered.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"result_type"})
        )
        return answered

    def _finished(self, call: RunCall, result: ExecutionResult, files_bytes: int) -> RunFinished:
        """The run, described once for everyone who follows runs (metrics, audit log, history)."""
        stdout_bytes, stderr_bytes = _output_bytes(result)
        return RunFinished(
            tenant=call.tenant,
            conversation=call.key,
            language=call.language,
            backend=self._service.engine.backend.name,
            status="busy" if call.busy else result.status,
            duration=time.perf_counter() - call.clock,
            warm=result.warm,
            limits=result.limits,
            exit_code=result.exit_code,
            stdout_bytes=stdout_bytes,
            stderr_bytes=stderr_bytes,
            files_bytes=files_bytes,
            started_at=call.started_at,
            run_ms=result.duration_ms,
            path=result.path,
            truncated=result.truncated,
        )


async def _take_state_lost(service: Service, key: str) -> str | None:
    """Why conversation ``key``'s interpreter was lost since its last run (a lease lapsed, its replica
    stopped: replicas/leases.py), taken so that only the run starting the fresh interpreter says it;
    None when it was not, on one server, or when the database cannot say now (the mark stays)."""
    try:
        return await service.storage.take_state_lost(key)
    except WorkspaceError as exc:
        logger.warning("cannot read whether a conversation's interpreter was lost: %s", exc)
        return None
