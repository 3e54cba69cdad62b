"""The container backends: podman and docker behind the same policy (see ``sandbox/containers.py``).

A sandbox is one container, started with ``<cli> run`` attached: the client's stdout/stderr
are the container's, its exit code the container's. Killing the client would leave the
container running, so a sandbox is always ended by name (``rm --force``); containers a crashed
server left behind are swept by label when a backend first starts one, but only those whose
owner (the server pid in the name and label) is gone: several servers may share a host.

Where the host gives us cgroups (root, v1) and the engine places containers with cgroupfs
paths, each container is nested in a per-run cgroup of ours at the hierarchies' root
(``--cgroup-parent``), with the same limits: the engine's monitor (conmon) sits in it too, so
ours is the one that binds, and its counters tell the engine a run hit its memory or pids
limit (the container's own cgroup, where the kernel counts that, is gone when it exits).

Which ids the container runs as:

- server running as root: the dedicated unprivileged ``sandbox_uid``/``sandbox_gid`` (as bwrap's
  host uid): without a user namespace the uid inside *is* the host uid, and 65534 on the host
  is ``nobody``, shared with NFS and other daemons; workspace files come out owned by the
  sandbox uid, as with bwrap;
- rootless podman: 65534 inside, ``--userns keep-id`` mapping the server's own uid to it, so
  workspace files are the server's, as with bwrap run by an unprivileged user.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import anyio
import anyio.to_thread

from mcp_sandbox.config import Settings
from mcp_sandbox.errors import BackendUnavailableError, ConfigError, SandboxStartError
from mcp_sandbox.sandbox.backends.base import BackendProbe, LimitEvents, SandboxOutcome
from mcp_sandbox.sandbox.cgroups import (
    CgroupSupport,
    RunCgroup,
    detect_root_cgroups,
    sweep_stale,
    sweep_stale_everywhere,
)
from mcp_sandbox.sandbox.containers import (
    CHANNEL_FD,
    LABEL,
    ContainerRun,
    container_argv,
    container_name,
    owner_of,
    server_env,
)
from mcp_sandbox.sandbox.policy import SandboxPolicy
from mcp_sandbox.sandbox.seccomp import oci_profile

__all__ = ["DEFAULT_IMAGE", "ContainerBackend", "ContainerSandbox", "detect_runtime"]

logger = logging.getLogger(__name__)

Flavour = Literal["podman", "docker"]

DEFAULT_IMAGE = "localhost/mcp-sandbox-python:latest"  # what scripts/build-container-image.sh makes
_TEARDOWN_SECONDS = 10.0
_CLI_SECONDS = 30.0
_CONNECT_SECONDS = 30.0
_STREAM_LIMIT = 1 << 20
_INSIDE_ID = 65534


def detect_runtime(settings: Settings) -> tuple[str, Flavour]:
    """The container CLI to use for ``--backend container``, in the earlier bridge's order.

    ``container_runtime`` (``MCP_BRIDGE_RUNTIME``) when set, else podman, else docker.

    Raises:
        BackendUnavailableError: none is installed.
    """
    if settings.container_runtime:
        return settings.container_runtime, _flavour_of(settings.container_runtime)
    for name in ("podman", "docker"):
        if shutil.which(name):
            return name, "podman" if name == "podman" else "docker"
    raise BackendUnavailableError("no container runtime: neither podman nor docker is on PATH")


def _flavour_of(cli: str) -> Flavour:
    """The dialect a CLI speaks, by its name (``docker``, ``/usr/bin/podman``, a wrapper's name)."""
    return "docker" if "docker" in Path(cli).name else "podman"


def _resolve_cli(cli: str) -> str:
    """An absolute path for ``cli``.

    Raises:
        BackendUnavailableError: it is not installed or not executable.
    """
    found = shutil.which(cli)
    if found is None:
        raise BackendUnavailableError(f"{cli}: not found or not executable")
    return found


class ContainerSandbox:
    """A running container (see :class:`mcp_sandbox.sandbox.backends.base.Sandbox`)."""

    def __init__(
        self,
        backend: ContainerBackend,
        process: asyncio.subprocess.Process,
        channel: socket.socket,
        name: str,
        cgroup: RunCgroup | None,
        limits: tuple[int, int],
        channel_dir: Path | None,
    ) -> None:
        assert process.stdout is not None and process.stderr is not None
        self.stdout: asyncio.StreamReader = process.stdout
        self.stderr: asyncio.StreamReader = process.stderr
        self.channel = channel
        self.name = name
        self._backend = backend
        self._process = process
        self._cgroup = cgroup
        self._memory, self._pids = limits
        self._channel_dir = channel_dir
        self._outcome: SandboxOutcome | None = None

    def _result(self, returncode: int) -> SandboxOutcome:
        cgroup = self._cgroup
        return SandboxOutcome(
            returncode=returncode,
            memory_exceeded=(cgroup.memory_exceeded() or cgroup.memory_peaked(self._memory)) if cgroup else False,
            pids_exhausted=cgroup.pids_peaked(self._pids) if cgroup else False,
        )

    async def wait(self) -> SandboxOutcome:
        return self._result(await self._process.wait())

    def limit_events(self) -> LimitEvents:
        return self._cgroup.limit_events() if self._cgroup is not None else LimitEvents()

    async def aclose(self) -> SandboxOutcome:
        if self._outcome is not None:
            return self._outcome
        with anyio.CancelScope(shield=True):
            # By name: the container outlives its client (and the client may be gone already).
            await self._backend.remove([self.name])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)
            returncode = -signal.SIGKILL
            with anyio.move_on_after(_TEARDOWN_SECONDS):
                returncode = await self._process.wait()
            outcome = self._result(returncode)
            self.channel.close()
            if self._cgroup is not None:
                await self._cgroup.aremove()
            if self._channel_dir is not None:
                shutil.rmtree(self._channel_dir, ignore_errors=True)
            self._outcome = outcome
        return outcome


