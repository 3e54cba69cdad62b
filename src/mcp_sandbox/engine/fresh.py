"""The fresh placement: a sandbox started for one run, serving it and exiting.

It takes every run no other placement took (a run granted network always lands here or in its
session). The run is judged by its process's exit code and the sandbox's memory and pids
counters; a run without a conversation gets a scratch workspace where the backend cannot size
one itself (:mod:`.scratch`), and :mod:`.disk` stops one that writes past its quota.
"""

from __future__ import annotations

import contextlib
import dataclasses

import anyio

from mcp_sandbox.config import EngineSettings
from mcp_sandbox.engine.disk import DiskBound, Overrun, disk_bound
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.engine.runtimes import policy_for, with_egress, with_file_size
from mcp_sandbox.engine.scratch import scratch_workspace
from mcp_sandbox.engine.verdict import captured, explain_file_size, judge_fresh, stopped_for_disk, timed_out

__all__ = ["FreshPlacement"]


class FreshPlacement:
    """Runs each request in a sandbox of its own (a :class:`~.placement.Placement` taking every request)."""

    def __init__(self, settings: EngineSettings, opener: Opener) -> None:
        self._settings = settings
        self._opener = opener

    def accepts(self, request: ExecutionRequest) -> bool:
        """Always: any run can start a sandbox of its own."""
        return True

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult:
        """Run ``request`` in a new sandbox and judge it as a one-shot sandbox."""
        settings = self._settings
        record = RunRecord.capped(settings.limits.max_output, request.on_output)
        interpreter: Interpreter | None = None
        async with contextlib.AsyncExitStack() as stack:
            workspace = request.workspace
            bound = DiskBound.conversation(settings.workspaces)
            uid = await self._opener.host_uid(request.tenant)
            if workspace is None and not self._opener.backend.sized_scratch:
                workspace = await stack.enter_async_context(
                    scratch_workspace(self._opener.layout, settings.sandbox, uid)
                )
                bound = DiskBound.scratch(settings.limits, settings.workspaces)
            policy = policy_for(
                settings,
                request.language,
                workspace=workspace,
                timeout=request.timeout,
                mounts=request.tools.mounts if request.tools is not None else (),
            )
            policy = dataclasses.replace(policy, host_uid=uid)
            if request.egress is not None:
                directory = await stack.enter_async_context(self._opener.egress(request, None))
                policy = with_egress(policy, directory, trust=bool(request.egress.secrets))
            overrun = Overrun(bound)
            with anyio.move_on_after(request.timeout) as deadline:
                async with disk_bound(workspace, bound) as overrun:
                    file_size = overrun.file_size(settings.limits.max_file_size)
                    async with self._opener.interpreter(with_file_size(policy, file_size)) as interpreter:
                        await interpreter.run(record, request, last=True)
        result = captured(record, interpreter, started)
        if overrun.reason is not None:
            return stopped_for_disk(result, overrun.reason, stopped=overrun.stopped)
        if deadline.cancelled_caught or interpreter is None or interpreter.outcome is None:
            return timed_out(result, request, "the sandbox and all its processes were killed")
        judged = judge_fresh(settings.limits, interpreter.outcome, record, result)
        return explain_file_size(settings.limits, overrun, judged)
