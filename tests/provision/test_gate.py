"""Setup's build of the sandbox's gate (``sandbox/gate.c``), and when the server runs it or not.

What the gate does once started is tests/sandbox/test_launcher.py's (on both gates).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.provision.gate import build_gate, find_compiler
from mcp_sandbox.provision.python import SetupError
from mcp_sandbox.sandbox import gate
from mcp_sandbox.sandbox.backends.bwrap.sandbox import SPARES, BwrapBackend
from mcp_sandbox.sandbox.hostfs import system_mounts
from mcp_sandbox.sandbox.launcher import LaunchSpec, gated, open_gate
from mcp_sandbox.sandbox.policy import SandboxPolicy
from mcp_test_helpers import own_processes, poll, private_tmpdir
from settings_helpers import bwrap_pieces

_NOBODY = 65534
_GATE = "mcp-sandbox-gat"  # the sh gate's $0, the static gate's name (the kernel keeps 15 characters)
_BOUND = 20.0  # a sandbox's start and end, and its spares' start, on a busy 2-core host


@pytest.fixture
def private_dir() -> Iterator[Path]:
    """A directory whose parents nobody else may write: not /tmp, which anyone may."""
    directory = private_tmpdir("test-gate-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def built(private_dir: Path) -> Path:
    """A gate directory with the gate built in it, whatever the umask."""
    if find_compiler() is None:
        pytest.fail("no C compiler: `make sysdeps` installs gcc and libc6-dev")
    old = os.umask(0o000)  # setup must not leave it writable by others
    try:
        build_gate(private_dir / "gate", log=lambda _: None)
    finally:
        os.umask(old)
    return private_dir / "gate"


def test_setup_builds_a_static_gate_writable_by_nobody_else_keeps_it_and_prunes_other_builds(built: Path) -> None:
    path = gate.built_path(built)
    assert gate.refusal(built) is None
    assert b"\x7fELF" == path.read_bytes()[:4]
    assert b"/lib64/ld-linux" not in path.read_bytes()  # static: no program interpreter to run
    for part in (built, path.parent, path):
        assert part.stat().st_mode & 0o022 == 0, part
    stale, other = built / "0123456789abcdef", built / "notes"
    stale.mkdir()
    other.mkdir()
    inode = path.stat().st_ino

    assert build_gate(built, log=lambda _: None) == path

    assert path.stat().st_ino == inode  # current: not built again
    assert not stale.exists() and other.exists()


def test_a_build_of_other_sources_is_not_run(built: Path) -> None:
    path = gate.built_path(built)
    elsewhere = built / "fedcba9876543210"
    path.parent.rename(elsewhere)  # what an upgrade leaves: the build of the earlier gate.c

    assert "not built for this version" in (gate.refusal(built) or "")


@pytest.mark.parametrize(
    "tamper",
    ["file group-writable", "directory writable by others", "gate_dir writable by others", "file owned by nobody",
     "not a file"],
)  # fmt: skip
def test_a_gate_someone_else_could_have_written_is_not_run(built: Path, tamper: str) -> None:
    path = gate.built_path(built)
    if tamper == "file group-writable":
        path.chmod(0o775)
    elif tamper == "directory writable by others":
        path.parent.chmod(0o757)
    elif tamper == "gate_dir writable by others":
        built.chmod(0o777)  # not sticky: anyone may swap the build directory
    elif tamper == "file owned by nobody":
        if os.geteuid() != 0:
            pytest.skip("needs root, to give the file away")
        os.chown(path, _NOBODY, _NOBODY)
    else:
        path.unlink()
        path.symlink_to("/bin/true")

    assert gate.refusal(built)


def test_without_a_compiler_setup_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, no gcc

    with pytest.raises(SetupError, match=r"no C compiler.*gcc libc6-dev"):
        build_gate(tmp_path / "gate", log=lambda _: None)
    assert not (tmp_path / "gate").exists()


def _policy() -> SandboxPolicy:
    mounts, links = system_mounts()
    return SandboxPolicy(command=("/bin/sh", "-c", "echo ran"), mounts=mounts, symlinks=links, cwd="/")


async def _waiting_at_the_gate(backend: BwrapBackend) -> list[str]:
    """Run one sandbox on a running ``backend``, then the programs its spares wait at the gate as."""
    sandbox = await backend.start(_policy())
    with anyio.fail_after(_BOUND):
        out = await sandbox.stdout.read()
        await sandbox.wait()
    await sandbox.aclose()
    assert out == b"ran\n"
    with anyio.fail_after(_BOUND):  # the spares the start asked for: first processes at their gate
        await poll(lambda: len(own_processes(_GATE)) == SPARES)
    return [_program(pid) for pid in own_processes(_GATE)]


def _program(pid: int) -> str:
    """What process ``pid`` runs: its first argument, or the file it executes when run from a descriptor."""
    first = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    return os.readlink(f"/proc/{pid}/exe") if first.startswith("/proc/self/fd/") else first


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_the_backend_starts_sandboxes_through_the_gate_and_falls_back_loudly_when_it_is_not_trusted(
    built: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = load_settings(env={}, flags={"gate_dir": str(built)})
    backend = BwrapBackend(*bwrap_pieces(settings))
    if backend.cgroups.version is None:
        pytest.skip(f"no cgroups here (a running backend keeps no spares): {backend.cgroups.reason}")
    async with backend.running():
        assert await _waiting_at_the_gate(backend) == [str(gate.built_path(built))] * SPARES

    gate.built_path(built).chmod(0o777)
    with caplog.at_level(logging.WARNING):
        backend = BwrapBackend(*bwrap_pieces(settings))
        async with backend.running():
            assert await _waiting_at_the_gate(backend) == ["/bin/sh"] * SPARES
    assert "not running the sandbox's gate" in caplog.text and "writable" in caplog.text


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_a_gate_removed_under_a_running_backend_is_not_run_again(built: Path) -> None:
    # What setup of another version does (it prunes the builds of other sources) while a server runs.
    backend = BwrapBackend(*bwrap_pieces(load_settings(env={}, flags={"gate_dir": str(built)})))
    if backend.cgroups.version is None:
        pytest.skip(f"no cgroups here (a running backend keeps no spares): {backend.cgroups.reason}")
    async with backend.running():
        assert await _waiting_at_the_gate(backend) == [str(gate.built_path(built))] * SPARES
        shutil.rmtree(gate.built_path(built).parent)
        for _ in range(SPARES):  # the spares started before: already running it, they start as well
            await _waiting_at_the_gate(backend)
        assert await _waiting_at_the_gate(backend) == ["/bin/sh"] * SPARES


def test_a_parent_of_gate_dir_another_user_owns_refuses_the_gate(private_dir: Path) -> None:
    parent = private_dir / "theirs"
    parent.mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        build_gate(parent / "gate", log=lambda _: None)
    finally:
        os.umask(old)
    assert gate.refusal(parent / "gate") is None
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a parent of gate_dir away")
    os.chown(parent, _NOBODY, _NOBODY)  # nobody may now swap gate/ for a directory of their own

    problem = gate.refusal(parent / "gate")

    assert problem is not None and str(parent) in problem and f"uid {_NOBODY}" in problem


def test_a_parent_writable_by_others_refuses_the_gate_unless_sticky(private_dir: Path) -> None:
    parent = private_dir / "shared"
    parent.mkdir()
    build_gate(parent / "gate", log=lambda _: None)
    parent.chmod(0o777)  # anyone may rename gate/ away and put their own in its place

    assert "writable by group or others" in (gate.refusal(parent / "gate") or "")

    parent.chmod(0o1777)  # as /tmp: others may add entries, not move ours (a checkout cloned under /tmp)
    assert gate.refusal(parent / "gate") is None


def test_a_sticky_parent_does_not_let_another_users_directory_in_it_pass(private_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory away")
    parent = private_dir / "shared"
    parent.mkdir()
    build_gate(parent / "theirs" / "gate", log=lambda _: None)
    parent.chmod(0o1777)
    os.chown(parent / "theirs", _NOBODY, _NOBODY)  # what another user's own directory in /tmp is

    problem = gate.refusal(parent / "theirs" / "gate")

    assert problem is not None and f"uid {_NOBODY}" in problem


def test_a_sticky_directory_another_user_owns_refuses_the_gate(private_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a directory away")
    parent = private_dir / "shared"
    parent.mkdir()
    build_gate(parent / "gate", log=lambda _: None)
    parent.chmod(0o1777)
    os.chown(parent, _NOBODY, _NOBODY)  # its owner may remove any entry of a sticky directory

    assert f"uid {_NOBODY}" in (gate.refusal(parent / "gate") or "")


def test_the_descriptor_checked_is_what_runs_when_the_path_is_swapped_after_the_check(built: Path) -> None:
    checked = gate.open_checked(built)
    assert isinstance(checked, int)
    marker = built.parent / "swapped-program-ran"
    try:
        path = gate.built_path(built)
        path.parent.rename(built / "moved-away")  # what a user who could write gate_dir would do
        path.parent.mkdir()
        path.write_text(f"#!/bin/sh\n: > {marker}\n")
        path.chmod(0o755)
        spec = LaunchSpec(cgroup_procs=(), rlimits=(), uid=None, gid=None)
        gate_read, gate_write = os.pipe()
        try:
            process = subprocess.Popen(
                gated(spec, ["/bin/sh", "-c", "echo gate passed"], checked),
                stdin=gate_read, stdout=subprocess.PIPE, text=True, pass_fds=(checked,),
            )  # fmt: skip
        finally:
            os.close(gate_read)
        open_gate(gate_write, admitted=True)
        out, _ = process.communicate(timeout=30)
    finally:
        os.close(checked)
    assert (process.returncode, out) == (0, "gate passed\n")
    assert not marker.exists()


@pytest.mark.sandbox
@pytest.mark.anyio
async def test_runs_start_through_sh_and_setpriv_when_another_user_owns_a_parent_of_gate_dir(
    private_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to give a parent of gate_dir away")
    parent = private_dir / "theirs"
    parent.mkdir(mode=0o755)
    build_gate(parent / "gate", log=lambda _: None)
    os.chown(parent, _NOBODY, _NOBODY)
    backend = BwrapBackend(*bwrap_pieces(load_settings(env={}, flags={"gate_dir": str(parent / "gate")})))
    if backend.cgroups.version is None:
        pytest.skip(f"no cgroups here (a running backend keeps no spares): {backend.cgroups.reason}")
    with caplog.at_level(logging.WARNING):
        async with backend.running():
            assert await _waiting_at_the_gate(backend) == ["/bin/sh"] * SPARES  # and the sandbox ran
    assert "not running the sandbox's gate" in caplog.text and f"uid {_NOBODY}" in caplog.text
