"""The gate in front of a sandbox's first process: it gets its limits and uid before anything of it runs.

Every test runs on both gates (``sandbox/launcher.py``): ``sh`` with ``setpriv``, and the static
program ``gate.c`` as ``make runtime`` built it; they must behave alike.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.sandbox import gate as gate_program
from mcp_sandbox.sandbox.launcher import GATE_CLOSED, LaunchSpec, admit, gated, open_gate

# Soft limits in bytes and counts (a shell's ulimit would count in blocks of its own), the ids, a mark.
_SHOW = (
    "awk '/^Max open files/ {{print $4}} /^Max file size/ {{print $4}}' /proc/self/limits; "
    "id -u; id -g; id -G; : > {marker}"
)


@pytest.fixture(params=["sh", pytest.param("static", marks=pytest.mark.sandbox)])  # static: `make runtime` builds it
def program(request: pytest.FixtureRequest) -> Iterator[int | None]:
    """The gate to start through: None (sh and setpriv) or a descriptor of the static one ``make runtime`` built."""
    if request.param == "sh":
        yield None
        return
    directory = load_settings(env={}, flags={}).paths.gate_dir
    opened = gate_program.open_checked(directory)
    if isinstance(opened, str):
        pytest.fail(f"no static gate to test: {opened}; run `make runtime`")
    try:
        yield opened
    finally:
        os.close(opened)


def passed(program: int | None) -> tuple[int, ...]:
    """The ``pass_fds`` a process started through ``program`` needs."""
    return () if program is None else (program,)


def _start(spec: LaunchSpec, marker: Path, program: int | None) -> tuple[subprocess.Popen[str], int]:
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/bin/sh", "-c", _SHOW.format(marker=marker)], program),
            pass_fds=passed(program),
            stdin=gate_read,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(gate_read)
    return process, gate


def test_the_process_runs_with_its_limits_and_uid_only_once_let_through(program: int | None) -> None:
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
        process, gate = _start(spec, marker, program)
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


def test_a_gate_closed_without_the_line_ends_the_process_before_the_command(
    tmp_path: Path, program: int | None
) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    marker = tmp_path / "ran"
    process, gate = _start(spec, marker, program)
    open_gate(gate, admitted=False)  # what the server does when it cannot admit it, or dies
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED
    assert not marker.exists()


def test_a_cgroup_that_refuses_the_process_is_an_error(tmp_path: Path, program: int | None) -> None:
    spec = LaunchSpec(cgroup_procs=(str(tmp_path / "no-such-cgroup" / "cgroup.procs"),), rlimits=(), uid=None, gid=None)
    process, gate = _start(spec, tmp_path / "ran", program)
    with pytest.raises(OSError):
        admit(spec, process.pid)
    open_gate(gate, admitted=False)
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED


def test_arguments_through_the_gate_complete_the_command_line_verbatim(program: int | None) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    then = ["two  spaces", "", "$HOME `id` $(id)", "back\\slash 'quote' \"double\"", " *", "-n"]
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/usr/bin/printf", "[%s]\\n"], program),
            stdin=gate_read,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=passed(program),
        )
    finally:
        os.close(gate_read)
    open_gate(gate, admitted=True, then=then)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out.splitlines() == [f"[{argument}]" for argument in then]


def test_an_argument_with_a_newline_is_refused_and_the_process_ends_at_the_gate(
    tmp_path: Path, program: int | None
) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    marker = tmp_path / "ran"
    process, gate = _start(spec, marker, program)
    with pytest.raises(ValueError, match="newline"):
        open_gate(gate, admitted=True, then=["first\nsecond"])
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED
    assert not marker.exists()


@pytest.mark.parametrize(
    "written",
    [b"", b"\n", b"x\n", b"-1\n", b"1x\nA\n", b"2\nonly one\n", b"1\nno newline", b"99999999999\n"],
    ids=["nothing", "empty count", "not a number", "negative", "trailing letter", "too few", "unended", "huge"],
)
def test_a_malformed_or_cut_short_line_ends_the_process_at_the_gate(
    tmp_path: Path, program: int | None, written: bytes
) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    marker = tmp_path / "ran"
    process, gate = _start(spec, marker, program)
    try:
        os.write(gate, written)
    finally:
        os.close(gate)
    process.communicate(timeout=30)
    assert process.returncode == GATE_CLOSED
    assert not marker.exists()


_PRIVILEGES = """
import os
print(os.getresuid(), os.getresgid(), os.getgroups())
print([line.split()[1] for line in open("/proc/self/status") if line.startswith(("CapEff", "CapPrm", "CapBnd"))][:2])
try:
    os.setresuid(0, 0, 0)
except PermissionError:
    print("no way back")
"""


def test_a_root_started_process_keeps_nothing_of_root(program: int | None) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: only a root server drops to the sandbox's uid")
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=65534, gid=65534)
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/usr/bin/python3", "-I", "-c", _PRIVILEGES], program),
            stdin=gate_read, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
            # a server with supplementary groups (root, adm): none must reach the sandbox
            pass_fds=passed(program), extra_groups=[0, 4],
        )  # fmt: skip
    finally:
        os.close(gate_read)
    open_gate(gate, admitted=True)
    out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert out.splitlines() == [
        "(65534, 65534, 65534) (65534, 65534, 65534) []",
        "['0000000000000000', '0000000000000000']",  # no effective or permitted capability
        "no way back",
    ]


def test_a_drop_that_fails_runs_nothing(tmp_path: Path, program: int | None) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to start the gate as another unprivileged user")
    shared = Path(tempfile.mkdtemp(prefix="mcp-sandbox-gate-"))
    os.chmod(shared, 0o777)
    marker = shared / "ran"
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=0, gid=0)  # asked of a gate that is not root
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/bin/sh", "-c", f": > {marker}"], program),
            stdin=gate_read, stderr=subprocess.PIPE, text=True, cwd="/", user=65534, group=65534, extra_groups=[],
            pass_fds=passed(program),
        )  # fmt: skip
        os.close(gate_read)
        open_gate(gate, admitted=True)
        _, err = process.communicate(timeout=30)
        assert process.returncode not in (0, GATE_CLOSED), err
        assert err.strip()  # it says why
        assert not marker.exists()
    finally:
        shutil.rmtree(shared)


_DESCRIPTORS = "import os; print(sorted(os.listdir('/proc/self/fd')))"


def test_the_gates_own_descriptor_does_not_reach_the_command(program: int | None) -> None:
    spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
    gate_read, gate = os.pipe()
    try:
        process = subprocess.Popen(
            gated(spec, ["/usr/bin/python3", "-I", "-c", _DESCRIPTORS], program),
            stdin=gate_read, stdout=subprocess.PIPE, text=True, pass_fds=passed(program),
        )  # fmt: skip
    finally:
        os.close(gate_read)
    open_gate(gate, admitted=True)
    out, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert out.strip() == "['0', '1', '2', '3']"  # stdio and the listing's own descriptor
