"""The bubblewrap sandbox and backend: unprivileged namespaces + seccomp + cgroups + rlimits."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import socket

import anyio

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe, SandboxOutcome
from mcp_sandbox.sandbox.backends.bwrap.argv import args_file, bwrap_argv, find_bwrap
from mcp_sandbox.sandbox.backends.bwrap.probe import probe_bwrap
from mcp_sandbox.sandbox.backends.bwrap.runner import Runner, find_runner
from mcp_sandbox.sandbox.backends.process import ProcessSandbox, launch, run_cgroup
from mcp_sandbox.sandbox.cgroups import CgroupSupport, RunCgroup, detect_cgroups, sweep_stale
from mcp_sandbox.sandbox.launcher import LaunchSpec, admit, gated, open_gate
from mcp_sandbox.sandbox.policy import SandboxPolicy
from mcp_sandbox.sandbox.seccomp import write_bpf

__all__ = ["BwrapBackend", "BwrapSandbox"]

logger = logging.getLogger(__name__)


class BwrapSandbox(ProcessSandbox):
    """A running bwrap sandbox (see :class:`mcp_sandbox.sandbox.backends.base.Sandbox`)."""

    _runner: Runner | None = None

    def watch_runner(self) -> None:
        self._runner = find_runner(self.pid)

    def runner_ended(self) -> SandboxOutcome | None:
        """See :mod:`.runner`: needs the cgroup (to see that nothing else runs in the sandbox)."""
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


async def _let_in(process: asyncio.subprocess.Process, spec: LaunchSpec, gate: int) -> None:
    """Admit the process waiting at ``gate`` to its cgroups and limits and open the gate (see the launcher).

    Raises:
        SandboxStartError: it could not be admitted (it ends at the closed gate, reaped here).
    """
    try:
        admit(spec, process.pid)
    except OSError as exc:
        open_gate(gate, admitted=False)
        with anyio.CancelScope(shield=True), anyio.move_on_after(5):
            await process.wait()
        raise SandboxStartError(f"cannot put the sandbox's process in its cgroup and limits: {exc}") from exc
    open_gate(gate, admitted=True)


class BwrapBackend:
    """Starts bwrap sandboxes (see the package docstring)."""

    name = "bwrap"
    warm_pool = True
    sized_scratch = True

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cgroups: CgroupSupport | None = None

    @property
    def cgroups(self) -> CgroupSupport:
        """What this host lets the sandboxes' cgroups limit (found, and stale ones swept, once)."""
        if self._cgroups is None:
            self._cgroups = detect_cgroups()
            swept = sweep_stale(self._cgroups)
            if swept:
                logger.info("removed %d cgroups left behind by servers that are gone", swept)
        return self._cgroups

    def host_ids(self) -> tuple[int | None, int | None]:
        """The host uid/gid bwrap runs as: the sandbox's when the server is root, else (None, None): ours."""
        if os.geteuid() != 0:
            return None, None
        return self._settings.sandbox_uid, self._settings.sandbox_gid

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
        if not support.enforces("pids"):
            rlimits.append((resource.RLIMIT_NPROC, limits.pids))  # per host uid, reported by probe
        uid, gid = self.host_ids()
        return LaunchSpec(
            cgroup_procs=cgroup.procs_files if cgroup else (),
            rlimits=tuple(rlimits),
            uid=uid,
            gid=gid,
        )

    async def start(self, policy: SandboxPolicy) -> BwrapSandbox:
        bwrap = find_bwrap(self._settings.bwrap_path)
        with contextlib.ExitStack() as undo:
            cgroup = run_cgroup(self.cgroups, policy.limits) if self.cgroups.version is not None else None
            if cgroup is not None:
                undo.callback(cgroup.remove)
            host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            undo.callback(host_end.close)
            # The sandbox's own end: once it is started, only bwrap holds it; the filter and the
            # options are read by bwrap and closed here either way.
            with sandbox_end, contextlib.ExitStack() as fds:
                seccomp_fd = write_bpf(egress=policy.egress)
                fds.callback(os.close, seccomp_fd)
                options_fd = os.memfd_create("mcp-sandbox-bwrap-args", os.MFD_CLOEXEC)
                fds.callback(os.close, options_fd)
                full = [*bwrap_argv(policy, bwrap=bwrap, seccomp_fd=seccomp_fd), str(sandbox_end.fileno())]
                argv, options = args_file(full, options_fd)
                os.write(options_fd, options)
                os.lseek(options_fd, 0, os.SEEK_SET)
                spec = self.launch_spec(policy, cgroup)
                command = gated(spec, argv)
                gate_read, gate = os.pipe()
                fds.callback(os.close, gate_read)
                try:
                    process = await launch(
                        command,
                        what=f"bwrap ({bwrap})",
                        env={},  # bwrap's own environment is visible in /proc/1/environ inside
                        pass_fds=(sandbox_end.fileno(), seccomp_fd, options_fd),
                        stdin=gate_read,
                    )
                except BaseException:
                    os.close(gate)
                    raise
            await _let_in(process, spec, gate)
            undo.pop_all()
        return BwrapSandbox(process, host_end, cgroup)

    def probe(self) -> BackendProbe:
        try:
            bwrap = find_bwrap(self._settings.bwrap_path)
        except BackendUnavailableError as exc:
            return BackendProbe(self.name, available=False, reason=str(exc))
        return probe_bwrap(self, bwrap)
