"""A thin harness over the engine for the conformance suite.

Sandboxed attack code reports what happened as one JSON object on its last stdout line: the
:data:`PRELUDE` gives it a ``report`` dict and helpers that turn an attempt into a short,
comparable outcome such as ``"ok"``, ``"PermissionError:EPERM"`` or ``"EPERM"`` (raw syscalls).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import textwrap
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from mcp_sandbox.config import Settings
from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.engine.startup import engine_for
from mcp_sandbox.state import StateLayout
from mcp_test_helpers import host_processes

__all__ = [
    "HOST_BOUND",
    "PRELUDE",
    "RunnerFactory",
    "SandboxRunner",
    "host_processes",
    "left_in_runs",
    "report_of",
    "wait_until_gone",
    "wait_until_running",
]

# Added to a run's own timeout to bound the test's wait for execute(): start-up, teardown, a busy host.
HOST_BOUND = 15.0
# A run's timeout unless the test gives its own. The timeout counts the sandbox's start too: a cold
# podman start on CI's loaded host took over 5 s with the run's own work, and under emulation
# (`make vm-test`'s guest) a container takes 10-15 s to start, so its podman step sets
# MCP_SANDBOX_TEST_RUN_SECONDS. Tests that bound a timeout's precision pass their own.
RUN_SECONDS = float(os.environ.get("MCP_SANDBOX_TEST_RUN_SECONDS", "15"))
# How long a process the sandbox left behind may take to disappear after execute() returned.
GONE_BOUND = 5.0
_POLL = 0.05


def left_in_runs(settings: Settings) -> list[Path]:
    """What runs left in ``runs/`` (scratch workspaces of backends that bind a host directory for one).

    A running bwrap backend's copy of the host's ``/etc`` entries (``sandbox/backends/bwrap/etc.py``,
    ``<pid>-etc-<hex>``) is not a run's: it stays until the backend stops.
    """
    runs = settings.paths.state_dir / "runs"
    entries = list(runs.iterdir()) if runs.exists() else []
    return [entry for entry in entries if not re.fullmatch(r"\d+-etc-[0-9a-f]{32}", entry.name)]


# Runs inside the sandbox before each attack. Stdlib only; every helper reports, never raises.
PRELUDE = '''\
import ctypes, errno, json, os, sys
report = {}
_libc = ctypes.CDLL(None, use_errno=True)
zeros = ctypes.create_string_buffer(4096)

def outcome(action):
    """'ok', or 'ExceptionName:ERRNO' for the exception the attempt raised."""
    try:
        action()
    except Exception as exc:
        code = getattr(exc, "errno", None)
        return f"{type(exc).__name__}:{errno.errorcode.get(code, code)}" if code is not None else type(exc).__name__
    return "ok"

def syscall(number, *args):
    """A raw syscall: 'ok <result>' or the errno name it failed with."""
    ctypes.set_errno(0)
    result = _libc.syscall(ctypes.c_long(number), *(ctypes.c_long(a) if isinstance(a, int) else a for a in args))
    return f"ok {result}" if result != -1 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))

def forking_syscall(number, *args):
    """A raw syscall that creates a process if it succeeds (clone): the child exits at once."""
    parent = os.getpid()
    result = syscall(number, *args)
    if os.getpid() != parent:
        os._exit(0)
    return result

def channel_fds():
    """The sockets among this process's fds: the host channel is the only one."""
    import stat
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if stat.S_ISSOCK(os.fstat(int(name)).st_mode):
                found.append(int(name))
        except OSError:
            pass
    return found

