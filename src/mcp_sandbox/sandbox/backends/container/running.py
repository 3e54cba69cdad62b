"""A running container sandbox: how it is ended and judged (started by ``sandbox.py``).

A container outlives its ``run`` client. Where it nests in a per-run cgroup of ours, its
processes are killed there and the ``run --rm`` client exits once the engine has removed it: no
``rm`` process per run. Otherwise, or when the client does not end so, it is ended by name
(``rm --force``, see ``engine.py``) once the client is gone. Its end is judged by that cgroup's
peaks, the container's own cgroup being gone by then; where the cgroup shows the runner alone,
its end is told early (``ending.py``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from pathlib import Path

import anyio

from mcp_sandbox.sandbox import kernfs
from mcp_sandbox.sandbox.backends.base import SandboxOutcome
from mcp_sandbox.sandbox.backends.container.aliases import remove_aliases
from mcp_sandbox.sandbox.backends.container.ending import MONITOR, ContainerRunner, container_runner
from mcp_sandbox.sandbox.backends.container.engine import ContainerEngine
from mcp_sandbox.sandbox.backends.process import ProcessSandbox
from mcp_sandbox.sandbox.cgroups import RunCgroup
from mcp_sandbox.sandbox.policy import Limits

__all__ = ["CIDFILE", "ContainerSandbox"]

CIDFILE = "cid"  # docker's client writes the container's id there once it is created
_CREATED_POLL = 0.01
# How the CLI exits when it failed itself (podman and docker alike): the container may not be removed.
_CLI_FAILURES = frozenset({125, 126, 127})


async def _ended(directory: Path) -> None:
    """Wait until the processes in cgroup ``directory`` have ended (none when it does not exist)."""
    try:
        pids = [int(pid) for pid in kernfs.read(directory / "cgroup.procs").split()]
    except OSError:
        return
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            await anyio.wait_readable(handle)  # a pidfd is readable once its process has ended
        finally:
            os.close(handle)


def _written(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


class ContainerSandbox(ProcessSandbox):
    """A running container (see :class:`mcp_sandbox.sandbox.backends.base.Sandbox`)."""

    teardown_seconds = 10.0
    _runner: ContainerRunner | None = None

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        channel: socket.socket,
        cgroup: RunCgroup | None,
        *,
        engine: ContainerEngine,
        name: str,
        limits: Limits,
        scratch: Path | None,
        aliases: Path,
    ) -> None:
        super().__init__(process, channel, cgroup)
        self.name = name
        self._engine = engine
        self._limits = limits
        self._scratch = scratch
        self._aliases = aliases

    async def _kill(self) -> None:
        if self._cgroup is not None and await self._ended_by_engine(self._cgroup):
            return
        # The client first, and gone: one still creating the container when a removal found
        # nothing yet would leave it created, never started. Then by name: the container outlives
        # its client (and the client may be gone already). Its processes are killed through our
        # cgroup at once: `rm` takes a while to start, and a run over its disk quota must stop now.
        await self._created()
        self._kill_session()
        if self._cgroup is not None:
            self._cgroup.kill_nested(spare=MONITOR)
        with anyio.move_on_after(self.teardown_seconds):
            await self._process.wait()
        await self._engine.remove([self.name])

    async def _ended_by_engine(self, cgroup: RunCgroup) -> bool:
        """End the container through our cgroup and let its client see the engine remove it (``--rm``).

        Its processes killed (a runner still starting finds its channel closed and ends), the
        container ends; an attached ``run --rm`` client waits until the engine has removed it
        (podman's client removes it itself, docker's waits for the daemon's removal) and exits
        with the container's status: no ``rm`` process per run. False (end it by name) when the
        client did not end so within the bound, or ended as the CLI does when it failed itself.
        podman's monitor, which runs the engine's clean-up command once the container has ended,
        is waited for too: removing our cgroup would kill it midway.
        """
        self.channel.close()
        cgroup.kill_nested(spare=MONITOR)
        with anyio.move_on_after(self.teardown_seconds):
            returncode = await self._process.wait()
            await _ended(Path(cgroup.procs_files[0]).parent / MONITOR)
            return returncode not in _CLI_FAILURES and returncode >= 0
        return False

    def watch_runner(self) -> None:
        if self._cgroup is not None:
            self._runner = container_runner(Path(self._cgroup.procs_files[0]).parent)

    def runner_ended(self) -> SandboxOutcome | None:
        """See :mod:`.ending`: needs our cgroup (to find the container's and see that nothing else runs)."""
        returncode = self._runner.ended() if self._runner is not None else None
        return None if returncode is None else self._judge(returncode)

    async def _created(self) -> None:
        """Wait until docker's client has its container created, or has ended; bounded.

        docker's engine goes on creating a container whose client is gone: a client killed while
        it waits for the create's answer leaves the container created just after the removal
        found no such name. The client creates ``--cidfile`` empty when it starts and writes the
        container's id there once the create has answered, so the removal that follows finds it.
        podman's client creates the container itself: killing it ends that.
        """
        if self._scratch is None:
            return
        cidfile = self._scratch / CIDFILE
        with anyio.move_on_after(self.teardown_seconds):
            while self._process.returncode is None and not _written(cidfile):  # noqa: ASYNC110 - a file has no event
                await anyio.sleep(_CREATED_POLL)

    def _release(self) -> None:
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        remove_aliases(self._aliases)

    def _judge(self, returncode: int) -> SandboxOutcome:
        # The container's own cgroup, where the kernel counts its kills, is gone: ours (its
        # parent) tells by its peaks.
        cgroup = self._cgroup
        memory, pids = self._limits.memory, self._limits.pids
        return SandboxOutcome(
            returncode=returncode,
            memory_exceeded=(cgroup.memory_exceeded() or cgroup.memory_peaked(memory)) if cgroup else False,
            pids_exhausted=cgroup.pids_peaked(pids) if cgroup else False,
        )
