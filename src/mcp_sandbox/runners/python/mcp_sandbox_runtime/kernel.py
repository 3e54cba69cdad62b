"""The Linux calls the zygote makes through ctypes: ``prctl`` and stacking the run's seccomp guard.

libc is loaded and ``struct sock_fprog`` defined once, in the zygote; its children inherit both.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "PR_SET_CHILD_SUBREAPER",
    "PR_SET_DUMPABLE",
    "install_guard",
    "libc",
    "prctl",
    "program_type",
]

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2


@functools.cache
def libc() -> Any:
    """libc through ctypes, loaded once in the zygote (its children inherit it: no dlopen per run)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def prctl(option: int, value: int) -> None:
    import ctypes

    if libc().prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}, {value})")


@functools.cache
def program_type() -> Any:
    """``struct sock_fprog``, defined once in the zygote."""
    import ctypes

    class _Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    return _Program


def install_guard(bpf: bytes) -> None:
    """Stack the host's guard filter (``zygote_guard_bpf``) on this process: it keeps the run off the zygote."""
    import ctypes

    if not bpf or len(bpf) % 8:
        raise ValueError("the guard filter is not a BPF program")

    code = ctypes.create_string_buffer(bpf, len(bpf))
    program = program_type()(len(bpf) // 8, ctypes.cast(code, ctypes.c_void_p))
    if libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
