"""The seccomp deny list, compiled to BPF with pyseccomp (ctypes over system libseccomp).

Default action ALLOW, with a deny list: the usual dangerous syscalls answer EPERM; ENOSYS, as
from a kernel without them, for ``clone3`` (its flags live in memory where BPF cannot read
them, so libc falls back to ``clone``, whose namespace flags the filter does inspect) and
inotify (a watch on a shared read-only tree sees other sandboxes' opens, its instances are a
per-uid pool; file watchers fall back to polling on ENOSYS); sockets other than ``AF_UNIX``
answer EAFNOSUPPORT, and ``ioctl(TIOCSTI/TIOCLINUX)`` EPERM. Syscalls of other architectures
(i386 via ``int 0x80``, x32) kill the process: libseccomp's bad-arch default.

The ``egress`` variant (a sandbox granted network) also allows TCP stream sockets of ``AF_INET``
and ``AF_INET6``, for the relay on the sandbox's loopback to the egress proxy; other socket
types of those families (UDP, raw) answer EPROTONOSUPPORT. The network namespace stays empty.
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import socket
import termios
from collections.abc import Iterable
from typing import Any

from mcp_sandbox.errors import BackendUnavailableError

__all__ = [
    "DENIED_SYSCALLS",
    "UNSUPPORTED_SYSCALLS",
    "build_filter",
    "compiled_bpf",
    "oci_profile",
    "seccomp_available",
    "server_oci_profile",
    "write_bpf",
    "zygote_guard_bpf",
]

# Denied with EPERM, grouped by what they reach (docs/security.md); names unknown to this
# libseccomp are skipped.
DENIED_SYSCALLS: tuple[str, ...] = (
    # debugging / cross-process memory
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    # mount family and root changes
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    # namespaces
    "unshare",
    "setns",
    # kernel keyring
    "keyctl",
    "add_key",
    "request_key",
    # eBPF, perf, userfaultfd, io_uring
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # kernel images and modules
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    # host-wide state
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "lookup_dcookie",
    "vhangup",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    # raw hardware and file handles
    "iopl",
    "ioperm",
    "name_to_handle_at",
    "open_by_handle_at",
    # fanotify watches the whole mount, landlock/namespaces are the host's to set
    "fanotify_init",
    "personality",
    # POSIX message queues outlive their processes in the sandbox's IPC namespace and cannot be
    # listed without mounting mqueue: a warm sandbox could not clear them between runs
    "mq_open",
    "mq_unlink",
)

# Answered ENOSYS, as by a kernel without them, so callers take the fallback they have for that.
UNSUPPORTED_SYSCALLS: tuple[str, ...] = ("clone3", "inotify_init", "inotify_init1", "inotify_add_watch")

_PRIO_PROCESS = 0  # setpriority(which=PRIO_PROCESS, who=pid, ...)
_IOPRIO_WHO_PROCESS = 1  # ioprio_set(which=IOPRIO_WHO_PROCESS, who=pid, ...)

# clone() flags that create namespaces; denied so no nested namespace (or user ns) is made.
_CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)

_OCI_ARCHES = {"x86_64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64"}

_DENIED_IOCTLS = (termios.TIOCSTI, getattr(termios, "TIOCLINUX", 0x541C))


def seccomp_available() -> str | None:
    """Return ``None`` when a filter can be built here, else the reason it cannot."""
    try:
        import pyseccomp  # noqa: F401  (imported for its side effect: loading libseccomp)
    except (ImportError, OSError, RuntimeError) as exc:
        return f"pyseccomp cannot load the system libseccomp: {exc}"
    return None


def _add(flt: Any, action: int, names: Iterable[str], *args: Any) -> None:
    for name in names:
        try:
            flt.add_rule(action, name, *args)
        except (RuntimeError, OSError, ValueError):
            # Not a syscall on this architecture / libseccomp version: nothing to deny.
            continue


# With egress: the address families that stay refused (all but AF_UNIX, AF_INET, AF_INET6; up to
# AF_MAX, and anything above), and the socket types refused for AF_INET/AF_INET6 (all but SOCK_STREAM,
# compared on the low 4 bits, where SOCK_NONBLOCK and SOCK_CLOEXEC do not reach).
_AF_MAX = 46
_EGRESS_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6)
_REFUSED_FAMILIES = tuple(family for family in range(_AF_MAX) if family not in _EGRESS_FAMILIES)
_SOCK_TYPE_MASK = 0xF
_REFUSED_TYPES = tuple(kind for kind in range(_SOCK_TYPE_MASK + 1) if kind != socket.SOCK_STREAM)


def build_filter(*, egress: bool = False) -> Any:
    """Build the deny-list filter (a ``pyseccomp.SyscallFilter``); ``egress``: TCP sockets allowed too.

    Raises:
        BackendUnavailableError: libseccomp cannot be loaded on this host.
    """
    reason = seccomp_available()
    if reason is not None:
        raise BackendUnavailableError(reason)
    import pyseccomp as sc

    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    _add(flt, eperm, DENIED_SYSCALLS)
    _add(flt, sc.ERRNO(errno.ENOSYS), UNSUPPORTED_SYSCALLS)
    for flag in _CLONE_NAMESPACE_FLAGS:
        # x86-64 clone(flags, ...): flags is argument 0.
        _add(flt, eperm, ["clone"], sc.Arg(0, sc.MASKED_EQ, flag, flag))
    no_family = sc.ERRNO(errno.EAFNOSUPPORT)
    _add(flt, no_family, ["socketpair"], sc.Arg(0, sc.NE, socket.AF_UNIX))
    if not egress:
        _add(flt, no_family, ["socket"], sc.Arg(0, sc.NE, socket.AF_UNIX))
    else:
        for family in _REFUSED_FAMILIES:
            _add(flt, no_family, ["socket"], sc.Arg(0, sc.EQ, family))
        _add(flt, no_family, ["socket"], sc.Arg(0, sc.GE, _AF_MAX))
        for family in (socket.AF_INET, socket.AF_INET6):
            for kind in _REFUSED_TYPES:
                _add(
                    flt,
                    sc.ERRNO(errno.EPROTONOSUPPORT),
                    ["socket"],
                    sc.Arg(0, sc.EQ, family),
                    sc.Arg(1, sc.MASKED_EQ, _SOCK_TYPE_MASK, kind),
                )
    for request in _DENIED_IOCTLS:
        _add(flt, eperm, ["ioctl"], sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    return flt


@functools.cache
def compiled_bpf(*, egress: bool = False) -> bytes:
    """The filter as BPF bytes, compiled once per process (per variant).

    Raises:
        BackendUnavailableError: libseccomp cannot be loaded on this host.
    """
    return _export(build_filter(egress=egress))


def _export(flt: Any) -> bytes:
    fd = os.memfd_create("mcp-sandbox-seccomp-build", os.MFD_CLOEXEC)
    try:
        with os.fdopen(fd, "w+b", closefd=True) as out:
            flt.export_bpf(out)
            out.flush()
            out.seek(0)
            return out.read()
    except OSError as exc:
        raise BackendUnavailableError(f"cannot compile the seccomp filter: {exc}") from exc


@functools.lru_cache(maxsize=64)
def zygote_guard_bpf(zygote_pid: int) -> bytes:
    """A second filter, stacked on the first in every run a warm sandbox forks: hands off the zygote.

    The run shares its pid namespace and uid with the zygote that forked it, so it could signal
    it; these are refused with EPERM: kill() of the zygote, of its process group or of everyone
    (-1), the thread-directed and queued signal calls and pidfd_open() on it, and joining its
    process group (from where kill(0) would reach it). Arguments are compared on their low 32
    bits, as the kernel reads a pid_t, so a raw syscall with garbage above cannot slip past.

    ``pidfd_send_signal`` is refused whatever its descriptor: a directory fd of ``/proc/<pid>``
    is a pidfd too, and which process it names is not in the syscall's arguments (a path
    lookup seccomp cannot see); a warm run has kill() for its own processes. The scheduling and
    I/O-priority calls a child of the same uid could aim at the zygote (which every later run
    would inherit) are refused on its pid; ``setpriority`` and ``ioprio_set`` on a process group
    or a whole uid are refused outright (the zygote's group or uid would be among them).

    Raises:
        BackendUnavailableError: libseccomp cannot be loaded on this host.
    """
    reason = seccomp_available()
    if reason is not None:
        raise BackendUnavailableError(reason)
    import pyseccomp as sc

    def low(value: int) -> int:
        return value & 0xFFFFFFFF

    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    eperm = sc.ERRNO(errno.EPERM)
    for target in (zygote_pid, -zygote_pid, -1):
        _add(flt, eperm, ["kill"], sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, low(target)))
    for name in ("tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open"):
        _add(flt, eperm, [name], sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, low(zygote_pid)))
    _add(flt, eperm, ["setpgid"], sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, low(zygote_pid)))
    _add(flt, eperm, ["pidfd_send_signal"])
    for name in ("sched_setscheduler", "sched_setparam", "sched_setattr", "sched_setaffinity"):
        _add(flt, eperm, [name], sc.Arg(0, sc.MASKED_EQ, 0xFFFFFFFF, low(zygote_pid)))
    for name, one_process in (("setpriority", _PRIO_PROCESS), ("ioprio_set", _IOPRIO_WHO_PROCESS)):
        _add(flt, eperm, [name], sc.Arg(0, sc.NE, one_process))
        _add(flt, eperm, [name], sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, low(zygote_pid)))
    return _export(flt)


def _known(names: Iterable[str]) -> list[str]:
    """The names libseccomp knows on this architecture (crun refuses a profile naming others)."""
    import pyseccomp as sc

    known: list[str] = []
    for name in names:
        try:
            sc.resolve_syscall(sc.Arch.NATIVE, name)
        except (RuntimeError, OSError, ValueError):
            continue
        known.append(name)
    return known


def oci_profile(*, egress: bool = False) -> dict[str, Any]:
    """The deny list as an OCI seccomp profile (the JSON podman and docker take); ``egress`` as :func:`build_filter`.

    Same rules as :func:`build_filter`: one entry per rule, since the conditions inside one
    entry are AND-ed and separate entries are OR-ed. Only the native architecture is listed,
    so the runtime kills syscalls of any other (``int 0x80``), as the BPF filter does.

    Raises:
        BackendUnavailableError: libseccomp cannot be loaded on this host.
    """
    reason = seccomp_available()
    if reason is not None:
        raise BackendUnavailableError(reason)

    def errno_rule(names: list[str], number: int, args: list[dict[str, int | str]] | None = None) -> dict[str, Any]:
        rule: dict[str, Any] = {"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": number}
        if args:
            rule["args"] = args
        return rule

    def arg(index: int, op: str, value: int, value_two: int = 0) -> dict[str, int | str]:
        return {"index": index, "value": value, "valueTwo": value_two, "op": op}

    rules = [errno_rule(_known(DENIED_SYSCALLS), errno.EPERM), errno_rule(_known(UNSUPPORTED_SYSCALLS), errno.ENOSYS)]
    rules += [errno_rule(["clone"], errno.EPERM, [arg(0, "SCMP_CMP_MASKED_EQ", f, f)]) for f in _CLONE_NAMESPACE_FLAGS]
    rules.append(errno_rule(["socketpair"], errno.EAFNOSUPPORT, [arg(0, "SCMP_CMP_NE", socket.AF_UNIX)]))
    if not egress:
        rules.append(errno_rule(["socket"], errno.EAFNOSUPPORT, [arg(0, "SCMP_CMP_NE", socket.AF_UNIX)]))
    else:
        rules += [errno_rule(["socket"], errno.EAFNOSUPPORT, [arg(0, "SCMP_CMP_EQ", f)]) for f in _REFUSED_FAMILIES]
        rules.append(errno_rule(["socket"], errno.EAFNOSUPPORT, [arg(0, "SCMP_CMP_GE", _AF_MAX)]))
        rules += [
            errno_rule(
                ["socket"],
                errno.EPROTONOSUPPORT,
                [arg(0, "SCMP_CMP_EQ", family), arg(1, "SCMP_CMP_MASKED_EQ", _SOCK_TYPE_MASK, kind)],
            )
            for family in (socket.AF_INET, socket.AF_INET6)
            for kind in _REFUSED_TYPES
        ]
    rules += [
        errno_rule(["ioctl"], errno.EPERM, [arg(1, "SCMP_CMP_MASKED_EQ", 0xFFFFFFFF, request)])
        for request in _DENIED_IOCTLS
    ]
    arch = _OCI_ARCHES.get(platform.machine(), "SCMP_ARCH_NATIVE")
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": [arch], "syscalls": rules}


# What bubblewrap itself needs of the deny list, when the server runs it inside a container, and
# what the server needs: inotify, for the wake-ups of its workspace measure (engine/inotify.py).
_BWRAP_NEEDS = frozenset({"mount", "umount", "umount2", "pivot_root", "chroot", "unshare", "setns", "sethostname"})
_SERVER_NEEDS = _BWRAP_NEEDS | {"inotify_init", "inotify_init1", "inotify_add_watch"}


def server_oci_profile() -> dict[str, Any]:
    """The OCI seccomp profile of the server's own container (deploy/seccomp-server.json).

    The server starts bwrap inside its container, so unlike a sandbox it must create user,
    mount, pid and network namespaces and mount inside them: the deny list minus exactly those
    calls (``_BWRAP_NEEDS``) and inotify, and none of the clone-flag or socket-family rules (the
    server listens on TCP). Everything else a sandbox may not do, the server may not either. Each
    sandbox still gets the full filter (:func:`build_filter`) from bwrap.

    Raises:
        BackendUnavailableError: libseccomp cannot be loaded on this host.
    """
    profile = oci_profile()
    rules = []
    for rule in profile["syscalls"]:
        if rule.get("args") and rule["names"] != ["ioctl"]:
            continue  # clone's namespace flags, socket families
        names = [name for name in rule["names"] if name not in _SERVER_NEEDS]
        if names:
            rules.append({**rule, "names": names})
    return {**profile, "syscalls": rules}


def write_bpf(*, egress: bool = False) -> int:
    """Return a fresh readable fd (a memfd at offset 0) holding the BPF; the caller closes it.

    Each sandbox gets its own fd because ``bwrap --seccomp FD`` reads it to the end.
    """
    data = compiled_bpf(egress=egress)
    fd = os.memfd_create("mcp-sandbox-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
