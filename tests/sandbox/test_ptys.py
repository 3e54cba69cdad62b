"""A run gets no pseudo-terminal, so none can take the host's pool (issue 35, finding 4).

Every devpts instance draws on one host-wide pool (``kernel/pty/max`` less its reserve); bwrap
and docker mount theirs with no ``max=``, so one run could hold them all and every other
sandbox's (and host user's) ``openpty()`` failed ENOSPC. On every backend ``/dev/pts`` is an
empty read-only tmpfs instead: ``/dev/ptmx`` (a link into it) names nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .harness import SandboxRunner

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

_PTY_COUNT = Path("/proc/sys/kernel/pty/nr")
_ATTEMPTS = 100  # two descriptors each, within the default open_files (256)
# Host processes outside the test (other suites, a terminal) may open a few ptys meanwhile.
_ELSEWHERE = 8
_REFUSED = {"FileNotFoundError:ENOENT", "PermissionError:EACCES"}


def _ptys_in_use() -> int:
    """The host's count of pseudo-terminals in use, every devpts instance's."""
    return int(_PTY_COUNT.read_text())


async def test_a_run_cannot_open_a_pseudo_terminal_or_take_the_hosts_pool(sandbox: SandboxRunner) -> None:
    before = _ptys_in_use()

    report = await sandbox.report(f"""
        import pty
        held, failures = [], {{"os": set(), "pty": set()}}
        for attempt in range({_ATTEMPTS}):
            module = "pty" if attempt % 2 else "os"
            try:
                held.append(pty.openpty() if module == "pty" else os.openpty())
            except OSError as exc:
                failures[module].add(f"{{type(exc).__name__}}:{{errno.errorcode.get(exc.errno, exc.errno)}}")
        report["opened"] = len(held)
        report["failures"] = {{module: sorted(seen) for module, seen in failures.items()}}
        report["host_count"] = int(open("/proc/sys/kernel/pty/nr").read())
        report["ptmx"] = outcome(lambda: os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
        report["pts_ptmx"] = outcome(lambda: os.open("/dev/pts/ptmx", os.O_RDWR | os.O_NOCTTY))
        report["pts"] = os.listdir("/dev/pts")
        report["create"] = outcome(lambda: os.open("/dev/pts/ptmx", os.O_RDWR | os.O_CREAT, 0o666))
        os.makedirs("/tmp/pts")
        ctypes.set_errno(0)
        mounted = _libc.mount(b"devpts", b"/tmp/pts", b"devpts", 0, b"newinstance,ptmxmode=0666")
        report["mount_devpts"] = "ok" if mounted == 0 else errno.errorcode[ctypes.get_errno()]
    """)

    assert report["opened"] == 0
    assert report["failures"]["os"] and set(report["failures"]["os"]) <= _REFUSED
    # pty.openpty() falls back to BSD pty names, none of which exists: "out of pty devices".
    assert report["failures"]["pty"] and set(report["failures"]["pty"]) <= {*_REFUSED, "OSError:None"}
    assert report["ptmx"] in _REFUSED
    assert report["pts_ptmx"] in _REFUSED
    assert report["pts"] == []
    assert report["create"] in {"OSError:EROFS", "PermissionError:EACCES"}
    assert report["mount_devpts"] == "EPERM"
    # The host-wide count, while the run held what it got, and after: nothing of the run's.
    assert report["host_count"] <= before + _ELSEWHERE
    assert _ptys_in_use() <= before + _ELSEWHERE
