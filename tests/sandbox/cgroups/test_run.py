"""A run's cgroup kills what a container runtime nested in it at once, sparing its monitor; it counts limit hits."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time

import pytest

from mcp_sandbox.sandbox import kernfs
from mcp_sandbox.sandbox.cgroups import RunCgroup, detect_root_cgroups
from mcp_sandbox.sandbox.policy import Limits


def _sleeper_in(directories: list[str]) -> subprocess.Popen[bytes]:
    sleeper = subprocess.Popen(["sleep", "60"])
    for directory in directories:
        kernfs.write(f"{directory}/cgroup.procs", str(sleeper.pid))
    return sleeper


def test_kill_nested_kills_the_containers_processes_and_spares_the_monitor() -> None:
    support = detect_root_cgroups()  # where the container backend nests containers
    if not support.bases:
        pytest.skip(f"no usable cgroups here: {support.reason}")
    group = RunCgroup.create(support, Limits())
    sleepers: list[subprocess.Popen[bytes]] = []
    try:
        nested: dict[str, list[str]] = {"libpod-0123": [], "conmon": []}
        for directory in {*group.directories.values()}:
            for name, made in nested.items():
                (directory / name).mkdir()
                made.append(str(directory / name))
        group.nested = True
        container, monitor = _sleeper_in(nested["libpod-0123"]), _sleeper_in(nested["conmon"])
        sleepers = [container, monitor]

        group.kill_nested(spare="conmon")

        assert container.wait(timeout=5) == -9
        time.sleep(0.1)
        assert monitor.poll() is None
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
        group.remove_waiting()


def _open_descriptors_under(directory: str) -> list[str]:
    links = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
    return [link for link in links if link.startswith(directory)]


def test_limit_hits_after_the_first_read_are_counted_and_removal_closes_what_was_read() -> None:
    support = detect_root_cgroups()
    if "pids" not in support.bases:
        pytest.skip(f"no pids cgroup here: {support.reason}")
    group = RunCgroup.create(support, Limits(pids=1))
    pids_directory = str(group.directories["pids"])
    try:
        assert group.events()[1] == 0
        # One process in the cgroup, at its limit: its fork is refused, and counted.
        script = f"echo $$ > {pids_directory}/cgroup.procs; /bin/true"
        refused = subprocess.run(["/bin/sh", "-c", script], capture_output=True, timeout=10)
        assert refused.returncode != 0

        assert group.events()[1] >= 1
    finally:
        group.remove_waiting()
    assert not os.path.exists(pids_directory)
    assert _open_descriptors_under(pids_directory) == []
    assert group.events() == (0, 0)  # gone: nothing read, nothing kept open
    assert _open_descriptors_under(pids_directory) == []


def test_remove_waiting_ends_what_a_runtime_left_nested_and_removes_the_cgroup() -> None:
    # What a container probe can leave: the engine's own cgroup nested in ours, with a process of
    # it still there after the probe's client has exited. One try at removal finds ours busy (the
    # probe used to stop there, leaving ours on the host); waiting kills it and removes both.
    support = detect_root_cgroups()
    if not support.bases:
        pytest.skip(f"no usable cgroups here: {support.reason}")
    group = RunCgroup.create(support, Limits())
    group.nested = True
    directories = [str(directory) for directory in {*group.directories.values()}]
    children = [f"{directory}/libpod-0123" for directory in directories]
    for child in children:
        os.mkdir(child)
    lingering = _sleeper_in(children)
    try:
        assert group.remove() is False
        group.remove_waiting(bound=10)
        assert [directory for directory in directories if os.path.exists(directory)] == []
        assert lingering.wait(timeout=5) == -9
    finally:
        lingering.kill()
        lingering.wait()
        group.remove_waiting()
