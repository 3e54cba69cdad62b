"""The gate in front of a sandbox's first process: it gets its limits and uid before anything of it runs."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from mcp_sandbox.sandbox.launcher import GATE_CLOSED, LaunchSpec, admit, gated, open_gate

# Soft limits in bytes and counts (a shell's ulimit would count in blocks of its own), the ids, a mark.
_SHOW = (
    "awk '/^Max open files/ {{print $4}} /^Max file size/ {{print $4}}' /proc/self/limits; "
    "id -u; id -g; id -G; : > {marker}"
)


def _start(spec: LaunchSpec, marker: Path) -> tuple[subprocess.Popen[str], int]:
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/bin/sh", "-c", _SHOW.format(marker=marker)]),
            stdin=gate_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(gate_read)
    return process, gate


def test_the_process_runs_with_its_limits_and_uid_only_once_let_through() -> None:
    root = os.geteuid() == 0
    uid = gid = 65534 if root else None
    shared = Path(tempfile.mkdtemp(prefix="mcp-sandbox-gate-"))  # /tmp: reachable by the sandbox uid
    os.chmod(shared, 0o777)
    spec = LaunchSpec(
        cgroup_procs=(),
        rlimits=((resource.RLIMIT_NOFILE, 77), (resource.RLIMIT_FSIZE, 1 << 20)),
        uid=uid,
        gid=gid,
    )
    marker = shared / "ran"
    try:
        process, gate = _start(spec, marker)
        try:
            admit(spec, process.pid)
            time.sleep(0.1)
            assert not marker.exists()  # waiting at the gate: nothing of the command ran yet
        finally:
            open_gate(gate, admitted=True)
        out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        size, files, shown_uid, shown_gid, groups = out.split("\n")[:5]
        assert (files, size) == ("77", str(1 << 20))
        if root:
            assert (shown_uid, shown_gid, groups) == ("65534", "65534", "65534")
        assert marker.exists()
    finally:
        shutil.rmtree(shared)


def test_a_gate_closed_without_the_line_ends_the_process_before_the_command(tmp_path: Path) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    marker = tmp_path / "ran"
    process, gate = _start(spec, marker)
    open_gate(gate, admitted=False)  # what the server does when it cannot admit it, or dies
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED
    assert not marker.exists()


def test_a_cgroup_that_refuses_the_process_is_an_error(tmp_path: Path) -> None:
    spec = LaunchSpec(cgroup_procs=(str(tmp_path / "no-such-cgroup" / "cgroup.procs"),), rlimits=(), uid=None, gid=None)
    process, gate = _start(spec, tmp_path / "ran")
    with pytest.raises(OSError):
        admit(spec, process.pid)
    open_gate(gate, admitted=False)
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED


def test_arguments_through_the_gate_complete_the_command_line_verbatim() -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    then = ["two  spaces", "", "$HOME `id` $(id)", "back\\slash 'quote' \"double\"", " *", "-n"]
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/usr/bin/printf", "[%s]\\n"]), stdin=gate_read, stdout=subprocess.PIPE, text=True
        )
    finally:
        os.close(gate_read)
    open_gate(gate, admitted=True, then=then)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out.splitlines() == [f"[{argument}]" for argument in then]


def test_an_argument_with_a_newline_is_refused_and_the_process_ends_at_the_gate(tmp_path: Path) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    marker = tmp_path / "ran"
    process, gate = _start(spec, marker)
    with pytest.raises(ValueError, match="newline"):
        open_gate(gate, admitted=True, then=["first\nsecond"])
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED
    assert not marker.exists()
