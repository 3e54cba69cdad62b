"""Privilege attacks: an unprivileged uid, no capabilities, no_new_privs, and a seccomp deny list.

Raw syscalls use x86-64 numbers and arguments chosen so that, without the filter, most of
them would succeed (or fail for another reason): the expected EPERM is the filter's answer.
"""

from __future__ import annotations

import os
import platform

import pytest

from .harness import SandboxRunner

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers are x86-64's")

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x00020000, 0x10000000, 0x40000000, 17


async def test_code_runs_as_the_unprivileged_uid(sandbox: SandboxRunner, sandbox_ids: tuple[int, int]) -> None:
    report = await sandbox.report("""
        report["uids"] = list(os.getresuid())
        report["gids"] = list(os.getresgid())
        report["groups"] = os.getgroups()
    """)
    uid, gid = sandbox_ids
    assert 0 not in (uid, gid)
    assert report["uids"] == [uid] * 3
    assert report["gids"] == [gid] * 3
    assert report["groups"] in ([], [gid])


async def test_process_has_no_new_privs_no_capabilities_and_a_seccomp_filter(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key.startswith("Cap") or key in ("NoNewPrivs", "Seccomp"):
                    report[key] = value.strip()
    """)
    assert report == {
        "CapInh": "0000000000000000",
        "CapPrm": "0000000000000000",
        "CapEff": "0000000000000000",
        "CapBnd": "0000000000000000",
        "CapAmb": "0000000000000000",
        "NoNewPrivs": "1",
        "Seccomp": "2",
    }


@x86_64_only
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        pytest.param("syscall(101, 0, 0, 0, 0)", "EPERM", id="ptrace-traceme"),
        pytest.param("syscall(101, 16, 1, 0, 0)", "EPERM", id="ptrace-attach-pid-1"),
        pytest.param("syscall(310, 1, 0, 0, 0, 0, 0)", "EPERM", id="process_vm_readv-pid-1"),
        pytest.param('syscall(165, b"none", b"/tmp", b"tmpfs", 0, 0)', "EPERM", id="mount"),
        pytest.param('syscall(166, b"/tmp", 2)', "EPERM", id="umount2"),
        pytest.param('syscall(155, b"/tmp", b"/tmp")', "EPERM", id="pivot_root"),
        pytest.param('syscall(161, b"/tmp")', "EPERM", id="chroot"),
        pytest.param('syscall(430, b"tmpfs", 0)', "EPERM", id="fsopen"),
        pytest.param('syscall(428, -100, b"/tmp", 1)', "EPERM", id="open_tree-clone"),
        pytest.param(f"syscall(272, {CLONE_NEWUSER})", "EPERM", id="unshare-user"),
        pytest.param(f"syscall(272, {CLONE_NEWNS})", "EPERM", id="unshare-mount"),
        pytest.param(f"syscall(272, {CLONE_NEWNET})", "EPERM", id="unshare-net"),
        pytest.param('syscall(308, os.open("/proc/self/ns/net", os.O_RDONLY), 0)', "EPERM", id="setns"),
        pytest.param(f"forking_syscall(56, {CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0)", "EPERM", id="clone-newuser"),
        pytest.param(f"forking_syscall(56, {CLONE_NEWNET | SIGCHLD}, 0, 0, 0, 0)", "EPERM", id="clone-newnet"),
        pytest.param("forking_syscall(435, zeros, 88)", "ENOSYS", id="clone3"),
        pytest.param("syscall(250, 0, -3, 1)", "EPERM", id="keyctl-session-keyring"),
        pytest.param('syscall(248, b"user", b"mcp", b"v", 1, -2)', "EPERM", id="add_key"),
        pytest.param("syscall(321, 0, zeros, 72)", "EPERM", id="bpf"),
        pytest.param("syscall(298, zeros, 0, -1, -1, 0)", "EPERM", id="perf_event_open"),
        pytest.param("syscall(323, 1)", "EPERM", id="userfaultfd-user-mode"),
        pytest.param("syscall(425, 1, zeros)", "EPERM", id="io_uring_setup"),
        pytest.param("syscall(304, -100, zeros, 0)", "EPERM", id="open_by_handle_at"),
        pytest.param('syscall(313, -1, b"", 0)', "EPERM", id="finit_module"),
        pytest.param("syscall(246, 0, 0, 0, 0)", "EPERM", id="kexec_load"),
        pytest.param("syscall(103, 10, 0, 0)", "EPERM", id="syslog"),
        pytest.param("syscall(135, 0x0008)", "EPERM", id="personality"),
    ],
)
async def test_dangerous_syscall_is_denied(sandbox: SandboxRunner, call: str, expected: str) -> None:
    report = await sandbox.report(f"""
        report["result"] = {call}
    """)
    assert report["result"] == expected


@x86_64_only
async def test_i386_syscall_abi_kills_the_caller(sandbox: SandboxRunner) -> None:
    # int 0x80 reaches the 32-bit syscall table, where a filter written for x86-64 numbers would
    # not apply: the filter must kill anything not of its own architecture (SIGSYS). A host without
    # IA-32 emulation answers int 0x80 with SIGSEGV, which is as good.
    report = await sandbox.report("""
        import mmap, signal
        # push rbx; mov eax, 26 (i386 ptrace); xor ebx, ebx (PTRACE_TRACEME); int 0x80; pop rbx; ret
        machine_code = bytes.fromhex("53b81a00000031dbcd805bc3")
        child = os.fork()
        if child == 0:
            page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
            page.write(machine_code)
            entry = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
            os._exit(0 if entry() == 0 else 1)
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            report["fate"] = signal.Signals(os.WTERMSIG(status)).name
        else:
            report["fate"] = f"exit {os.WEXITSTATUS(status)}"
    """)
    assert report["fate"] in {"SIGSYS", "SIGSEGV"}


@x86_64_only
async def test_x32_syscall_abi_is_rejected(sandbox: SandboxRunner) -> None:
    # x32 numbers carry bit 30 and share the x86-64 audit architecture: ptrace is x32 number 521.
    report = await sandbox.report("""
        import signal
        child = os.fork()
        if child == 0:
            os._exit(0 if _libc.syscall(ctypes.c_long(0x40000000 | 521), 0, 0, 0, 0) == 0 else 1)
        _, status = os.waitpid(child, 0)
        if os.WIFSIGNALED(status):
            report["fate"] = signal.Signals(os.WTERMSIG(status)).name
        else:
            report["fate"] = f"exit {os.WEXITSTATUS(status)}"
    """)
    assert report["fate"] in {"SIGSYS", "exit 1"}  # killed by the filter, or ENOSYS without x32


async def test_tiocsti_cannot_push_keystrokes(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        import fcntl, termios
        report["stdin"] = outcome(lambda: fcntl.ioctl(0, termios.TIOCSTI, b"x"))
        report["dev_tty"] = outcome(lambda: os.open("/dev/tty", os.O_RDWR))
        # A run gets no pty (test_ptys.py): the filter is seen on a descriptor that is no
        # terminal, where the kernel itself would answer ENOTTY.
        not_a_tty = os.open("/dev/null", os.O_RDWR)
        report["not_a_tty"] = outcome(lambda: fcntl.ioctl(not_a_tty, termios.TIOCSTI, b"x"))
        # The kernel reads the request as 32 bits: high bits must not slip past the filter.
        ctypes.set_errno(0)
        wide = _libc.ioctl(not_a_tty, ctypes.c_ulong((1 << 32) | termios.TIOCSTI), ctypes.c_char_p(b"x"))
        report["wide_request"] = "ok" if wide == 0 else errno.errorcode[ctypes.get_errno()]
    """)
    assert report["stdin"] in {"PermissionError:EPERM", "OSError:ENOTTY"}
    assert report["dev_tty"] in {"OSError:ENXIO", "FileNotFoundError:ENOENT", "PermissionError:EACCES"}
    assert report["not_a_tty"] == "PermissionError:EPERM"
    assert report["wide_request"] == "EPERM"


