"""Opening sandboxes: their policies, a run's egress proxy, long-lived sandboxes with a ``/tools`` view.

Every placement and pool opens its sandboxes through one :class:`Opener`: a fresh run's
interpreter, a zygote (a warm or pre-started Python sandbox), a pre-started single-use sandbox,
a session's sandbox. It holds the backend, the state directory's layout, what a run may send the
host (:class:`.run_frames.RunCaps`, built from the settings by :func:`run_caps`) and the egress
audit log, opened on the first run granted network.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from mcp_sandbox.config import DEFAULT_TENANT, CodeModeSettings, EngineSettings, LimitSettings
from mcp_sandbox.egress import (
    AuditLog,
    Resolver,
    TenantEgress,
    remove_socket_directory,
    serve_egress,
    socket_directory,
    system_resolver,
)
from mcp_sandbox.engine.interpreter import Interpreter, open_interpreter
from mcp_sandbox.engine.result import ExecutionRequest
from mcp_sandbox.engine.run_frames import RunCaps
from mcp_sandbox.engine.runtimes import policy_for, python_policy, with_egress, with_file_size, zygote_policy
from mcp_sandbox.engine.scratch import remove_shielded, scratch_workspace
from mcp_sandbox.engine.tools_view import ToolsView
from mcp_sandbox.errors import ConfigError, SandboxStartError
from mcp_sandbox.events import Observer, PoolStarted, unheard
from mcp_sandbox.sandbox.backends import Backend
from mcp_sandbox.sandbox.policy import Mount, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import zygote_guard_bpf
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids

if TYPE_CHECKING:
    from mcp_sandbox.egress.authority import Authority

__all__ = ["MakePolicy", "Opener", "run_caps", "zygote_guard"]

logger = logging.getLogger(__name__)

# A long-lived sandbox's policy for its workspace (None: the backend's sized scratch) and its /tools mounts.
MakePolicy = Callable[[Path | None, tuple[Mount, ...]], SandboxPolicy]


def run_caps(limits: LimitSettings, code_mode: CodeModeSettings) -> RunCaps:
    """What a run may send the host, from the settings: the one place an interpreter's limits come from."""
    return RunCaps(
        max_images=limits.max_images,
        max_image_bytes=limits.max_image_bytes,
        max_call_bytes=code_mode.max_call_bytes,
        max_calls_in_flight=code_mode.max_calls_in_flight,
    )


def zygote_guard(interpreter: Interpreter) -> bytes:
    """The seccomp guard of the runs of ``interpreter``'s zygote (see :func:`zygote_guard_bpf`).

    Raises:
        SandboxStartError: the zygote cannot serve runs (it says why in its READY).
    """
    ready = interpreter.ready
    if not ready.zygote or ready.problem or ready.pid is None or ready.pid < 1:
        said = ready.problem if ready.problem is not None else ready.encode()
        raise SandboxStartError(f"the warm sandbox cannot serve runs: {said}")
    return zygote_guard_bpf(ready.pid)