class ContainerBackend:
    """Starts podman or docker containers; see the module docstring."""

    # Not yet: a run's memory and pids limit hits are told apart by the container's own cgroup,
    # which exists only once per container, so a zygote's runs could not be judged one by one.
    warm_pool = False

    def __init__(self, settings: Settings, name: str, cli: str | None, flavour: Flavour) -> None:
        self.name = name
        self.flavour: Flavour = flavour
        self._settings = settings
        self._cli_name = cli or flavour
        self._cgroups: CgroupSupport | None = None
        self._swept = False
        self._sweep_lock = anyio.Lock()
        self._profile: str | None = None

    # --- host facts ---------------------------------------------------------------------------

    @property
    def cli(self) -> str:
        """The CLI's absolute path.

        Raises:
            BackendUnavailableError: it is not installed.
        """
        return _resolve_cli(self._cli_name)

    @property
    def cgroups(self) -> CgroupSupport:
        if self._cgroups is None:
            self._cgroups = detect_root_cgroups()
            swept = sweep_stale(self._cgroups) + sweep_stale_everywhere()
            if swept:
                logger.info("removed %d cgroups left behind by servers that are gone", swept)
        return self._cgroups

    @functools.cached_property
    def _facts(self) -> dict[str, str]:
        """``version``, ``rootless`` and ``cgroup_manager`` of the engine, or ``error``.

        Read from ``info`` as JSON in either dialect (podman's or docker's keys), so a CLI that
        answers for the other one (podman installed as ``docker``) is understood too.
        """
        try:
            done = self._run_cli(["info", "--format", "{{json .}}"])
        except BackendUnavailableError as exc:
            return {"error": str(exc)}
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip()
            return {"error": f"`{self._cli_name} info` failed (is the engine running?): {message}"}
        try:
            info = json.loads(done.stdout)
        except ValueError:
            return {"error": f"`{self._cli_name} info` did not answer JSON"}
        if "host" in info:  # podman
            host = info.get("host", {})
            return {
                "version": str(info.get("version", {}).get("Version", "?")),
                "rootless": str(bool(host.get("security", {}).get("rootless"))).lower(),
                "cgroup_manager": str(host.get("cgroupManager", "")),
            }
        options = " ".join(str(o) for o in info.get("SecurityOptions") or ())
        return {
            "version": str(info.get("ServerVersion", "?")),
            "rootless": str("rootless" in options).lower(),
            "cgroup_manager": str(info.get("CgroupDriver", "")),
        }

    def _run_cli(self, args: list[str], timeout: float = _CLI_SECONDS) -> subprocess.CompletedProcess[str]:
        """Run the CLI synchronously (probe, sweep).

        Raises:
            BackendUnavailableError: it cannot be run.
        """
        try:
            return subprocess.run(
                [self.cli, *args],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=server_env(),
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendUnavailableError(f"{self._cli_name} {args[0]}: {exc}") from exc

    @property
    def rootless(self) -> bool:
        return self._facts.get("rootless") == "true" or os.geteuid() != 0

    def image_for(self, language: str) -> str:
        """The image for ``language``: ``images`` by language, else ``image``, else the default."""
        for entry in self._settings.images:
            key, _, value = entry.partition("=")
            if key.strip() == language:
                return value.strip()
        return self._settings.image or DEFAULT_IMAGE

    def _seccomp_profile(self) -> str:
        """The OCI seccomp profile's path: ``<state_dir>/seccomp-<digest>.json``, written once.

        Named by its content, so servers sharing a state directory share the file and a changed
        deny list gets a new one; the state directory is the server's own, so no other host
        user can swap it between writing and the CLI reading it.
        """
        if self._profile is None:
            data = json.dumps(oci_profile(), sort_keys=True).encode()
            digest = hashlib.sha256(data).hexdigest()[:16]
            directory = self._settings.state_dir
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            path = directory / f"seccomp-{digest}.json"
            if not path.exists():
                with tempfile.NamedTemporaryFile(dir=directory, prefix=".seccomp-", delete=False) as out:
                    out.write(data)
                os.replace(out.name, path)
            self._profile = str(path)
        return self._profile

    def ids_inside(self) -> tuple[int, int]:
        """The uid/gid the container's processes have (see the module docstring)."""
        return self._user()[0]

    def _user(self) -> tuple[tuple[int, int], bool]:
        if os.geteuid() == 0 and not self.rootless:
            return (self._settings.sandbox_uid, self._settings.sandbox_gid), False
        return (_INSIDE_ID, _INSIDE_ID), self.flavour == "podman"

    def run_spec(self, policy: SandboxPolicy, name: str, channel_dir: Path | None, parent: str | None) -> ContainerRun:
        """What, besides the policy, goes into this container's argv."""
        user, keep_id = self._user()
        return ContainerRun(
            cli=self.cli,
            flavour=self.flavour,
            name=name,
            owner=os.getpid(),
            image=self.image_for(policy.language),
            seccomp_profile=self._seccomp_profile(),
            user=user,
            keep_id=keep_id,
            channel="fd" if self.flavour == "podman" else "socket",
            channel_dir=str(channel_dir) if channel_dir is not None else None,
            cgroup_parent=parent,
        )

    # --- sweeping and removing ----------------------------------------------------------------

    def sweep(self) -> int:
        """Remove containers of servers that are gone; return how many. Never raises."""
        try:
            done = self._run_cli(["ps", "--all", "--filter", f"label={LABEL}=1", "--format", "{{.Names}}"])
        except BackendUnavailableError as exc:
            logger.warning("cannot list leftover containers: %s", exc)
            return 0
        stale = []
        for name in done.stdout.split():
            owner = owner_of(name)
            if owner is not None and not Path(f"/proc/{owner}").exists():
                stale.append(name)
        if stale:
            try:
                self._run_cli(self._remove_args(stale))
            except BackendUnavailableError as exc:
                logger.warning("cannot remove leftover containers %s: %s", stale, exc)
                return 0
            logger.info("removed %d containers left behind by servers that are gone", len(stale))
        return len(stale)

    def _remove_args(self, names: list[str]) -> list[str]:
        # podman waits 10 s for a graceful stop unless told not to, and stops at a name that is
        # gone already unless told to ignore it; docker rm -f kills at once and goes on.
        podman = ["--time", "0", "--ignore"] if self.flavour == "podman" else []
        return ["rm", "--force", *podman, *names]

    def sweep_own(self, name: str) -> None:
        """Remove one container of ours synchronously (the probe's); never raises."""
        with contextlib.suppress(BackendUnavailableError):
            self._run_cli(self._remove_args([name]))

    async def remove(self, names: list[str]) -> None:
        """Kill and remove containers by name, bounded; failures are logged, not raised."""
        try:
            with anyio.move_on_after(_TEARDOWN_SECONDS):
                done = await anyio.run_process(
                    [self.cli, *self._remove_args(names)], env=server_env(), check=False, stdin=subprocess.DEVNULL
                )
                if done.returncode != 0 and b"no such container" not in done.stderr.lower():
                    logger.warning("removing %s failed: %s", names, done.stderr.decode(errors="replace").strip())
        except (OSError, BackendUnavailableError) as exc:
            logger.warning("removing %s failed: %s", names, exc)

    async def _sweep_once(self) -> None:
        async with self._sweep_lock:
            if not self._swept:
                self._swept = True
                await anyio.to_thread.run_sync(self.sweep)

    # --- starting -----------------------------------------------------------------------------

    async def start(self, policy: SandboxPolicy) -> ContainerSandbox:
        if policy.language != "python":
            # The JavaScript runtimes' channel set-up and ids inside are bwrap's so far.
            raise SandboxStartError(
                f"the {self.name} backend runs Python only for now; {policy.language} needs the bwrap backend"
            )
        await self._sweep_once()
        cli = self.cli
        name = container_name(os.getpid())
        cgroup: RunCgroup | None = None
        parent: str | None = None
        if self.cgroups.version is not None and self._facts.get("cgroup_manager") == "cgroupfs":
            try:
                cgroup = RunCgroup.create(self.cgroups, policy.limits)
            except OSError as exc:
                raise SandboxStartError(f"cannot create the sandbox's cgroup: {exc}") from exc
            parent = cgroup.hierarchy_path()
        channel_dir: Path | None = None
        listener: socket.socket | None = None
        host_end: socket.socket | None = None
        sandbox_end: socket.socket | None = None
        try:
            if self.flavour == "podman":
                host_end, sandbox_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            else:
                channel_dir, listener = self._listen()
            try:
                command = container_argv(policy, self.run_spec(policy, name, channel_dir, parent))
            except ValueError as exc:
                raise SandboxStartError(str(exc)) from exc
            passed = sandbox_end.fileno() if sandbox_end is not None else None
            try:
                process = await asyncio.create_subprocess_exec(
                    *command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(CHANNEL_FD, passed) if passed is not None else (),
                    env=server_env(),
                    start_new_session=True,
                    preexec_fn=_place_fd(passed),
                    limit=_STREAM_LIMIT,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise SandboxStartError(f"cannot start {cli}: {exc}") from exc
        except BaseException:
            for end in (host_end, sandbox_end, listener):
                if end is not None:
                    end.close()
            if cgroup is not None:
                cgroup.remove()
            if channel_dir is not None:
                shutil.rmtree(channel_dir, ignore_errors=True)
            raise
        if sandbox_end is not None:
            sandbox_end.close()
        limits = (policy.limits.memory, policy.limits.pids)
        channel = host_end or socket.socket(socket.AF_UNIX)  # a placeholder until the container connects
        sandbox = ContainerSandbox(self, process, channel, name, cgroup, limits, channel_dir)
        if listener is not None:
            try:
                await self._accept(sandbox, listener)
            except BaseException:
                await sandbox.aclose()  # cancelled while waiting: the container must not outlive it
                raise
        return sandbox

    def _listen(self) -> tuple[Path, socket.socket]:
        """A listening socket in a fresh directory only the container's uid (and root) can enter."""
        directory = Path(tempfile.mkdtemp(prefix="mcp-sandbox-channel-"))
        user, _ = self._user()
        if os.geteuid() == 0:
            os.chown(directory, user[0], user[1])
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(directory / "channel.sock"))
        if os.geteuid() == 0:
            os.chown(directory / "channel.sock", user[0], user[1])
        listener.listen(1)
        listener.setblocking(False)
        return directory, listener

    async def _accept(self, sandbox: ContainerSandbox, listener: socket.socket) -> None:
        """Wait for the container's one connection (or its early end), then stop listening.

        Raises:
            SandboxStartError: it ended or did not connect in time (the container is removed).
        """
        loop = asyncio.get_running_loop()
        connected: socket.socket | None = None
        try:
            with anyio.move_on_after(_CONNECT_SECONDS):
                async with anyio.create_task_group() as group:

                    async def accept() -> None:
                        nonlocal connected
                        connected, _ = await loop.sock_accept(listener)
                        group.cancel_scope.cancel()

                    async def ended() -> None:
                        await sandbox.wait()
                        group.cancel_scope.cancel()

                    group.start_soon(accept)
                    group.start_soon(ended)
        finally:
            listener.close()
        if connected is None:
            outcome = await sandbox.aclose()
            raise SandboxStartError(f"the container did not connect its channel (exit {outcome.returncode})")
        connected.setblocking(True)
        sandbox.channel.close()
        sandbox.channel = connected

    # --- probing ------------------------------------------------------------------------------

    def probe(self) -> BackendProbe:
        try:
            cli = self.cli
        except BackendUnavailableError as exc:
            return BackendProbe(self.name, available=False, reason=str(exc))
        facts = self._facts
        if "error" in facts:
            return BackendProbe(self.name, available=False, reason=facts["error"], version=cli)
        from mcp_sandbox.sandbox.container_probe import probe_container

        return probe_container(self, cli, facts)


def _place_fd(fd: int | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` putting ``fd`` at :data:`CHANNEL_FD`, where ``--preserve-fds`` takes it."""
    if fd is None:
        return None

    def place() -> None:
        if fd != CHANNEL_FD:
            os.dup2(fd, CHANNEL_FD)

    return place


def create_named(settings: Settings, name: str) -> ContainerBackend:
    """The registry's constructor for ``podman``, ``docker`` and ``container`` (autodetected).

    Raises:
        ConfigError: ``name`` is not a container backend.
    """
    if name == "container":
        try:
            found, dialect = detect_runtime(settings)
        except BackendUnavailableError:
            found, dialect = "podman", "podman"
        return ContainerBackend(settings, "container", found, dialect)
    if name not in ("podman", "docker"):
        raise ConfigError(f"backend: {name!r} is not a container backend")
    flavour: Flavour = "podman" if name == "podman" else "docker"
    # container_runtime names the CLI of its own dialect only: a podman path is not docker's.
    configured = settings.container_runtime
    cli = configured if configured and _flavour_of(configured) == flavour else None
    return ContainerBackend(settings, name, cli, flavour)


def create(settings: Settings) -> ContainerBackend:
    """The registry's constructor for ``--backend container``: podman or docker, autodetected."""
    return create_named(settings, "container")
