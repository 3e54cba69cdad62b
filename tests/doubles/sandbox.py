"""A sandbox backend with no isolation: the in-sandbox runner as a plain child process, for tests.

It runs the same runner (``runners/python/boot.py``) with the same frames on the same channel as
bwrap does, so the engine's routing, its verdicts and the server's results can be tested without
bwrap or a built runtime. It confines nothing: whatever checks isolation or limits runs on a real
backend (tests/sandbox, tests/containers). It loads only under pytest.

Paths of the policy's command are mapped back from the sandbox's mounts to the host's, the
interpreter is this one (``sys.executable``), and the process runs in the run's workspace. A
zygote (a warm or pre-started Python sandbox) is refused: it empties ``/tmp``, ``/dev/shm`` and
``/workspace`` of the machine it runs on, which only a sandbox's own mount namespace makes safe.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator

from mcp_sandbox.errors import SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe
from mcp_sandbox.sandbox.backends.process import ProcessSandbox, launch
from mcp_sandbox.sandbox.policy import SandboxPolicy

if "pytest" not in sys.modules:  # pragma: no cover - the guard itself
    raise ImportError("tests/doubles/sandbox.py runs code with no isolation: it is for the test suite only")

__all__ = ["PlainProcessBackend", "PlainProcessSandbox"]


class PlainProcessSandbox(ProcessSandbox):
    """The runner's process in a session of its own; closing kills that session."""

    async def _kill(self) -> None:
        self._kill_session()


class PlainProcessBackend:
    """A :class:`~mcp_sandbox.sandbox.backends.base.Backend` that starts the runner unconfined."""

    name = "plain-process"
    warm_pool = False  # no zygotes (see the module docstring)
    sized_scratch = False  # the engine gives a run without a workspace a scratch directory

    def __init__(self) -> None:
        self.started: list[SandboxPolicy] = []  # every policy started, in order

    def probe(self) -> BackendProbe:
        return BackendProbe(self.name, available=True, version="test double")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[PlainProcessBackend]:
        yield self

    async def start(self, policy: SandboxPolicy) -> PlainProcessSandbox:
        if any(argument.startswith("--zygote") for argument in policy.command):
            raise SandboxStartError("the test double runs no zygote: it would empty this machine's /tmp")
        if policy.language != "python":
            raise SandboxStartError(f"the test double runs only the Python runner, not {policy.language}")
        self.started.append(policy)
        command = [sys.executable, *(self._host_path(policy, argument) for argument in policy.command[1:])]
        host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        workspace = policy.workspace
        try:
            process = await launch(
                [*command, str(sandbox_end.fileno())],
                what="the runner as a plain process",
                env=dict(policy.environment),
                pass_fds=(sandbox_end.fileno(),),
                preexec_fn=(lambda: os.chdir(workspace)) if workspace is not None else None,
            )
        except BaseException:
            host_end.close()
            raise
        finally:
            sandbox_end.close()
        return PlainProcessSandbox(process, host_end, None)

    @staticmethod
    def _host_path(policy: SandboxPolicy, argument: str) -> str:
        """``argument`` with a path inside the sandbox turned into the host path mounted there."""
        for mount in sorted(policy.mounts, key=lambda m: len(m.target), reverse=True):
            if argument == mount.target or argument.startswith(mount.target + "/"):
                return str(mount.source) + argument[len(mount.target) :]
        return argument
