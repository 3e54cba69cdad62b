"""The bubblewrap sandbox and backend: unprivileged namespaces + seccomp + cgroups + rlimits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox.config import LimitSettings, PathSettings, SandboxSettings
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox import gate as gate_program
from mcp_sandbox.sandbox.backends.base import BackendProbe, SandboxOutcome
from mcp_sandbox.sandbox.backends.bwrap.argv import args_file, bwrap_argv, etc_entries, find_bwrap
from mcp_sandbox.sandbox.backends.bwrap.etc import EtcCopies
from mcp_sandbox.sandbox.backends.bwrap.probe import probe_bwrap
from mcp_sandbox.sandbox.backends.process import ProcessSandbox, launch, run_cgroup
from mcp_sandbox.sandbox.backends.runner import Runner, find_runner
from mcp_sandbox.sandbox.cgroups import CgroupSupport, RunCgroup, detect_cgroups, sweep_stale
from mcp_sandbox.sandbox.launcher import LaunchSpec, admit, gated, open_gate
from mcp_sandbox.sandbox.nproc import nproc_limit
from mcp_sandbox.sandbox.policy import Limits, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import compiled_bpf
from mcp_sandbox.state import StateLayout

__all__ = ["BwrapBackend", "BwrapSandbox"]

logger = logging.getLogger(__name__)


class BwrapSandbox(ProcessSandbox):
    """A running bwrap sandbox (see :class:`mcp_sandbox.sandbox.backends.base.Sandbox`)."""

    _runner: Runner | None = None

    def watch_runner(self) -> None:
        self._runner = find_runner(self.pid)

    def runner_ended(self) -> SandboxOutcome | None:
        """See :mod:`..runner`: needs the cgroup (to see that nothing else runs in the sandbox)."""
        if self._runner is None or self._cgroup is None:
            return None
        returncode = self._runner.ended(self._cgroup.procs_files[0])
        return None if returncode is None else self._judge(returncode)

    async def _kill(self) -> None:
        # The outer bwrap leads its own session; its death takes the sandbox's pid namespace
        # (and every orphan in it) with it through --die-with-parent. The cgroup is the backstop.
        self._kill_session()
        if self._cgroup is not None:
            self._cgroup.kill()


# First processes kept admitted ahead of the starts by a running backend (see BwrapBackend.running).
SPARES = 2


def _fill(fd: int, data: bytes) -> None:
    """Write ``data`` to the empty memfd ``fd`` and rewind it for the reader that shares its offset."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)


@dataclass(eq=False)
class _Gate:
    """A sandbox's first process, started and admitted to its cgroups before its policy is known.

    It waits at its gate (see ``sandbox/launcher.py``), about to drop to the sandbox's uid and exec
    ``bwrap --args <options> --``, holding the sandbox's end of the channel and two empty memfds
    (the seccomp filter, bwrap's options) that :meth:`BwrapBackend._go` fills from the policy.
    """

    process: asyncio.subprocess.Process
    gate: int  # the gate pipe's write end; -1 once opened or closed
    cgroup: RunCgroup | None
    limits: Limits  # what the cgroup holds now
    host_end: socket.socket
    sandbox_end: socket.socket
    seccomp_fd: int
    options_fd: int
    uid: int | None  # the host uid it drops to at its gate (None: ours): it serves only policies of it

    def release_fds(self) -> None:
        """Close what only the sandbox's process needs (it holds its own copies). Idempotent."""
        self.sandbox_end.close()
        for fd in (self.seccomp_fd, self.options_fd):
            if fd >= 0:
                os.close(fd)
        self.seccomp_fd = self.options_fd = -1

    async def discard(self) -> None:
        """End the process at its closed gate (if it is still there), reap it, release everything. Never raises."""
        with anyio.CancelScope(shield=True):
            if self.gate >= 0:
                gate, self.gate = self.gate, -1
                with contextlib.suppress(OSError):
                    open_gate(gate, admitted=False)
            with anyio.move_on_after(5):
                await self.process.wait()
            self.release_fds()
            self.host_end.close()
            if self.cgroup is not None:
                await self.cgroup.aremove()


