"""The seccomp deny list and its compiled BPF."""

from __future__ import annotations

import os
import struct

import pytest

from mcp_sandbox.sandbox.seccomp import (
    DENIED_SYSCALLS,
    UNSUPPORTED_SYSCALLS,
    compiled_bpf,
    seccomp_available,
    server_oci_profile,
    write_bpf,
)

SOCK_FILTER_SIZE = 8  # struct sock_filter: u16 code, u8 jt, u8 jf, u32 k

needs_libseccomp = pytest.mark.skipif(
    seccomp_available() is not None, reason=f"libseccomp unavailable: {seccomp_available()}"
)


def read_all(fd: int) -> bytes:
    chunks: list[bytes] = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


@needs_libseccomp
def test_the_compiled_filter_is_a_whole_number_of_bpf_instructions() -> None:
    bpf = compiled_bpf()

    assert len(bpf) > 0
    assert len(bpf) % SOCK_FILTER_SIZE == 0


def compared_constants(bpf: bytes) -> set[int]:
    """The constants the filter compares the syscall number (or an argument) with."""
    jeq_k = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
    instructions = struct.iter_unpack("=HBBI", bpf)
    return {k for code, _, _, k in instructions if code == jeq_k}


def native_number(name: str) -> int:
    import pyseccomp

    return int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, name))


@needs_libseccomp
def test_every_denied_syscall_this_architecture_has_is_checked_by_the_filter() -> None:
    # Guards against rules being skipped silently (seccomp._add swallows libseccomp errors).
    numbers = {name: native_number(name) for name in DENIED_SYSCALLS}
    known = {name: number for name, number in numbers.items() if number >= 0}

    unchecked = {name for name, number in known.items() if number not in compared_constants(compiled_bpf())}

    assert unchecked == set()
    assert len(known) > len(DENIED_SYSCALLS) // 2  # most names are real syscalls here


@needs_libseccomp
@pytest.mark.parametrize("syscall", ["clone", "socket", "socketpair", "ioctl", *UNSUPPORTED_SYSCALLS])
def test_the_syscalls_with_special_rules_are_checked_by_the_filter(syscall: str) -> None:
    assert native_number(syscall) in compared_constants(compiled_bpf())


@needs_libseccomp
def test_write_bpf_gives_an_fd_at_offset_zero_holding_the_filter() -> None:
    fd = write_bpf()
    try:
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
        assert read_all(fd) == compiled_bpf()
    finally:
        os.close(fd)


@needs_libseccomp
def test_each_write_bpf_call_gives_a_fresh_fd() -> None:
    # bwrap reads its --seccomp fd to the end, so one fd cannot serve two sandboxes.
    first, second = write_bpf(), write_bpf()
    try:
        assert first != second
        assert read_all(first) == read_all(second) == compiled_bpf()
    finally:
        os.close(first)
        os.close(second)


@needs_libseccomp
def test_the_bpf_fd_is_not_inherited_by_accident() -> None:
    fd = write_bpf()
    try:
        assert not os.get_inheritable(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    "syscall",
    [
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "unshare",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "reboot",
        "swapon",
        "open_by_handle_at",
    ],
)
def test_the_design_deny_list_is_denied(syscall: str) -> None:
    assert syscall in DENIED_SYSCALLS


def test_the_deny_list_names_each_syscall_once() -> None:
    assert len(set(DENIED_SYSCALLS)) == len(DENIED_SYSCALLS)


@needs_libseccomp
def test_the_oci_profile_denies_what_the_bpf_filter_denies() -> None:
    import errno
    import socket

    from mcp_sandbox.sandbox.seccomp import oci_profile

    profile = oci_profile()
    rules = profile["syscalls"]
    plain = {name: rule["errnoRet"] for rule in rules if "args" not in rule for name in rule["names"]}

    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    assert len(profile["architectures"]) == 1  # other architectures' syscalls are killed
    for name in ("ptrace", "mount", "unshare", "setns", "bpf", "keyctl", "io_uring_setup", "userfaultfd"):
        assert plain[name] == errno.EPERM
    for name in ("clone3", "inotify_init", "inotify_init1", "inotify_add_watch"):
        assert plain[name] == errno.ENOSYS
    assert set(plain) - set(UNSUPPORTED_SYSCALLS) <= set(DENIED_SYSCALLS)
    sockets = [r for r in rules if r["names"] == ["socket"]]
    assert sockets == [
        {
            "names": ["socket"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": errno.EAFNOSUPPORT,
            "args": [{"index": 0, "value": socket.AF_UNIX, "valueTwo": 0, "op": "SCMP_CMP_NE"}],
        }
    ]
    user_ns = [r for r in rules if r["names"] == ["clone"] and r["args"][0]["value"] == 0x10000000]
    assert user_ns and user_ns[0]["args"][0]["op"] == "SCMP_CMP_MASKED_EQ"


@needs_libseccomp
def test_the_servers_own_profile_keeps_inotify_for_its_workspace_measure() -> None:
    denied = {name for rule in server_oci_profile()["syscalls"] for name in rule["names"]}

    assert not denied & {"inotify_init", "inotify_init1", "inotify_add_watch"}
    assert {"clone3", "ptrace", "fanotify_init"} <= denied