'''

_POSTLUDE = "\nprint(json.dumps(report), flush=True)\n"


@dataclass(frozen=True, slots=True)
class SandboxRunner:
    """One engine on one backend, with the settings it was built from.

    ``warm``: each run is served by a warm sandbox (the engine runs, its pool has one ready);
    on a container backend, and for TypeScript and JavaScript everywhere, by a pre-started
    single-use sandbox. ``fork``: each Python run is the first of a session forked from a live
    one (its variables carried), in an engine of its own, which ends it. ``born``: each Python
    run is the first of a conversation's session born of a session-ready sandbox, in an engine of
    its own (bwrap only: the container backends keep none). ``resumed``: each Python run is the
    first of a conversation's session resumed from its parked state, in an engine of its own.
    """

    settings: Settings
    engine: Engine
    warm: bool = False
    fork: bool = False
    born: bool = False
    resumed: bool = False

    async def run(
        self, code: str, *, time_limit: float = RUN_SECONDS, workspace: Path | None = None
    ) -> ExecutionResult:
        """Run ``code`` (dedented, after the prelude); the wait is bounded."""
        request = ExecutionRequest(code=PRELUDE + textwrap.dedent(code), timeout=time_limit, workspace=workspace)
        return await self.execute(request)

    async def execute(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` as it is (in a warm sandbox when ``warm``); the wait is bounded."""
        language = request.language
        if self.fork and language == "python" and request.session is None:
            return await self._forked(request)
        if self.born and language == "python" and request.session is None:
            return await self._born(request)
        if self.resumed and language == "python" and request.session is None:
            return await self._resumed(request)
        with anyio.fail_after(request.timeout + HOST_BOUND):
            if not self.warm or request.workspace is not None:  # a conversation's is never a warm sandbox's
                return await self.engine.execute(request)
            # An engine per run: runs of one test may overlap, and each needs its own warm sandbox.
            # Python forks from a zygote where the backend keeps them; any other run, and every
            # run on a container backend, takes a pre-started sandbox.
            zygotes = self.engine.backend.warm_pool and language == "python"
            # A pre-started sandbox has the limits of the default timeout: this run's.
            settings = self.settings if zygotes else self.settings.replace(timeout=request.timeout)
            async with engine_for(settings, self.engine.backend).running() as engine:
                # The pools have no event to wait on.
                while (engine.pool.idle if zygotes else engine.prestart.ready(language)) == 0:
                    if not zygotes:
                        engine.prestart.fill(language)
                    await anyio.sleep(_POLL)
                result = await engine.execute(request)
                assert result.warm, "the run did not go to a warm sandbox"
                return result

    async def _forked(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` as the first run of a session forked from a live one that set a variable."""
        source, fork = f"source-{uuid.uuid4().hex}", f"fork-{uuid.uuid4().hex}"
        with anyio.fail_after(request.timeout + 3 * HOST_BOUND):
            async with engine_for(self.settings, self.engine.backend).running() as engine:
                started = await engine.execute(ExecutionRequest(code="carried = 1", timeout=HOST_BOUND, session=source))
                assert started.status == "success", started
                async with engine.fork_source(source, 1 << 20) as state:
                    assert isinstance(state, ForkState), f"the source's variables were not dumped: {state}"
                forked = dataclasses.replace(request, session=fork, fork_state=state)
                try:
                    result = await engine.execute(forked)
                finally:
                    state.close()
                if result.status != "error" or result.forked is not None:
                    assert result.forked is not None and result.forked.variables == 1, result
                return result

    async def _born(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` as the first run of a conversation's session, born of the one session-ready sandbox."""
        settings = self.settings.replace(session_ready=1, pool_size=0, pool_min=0, pool_preload="")
        workspace = request.workspace or _conversation_directory(settings)
        with anyio.fail_after(request.timeout + 3 * HOST_BOUND):
            async with engine_for(settings, self.engine.backend).running() as engine:
                engine.ready.wake()
                # The pool has no event to wait on.
                while engine.ready.idle == 0:  # noqa: ASYNC110
                    await anyio.sleep(_POLL)
                ready = engine.ready._idle[0]
                result = await engine.execute(
                    dataclasses.replace(request, session=f"born-{uuid.uuid4().hex}", workspace=workspace)
                )
                assert ready.claimed, "the run's session was not born of the session-ready sandbox"
                return result

    async def _resumed(self, request: ExecutionRequest) -> ExecutionResult:
        """Run ``request`` as the first run of a conversation's session resumed from its parked state
        (a variable set by a first run, the session then parked as at idle or a graceful stop)."""
        settings = self.settings.replace(session_ready=1, pool_size=0, pool_min=0, pool_preload="")
        workspace = request.workspace or _conversation_directory(settings)
        key = f"resumed-{uuid.uuid4().hex}"
        layout = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces)
        parked = ParkedStates(layout, secrets.token_bytes(32))
        with anyio.fail_after(request.timeout + 3 * HOST_BOUND):
            async with engine_for(settings, self.engine.backend).running(parked) as engine:
                first = ExecutionRequest(code="carried = 1", timeout=HOST_BOUND, session=key, workspace=workspace)
                started = await engine.execute(first)
                assert started.status == "success", started
                await engine.park_sessions()
                assert parked.exists(key), "the session was not parked"
                if engine.backend.warm_pool:  # bwrap: the resume is born of a session-ready sandbox
                    engine.ready.wake()
                    while engine.ready.idle == 0:  # noqa: ASYNC110 - the pool has no event to wait on
                        await anyio.sleep(_POLL)
                result = await engine.execute(dataclasses.replace(request, session=key, workspace=workspace))
                if result.status != "error" or result.session is not None:
                    assert result.session == "resumed", result
                    assert result.born or not engine.backend.warm_pool, "the resume was not born of a ready sandbox"
                return result

    async def report(
        self, code: str, *, time_limit: float = RUN_SECONDS, workspace: Path | None = None
    ) -> dict[str, Any]:
        """Run attack code that fills ``report``; it must finish successfully. Return the report."""
        result = await self.run_reporting(code, time_limit=time_limit, workspace=workspace)
        assert result.status == "success", f"{result.status}: {result.error}\n{result.stderr}"
        return report_of(result)

    async def run_reporting(
        self, code: str, *, time_limit: float = RUN_SECONDS, workspace: Path | None = None
    ) -> ExecutionResult:
        """Run attack code that fills ``report``, whatever the status; see :func:`report_of`."""
        return await self.run(textwrap.dedent(code) + _POSTLUDE, time_limit=time_limit, workspace=workspace)


def _conversation_directory(settings: Settings) -> Path:
    """A new conversation's workspace under the state directory, owned by the sandbox's uid as root."""
    workspace = settings.paths.state_dir / f"conversation-{uuid.uuid4().hex}"
    workspace.mkdir(mode=0o700, parents=True)
    if os.geteuid() == 0:
        os.chown(workspace, settings.sandbox.sandbox_uid, settings.sandbox.sandbox_gid)
    return workspace


RunnerFactory = Callable[..., SandboxRunner]  # make_sandbox(**settings flags)


def report_of(result: ExecutionResult) -> dict[str, Any]:
    """The report printed on the last stdout line of a run."""
    lines = result.stdout.strip().splitlines()
    assert lines, f"no report printed ({result.status}: {result.error}); stderr:\n{result.stderr}"
    parsed: dict[str, Any] = json.loads(lines[-1])
    return parsed


async def wait_until_gone(marker: str, bound: float = GONE_BOUND) -> list[int]:
    """Poll (bounded) until no host process carries ``marker``; return those still there."""
    with anyio.move_on_after(bound):
        # Polling the host's /proc: there is no event to wait on.
        while host_processes(marker):  # noqa: ASYNC110
            await anyio.sleep(_POLL)
    return host_processes(marker)


async def wait_until_running(marker: str, bound: float = HOST_BOUND) -> list[int]:
    """Poll (bounded) until a host process carries ``marker``; return their pids.

    Raises:
        TimeoutError: none appeared within ``bound`` seconds.
    """
    with anyio.fail_after(bound):
        while not (found := host_processes(marker)):  # noqa: ASYNC110 - as above
            await anyio.sleep(_POLL)
    return found
