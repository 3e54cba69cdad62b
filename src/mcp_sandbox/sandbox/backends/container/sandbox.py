"""The container backend: podman and docker behind the same policy (see ``argv.py``).

A sandbox is one container, started with ``<cli> run`` attached: the client's stdout/stderr
are the container's, its exit code the container's. Killing the client would leave the
container running, so a sandbox is ended through its cgroup or by name (see ``running.py``);
containers a crashed server left behind are swept by label when a backend of the engine
(``engine.py``) first starts one.
What a start gives back, the running container, is ``running.py``'s.

Where the host gives us cgroups (root, v1) and the engine places containers with cgroupfs
paths, each container is nested in a per-run cgroup of ours at the hierarchies' root
(``--cgroup-parent``), with the same limits: the engine's monitor (conmon) sits in it too, so
ours is the one that binds, and its counters tell the engine a run hit its memory or pids
limit (the container's own cgroup, where the kernel counts that, is gone when it exits).
Rootless podman on cgroup v2 nests the same way in the cgroup systemd delegated to the server
(the ``Delegate=yes`` scope bwrap's cgroups use, see ``cgroups/support.py``), driven with
``--cgroup-manager cgroupfs`` for those containers: under its default systemd manager podman
would place them in transient units of the user's manager, beyond our reach and gone when they
end, so a run's memory or pids limit hit could not be told.

Which ids the container runs as:

- server running as root: the dedicated unprivileged ``sandbox_uid``/``sandbox_gid`` (as bwrap's
  host uid; a tenant's own uid from ``tenant_uid_range``, see ``mcp_sandbox.tenant_uids``):
  without a user namespace the uid inside *is* the host uid, and 65534 on the host is
  ``nobody``, shared with NFS and other daemons; workspace files come out owned by that uid, as
  with bwrap;
- rootless podman: 65534 inside, ``--userns keep-id`` mapping the server's own uid to it, so
  workspace files are the server's, as with bwrap run by an unprivileged user.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import Literal

import anyio
import anyio.to_thread

from mcp_sandbox.config import SandboxSettings
from mcp_sandbox.errors import BackendUnavailableError, SandboxStartError
from mcp_sandbox.runners import runner_dir
from mcp_sandbox.sandbox.backends.base import BackendProbe, Capability
from mcp_sandbox.sandbox.backends.container.aliases import alias_binds, remove_aliases
from mcp_sandbox.sandbox.backends.container.argv import (
    CHANNEL_FD,
    CONNECT,
    ContainerRun,
    Flavour,
    container_argv,
    container_name,
    server_env,
)
from mcp_sandbox.sandbox.backends.container.channel import accept, listen, place_fd
from mcp_sandbox.sandbox.backends.container.engine import ContainerEngine
from mcp_sandbox.sandbox.backends.container.probe import probe_container
from mcp_sandbox.sandbox.backends.container.rootless import RootlessProblems, rootless_problems
from mcp_sandbox.sandbox.backends.container.running import CIDFILE, ContainerSandbox
from mcp_sandbox.sandbox.backends.process import launch, run_cgroup
from mcp_sandbox.sandbox.cgroups import (
    CgroupSupport,
    RunCgroup,
    detect_cgroups,
    detect_root_cgroups,
    sweep_stale,
    sweep_stale_everywhere,
)
from mcp_sandbox.sandbox.policy import Mount, SandboxPolicy
from mcp_sandbox.sandbox.seccomp import oci_profile
from mcp_sandbox.state import StateLayout

__all__ = ["DEFAULT_IMAGE", "ContainerBackend", "ContainerSandbox"]

logger = logging.getLogger(__name__)

DEFAULT_IMAGE = "localhost/mcp-sandbox-python:latest"  # what scripts/build-container-image.sh makes
_INSIDE_ID = 65534
# The limits rootless podman enforces only through controllers systemd delegated to the user.
_CGROUP_LIMITS = ("memory limit", "pids limit", "cpu quota")
# Our cgroup, the container's parent, also holds podman's conmon: its memory limit leaves room
# above the container's own, so that a run that fills its limit meets its own cgroup's OOM killer,
# which picks among the container's processes, and never ours, which could pick conmon (the run
# would then hang to its timeout). The container's cgroup still enforces the run's limit.
_RUNTIME_HEADROOM = 32 << 20


def with_connector(policy: SandboxPolicy) -> SandboxPolicy:
    """``policy`` with the socket channel's connector (the Python runner's ``connect.py``) bound in.

    A Python sandbox has it already; a JavaScript one gets the Python runner's directory, read-only,
    at its usual place (the connector runs on the image's python3, see ``argv.py``).
    """
    inside = str(PurePosixPath(CONNECT).parent)
    if any(mount.target == inside for mount in policy.mounts):
        return policy
    return dataclasses.replace(policy, mounts=(*policy.mounts, Mount(runner_dir("python"), inside)))


class ContainerBackend:
    """Starts podman or docker containers; see the module docstring."""

    # Not yet: a run's memory and pids limit hits are told apart by the container's own cgroup,
    # which exists only once per container, so a zygote's runs could not be judged one by one.
    warm_pool = False
    sized_scratch = False  # /data and /workspace must be one directory: a bound host one, watched

    def __init__(self, sandbox: SandboxSettings, layout: StateLayout, name: str, engine: ContainerEngine) -> None:
        self.name = name
        self.engine = engine  # backends of one engine share its facts and its one sweep
        self._sandbox = sandbox
        self._layout = layout
        self._cgroups: CgroupSupport | None = None
        self._profiles: dict[bool, str] = {}  # by egress

    @property
    def flavour(self) -> Flavour:
        """The CLI dialect this backend speaks."""
        return self.engine.flavour

    @property
    def cgroups(self) -> CgroupSupport:
        """Where per-run cgroups can nest containers here (found, and stale ones swept, once)."""
        if self._cgroups is None:
            self._cgroups = detect_root_cgroups()
            if self._cgroups.version is None and self._rootless_podman:
                delegated = detect_cgroups()
                if delegated.version == 2 and all(map(delegated.enforces, ("memory", "pids", "cpu"))):
                    self._cgroups = delegated
            swept = sweep_stale(self._cgroups) + sweep_stale_everywhere()
            if swept:
                logger.info("removed %d cgroups left behind by servers that are gone", swept)
        return self._cgroups

    @property
    def _rootless_podman(self) -> bool:
        return self.flavour == "podman" and os.geteuid() != 0

    @property
    def _cgroup_manager(self) -> Literal["cgroupfs"] | None:
        """The ``--cgroup-manager`` a nested container needs, when not the engine's own."""
        return "cgroupfs" if self._rootless_podman and self.cgroups.version == 2 else None

    @property
    def nests_cgroups(self) -> bool:
        """Whether each container is nested in a per-run cgroup of ours (see the module docstring)."""
        if self.cgroups.version is None:
            return False
        return self._cgroup_manager is not None or self.engine.facts.get("cgroup_manager") == "cgroupfs"

    def image_for(self, language: str) -> str:
        """The image for ``language``: ``images`` by language, else ``image``, else the default."""
        for entry in self._sandbox.images:
            key, _, value = entry.partition("=")
            if key.strip() == language:
                return value.strip()
        return self._sandbox.image or DEFAULT_IMAGE

    def _seccomp_profile(self, *, egress: bool = False) -> str:
        """The OCI seccomp profile's path: ``<state_dir>/seccomp-<digest>.json``, written once.

        Named by its content, so servers sharing a state directory share the file and a changed
        deny list gets a new one; the state directory is the server's own, so no other host
        user can swap it between writing and the CLI reading it.
        """
        if (known := self._profiles.get(egress)) is not None:
            return known
        data = json.dumps(oci_profile(egress=egress), sort_keys=True).encode()
        digest = hashlib.sha256(data).hexdigest()[:16]
        layout = self._layout
        layout.make_root_private()
        path = layout.seccomp_profile(digest)
        directory = path.parent
        if not path.exists():
            with tempfile.NamedTemporaryFile(dir=directory, prefix=".seccomp-", delete=False) as out:
                out.write(data)
            os.replace(out.name, path)
        self._profiles[egress] = str(path)
        return str(path)

    def user(self, policy: SandboxPolicy | None = None) -> tuple[tuple[int, int], bool]:
        """The uid/gid the container's processes have (``policy``'s tenant's, as root), and whether
        the server's own uid is mapped to them (rootless podman's ``--userns keep-id``); see the
        module docstring."""
        if os.geteuid() == 0 and not self.engine.rootless:
            sandbox = self._sandbox
            uid = policy.host_uid if policy is not None and policy.host_uid is not None else sandbox.sandbox_uid
            return (uid, sandbox.sandbox_gid), False
        return (_INSIDE_ID, _INSIDE_ID), self.flavour == "podman"

    def ids_inside(self) -> tuple[int, int]:
        """The uid/gid the container's processes have (see the module docstring)."""
        return self.user()[0]

    def run_spec(self, policy: SandboxPolicy, name: str, channel_dir: Path | None, parent: str | None) -> ContainerRun:
        """What, besides the policy, goes into this container's argv.

        Raises:
            BackendUnavailableError: the CLI is not installed.
        """
        user, keep_id = self.user(policy)
        return ContainerRun(
            cli=self.engine.cli,
            flavour=self.flavour,
            name=name,
            owner=os.getpid(),
            image=self.image_for(policy.language),
            seccomp_profile=self._seccomp_profile(egress=policy.egress),
            user=user,
            keep_id=keep_id,
            channel="fd" if self.flavour == "podman" else "socket",
            channel_dir=str(channel_dir) if channel_dir is not None else None,
            cgroup_parent=parent,
            cgroup_manager=self._cgroup_manager if parent is not None else None,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ContainerBackend]:
        """Nothing to keep in the background (whole containers are started ahead by ``engine/prestart.py``)."""
        yield self

    async def start(self, policy: SandboxPolicy) -> ContainerSandbox:
        if not self.engine.swept:
            await anyio.to_thread.run_sync(self.engine.sweep_once)
        if self.flavour == "docker":
            policy = with_connector(policy)
        cli = self.engine.cli
        name = container_name(os.getpid())
        async with contextlib.AsyncExitStack() as undo:
            cgroup: RunCgroup | None = None
            parent: str | None = None
            if self.nests_cgroups:
                room = dataclasses.replace(policy.limits, memory=policy.limits.memory + _RUNTIME_HEADROOM)
                cgroup = run_cgroup(self.cgroups, room, nested=True)
                undo.callback(cgroup.remove)
                parent = cgroup.hierarchy_path()
            scratch: Path | None = None
            channel_dir: Path | None = None
            listener: socket.socket | None = None
            host_end: socket.socket | None = None
            sandbox_end: socket.socket | None = None
            if self.flavour == "podman":
                host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                undo.callback(host_end.close)
                undo.callback(sandbox_end.close)
            else:  # the channel's directory (bound into the container) and the cidfile beside it
                # In runs/, named after this server: the next server sweeps it if this one is killed.
                try:
                    self._layout.prepare_runs()
                    scratch = self._layout.new_scratch()
                except OSError as exc:
                    raise SandboxStartError(f"cannot create the container's channel directory: {exc}") from exc
                undo.callback(shutil.rmtree, scratch, ignore_errors=True)
                channel_dir = scratch / "channel"
                channel_dir.mkdir(mode=0o700)
                listener = listen(channel_dir, self.user(policy)[0])
                undo.callback(listener.close)
            try:
                aliased, aliases = alias_binds(policy, self._layout)
            except OSError as exc:
                raise SandboxStartError(f"cannot alias the container's bind sources: {exc}") from exc
            undo.callback(remove_aliases, aliases)
            try:
                spec = self.run_spec(policy, name, channel_dir, parent)
                if scratch is not None:
                    spec = dataclasses.replace(spec, cidfile=str(scratch / CIDFILE))
                command = container_argv(aliased, spec)
            except ValueError as exc:
                raise SandboxStartError(str(exc)) from exc
            passed = sandbox_end.fileno() if sandbox_end is not None else None
            process = await launch(
                command,
                what=cli,
                env=server_env(),
                pass_fds=(CHANNEL_FD, passed) if passed is not None else (),
                preexec_fn=place_fd(passed),
            )
            if sandbox_end is not None:
                sandbox_end.close()
            channel = host_end or socket.socket(socket.AF_UNIX)  # a placeholder until the container connects
            sandbox = ContainerSandbox(
                process,
                channel,
                cgroup,
                engine=self.engine,
                name=name,
                limits=policy.limits,
                scratch=scratch,
                aliases=aliases,
            )
            undo.pop_all()  # the sandbox holds them now and releases them when it closes
            undo.push_async_callback(sandbox.aclose)  # cancelled while it connects: the container must not outlive it
            if listener is not None:
                connected = await accept(listener, sandbox.wait)
                if connected is None:
                    outcome = await sandbox.aclose()
                    raise SandboxStartError(f"the container did not connect its channel (exit {outcome.returncode})")
                sandbox.channel.close()
                sandbox.channel = connected
            undo.pop_all()
        return sandbox

    def probe(self) -> BackendProbe:
        try:
            cli = self.engine.cli
        except BackendUnavailableError as exc:
            return BackendProbe(self.name, available=False, reason=str(exc))
        facts = self.engine.facts
        if "error" in facts:
            return BackendProbe(self.name, available=False, reason=facts["error"], version=cli)
        lacking = rootless_problems() if self.flavour == "podman" else RootlessProblems()
        if lacking.ids:
            return BackendProbe(self.name, available=False, reason="rootless podman: " + "; ".join(lacking.ids))
        probe = probe_container(self, cli, facts)
        if not lacking.limits:
            return probe
        weak = tuple(
            Capability(c.name, False, "; ".join(lacking.limits)) if c.name in _CGROUP_LIMITS else c
            for c in probe.capabilities
        )
        return dataclasses.replace(probe, capabilities=weak)