class BwrapBackend:
    """Starts bwrap sandboxes (see the package docstring)."""

    name = "bwrap"
    warm_pool = True
    sized_scratch = True

    def __init__(
        self, sandbox: SandboxSettings, paths: PathSettings, limits: LimitSettings, layout: StateLayout
    ) -> None:
        self._sandbox, self._paths, self._limits = sandbox, paths, limits
        self._cgroups: CgroupSupport | None = None
        self._spares: list[_Gate] = []
        self._wanted: anyio.Event | None = None  # set by a start: prepare spares; None: not running
        self._last_limits: Limits | None = None
        self._etc = EtcCopies(layout)
        self._gate_refused = False  # a gate was found built but not to be run, and that was said

    @property
    def cgroups(self) -> CgroupSupport:
        """What this host lets the sandboxes' cgroups limit (found, and stale ones swept, once)."""
        if self._cgroups is None:
            self._cgroups = detect_cgroups()
            swept = sweep_stale(self._cgroups)
            if swept:
                logger.info("removed %d cgroups left behind by servers that are gone", swept)
        return self._cgroups

    def open_gate(self) -> int | None:
        """A descriptor of the static gate sandboxes start through, or None: ``sh`` and ``setpriv`` (see :mod:`.gate`).

        Opened and checked at every start (a walk from ``/``): a setup run meanwhile (an upgrade)
        may have replaced the build, and a start must not exec one that is gone. The caller
        passes it to the process it starts and closes it.
        """
        directory = self._paths.gate_dir
        opened = gate_program.open_checked(directory)
        if isinstance(opened, int):
            self._gate_refused = False
            return opened
        if not self._gate_refused and os.path.lexists(gate_program.built_path(directory)):
            self._gate_refused = True  # said once, until a usable one is found again
            logger.warning(
                "not running the sandbox's gate built in %s: %s; starting through sh and setpriv", directory, opened
            )
        return None

    def host_ids(self, policy: SandboxPolicy | None = None) -> tuple[int | None, int | None]:
        """The host uid/gid bwrap runs as when the server is root: the policy's tenant's uid (else
        ``sandbox_uid``) and ``sandbox_gid``; else (None, None): ours."""
        if os.geteuid() != 0:
            return None, None
        uid = policy.host_uid if policy is not None and policy.host_uid is not None else None
        return uid if uid is not None else self._sandbox.sandbox_uid, self._sandbox.sandbox_gid

    def configured_limits(self) -> Limits:
        """The settings' limits that become a run's rlimits (for the probe; the rest default)."""
        limits = self._limits
        return Limits(
            memory=limits.memory, pids=limits.pids, file_size=limits.max_file_size, open_files=limits.open_files
        )

    def launch_spec(self, policy: SandboxPolicy, cgroup: RunCgroup | None) -> LaunchSpec:
        """What bwrap's process is given before it execs bwrap (see ``sandbox/launcher.py``)."""
        limits = policy.limits
        rlimits = [
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_FSIZE, limits.file_size),
            (resource.RLIMIT_NOFILE, limits.open_files),
            (resource.RLIMIT_CORE, 0),
        ]
        support = self.cgroups
        if not support.enforces("memory") and limits.address_space:
            rlimits.append((resource.RLIMIT_AS, limits.memory))  # weaker stand-in, reported by probe
        uid, gid = self.host_ids(policy)
        if not support.enforces("pids"):  # counts all the uid runs: see sandbox/nproc.py; the probe says so
            rlimits.append((resource.RLIMIT_NPROC, nproc_limit(os.getuid() if uid is None else uid, limits.pids)))
        return LaunchSpec(
            cgroup_procs=cgroup.procs_files if cgroup else (),
            rlimits=tuple(rlimits),
            uid=uid,
            gid=gid,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[BwrapBackend]:
        """Keep :data:`SPARES` first processes admitted ahead of the starts, for this block.

        A start takes one that is ready (else it starts its own) and a replacement is prepared
        behind it: what a start waits for in the kernel to move a process into its cgroups (an
        RCU grace period) is then spent beforehand, with no CPU, and a start goes straight from the
        policy to bwrap. Each costs an idle gate process and empty cgroups; all are discarded on the
        way out. The copies of the host's ``/etc`` entries (:mod:`.etc`) are made during the
        block too, and removed after it.
        """
        try:
            async with self._etc.running(), anyio.create_task_group() as group:
                self._wanted = anyio.Event()
                group.start_soon(self._keep_spares)
                try:
                    yield self
                finally:
                    group.cancel_scope.cancel()
        finally:
            self._wanted = None
            spares, self._spares = self._spares, []
            for spare in spares:
                await spare.discard()

    @property
    def spare_cgroups(self) -> frozenset[Path]:
        """The cgroup directories the first processes kept ahead of the starts are in now."""
        return frozenset(d for spare in self._spares if spare.cgroup for d in spare.cgroup.directories.values())

    async def _keep_spares(self) -> None:
        assert self._wanted is not None
        await self._wanted.wait()  # the first start says which limits its cgroups hold
        while True:
            self._wanted = anyio.Event()
            while len(self._spares) < SPARES:
                assert self._last_limits is not None
                try:
                    self._spares.append(await self._open(self._last_limits))
                except (SandboxStartError, BackendUnavailableError) as exc:
                    logger.warning("cannot start a sandbox's first process ahead of its start: %s", exc)
                    break
            await self._wanted.wait()

    async def start(self, policy: SandboxPolicy) -> BwrapSandbox:
        entries = etc_entries(policy)
        etc = self._etc.directory(entries) if entries else None
        self._last_limits = policy.limits
        if self._wanted is not None:
            self._wanted.set()
        uid, _ = self.host_ids(policy)
        # A spare has dropped to its uid already: it never serves another tenant's sandbox.
        while spare := next((spare for spare in self._spares if spare.uid == uid), None):
            self._spares.remove(spare)
            if spare.process.returncode is None:
                try:
                    return await self._go(spare, policy, etc)
                except SandboxStartError as exc:  # gone meanwhile: start one of its own
                    logger.warning("a sandbox's first process started ahead failed: %s", exc)
            else:
                await spare.discard()
        return await self._go(await self._open(policy.limits, policy), policy, etc)

    async def _open(self, limits: Limits, policy: SandboxPolicy | None = None) -> _Gate:
        """Start a sandbox's first process behind its gate and admit it to cgroups holding ``limits``,
        to drop to ``policy``'s host uid (None: the default tenant's, as spares are).

        Raises:
            BackendUnavailableError: no bwrap.
            SandboxStartError: it could not be started or admitted.
        """
        bwrap = find_bwrap(self._paths.bwrap_path)
        with contextlib.ExitStack() as undo:
            cgroup = run_cgroup(self.cgroups, limits) if self.cgroups.version is not None else None
            if cgroup is not None:
                undo.callback(cgroup.remove)
            host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            undo.callback(host_end.close)
            undo.callback(sandbox_end.close)
            seccomp_fd = os.memfd_create("mcp-sandbox-seccomp", os.MFD_CLOEXEC)
            undo.callback(os.close, seccomp_fd)
            options_fd = os.memfd_create("mcp-sandbox-bwrap-args", os.MFD_CLOEXEC)
            undo.callback(os.close, options_fd)
            uid, gid = self.host_ids(policy)
            spec = LaunchSpec(cgroup_procs=cgroup.procs_files if cgroup else (), rlimits=(), uid=uid, gid=gid)
            program = self.open_gate()
            if program is not None:
                undo.callback(os.close, program)
            command = gated(spec, [bwrap, "--args", str(options_fd), "--"], program)
            gate_read, gate = os.pipe()
            try:
                process = await launch(
                    command,
                    what=f"bwrap ({bwrap})",
                    env={},  # bwrap's own environment is visible in /proc/1/environ inside
                    pass_fds=(sandbox_end.fileno(), seccomp_fd, options_fd, *([] if program is None else [program])),
                    stdin=gate_read,
                )
            except BaseException:
                os.close(gate)
                raise
            finally:
                os.close(gate_read)
            if program is not None:
                os.close(program)
            undo.pop_all()
        opened = _Gate(process, gate, cgroup, limits, host_end, sandbox_end, seccomp_fd, options_fd, uid)
        try:
            # In a worker thread: the move into a cgroup sleeps through an RCU grace period
            # (the kernel's cgroup_threadgroup_rwsem taken for writing), which on the event loop
            # would hold every other run's frames and answers back that long.
            await anyio.to_thread.run_sync(admit, spec, process.pid)
        except BaseException as exc:  # refused, or the start cancelled while it waited
            await opened.discard()
            if isinstance(exc, OSError):
                raise SandboxStartError(f"cannot put the sandbox's process in its cgroup: {exc}") from exc
            raise
        return opened

    async def _go(self, opened: _Gate, policy: SandboxPolicy, etc: Path | None) -> BwrapSandbox:
        """Give ``opened`` the policy (limits, seccomp filter, options, command) and let it exec bwrap.

        ``etc``: a copy of the policy's host ``/etc`` entries to bind instead of them (see :mod:`.etc`).

        Raises:
            SandboxStartError: its limits or the policy's command could not be given to it.
        """
        try:
            if opened.cgroup is not None and opened.limits != policy.limits:
                opened.cgroup.write_limits(policy.limits)
                opened.limits = policy.limits
            _fill(opened.seccomp_fd, compiled_bpf(egress=policy.egress))
            bwrap = find_bwrap(self._paths.bwrap_path)
            full = [
                *bwrap_argv(policy, bwrap=bwrap, seccomp_fd=opened.seccomp_fd, etc=etc),
                str(opened.sandbox_end.fileno()),
            ]
            argv, options = args_file(full, opened.options_fd)
            _fill(opened.options_fd, options)
            admit(self.launch_spec(policy, None), opened.process.pid)  # its rlimits (it is in its cgroups)
            gate, opened.gate = opened.gate, -1
            open_gate(gate, admitted=True, then=argv[4:])  # argv: bwrap --args <fd> -- <command>
        except (OSError, ValueError) as exc:
            await opened.discard()
            raise SandboxStartError(f"cannot give the sandbox's first process its limits and command: {exc}") from exc
        opened.release_fds()
        return BwrapSandbox(opened.process, opened.host_end, opened.cgroup)

    def probe(self) -> BackendProbe:
        try:
            bwrap = find_bwrap(self._paths.bwrap_path)
        except BackendUnavailableError as exc:
            return BackendProbe(self.name, available=False, reason=str(exc))
        return probe_bwrap(self, bwrap)
