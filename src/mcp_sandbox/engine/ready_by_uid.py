"""Session-ready sandboxes per host uid: a new session is born only of a sandbox of its own tenant's uid.

As the warm and pre-started pools are (:mod:`.pools_by_uid`): ``sandbox_uid``'s pool (the ``default``
tenant's, and every tenant's where all share one uid) is kept while the engine runs; another uid's
is made on its tenant's first conversation run (that run starts its session from nothing; the
pool's sandboxes start then), keeps ``session_ready`` sandboxes (at most
``tenant_concurrent_runs``), each on a slot of that uid, more while its tenant's new
conversations come faster (:mod:`.ready_sizing`: every uid's pool draws those from one budget,
``session_ready_burst``), and is retired once no session of the uid has been born or asked for
one for ``pool_idle``: its idle sandboxes stop at once, those serving sessions when the sessions
end. A ready sandbox of one uid never serves another tenant.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path

from mcp_sandbox.config import EngineSettings
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.ready import ReadyPool, ReadySandbox
from mcp_sandbox.engine.ready_sizing import ReadyBudget
from mcp_sandbox.engine.uid_registry import UidRegistry

__all__ = ["ReadyByUid"]


class ReadyByUid:
    """The session-ready pool of each host uid a conversation's run has come as; see the module docstring."""

    def __init__(self, settings: EngineSettings, opener: Opener, *, zygotes: bool) -> None:
        """``zygotes``: the backend keeps warm sandboxes (and so session-ready ones)."""
        self._settings = settings
        self._opener = opener
        self.budget = ReadyBudget(settings.sessions.session_ready_burst)
        sessions, sandbox = settings.sessions, settings.sandbox
        self.default = ReadyPool(sessions, sandbox, opener, zygotes=zygotes, budget=self.budget)
        size = settings.admission.tenant_concurrent_runs or settings.admission.max_concurrent_runs
        self._others = UidRegistry(
            lambda uid: ReadyPool(sessions, sandbox, opener, zygotes=zygotes, uid=uid, size=size, budget=self.budget),
            _kept,
            idle_for=settings.pool.pool_idle,
        )

    def of(self, uid: int | None) -> ReadyPool | None:
        """The session-ready pool of ``uid`` (None: ``sandbox_uid``), if it has one now."""
        return self.default if uid is None else self._others.get(uid)

    @property
    def idle(self) -> int:
        """Session-ready sandboxes of every uid idle now."""
        return self.default.idle + sum(pool.idle for pool in self._others.items())

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadyByUid]:
        """Keep ``sandbox_uid``'s pool for this block, and other uids' when they come; all stop on the way out."""
        async with self.default.running(), self._others.running():
            yield self

    async def claim(
        self, workspace: Path, tenant: str, lock: threading.Lock, *, preloaded: bool = True
    ) -> ReadySandbox | None:
        """A ready sandbox of ``tenant``'s host uid whose ``/workspace`` is now ``workspace``, or None.

        See :meth:`.ReadyPool.claim`; the caller calls :meth:`settle` once the session's first run is over.

        Raises:
            SandboxStartError: the tenant is new and no uid can be given to it.
        """
        uid = await self._opener.host_uid(tenant)
        if uid is None:
            return await self.default.claim(workspace, lock, preloaded=preloaded)
        async with self._others.use(uid) as entry:
            if entry is None:
                return None
            await entry.started.wait()
            return await entry.item.claim(workspace, lock, preloaded=preloaded)

    def settle(self, ready: ReadySandbox) -> None:
        """After the first run of the session ``ready`` was claimed for (see :meth:`.ReadyPool.settle`)."""
        ready.pool.settle(ready)


@contextlib.asynccontextmanager
async def _kept(pool: ReadyPool) -> AsyncIterator[None]:
    """Run ``pool``; once retired, its idle sandboxes stop at once and those serving sessions when they end."""
    async with pool.running():
        yield
        await pool.retire()
