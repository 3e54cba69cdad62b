"""What the bwrap backend can enforce on this host, found by starting a real sandbox."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Protocol

from mcp_sandbox.errors import SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe, Capability
from mcp_sandbox.sandbox.backends.bwrap.argv import bwrap_argv
from mcp_sandbox.sandbox.cgroups import CgroupSupport, RunCgroup
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.launcher import GATE_CLOSED, LaunchSpec, admit, gated, open_gate
from mcp_sandbox.sandbox.nproc import tasks_of
from mcp_sandbox.sandbox.policy import Limits, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import seccomp_available, write_bpf

__all__ = ["Probed", "probe_bwrap"]

_PROBE_SECONDS = 20
_FIXED = (0, 12)  # bubblewrap 0.12.0 fixed GHSA-pxhw-h44j-8pfx


class Probed(Protocol):
    """What the probe asks of the backend (``BwrapBackend``, whose module imports this one)."""

    name: str

    @property
    def cgroups(self) -> CgroupSupport: ...

    def open_gate(self) -> int | None: ...

    def host_ids(self) -> tuple[int | None, int | None]: ...

    def launch_spec(self, policy: SandboxPolicy, cgroup: RunCgroup | None) -> LaunchSpec: ...

    def configured_limits(self) -> Limits: ...


def _version(bwrap: str) -> str:
    try:
        shown = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return shown.stdout.strip() or "unknown"


def _version_note(version: str) -> str:
    """``bwrap --version`` said, and what a release before 0.12.0 lacks."""
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if found is None:
        return f"{version}: not a version we can read"
    if (int(found[1]), int(found[2])) >= _FIXED:
        return version
    return (
        f"{version}, before 0.12.0 (GHSA-pxhw-h44j-8pfx: a mount destination under a path the sandbox"
        " can write): the policy mounts nothing there"
    )


def _try_sandbox(backend: Probed, bwrap: str) -> str | None:
    """Start a minimal sandbox with the full policy; return None on success, else why not."""
    mounts, links = system_mounts()
    # The configured limits: a run's rlimits above the hard ones this server may not raise fail here.
    limits = backend.configured_limits()
    policy = SandboxPolicy(command=("/bin/sh", "-c", "exit 0"), mounts=mounts, symlinks=links, cwd="/", limits=limits)
    spec = backend.launch_spec(policy, None)
    seccomp_fd = write_bpf()
    program = backend.open_gate()
    gate_read, gate = os.pipe()
    try:
        # Started as every sandbox is (see mcp_sandbox.sandbox.launcher): behind the gate.
        with subprocess.Popen(
            gated(spec, bwrap_argv(policy, bwrap=bwrap, seccomp_fd=seccomp_fd), program),
            stdin=gate_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            pass_fds=(seccomp_fd, *([] if program is None else [program])),
            env={},
        ) as process:
            os.close(gate_read)
            gate_read = -1
            try:
                admit(spec, process.pid)
            except OSError:
                open_gate(gate, admitted=False)
                raise
            open_gate(gate, admitted=True)
            try:
                _, stderr = process.communicate(timeout=_PROBE_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
    except (OSError, subprocess.SubprocessError, SandboxStartError) as exc:
        return f"bwrap could not be started: {exc}"
    finally:
        os.close(seccomp_fd)
        if program is not None:
            os.close(program)
        if gate_read >= 0:
            os.close(gate_read)
            os.close(gate)
    if process.returncode == GATE_CLOSED:
        return f"bwrap could not be started: the sandbox's first process did not pass its gate: {stderr.strip()}"
    if process.returncode != 0:
        said = stderr.strip() or "no message"
        if "Resource temporarily unavailable" in said and not backend.cgroups.enforces("pids"):
            uid = spec.uid if spec.uid is not None else os.getuid()
            said += (
                f" (EAGAIN: the process limit RLIMIT_NPROC, which counts every thread uid {uid} runs, all its"
                f" programs together: {tasks_of(uid)} now; not user namespaces; a pids cgroup lifts it)"
            )
        return f"bwrap failed (exit {process.returncode}): {said}"
    return None


def probe_bwrap(backend: Probed, bwrap: str) -> BackendProbe:
    """Probe ``bwrap`` for real and list which parts of the default policy hold here."""
    version = _version(bwrap)
    reason = seccomp_available()
    if reason is None:
        reason = _try_sandbox(backend, bwrap)
    if reason is not None:
        return BackendProbe(backend.name, available=False, reason=reason, version=f"{version} ({bwrap})")
    cgroups = backend.cgroups
    cg = f"cgroup v{cgroups.version}" if cgroups.version else ""
    where = f" ({cgroups.origin})" if cgroups.origin else ""
    uid, _ = backend.host_ids()
    host_uid = uid if uid is not None else os.geteuid()
    capabilities = (
        Capability("bwrap version", True, _version_note(version)),
        Capability("network", True, "empty network namespace; seccomp allows only AF_UNIX sockets"),
        Capability("read-only root", True, "only /usr, linker files and the runtime bound in, read-only"),
        Capability("unprivileged uid", True, f"uid 65534 inside, host uid {host_uid}"),
        Capability("capabilities", True, "all dropped; no_new_privs"),
        Capability("nested namespaces", True, "--disable-userns and seccomp clone-flag filter"),
        Capability("seccomp", True, "deny list built with pyseccomp"),
        Capability("process tree kill", True, "pid namespace dies with its init; cgroup kill as backstop"),
        Capability("tmp size", True, "tmpfs /tmp with --size"),
        Capability(
            "disk bound",
            True,
            "scratch /workspace a tmpfs of scratch_size; a conversation's measured while the run writes",
        ),
        Capability("rlimits", True, "CPU seconds, file size, open files, no core dumps"),
        Capability(
            "memory limit",
            cgroups.enforces("memory"),
            f"{cg} memory controller{where}" if cgroups.enforces("memory") else f"RLIMIT_AS only: {cgroups.reason}",
        ),
        Capability(
            "pids limit",
            cgroups.enforces("pids"),
            f"{cg} pids controller{where}"
            if cgroups.enforces("pids")
            # No ": " before the reason, which bwrap's three cgroup limits share (missing_summary).
            else (
                f"RLIMIT_NPROC per host uid, pids above the {tasks_of(host_uid)} tasks uid {host_uid} runs"
                f" (its other programs' too), counted at each start: {cgroups.reason}"
            ),
        ),
        Capability(
            "cpu quota",
            cgroups.enforces("cpu"),
            f"{cg} cpu controller{where}" if cgroups.enforces("cpu") else f"CPU-seconds rlimit only: {cgroups.reason}",
        ),
    )
    return BackendProbe(backend.name, available=True, version=f"{version} ({bwrap})", capabilities=capabilities)
