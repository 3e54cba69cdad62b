"""The gate as a static program of ours (``gate.c``): where its build lives, and whether to run it.

A sandbox's first process waits at its gate (see :mod:`.launcher`), then drops to the sandbox's
uid and execs the backend's binary. ``sh`` and ``setpriv`` do it as two dynamically linked execs;
``gate.c``, built statically at setup, does it as one (about 1.2 ms less CPU per sandbox here).
Setup (``make runtime``, ``mcp-sandbox setup``: :mod:`mcp_sandbox.provision.gate`) compiles it
into ``<gate_dir>/<digest>/mcp-sandbox-gate``; the digest covers the source and the compiler's
flags, so a build is never run for other sources. The server runs it as itself (root, for a root
server), so it is used only when nobody else could have written it or swapped it: the file, its
directory, ``gate_dir`` and every parent up to ``/`` owned by root or by us and writable by
nobody else, but for a sticky directory (``/tmp``): others may add entries there but not rename
or remove ours, so what follows it on the way, itself owned by root or by us, stays ours (the
rule sudo and systemd apply to a path); and the descriptor that was checked is what runs
(``/proc/self/fd/N``), not the path again. Without a usable build, sandboxes start through
``sh`` and ``setpriv``, as correctly.
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
from pathlib import Path

__all__ = ["CFLAGS", "NAME", "SOURCE", "built_path", "exec_path", "open_checked", "refusal"]

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


def _walk(path: Path) -> int:
    """An ``O_PATH`` descriptor of ``path``, each directory on the way opened from the last, none followed.

    Raises:
        _Untrusted: a part of the way is owned by another user or writable by group or others.
        OSError: a part is missing, or is a symbolic link.
    """
    ours = {0, os.geteuid()}
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    shown = Path("/")
    try:
        parts = path.parts[1:]
        for index, name in enumerate(("", *parts)):
            if name:
                last = index == len(parts)
                flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if last else os.O_DIRECTORY)
                opened = os.open(name, flags, dir_fd=fd)
                os.close(fd)
                fd, shown = opened, shown / name
            info = os.fstat(fd)
            if info.st_uid not in ours:
                raise _Untrusted(f"{shown} is owned by uid {info.st_uid}, neither root nor this server's user")
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not _sticky_directory(info):
                raise _Untrusted(f"{shown} is writable by group or others (mode {stat.filemode(info.st_mode)})")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sticky_directory(info: os.stat_result) -> bool:
    """Whether ``info`` is a sticky directory (the gate itself is a file): nobody but its owner and
    an entry's owner may rename or remove an entry, and the walk checks the next entry's owner."""
    return stat.S_ISDIR(info.st_mode) and bool(info.st_mode & stat.S_ISVTX)


class _Untrusted(Exception):
    pass


def open_checked(directory: Path) -> int | str:
    """The gate under ``directory`` opened (``O_PATH``, close-on-exec) once checked, or why it is not to be run.

    Not there (never built, or built from other sources), not a regular executable file, or
    something on its path, from ``/`` down, owned by another user, writable by group or others
    (but for a sticky directory on the way, such as ``/tmp``), or a symbolic link. The caller
    runs the descriptor, never the path again (:func:`exec_path`), so nothing can be swapped in
    between, and closes it.
    """
    path = built_path(Path(os.path.realpath(directory)))
    try:
        fd = _walk(path)
    except _Untrusted as untrusted:
        if not os.path.lexists(path):  # what is said first: nothing to run (the walk decides the rest)
            return _missing(directory)
        return str(untrusted)
    except FileNotFoundError:
        return _missing(directory)
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or not info.st_mode & stat.S_IXUSR:
        os.close(fd)
        return f"{path} is not an executable file"
    return fd


def _missing(directory: Path) -> str:
    return f"not built for this version ({built_path(directory)} is missing)"


def exec_path(fd: int) -> str:
    """The path that runs the file of descriptor ``fd`` in a child it is passed to (``pass_fds``)."""
    return f"/proc/self/fd/{fd}"


def refusal(directory: Path) -> str | None:
    """Why the gate under ``directory`` is not to be run (see :func:`open_checked`), or None when it is."""
    opened = open_checked(directory)
    if isinstance(opened, str):
        return opened
    os.close(opened)
    return None