async def test_device_nodes_cannot_be_created(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        import stat
        report["block"] = outcome(lambda: os.mknod("/workspace/disk", stat.S_IFBLK | 0o600, os.makedev(254, 0)))
        report["char"] = outcome(lambda: os.mknod("/tmp/mem", stat.S_IFCHR | 0o600, os.makedev(1, 1)))
    """)
    assert report == {"block": "PermissionError:EPERM", "char": "PermissionError:EPERM"}


async def test_every_mount_is_nosuid(sandbox: SandboxRunner, backend_name: str) -> None:
    report = await sandbox.report("""
        with open("/proc/self/mountinfo") as mountinfo:
            fields = [line.split() for line in mountinfo]
        report["suid_mounts"] = [f[4] for f in fields if "nosuid" not in f[5].split(",")]
        report["read_only"] = [f[4] for f in fields if "ro" in f[5].split(",")]
    """)
    suid = report["suid_mounts"]
    if backend_name in ("podman", "docker"):
        # Known container gap, reported by doctor: the image's root (and podman's masks over
        # /proc and /sys) cannot be mounted nosuid from the CLI. Those must be read-only; every
        # bind from the host must still be nosuid; no_new_privs makes setuid bits inert (the two
        # setuid tests below attack that for real).
        exempt = [m for m in suid if m == "/" or m.startswith(("/proc/", "/sys/", "/dev/"))]
        assert set(exempt) <= set(report["read_only"]) | {"/dev/null"}, exempt
        suid = [m for m in suid if m not in exempt]
    if backend_name == "docker" and suid:
        # Known docker gap, in docs/containers.md: its --mount has no nosuid, so binds from the host
        # (workspace, runtime, runner) are not nosuid either; no_new_privs still holds.
        pytest.xfail(f"docker binds cannot be nosuid: {suid}")
    assert suid == []


@pytest.mark.skipif(not os.path.exists("/usr/bin/su"), reason="no /usr/bin/su on this host")
async def test_setuid_su_does_not_give_root(sandbox: SandboxRunner, sandbox_ids: tuple[int, int]) -> None:
    report = await sandbox.report("""
        import stat, subprocess
        report["setuid_bit"] = bool(os.stat("/usr/bin/su").st_mode & stat.S_ISUID)
        done = subprocess.run(
            ["/usr/bin/su", "root", "-c", "id -u"], capture_output=True, stdin=subprocess.DEVNULL, timeout=5
        )
        report["returncode"] = done.returncode
        report["stdout"] = done.stdout.decode()
        report["uid_after"] = os.geteuid()
    """)
    assert report["setuid_bit"] is True  # the attack is real: the binary is setuid root
    assert report["returncode"] != 0
    assert report["stdout"].strip() != "0"
    assert report["uid_after"] == sandbox_ids[0]


_POLKIT_HELPER = "/usr/lib/polkit-1/polkit-agent-helper-1"


@pytest.mark.skipif(not os.path.exists(_POLKIT_HELPER), reason="no polkit agent helper on this host")
async def test_setuid_helper_sees_an_unprivileged_euid(sandbox: SandboxRunner) -> None:
    # polkit's helper checks geteuid() == 0 first and says so when not: the one setuid binary here
    # that reports the euid it got. With no_new_privs and nosuid mounts it must not get 0.
    report = await sandbox.report(f"""
        import subprocess
        done = subprocess.run(
            [{_POLKIT_HELPER!r}, "root"], capture_output=True, stdin=subprocess.DEVNULL, timeout=5
        )
        report["returncode"] = done.returncode
        report["not_root"] = b"needs to be setuid root" in done.stderr
    """)
    assert report == {"returncode": 1, "not_root": True}


async def test_kernel_memory_and_logs_are_unreadable(sandbox: SandboxRunner) -> None:
    targets = ["/proc/kcore", "/proc/kmsg", "/dev/kmsg", "/dev/mem", "/dev/port"]
    report = await sandbox.report(f"""
        for target in {targets!r}:
            report[target] = outcome(lambda: open(target, "rb").read(1))
    """)
    denied = {"PermissionError:EACCES", "FileNotFoundError:ENOENT", "PermissionError:EPERM"}
    assert set(report) == set(targets)
    assert set(report.values()) <= denied, report
