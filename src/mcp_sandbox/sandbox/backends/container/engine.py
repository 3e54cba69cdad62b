"""A container engine seen through its CLI: which CLI, what the engine says of itself, removal.

Containers are ended by name (``rm --force``) where the engine's own ``--rm`` did not remove
them (see ``running.py``): killing the ``run`` client would leave the container running.
Containers a crashed server left behind are swept by label, but only those whose owner (the
server pid in the name and label) is gone: several servers may share a host.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

import anyio

from mcp_sandbox.config import SandboxSettings
from mcp_sandbox.errors import BackendUnavailableError
from mcp_sandbox.sandbox.backends.container.argv import LABEL, Flavour, owner_of, server_env

__all__ = ["ContainerEngine", "detect_runtime", "engine_failure_advice", "flavour_of"]

logger = logging.getLogger(__name__)

_CLI_SECONDS = 30.0
# Roomy: cut short, `rm` leaves the container behind (stopped, its storage kept) until a later
# server's sweep. On a slow host (emulation, the vfs storage driver) it took past 10 s.
_REMOVE_SECONDS = 60.0


def detect_runtime(sandbox: SandboxSettings) -> tuple[str, Flavour]:
    """The container CLI to use for ``--backend container``, in the earlier bridge's order.

    ``container_runtime`` (``MCP_BRIDGE_RUNTIME``) when set, else podman, else docker.

    Raises:
        BackendUnavailableError: none is installed.
    """
    if sandbox.container_runtime:
        return sandbox.container_runtime, flavour_of(sandbox.container_runtime)
    for name in ("podman", "docker"):
        if shutil.which(name):
            return name, "podman" if name == "podman" else "docker"
    raise BackendUnavailableError("no container runtime: neither podman nor docker is on PATH")


def flavour_of(cli: str) -> Flavour:
    """The dialect a CLI speaks, by its name (``docker``, ``/usr/bin/podman``, a wrapper's name)."""
    return "docker" if "docker" in Path(cli).name else "podman"


def engine_failure_advice(message: str) -> str:
    """What fixes a failed ``info``: rootless podman without Debian's uidmap says only "not found"."""
    helpers = [helper for helper in ("newuidmap", "newgidmap") if helper in message]
    if helpers and ("not found" in message or "no such file" in message.lower()):
        return f"{'/'.join(helpers)} is missing (as root: apt install uidmap); podman said: {message}"
    return f"is the engine running? {message}"


class ContainerEngine:
    """One podman or docker engine, driven through its CLI ``cli_name`` speaking ``flavour``."""

    def __init__(self, cli_name: str, flavour: Flavour) -> None:
        self.cli_name = cli_name
        self.flavour: Flavour = flavour
        self.swept = False  # by :meth:`sweep_once`
        self._sweeping = threading.Lock()

    @property
    def cli(self) -> str:
        """The CLI's absolute path.

        Raises:
            BackendUnavailableError: it is not installed or not executable.
        """
        found = shutil.which(self.cli_name)
        if found is None:
            raise BackendUnavailableError(f"{self.cli_name}: not found or not executable")
        return found

    @functools.cached_property
    def facts(self) -> dict[str, str]:
        """``version``, ``rootless`` and ``cgroup_manager`` of the engine, or ``error``.

        Read from ``info`` as JSON in either dialect (podman's or docker's keys), so a CLI that
        answers for the other one (podman installed as ``docker``) is understood too.
        """
        try:
            done = self.run(["info", "--format", "{{json .}}"])
        except BackendUnavailableError as exc:
            return {"error": str(exc)}
        if done.returncode != 0:
            message = done.stderr.strip() or done.stdout.strip()
            return {"error": f"`{self.cli_name} info` failed: {engine_failure_advice(message)}"}
        try:
            info = json.loads(done.stdout)
        except ValueError:
            return {"error": f"`{self.cli_name} info` did not answer JSON"}
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

    @property
    def rootless(self) -> bool:
        """Whether the engine runs without root (or we do)."""
        return self.facts.get("rootless") == "true" or os.geteuid() != 0

    def run(self, args: list[str], timeout: float = _CLI_SECONDS) -> subprocess.CompletedProcess[str]:
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
            raise BackendUnavailableError(f"{self.cli_name} {args[0]}: {exc}") from exc

    def _remove_args(self, names: list[str]) -> list[str]:
        # podman waits 10 s for a graceful stop unless told not to, and stops at a name that is
        # gone already unless told to ignore it; docker rm -f kills at once and goes on.
        podman = ["--time", "0", "--ignore"] if self.flavour == "podman" else []
        return ["rm", "--force", *podman, *names]

    async def remove(self, names: list[str]) -> None:
        """Kill and remove containers by name, bounded; failures are logged, not raised."""
        try:
            with anyio.move_on_after(_REMOVE_SECONDS):
                # Twice at most: podman's removal fails when the container's process exits under it
                # ("open pidfd: No such process", seen when a start is cancelled).
                for attempt in range(2):
                    done = await anyio.run_process(
                        [self.cli, *self._remove_args(names)], env=server_env(), check=False, stdin=subprocess.DEVNULL
                    )
                    if done.returncode == 0 or b"no such container" in done.stderr.lower():
                        return
                    if attempt:
                        logger.warning("removing %s failed: %s", names, done.stderr.decode(errors="replace").strip())
        except (OSError, BackendUnavailableError) as exc:
            logger.warning("removing %s failed: %s", names, exc)

    def remove_now(self, name: str) -> None:
        """Remove one container of ours synchronously (the probe's); never raises."""
        with contextlib.suppress(BackendUnavailableError):
            self.run(self._remove_args([name]))

    def sweep_once(self) -> None:
        """:meth:`sweep`, the first time only (the first container a backend of this engine starts)."""
        with self._sweeping:
            if not self.swept:
                self.sweep()
                self.swept = True

    def sweep(self) -> int:
        """Remove containers of servers that are gone; return how many. Never raises."""
        try:
            done = self.run(["ps", "--all", "--filter", f"label={LABEL}=1", "--format", "{{.Names}}"])
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
                self.run(self._remove_args(stale))
            except BackendUnavailableError as exc:
                logger.warning("cannot remove leftover containers %s: %s", stale, exc)
                return 0
            logger.info("removed %d containers left behind by servers that are gone", len(stale))
        return len(stale)
