"""The part of the host filesystem every sandbox sees, read-only.

Only what an interpreter needs: ``/usr`` (binaries, libraries, the stdlib), the usr-merged
``/bin``, ``/lib``... links (or binds where the host is not usr-merged), and a handful of
``/etc`` files (dynamic linker cache, time zone, CA certificates, fontconfig). Nothing else of ``/etc``,
no ``/home``, ``/root``, ``/var`` or ``/run``. ``/etc/hosts`` is the sandbox's own (``etc/hosts`` here):
``localhost`` resolves, and none of the host's names show.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from mcp_sandbox.sandbox.policy import Mount

__all__ = ["system_mounts"]

_TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/fonts",  # fontconfig (matplotlib) complains on every plot without it
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/mime.types",
)
# Names only loopback: the host's file would show its names and addresses, and without one
# ``localhost`` does not resolve at all (no resolver runs in a sandbox).
_HOSTS = Path(__file__).with_name("etc") / "hosts"


@functools.cache
def system_mounts() -> tuple[tuple[Mount, ...], tuple[tuple[str, str], ...]]:
    """(read-only mounts, symlinks) giving the sandbox the host's ``/usr`` and friends."""
    mounts: list[Mount] = [Mount(Path("/usr"), "/usr", system=True)]
    links: list[tuple[str, str]] = []
    for name in _TOP_LEVEL:
        host = Path("/") / name
        if host.is_symlink():
            links.append((os.readlink(host), f"/{name}"))
        elif host.is_dir():
            mounts.append(Mount(host, f"/{name}", system=True))
    mounts.extend(Mount(Path(p), p, system=True) for p in _ETC if os.path.exists(p))
    mounts.append(Mount(_HOSTS, "/etc/hosts", system=True))
    return tuple(mounts), tuple(links)