class Opener:
    """Opens the engine's sandboxes on ``backend``; see the module docstring."""

    def __init__(
        self,
        settings: EngineSettings,
        backend: Backend,
        *,
        egress_resolver: Resolver = system_resolver,
        emit: Observer = unheard,
        layout: StateLayout,
        uids: TenantUids,
        egress: TenantEgress,
    ) -> None:
        """``egress_resolver``: how the egress proxy resolves names (tests give a table of their own hosts).

        ``emit``: hears each egress connection's end and each sandbox a pool starts (metrics).
        ``layout``, ``uids``, ``egress``: the state directory, the tenants' host uids and egress rules,
        each built once at start and shared with the rest of the server.
        """
        self.settings = settings
        self._emit = emit
        self.backend = backend
        self.layout = layout
        self.caps = run_caps(settings.limits, settings.code_mode)
        self.tenant_uids = uids
        self._egress_resolver = egress_resolver
        self._audit: AuditLog | None = None
        # The CA of the hosts a secret goes to: made once per server start, its key only in memory.
        self._authority: Authority | None = None
        if settings.egress.secrets:
            from mcp_sandbox.egress.authority import Authority  # cryptography.x509: only with secrets

            self._authority = Authority(settings.egress.egress_upstream_ca)
        # Sessions' sandboxes can hold a relay only where some tenant may be granted network.
        self.session_relay = egress.anywhere()

    async def close_egress(self) -> None:
        """Close the egress proxy's kept connections to the hosts a secret goes to (at the engine's end)."""
        if self._authority is not None:
            await self._authority.pool.aclose()

    async def host_uid(self, tenant: str) -> int | None:
        """The host uid of ``tenant``'s sandboxes when it is not ``sandbox_uid`` (see :mod:`mcp_sandbox.tenant_uids`).

        Raises:
            SandboxStartError: the tenant is new and no uid can be given to it.
        """
        if self.tenant_uids.is_default(tenant):
            return None
        if (known := self.tenant_uids.known(tenant)) is not None:  # no worker thread's round trip on each run
            return known
        try:
            return await anyio.to_thread.run_sync(self.tenant_uids.uid, tenant)
        except (OSError, ConfigError) as exc:
            logger.error("cannot give tenant %r a host uid: %s", tenant, exc)
            raise SandboxStartError(f"this tenant's sandbox cannot be given its host uid: {exc}") from None

    def interpreter(self, policy: SandboxPolicy) -> AbstractAsyncContextManager[Interpreter]:
        """A sandbox of ``policy`` running the runner, READY (see :func:`.interpreter.open_interpreter`)."""
        return open_interpreter(self.backend, policy, self.caps)

    def pool_started(self, pool: str, language: str) -> None:
        """Tell the observers a pool (``warm``, ``prestarted``) started a sandbox of ``language``."""
        self._emit(PoolStarted(pool, language))

    def sandbox_group(self) -> int | None:
        """The host gid given the proxy's socket: the sandbox's when the server runs as root, else None."""
        return self.settings.sandbox.sandbox_gid if os.geteuid() == 0 else None

    @contextlib.asynccontextmanager
    async def egress(self, request: ExecutionRequest, directory: Path | None) -> AsyncIterator[Path]:
        """The run's egress proxy for this block (in ``directory``, else a new one); yield the socket's directory."""
        assert request.egress is not None
        if self._audit is None:
            self._audit = AuditLog.open(self.layout.egress_log)
        served = serve_egress(
            self.layout.prepare_runs(),
            request.egress,
            self._audit,
            resolver=self._egress_resolver,
            group=self.sandbox_group(),
            directory=directory,
            emit=self._emit,
            authority=self._authority,
        )
        async with served as (_proxy, used):
            yield used

    @contextlib.asynccontextmanager
    async def long_lived(
        self, workspace: Path | None, make_policy: MakePolicy, uid: int | None = None
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """A sandbox with a /tools view: its interpreter, that view, its workspace (a scratch one when None).

        The workspace is None when the backend gives the sandbox a sized scratch space of its own.
        ``uid``: the host uid it runs as (see :meth:`host_uid`; None: ``sandbox_uid``).
        """
        async with contextlib.AsyncExitStack() as stack:
            if workspace is None and not self.backend.sized_scratch:
                workspace = await stack.enter_async_context(scratch_workspace(self.layout, self.settings.sandbox, uid))
            self.layout.prepare_runs()
            tools = ToolsView.create(self.layout)
            stack.push_async_callback(remove_shielded, tools.directory)
            policy = dataclasses.replace(make_policy(workspace, tools.mounts()), host_uid=uid)
            interpreter = await stack.enter_async_context(self.interpreter(policy))
            yield interpreter, tools, workspace

    @contextlib.asynccontextmanager
    async def zygote(
        self, uid: int | None = None, *, preload: Sequence[str] | None
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None, bytes]]:
        """A Python sandbox whose zygote is READY: its interpreter, /tools view, workspace and runs' seccomp guard.

        The zygote imports ``preload`` (None: ``pool_preload``); its scratch workspace is as
        :meth:`long_lived` gives it, and so is ``uid``.

        Raises:
            SandboxStartError: it did not start, or its zygote cannot fork safely.
        """
        settings = self.settings

        def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            return zygote_policy(settings, workspace=workspace, mounts=mounts, preload=preload)

        async with self.long_lived(None, policy, uid) as (interpreter, tools, workspace):
            yield interpreter, tools, workspace, zygote_guard(interpreter)

    @contextlib.asynccontextmanager
    async def single_use(
        self, language: str, uid: int | None = None
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """A sandbox for one run of ``language`` with the default timeout's limits, READY, waiting for its EXEC.

        ``uid``: the host uid it runs as, as :meth:`long_lived` takes it.

        Raises:
            SandboxStartError: it did not start.
        """
        settings = self.settings

        def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
            return policy_for(settings, language, workspace=workspace, timeout=settings.limits.timeout, mounts=mounts)

        async with self.long_lived(None, policy, uid) as (interpreter, tools, workspace):
            interpreter.sandbox.watch_runner()  # READY: no code has run in it yet
            yield interpreter, tools, workspace

    def session_policy(
        self, workspace: Path | None, mounts: tuple[Mount, ...], sockets: Path | None = None
    ) -> SandboxPolicy:
        """The policy of a session's sandbox on ``workspace``, holding a relay when ``sockets`` is given."""
        settings = self.settings
        made = python_policy(
            settings, workspace=workspace, timeout=settings.limits.max_timeout, mounts=mounts, session=True
        )
        if workspace is not None:  # no file of its may outgrow the quota (each run lowers its own limit)
            made = with_file_size(made, min(made.limits.file_size, settings.workspaces.quota_bytes))
        return made if sockets is None else with_egress(made, sockets, for_life=False)

    @contextlib.asynccontextmanager
    async def ready_session(
        self, slot: Path, uid: int | None = None, *, preloaded: bool = True
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """A session's sandbox started ahead: a session's policy on ``slot``, as ``uid``, its runner READY.

        The runner imports ``pool_preload`` first if ``preloaded`` (else nothing), then serves the
        session's runs itself (``runner.py --ready``, see :mod:`.ready`). Yields what
        :meth:`session` does: the interpreter, its /tools view and the relay's socket directory.

        Raises:
            SandboxStartError: it did not start.
        """
        preload = ",".join(self.settings.pool.pool_preload) if preloaded else ""
        async with contextlib.AsyncExitStack() as stack:
            sockets = self._relay_sockets(stack)

            def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
                made = self.session_policy(workspace, mounts, sockets)
                return dataclasses.replace(made, command=(*made.command, f"--ready={preload}"))

            interpreter, tools, _ = await stack.enter_async_context(self.long_lived(slot, policy, uid))
            yield interpreter, tools, sockets

    def _relay_sockets(self, stack: contextlib.AsyncExitStack) -> Path | None:
        """Where network may be granted, a session's (empty) directory for the proxy's socket; ``stack`` removes it."""
        if not self.session_relay:
            return None
        sockets = socket_directory(self.layout.prepare_runs(), self.sandbox_group())
        stack.callback(remove_socket_directory, sockets)
        return sockets

    @contextlib.asynccontextmanager
    async def session(
        self, workspace: Path | None, tenant: str = DEFAULT_TENANT
    ) -> AsyncIterator[tuple[Interpreter, ToolsView, Path | None]]:
        """A session's sandbox on ``workspace`` (None: a scratch one), as ``tenant``'s host uid:
        interpreter, /tools, relay's socket directory.

        Where network may be granted (:attr:`session_relay`), it holds the relay and an (empty)
        directory for the proxy's socket for life (None otherwise); the socket itself exists only
        during its runs granted network (see :meth:`egress`).
        """
        uid = await self.host_uid(tenant)
        async with contextlib.AsyncExitStack() as stack:
            sockets = self._relay_sockets(stack)

            def policy(workspace: Path | None, mounts: tuple[Mount, ...]) -> SandboxPolicy:
                return self.session_policy(workspace, mounts, sockets)

            interpreter, tools, _ = await stack.enter_async_context(self.long_lived(workspace, policy, uid))
            yield interpreter, tools, sockets
