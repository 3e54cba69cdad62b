"""What a container backend can enforce on this host, found by starting a real container."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path
from typing import Protocol

from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe, Capability
from mcp_sandbox.sandbox.backends.container.argv import ContainerRun, container_argv, container_name, server_env
from mcp_sandbox.sandbox.backends.container.engine import ContainerEngine
from mcp_sandbox.sandbox.backends.process import run_cgroup
from mcp_sandbox.sandbox.cgroups import CgroupSupport
from mcp_sandbox.sandbox.policy import SandboxPolicy
from mcp_sandbox.sandbox.seccomp import seccomp_available

__all__ = ["Probed", "probe_container"]

_PROBE_SECONDS = 60


class Probed(Protocol):
    """What the probe asks of the backend (``ContainerBackend``, whose module imports this one)."""

    name: str
    engine: ContainerEngine

    @property
    def nests_cgroups(self) -> bool: ...

    @property
    def cgroups(self) -> CgroupSupport: ...

    def image_for(self, language: str) -> str: ...

    def user(self) -> tuple[tuple[int, int], bool]: ...

    def run_spec(
        self, policy: SandboxPolicy, name: str, channel_dir: Path | None, parent: str | None
    ) -> ContainerRun: ...


def _try_container(backend: Probed) -> str | None:
    """Start a container of the Python image with the full policy; None on success, else why not."""
    policy = SandboxPolicy(command=("/bin/sh", "-c", "exit 0"), cwd="/")
    cgroup = None
    if backend.nests_cgroups:  # nested as a run's container is, so that placement is tried too
        try:
            cgroup = run_cgroup(backend.cgroups, policy.limits, nested=True)
        except SandboxStartError as exc:
            return str(exc)
    parent = cgroup.hierarchy_path() if cgroup is not None else None
    run = dataclasses.replace(backend.run_spec(policy, container_name(os.getpid()), None, parent), channel="none")
    argv = container_argv(policy, run)
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=_PROBE_SECONDS,
            stdin=subprocess.DEVNULL,
            env=server_env(),
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{run.cli} could not be started: {exc}"
    finally:
        backend.engine.remove_now(run.name)
        if cgroup is not None:
            # The engine tears the container's own cgroups (nested in ours) down after its client
            # has exited: one try would often find ours busy and leave it on the host for good.
            cgroup.remove_waiting()
    if done.returncode != 0:
        message = (done.stderr.strip() or "no message").splitlines()[-1]
        return f"a container of {run.image} failed (exit {done.returncode}): {message}"
    return None


def probe_container(backend: Probed, cli: str, facts: dict[str, str]) -> BackendProbe:
    """Probe the container engine for real and list which parts of the default policy hold here."""
    version = f"{backend.engine.flavour} {facts.get('version', '?')} ({cli}); image {backend.image_for('python')}"
    reason = seccomp_available()
    if reason is None:
        try:
            reason = _try_container(backend)
        except BackendUnavailableError as exc:
            reason = str(exc)
    if reason is not None:
        return BackendProbe(backend.name, available=False, reason=reason, version=version)
    (uid, _), keep_id = backend.user()
    host = "the server's own uid on the host (--userns keep-id)" if keep_id else f"host uid {uid}"
    who = f"uid {uid} inside, {host}"
    if backend.engine.rootless and not keep_id:
        who = f"uid {uid} inside, a subordinate uid on the host (rootless docker)"
    nested = backend.nests_cgroups
    origin = backend.cgroups.origin if nested else ""
    told = f"; per-run cgroup{f' in {origin}' if origin else ''} tells when it was hit"
    capabilities = (
        Capability("network", True, "--network none; seccomp allows only AF_UNIX sockets"),
        Capability("read-only root", True, "--read-only image root; workspace and runtime bound, /tmp a tmpfs"),
        Capability("unprivileged uid", True, who),
        Capability(
            "capabilities",
            True,
            "--cap-drop ALL; no-new-privileges (setuid bits inert; the image root itself is not nosuid)",
        ),
        Capability("nested namespaces", True, "seccomp denies unshare/setns and namespace clone flags"),
        Capability("seccomp", True, "our deny list as an OCI profile (--security-opt seccomp=)"),
        Capability("process tree kill", True, "container killed and removed by name; swept by label"),
        Capability("tmp size", True, "--tmpfs /tmp size=, --shm-size"),
        Capability("disk bound", True, "scratch and conversation workspaces measured while the run writes"),
        Capability("rlimits", True, "--ulimit cpu, fsize, nofile, core"),
        Capability(
            "memory limit",
            True,
            "--memory (no swap)" + (told if nested else "; a kill is not attributed"),
        ),
        Capability(
            "pids limit",
            True,
            "--pids-limit" + (told if nested else "; exhaustion is not attributed"),
        ),
        Capability("cpu quota", True, "--cpus"),
    )
    return BackendProbe(backend.name, available=True, version=version, capabilities=capabilities)
