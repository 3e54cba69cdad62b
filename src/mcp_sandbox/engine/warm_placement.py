"""The placement of a run in a warm sandbox: the request served by the zygote's forked child.

The pool (:mod:`.warm`) hands out an idle warm sandbox and takes it back; this module runs one
request in it under the request's limits, gives it back reusable or killed, and judges the run
as a fresh one.
"""

from __future__ import annotations

import dataclasses
import logging

import anyio

from mcp_sandbox.config import LimitSettings, WorkspaceSettings
from mcp_sandbox.engine.disk import DiskBound, Overrun
from mcp_sandbox.engine.interpreter import Exited
from mcp_sandbox.engine.placement import DEATH_SETTLE_SECONDS, tool_mounts
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.run_frames import RunRecord
from mcp_sandbox.engine.runtimes import limits_for
from mcp_sandbox.engine.verdict import captured, death, explain_file_size, judge_fresh, timed_out
from mcp_sandbox.engine.warm import WarmPool, fits_warm_sandbox
from mcp_sandbox.sandbox.backends import SandboxOutcome

__all__ = ["WarmPlacement"]

logger = logging.getLogger(__name__)


class WarmPlacement:
    """Runs a request in a warm sandbox's forked child (a :class:`~.placement.Placement`), judged as a fresh run.

    It is answered on the zygote's EXITED; the restore after it is the pool's, off the run's path.
    """

    def __init__(self, limits: LimitSettings, workspaces: WorkspaceSettings, pool: WarmPool, *, zygotes: bool) -> None:
        """``zygotes``: the backend keeps warm sandboxes (else this placement takes no run)."""
        self._limits, self._workspaces = limits, workspaces
        self._pool = pool
        self._zygotes = zygotes

    def accepts(self, request: ExecutionRequest) -> bool:
        """A Python run without a conversation or network, on a backend with warm sandboxes."""
        return self._zygotes and fits_warm_sandbox(request)

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult | None:
        """Run ``request`` in an idle warm sandbox; None if none came (see :meth:`WarmPool.take`)."""
        warm = await self._pool.take(preloaded=self._pool.needs_preload(request.code))
        if warm is None:
            return None
        limits = self._limits
        record = RunRecord.capped(limits.max_output, request.on_output)
        interpreter = warm.interpreter
        scratch = Overrun(DiskBound.scratch(limits, self._workspaces))  # wiped: all of it is left
        before = warm.limits
        after = before
        exited: Exited | None = None
        reusable = False
        cancelled = False
        try:
            with anyio.move_on_after(request.timeout) as deadline:
                await warm.tools.show(tool_mounts(request))
                interpreter.take_own_output()  # what came between runs is no run's
                exited = await interpreter.run_forked(
                    record,
                    request,
                    cpu_seconds=limits_for(limits, request.timeout).cpu_seconds,
                    guard=warm.guard,
                    file_size=scratch.file_size(limits.max_file_size),
                )
                after = interpreter.limit_events()
            reusable = exited is not None and exited.problem is None and not deadline.cancelled_caught
            if exited is not None and exited.problem is not None:
                logger.info("a warm sandbox is replaced: %s", exited.problem)
        except anyio.get_cancelled_exc_class():
            cancelled = True  # the caller gave up (the client cancelled or hung up): the run ends now
            raise
        finally:
            # Shielded: a cancelled run's sandbox is killed and handed back all the same, or its
            # processes outlive the run and the pool never sees the sandbox again.
            with anyio.CancelScope(shield=True):
                if not reusable:
                    if exited is None and not deadline.cancelled_caught and not cancelled:
                        with anyio.move_on_after(DEATH_SETTLE_SECONDS):  # the zygote died: let its outcome be known
                            await interpreter.exited.wait()
                    await interpreter.kill()
                self._pool.give_back(warm, reusable=reusable)
        result = dataclasses.replace(captured(record, interpreter, started), warm=True)
        if deadline.cancelled_caught:
            return timed_out(result, request, "the sandbox and all its processes were killed")
        if exited is None:
            outcome = interpreter.outcome or SandboxOutcome(returncode=-1)
            error = death(limits, outcome, record) or "the warm sandbox ended before reporting the run"
            return dataclasses.replace(result, status="error", exit_code=None, error=error)
        outcome = SandboxOutcome(
            returncode=exited.exit_code,
            memory_exceeded=after.memory > before.memory,
            pids_exhausted=after.pids > before.pids,
        )
        return explain_file_size(limits, scratch, judge_fresh(limits, outcome, record, result))
