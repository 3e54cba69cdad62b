"""The gate as a static program of ours (``gate.c``): where its build lives, and whether to run it.

A sandbox's first process waits at its gate (see :mod:`.launcher`), then drops to the sandbox's
uid and execs the backend's binary. ``sh`` and ``setpriv`` do it as two dynamically linked execs;
``gate.c``, built statically at setup, does it as one (about 1.2 ms less CPU per sandbox here).
Setup (``make runtime``, ``mcp-sandbox setup``: :mod:`mcp_sandbox.provision.gate`) compiles it
into ``<gate_dir>/<digest>/mcp-sandbox-gate``; the digest covers the source and the compiler's
flags, so a build is never run for other sources. The server runs it as itself (root, for a root
server), so it is used only when nobody else could have written it: the file, its directory and
``gate_dir`` owned by root or by us and writable by nobody else. Without a usable build, sandboxes
start through ``sh`` and ``setpriv``, as correctly.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

__all__ = ["CFLAGS", "NAME", "SOURCE", "built_path", "refusal"]

SOURCE = Path(__file__).with_name("gate.c")
NAME = "mcp-sandbox-gate"
# Static: no dynamic loader runs at its exec (which is the whole point of it); hardened as
# Debian builds its packages.
CFLAGS = ("-std=c11", "-O2", "-Wall", "-D_FORTIFY_SOURCE=2", "-fstack-protector-strong", "-static")


@functools.cache
def _digest() -> str:
    content = hashlib.sha256(SOURCE.read_bytes())
    content.update("\0".join(CFLAGS).encode())
    return content.hexdigest()[:16]


def built_path(directory: Path) -> Path:
    """Where setup puts the gate built from this package's source under ``directory``."""
    return directory / _digest() / NAME


def refusal(directory: Path) -> str | None:
    """Why the gate under ``directory`` is not to be run, or None when it is.

    Not there (never built, or built from other sources), not a regular executable file, or
    something on its path owned by another user or writable by group or others.
    """
    path = built_path(directory)
    ours = {0, os.geteuid()}
    try:
        for part in (directory, path.parent, path):
            info = part.lstat()
            if info.st_uid not in ours or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return (
                    f"{part} is owned by uid {info.st_uid} or writable by others (mode {stat.filemode(info.st_mode)})"
                )
    except FileNotFoundError:
        return f"not built for this version ({path} is missing)"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if not stat.S_ISREG(info.st_mode) or not os.access(path, os.X_OK):
        return f"{path} is not an executable file"
    return None
