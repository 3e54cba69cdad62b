"""Runs cannot watch each other through the files they share (issue 35, finding 2).

Every sandbox reads the same read-only trees (``/usr``, the time zones, the runtime): an inotify
watch there saw other tenants' file opens and program starts, and inotify instances are a
per-uid pool one run could empty. Inside a sandbox inotify answers ENOSYS, as a kernel without
it would; fanotify needs a capability no run has, and is refused by the filter too.
"""

from __future__ import annotations

import anyio
import pytest

from .harness import HOST_BOUND, SandboxRunner

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# x86-64 numbers: inotify_init, inotify_add_watch, inotify_init1, fanotify_init, fanotify_mark.
_INOTIFY_INIT, _INOTIFY_ADD_WATCH, _INOTIFY_INIT1 = 253, 254, 294
_FANOTIFY_INIT, _FANOTIFY_MARK = 300, 301
_WATCH_SECONDS = 3.0

_WATCHER = f"""
    import select, time
    IN_OPEN, IN_ACCESS = 0x20, 0x1
    report["init"] = syscall({_INOTIFY_INIT})
    report["init1"] = syscall({_INOTIFY_INIT1}, os.O_CLOEXEC)
    ctypes.set_errno(0)
    fd = _libc.inotify_init1(os.O_NONBLOCK)
    report["libc"] = "ok" if fd >= 0 else errno.errorcode[ctypes.get_errno()]
    report["events"] = 0
    if fd >= 0:
        for path in (b"/usr/share/zoneinfo", b"/usr/share/zoneinfo/Europe"):
            _libc.inotify_add_watch(fd, path, IN_OPEN | IN_ACCESS)
        deadline = time.monotonic() + {_WATCH_SECONDS}
        while (left := deadline - time.monotonic()) > 0:
            if select.select([fd], [], [], left)[0]:
                report["events"] += len(os.read(fd, 65536))
"""

_NEIGHBOUR = f"""
    import time, zoneinfo
    deadline = time.monotonic() + {_WATCH_SECONDS} + 1
    while time.monotonic() < deadline:
        zoneinfo.ZoneInfo.clear_cache()
        zoneinfo.ZoneInfo("Europe/Oslo")
        time.sleep(0.01)
    report["done"] = True
"""


async def test_a_run_cannot_watch_another_runs_file_opens_in_the_shared_trees(sandbox: SandboxRunner) -> None:
    reports: dict[str, dict[str, object]] = {}

    async def run(name: str, code: str) -> None:
        reports[name] = await sandbox.report(code, time_limit=_WATCH_SECONDS + 10)

    with anyio.fail_after(2 * (_WATCH_SECONDS + 10 + HOST_BOUND)):
        async with anyio.create_task_group() as group:
            group.start_soon(run, "watcher", _WATCHER)
            group.start_soon(run, "neighbour", _NEIGHBOUR)

    assert reports["neighbour"] == {"done": True}
    assert reports["watcher"] == {"init": "ENOSYS", "init1": "ENOSYS", "libc": "ENOSYS", "events": 0}


async def test_a_run_cannot_take_the_inotify_instances_of_the_sandbox_uid(sandbox: SandboxRunner) -> None:
    attack = f"""
        made, failures = 0, set()
        for _ in range(200):  # the default per-user limit is 128
            result = syscall({_INOTIFY_INIT1}, 0)
            if result.startswith("ok"):
                made += 1
            else:
                failures.add(result)
        report["made"] = made
        report["failures"] = sorted(failures)
        report["add_watch"] = syscall({_INOTIFY_ADD_WATCH}, 0, b"/usr", 0x20)
    """
    first = await sandbox.report(attack)
    second = await sandbox.report(attack)  # another sandbox, started after: it gets what the first did

    assert first == second == {"made": 0, "failures": ["ENOSYS"], "add_watch": "ENOSYS"}


async def test_fanotify_is_refused_in_a_run(sandbox: SandboxRunner) -> None:
    report = await sandbox.report(f"""
        FAN_CLASS_NOTIF, FAN_MARK_ADD, FAN_MARK_MOUNT, FAN_OPEN = 0, 0x1, 0x10, 0x20
        report["init"] = syscall({_FANOTIFY_INIT}, FAN_CLASS_NOTIF, os.O_RDONLY)
        report["mark"] = syscall({_FANOTIFY_MARK}, -1, FAN_MARK_ADD | FAN_MARK_MOUNT, FAN_OPEN, -100, b"/usr")
    """)

    assert report["init"] == "EPERM"
    assert report["mark"] == "EBADF"  # no fanotify descriptor to mark with
