"""Warm and pre-started sandboxes per host uid: a run takes only a sandbox of its own tenant's uid.

Where tenants run as host uids of their own (:mod:`mcp_sandbox.tenant_uids`), a sandbox of one uid
never serves another tenant. ``sandbox_uid``'s pools (the ``default`` tenant's, and every tenant's
where all share one uid) start with the engine as before. Another uid's warm and pre-started pools
are made on its tenant's first run, hold at most ``tenant_concurrent_runs`` sandboxes each (more
could never serve that tenant at once; ``pool_min`` of them kept while the pools live), and are
retired whole once no run of the uid has come for ``pool_idle``. So one busy tenant's pools take no
sandbox from another's, and the memory they hold is ``sandbox_uid``'s pools plus, per tenant that
ran in the last ``pool_idle``, at most ``tenant_concurrent_runs`` warm and as many pre-started
sandboxes per language it ran. Every pool stops with the engine.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio

from mcp_sandbox.config import AdmissionSettings, EngineSettings, PoolSettings
from mcp_sandbox.engine.opener import Opener
from mcp_sandbox.engine.placement import Placement
from mcp_sandbox.engine.prestart import DEFAULT_SIZES, PrestartPlacement, PrestartPool
from mcp_sandbox.engine.result import ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.uid_registry import UidRegistry
from mcp_sandbox.engine.warm import WarmPool
from mcp_sandbox.engine.warm_placement import WarmPlacement

__all__ = ["PoolsByUid", "UidPools", "tenant_pool_settings"]


def tenant_pool_settings(pool: PoolSettings, admission: AdmissionSettings) -> PoolSettings:
    """The pool settings of a tenant uid's pools: each holds at most ``tenant_concurrent_runs`` sandboxes."""
    cap = admission.tenant_concurrent_runs or admission.max_concurrent_runs
    size = min(pool.pool_size, cap)
    prestart = pool.prestart_size if pool.prestart_size is not None else max(DEFAULT_SIZES.values())
    return dataclasses.replace(
        pool, pool_size=size, pool_min=min(pool.pool_min, size), prestart_size=min(prestart, cap)
    )


@dataclass(eq=False)
class UidPools:
    """One host uid's warm and pre-started pools, and the placements that take from them."""

    uid: int | None  # None: sandbox_uid
    warm: WarmPool
    prestart: PrestartPool
    placements: dict[str, Placement]
    zygotes: bool  # the backend keeps warm sandboxes

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Keep both pools for this block."""
        async with contextlib.AsyncExitStack() as stack:
            if self.zygotes:
                await stack.enter_async_context(self.warm.running())
            await stack.enter_async_context(self.prestart.running())
            yield


class PoolsByUid:
    """The pools of each host uid runs have come as; see the module docstring."""

    def __init__(self, settings: EngineSettings, opener: Opener, *, zygotes: bool) -> None:
        """``zygotes``: the backend keeps warm sandboxes."""
        self.settings = settings
        self._opener = opener
        self._zygotes = zygotes
        tenant_pool = tenant_pool_settings(settings.pool, settings.admission)
        self.default = self._make(None, settings.pool)
        self._others = UidRegistry(
            lambda uid: self._make(uid, tenant_pool), UidPools.running, idle_for=tenant_pool.pool_idle
        )

    def _make(self, uid: int | None, pool: PoolSettings) -> UidPools:
        warm = WarmPool(pool, self._opener, uid)
        prestart = PrestartPool(pool, self._opener, uid)
        limits, workspaces = self.settings.limits, self.settings.workspaces
        placements: dict[str, Placement] = {
            "warm": WarmPlacement(limits, workspaces, warm, zygotes=self._zygotes),
            "prestarted": PrestartPlacement(limits, workspaces, prestart, zygotes=self._zygotes),
        }
        return UidPools(uid, warm, prestart, placements, self._zygotes)

    def all(self) -> list[UidPools]:
        """Every uid's pools now, ``sandbox_uid``'s first (a copy: the metrics read it from a worker thread)."""
        return [self.default, *self._others.items()]

    def of(self, uid: int | None) -> UidPools | None:
        """The pools of ``uid`` (None: ``sandbox_uid``), if it has some now."""
        return self.default if uid is None else self._others.get(uid)

    @property
    def warm_size(self) -> int:
        """Warm sandboxes of every uid, starting, idle or serving a run."""
        return sum(pools.warm.size for pools in self.all())

    @property
    def warm_idle(self) -> int:
        """Warm sandboxes of every uid idle now."""
        return sum(pools.warm.idle for pools in self.all())

    @property
    def prestarted_size(self) -> int:
        """Pre-started sandboxes of every uid and language, starting, ready or serving a run."""
        return sum(pools.prestart.size(language) for pools in self.all() for language in DEFAULT_SIZES)

    @property
    def prestarted_ready(self) -> int:
        """Pre-started sandboxes of every uid and language waiting for a run."""
        return sum(pools.prestart.ready(language) for pools in self.all() for language in DEFAULT_SIZES)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PoolsByUid]:
        """Keep ``sandbox_uid``'s pools for this block, and other uids' when they come; all stop on the way out."""
        async with self.default.running(), self._others.running():
            yield self

    def placement(self, name: str) -> Placement:
        """The placement ``name`` (``warm``, ``prestarted``) of the pools of each run's tenant's uid."""
        return _ByUid(self, name)

    @contextlib.asynccontextmanager
    async def lease(self, tenant: str) -> AsyncIterator[UidPools | None]:
        """The pools of ``tenant``'s host uid for one run (made on its first); None: the engine is not running.

        Raises:
            SandboxStartError: the tenant is new and no uid can be given to it.
        """
        if not self._others.running_now:  # not running (or stopped meanwhile): the run starts its own sandbox
            yield None
            return
        uid = await self._opener.host_uid(tenant)
        if uid is None:
            yield self.default
            return
        async with self._others.use(uid) as entry:
            if entry is not None:
                with anyio.move_on_after(1.0):  # entering the pools starts nothing it waits for
                    await entry.started.wait()
            yield None if entry is None else entry.item


class _ByUid:
    """A placement (``warm`` or ``prestarted``) that runs each request in its tenant's uid's pools."""

    def __init__(self, pools: PoolsByUid, name: str) -> None:
        self._pools = pools
        self._name = name
        self._accepts: Callable[[ExecutionRequest], bool] = pools.default.placements[name].accepts

    def accepts(self, request: ExecutionRequest) -> bool:
        """As the placement of ``sandbox_uid``'s pools (which runs it may take does not depend on the uid)."""
        return self._accepts(request)

    async def run(self, request: ExecutionRequest, started: float) -> ExecutionResult | None:
        """Run ``request`` in a sandbox of its tenant's uid; None if none came (then it starts its own)."""
        async with self._pools.lease(request.tenant) as pools:
            if pools is None:
                return None
            return await pools.placements[self._name].run(request, started)
