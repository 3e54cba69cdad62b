"""A run in its conversation's session: the session's interpreter leased, the run's network and disk bound, the verdict.

The placement the engine picks for a Python run that names a session (see
:mod:`.placement`); the sessions themselves, their interpreters and leases are :mod:`.sessions`'.
"""

from __future__ import annotations

import contextlib
import dataclasses

import anyio

from mcp_sandbox.config import EngineSettings
from mcp_sandbox.egress import grant_environment, sandbox_environment
from mcp_sandbox.engine.disk import DiskBound, Overrun, disk_bound
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.parking import TAMPERED
from mcp_sandbox.engine.placement import Shared, tool_mounts
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult, SessionState
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.engine.runtimes import needs_preload
from mcp_sandbox.engine.sessions import Lease, SessionManager
from mcp_sandbox.engine.verdict import (
    STATE_LOST,
    captured,
    explain_file_size,
    judge_session,
    stopped_for_disk,
    timed_out,
)
from mcp_sandbox.errors import WorkspaceError

__all__ = ["SessionPlacement"]


class SessionPlacement:
    """Runs a request in its session's interpreter (a :class:`~.placement.Placement`)."""

    def __init__(self, settings: EngineSettings, sessions: SessionManager, opener: Opener, shared: Shared) -> None:
        self._settings = settings
        self._sessions = sessions
        self._opener = opener
        self._shared = shared

    def accepts(self, request: ExecutionRequest) -> bool:
        """A Python run naming a session, where sessions are on; granted network only if sessions hold a relay.

        JavaScript keeps no session: each of its runs is a fresh sandbox (on the conversation's workspace).
        """
        if request.session is None or not self._settings.sessions.sessions or request.language != "python":
            return False
        return request.egress is None or self._opener.session_relay

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult:
        """Run ``request`` in its session, starting the session's interpreter if it has none.

        Raises:
            WorkspaceError: the conversation's parked state failed its integrity check (deleted; its
                sandbox killed before it loaded any of it, nothing ran), or cannot be read.
        """
        assert request.session is not None
        settings = self._settings
        record = RunRecord.capped(settings.limits.max_output, request.on_output)
        lease: Lease | None = None
        overrun = Overrun(DiskBound.conversation(settings.workspaces))
        # Born of a session-ready sandbox only on a workspace no other run uses (the lease, which renames it, comes
        # first), of a ready sandbox of the tenant's own host uid (.ready_by_uid).
        born = request.workspace is not None and not self._shared(request.workspace)
        # A light one unless the code names a preloaded module or a fork's variables may need them.
        preloaded = request.fork_state is not None or needs_preload(settings.pool, request.code)
        with anyio.move_on_after(request.timeout) as deadline:
            async with (
                self._sessions.lease(
                    request.session,
                    workspace=request.workspace,
                    reset=request.reset,
                    tenant=request.tenant,
                    born=born,
                    preloaded=preloaded,
                ) as lease,
                disk_bound(request.workspace, overrun.bound) as overrun,
            ):
                try:
                    await lease.tools.show(tool_mounts(request))
                    lease.interpreter.take_own_output()  # what came between runs is no run's
                    async with contextlib.AsyncExitStack() as network:
                        run = request
                        if request.egress is not None:
                            await network.enter_async_context(self._opener.egress(request, lease.sockets))
                            proxies = {**sandbox_environment(request.language), **grant_environment(request.egress)}
                            environment = {**proxies, **request.environment}
                            run = dataclasses.replace(request, environment=environment)
                        file_size = overrun.file_size(settings.limits.max_file_size) if request.workspace else None
                        # A fork's first run: its source's variables; a resumed session's: its parked ones.
                        fork = (request.fork_state or lease.parked) if lease.new else None
                        await lease.interpreter.run(record, run, last=False, file_size=file_size, state=fork)
                        if lease.parked is not None and record.forked is not None:  # loaded: no longer needed
                            await self._sessions.unpark(request.session)
                finally:
                    if not record.done or record.protocol_error is not None:
                        # Cut short (timeout, cancelled), dead or confused: it cannot serve another run.
                        await lease.discard()
        if record.refused:  # its sandbox was killed before it loaded any of it
            unreadable = lease.parked.unreadable if lease is not None and lease.parked is not None else None
            raise WorkspaceError(unreadable or TAMPERED)  # kept if unreadable, else deleted
        if lease is None:  # the deadline passed while waiting for the session's previous run
            result = captured(record, None, started)
            return timed_out(
                result, request, "it was still waiting for the session's previous run to finish; nothing ran", None
            )
        state: SessionState = "new" if lease.new else "kept"
        if lease.new and lease.parked is not None and request.fork_state is None:
            state = "resumed"
        result = dataclasses.replace(
            captured(record, lease.interpreter, started), session=state, forked=record.forked, born=lease.born
        )
        if overrun.reason is not None and overrun.stopped:
            return stopped_for_disk(result, f"{overrun.reason}; {STATE_LOST}", state)
        if deadline.cancelled_caught:
            return timed_out(
                result, request, f"the session's interpreter and all its processes were killed: {STATE_LOST}", state
            )
        judged = judge_session(
            settings.limits, settings.sessions, record, result, outcome=lease.interpreter.outcome, ended=lease.ended
        )
        if overrun.reason is not None:
            return stopped_for_disk(judged, overrun.reason, state, stopped=False)
        return explain_file_size(settings.limits, overrun, judged)
