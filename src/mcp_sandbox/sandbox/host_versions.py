"""The versions of the host's sandbox programs and kernel, and the escape advisories that hit them.

Asked of each program (``--version``), and of dpkg where it installed the program, since a
Debian build's package version says which fixes it carries beyond its upstream version
(:mod:`.advisories`). The kernel's upstream version is read from ``uname -v`` on Debian
(``Debian 6.1.76-1``: ``uname -r`` says only ``6.1.0-18``) and ``/proc/version_signature`` on
Ubuntu, else ``uname -r``. Nothing here raises: a program that is missing or says nothing
readable is reported as such.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.sandbox.advisories import Advisory, affecting, parse_version

__all__ = ["HostVersion", "host_versions"]

_PROGRAMS = ("bwrap", "podman", "crun", "runc")
_SECONDS = 10
_DEBIAN_KERNEL = re.compile(r"Debian (\d+\.\d+\.\d+)")


@dataclass(frozen=True, slots=True)
class HostVersion:
    """``component``'s version as it said it (``shown``), its Debian package version, what hits it."""

    component: str
    shown: str | None  # None: not installed
    package: str | None = None
    advisories: tuple[Advisory, ...] = ()


def _run(*argv: str) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _package_version(path: str) -> str | None:
    """The Debian package version of the package that installed ``path``, if dpkg did."""
    if shutil.which("dpkg-query") is None:
        return None
    for candidate in dict.fromkeys((path, os.path.realpath(path))):
        owner = _run("dpkg-query", "-S", candidate)
        if owner and ":" in owner:
            name = owner.split(":", 1)[0].split(",")[0].strip()
            version = _run("dpkg-query", "-W", "-f=${Version}", name)
            if version:
                return version
    return None


def _program(name: str) -> HostVersion:
    path = shutil.which(name)
    if path is None:
        return HostVersion(name, None)
    said = _run(path, "--version")
    first = said.splitlines()[0] if said else ""
    version = parse_version(first)
    package = _package_version(path)
    if version is None:
        return HostVersion(name, first or "unknown", package)
    return HostVersion(name, first, package, tuple(affecting(name, version, package)))


def _kernel() -> HostVersion:
    release = platform.release()
    upstream = None
    if found := _DEBIAN_KERNEL.search(platform.version()):
        upstream = found[1]
    else:
        try:  # "Ubuntu 5.15.0-91.101-generic 5.15.131": the last field is the upstream version
            upstream = Path("/proc/version_signature").read_text(encoding="ascii").split()[-1]
        except (OSError, IndexError, UnicodeDecodeError):
            upstream = None
    shown = release if upstream is None or upstream in release else f"{release} (upstream {upstream})"
    version = parse_version(upstream or release)
    if version is None:
        return HostVersion("kernel", shown)
    return HostVersion("kernel", shown, None, tuple(affecting("kernel", version)))


def host_versions() -> list[HostVersion]:
    """bwrap, podman, crun, runc and the kernel, in that order."""
    return [*(_program(name) for name in _PROGRAMS), _kernel()]
