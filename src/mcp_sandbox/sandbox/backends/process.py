"""What a sandbox that is one host process tree does on every backend: launch, wait, close.

A backend supplies the small parts that differ (:class:`ProcessSandbox`'s hooks): how the tree
is killed, what else is released, and how its end is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Sequence

import anyio

from mcp_sandbox.errors import SandboxStartError
from mcp_sandbox.sandbox.backends.base import LimitEvents, SandboxOutcome
from mcp_sandbox.sandbox.cgroups import CgroupSupport, RunCgroup
from mcp_sandbox.sandbox.policy import Limits

__all__ = ["ProcessSandbox", "launch", "run_cgroup"]

_STREAM_LIMIT = 1 << 20


def run_cgroup(support: CgroupSupport, limits: Limits, *, nested: bool = False) -> RunCgroup:
    """A new cgroup for one sandbox, with its limits written; the caller removes it. ``nested``:
    a container runtime puts its own cgroup in it (the controllers are enabled for children).

    Raises:
        SandboxStartError: the cgroup filesystem refused.
    """
    try:
        group = RunCgroup.create(support, limits)
    except OSError as exc:
        raise SandboxStartError(f"cannot create the sandbox's cgroup: {exc}") from exc
    if nested:
        group.nested = True
        try:
            group.enable_for_children()
        except OSError as exc:
            group.remove()
            raise SandboxStartError(f"cannot enable the sandbox cgroup's controllers for a container: {exc}") from exc
    return group


async def launch(
    command: Sequence[str],
    *,
    what: str,
    env: dict[str, str],
    pass_fds: Sequence[int],
    preexec_fn: Callable[[], None] | None = None,
    stdin: int = subprocess.DEVNULL,
) -> asyncio.subprocess.Process:
    """Start a sandbox's first host process in a session of its own, stdout and stderr piped.

    Without a ``preexec_fn`` Python spawns it with vfork, and the server's event loop does not wait
    for a fork of the whole server (see :mod:`mcp_sandbox.sandbox.launcher`).

    Raises:
        SandboxStartError: it could not be started (``what`` names it in the message).
    """
    # Shielded: cancelled once the process exists, asyncio kills only that process (not its
    # session: a container CLI's children, a container half created) and loses it, so the caller
    # could not undo the start. Spawning is quick; the caller's next await sees the
    # cancellation, with the process in hand.
    with anyio.CancelScope(shield=True):
        try:
            # asyncio under anyio: anyio.open_process has no preexec_fn, and the container backend needs one.
            process = await asyncio.create_subprocess_exec(
                *command,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                env=env,
                start_new_session=True,
                preexec_fn=preexec_fn,
                limit=_STREAM_LIMIT,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise SandboxStartError(f"cannot start {what}: {exc}") from exc
    return process


class ProcessSandbox:
    """A running sandbox whose host side is one process (see :class:`~.base.Sandbox`).

    Subclasses say how the tree is killed (:meth:`_kill`), what else is released once it is
    gone (:meth:`_release`) and how its end is judged (:meth:`_judge`).
    """

    teardown_seconds = 5.0

    def __init__(self, process: asyncio.subprocess.Process, channel: socket.socket, cgroup: RunCgroup | None) -> None:
        assert process.stdout is not None and process.stderr is not None
        self.stdout: asyncio.StreamReader = process.stdout
        self.stderr: asyncio.StreamReader = process.stderr
        self.channel = channel
        self._process = process
        self._cgroup = cgroup
        self._outcome: SandboxOutcome | None = None

    @property
    def pid(self) -> int:
        """The host pid of the sandbox's outer process (bwrap's; for memory accounting in benchmarks)."""
        return self._process.pid

    async def wait(self) -> SandboxOutcome:
        return self._judge(await self._process.wait())

    def limit_events(self) -> LimitEvents:
        if self._cgroup is None:
            return LimitEvents()
        memory, pids = self._cgroup.events()
        return LimitEvents(memory=memory, pids=pids)

    def judge(self, returncode: int) -> SandboxOutcome:
        return self._judge(returncode)

    def watch_runner(self) -> None:
        """Nothing to note: a backend that can tell overrides this and :meth:`runner_ended`."""

    def runner_ended(self) -> SandboxOutcome | None:
        return None

    async def aclose(self) -> SandboxOutcome:
        if self._outcome is not None:
            return self._outcome
        with anyio.CancelScope(shield=True):
            await self._kill()
            returncode = -signal.SIGKILL
            with anyio.move_on_after(self.teardown_seconds):
                returncode = await self._process.wait()
            outcome = self._judge(returncode)
            self.channel.close()
            if self._cgroup is not None:
                await self._cgroup.aremove()
            self._release()
            self._outcome = outcome
        return outcome

    # --- hooks --------------------------------------------------------------------------------

    async def _kill(self) -> None:
        """Kill the whole tree, orphans included (called shielded, once)."""
        raise NotImplementedError

    def _release(self) -> None:
        """Release what else the sandbox holds, once its tree is gone."""

    def _judge(self, returncode: int) -> SandboxOutcome:
        """The outcome of a tree that ended with ``returncode``, by the cgroup's counters."""
        cgroup = self._cgroup
        return SandboxOutcome(
            returncode=returncode,
            memory_exceeded=cgroup.memory_exceeded() if cgroup else False,
            pids_exhausted=cgroup.pids_exhausted() if cgroup else False,
        )

    def _kill_session(self) -> None:
        """SIGKILL the first process's session (its process group)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
