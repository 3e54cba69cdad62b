"""A run's cgroup kills what a container runtime nested in it at once, sparing its monitor."""

from __future__ import annotations

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
        deadline = time.monotonic() + 5
        while not group.remove() and time.monotonic() < deadline:
            time.sleep(0.01)
