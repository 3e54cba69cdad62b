"""Session-ready sandboxes per host uid: a new session is born only of a sandbox of its own tenant's uid.

As the warm and pre-started pools are (:mod:`.uid_pools`): ``sandbox_uid``'s pool (the ``default``
tenant's, and every tenant's where all share one uid) is kept while the engine runs; another uid's
is made on its tenant's first conversation run (that run starts its session from nothing; the
pool's sandboxes start then), holds at most ``tenant_concurrent_runs`` (and ``session_ready``)
sandboxes, each on a slot of that uid, and is retired once no session of the uid has been born or
asked for one for ``pool_idle``: its idle sandboxes stop at once, those serving sessions when the
sessions end. A ready sandbox of one uid never serves another tenant.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskGroup, TaskStatus

from mcp_sandbox.config import Settings
from mcp_sandbox.engine.opening import Opener
from mcp_sandbox.engine.ready import ReadyPool, ReadySandbox

__all__ = ["ReadyByUid"]


@dataclass(eq=False)
class _UidReady:
    """One host uid's session-ready pool, when it was last asked for a sandbox, and its retirement."""

    pool: ReadyPool
    claims: int = 0  # claims of this uid in progress now
    used_at: float = field(default_factory=time.monotonic)
    retired: anyio.Event = field(default_factory=anyio.Event)


class ReadyByUid:
    """The session-ready pool of each host uid a conversation's run has come as; see the module docstring."""

    def __init__(self, settings: Settings, opener: Opener, *, zygotes: bool) -> None:
        """``zygotes``: the backend keeps warm sandboxes (and so session-ready ones)."""
        self._settings = settings
        self._opener = opener
        self._zygotes = zygotes
        self.default = ReadyPool(settings, opener, zygotes=zygotes)
        self._size = settings.admission.tenant_concurrent_runs or settings.admission.max_concurrent_runs
        self._others: dict[int, _UidReady] = {}
        self._group: TaskGroup | None = None

    def of(self, uid: int | None) -> ReadyPool | None:
        """The session-ready pool of ``uid`` (None: ``sandbox_uid``), if it has one now."""
        if uid is None:
            return self.default
        found = self._others.get(uid)
        return None if found is None else found.pool

    @property
    def idle(self) -> int:
        """Session-ready sandboxes of every uid idle now."""
        return self.default.idle + sum(entry.pool.idle for entry in list(self._others.values()))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ReadyByUid]:
        """Keep ``sandbox_uid``'s pool for this block, and other uids' when they come; all stop on the way out."""
        async with anyio.create_task_group() as group, self.default.running():
            if self._settings.pool.pool_idle > 0:
                group.start_soon(self._retire_idle)
            self._group = group
            try:
                yield self
            finally:
                self._group = None
                for entry in self._others.values():
                    entry.retired.set()
                self._others.clear()
                group.cancel_scope.cancel()

    async def claim(self, workspace: Path, tenant: str) -> ReadySandbox | None:
        """A ready sandbox of ``tenant``'s host uid whose ``/workspace`` is now ``workspace``, or None.

        See :meth:`.ReadyPool.claim`; the caller calls :meth:`settle` once the session's first run is over.

        Raises:
            SandboxStartError: the tenant is new and no uid can be given to it.
        """
        uid = await self._opener.host_uid(tenant)
        if uid is None:
            return await self.default.claim(workspace)
        if self._group is None:
            return None
        entry = self._others.get(uid)
        if entry is None:
            entry = self._others[uid] = _UidReady(
                ReadyPool(self._settings, self._opener, zygotes=self._zygotes, uid=uid, size=self._size)
            )
            await self._group.start(self._keep, entry)
        entry.claims += 1
        try:
            return await entry.pool.claim(workspace)
        finally:
            entry.claims -= 1
            entry.used_at = time.monotonic()

    def settle(self, ready: ReadySandbox) -> None:
        """After the first run of the session ``ready`` was claimed for (see :meth:`.ReadyPool.settle`)."""
        ready.pool.settle(ready)

    async def _keep(self, entry: _UidReady, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run ``entry``'s pool until it is retired (or the engine stops), then until its sessions have ended."""
        async with entry.pool.running():
            task_status.started()
            await entry.retired.wait()
            await entry.pool.retire()

    async def _retire_idle(self) -> None:
        """Retire the pool of each uid other than ``sandbox_uid`` no conversation has asked of for ``pool_idle``."""
        idle_for = self._settings.pool.pool_idle
        while True:
            await anyio.sleep(min(idle_for / 2, 60.0))
            now = time.monotonic()
            for uid, entry in list(self._others.items()):
                if entry.claims == 0 and now - entry.used_at >= idle_for:
                    del self._others[uid]  # the uid's next conversation makes a new one
                    entry.retired.set()
