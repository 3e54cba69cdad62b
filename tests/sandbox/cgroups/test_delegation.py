"""Taking over a delegated cgroup v2 subtree, as the unprivileged user it was delegated to.

A delegation is simulated the way systemd makes one: a cgroup under this host's cgroup2 mount,
chowned to an unprivileged uid (the directory, ``cgroup.procs``, ``cgroup.subtree_control``,
``cgroup.threads``) and marked with the ``user.delegate`` xattr. A forked child joins it, drops
to that uid and runs the real detection there. This host's cgroup2 has no memory, pids or cpu
(they are on v1), so enabling them is proven in the systemd guest (``make vm-test``); here the
decision, the move into the leaf and the advice are.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.sandbox.cgroups import CgroupSupport, detect_cgroups
from mcp_sandbox.sandbox.cgroups.delegation import LEAF, into_leaf, is_delegated_to_us, marked_delegated
from mcp_sandbox.sandbox.cgroups.hierarchy import mounts, rmdir_tree
from mcp_sandbox.sandbox.cgroups.systemd import SystemdUnavailable, bus_address, start_delegated_scope

from ..children import in_child

_DELEGATED_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")


def _v2_mount() -> Path:
    point = next((Path(p) for p, fstype, _ in mounts() if fstype == "cgroup2"), None)
    if point is None or os.geteuid() != 0:
        pytest.skip("needs root and a cgroup2 mount to simulate a delegation")
    return point


@pytest.fixture
def uid() -> int:
    return load_settings(env={}, flags={}).sandbox.sandbox_uid


@pytest.fixture
def scope(uid: int) -> Iterator[Path]:
    """A cgroup delegated to ``uid`` as systemd's ``Delegate=yes`` does (marked, chowned)."""
    directory = _v2_mount() / f"mcp-sandbox-test-{uuid.uuid4().hex[:8]}.scope"
    directory.mkdir()
    try:
        for path in (directory, *(directory / name for name in _DELEGATED_FILES)):
            os.chown(path, uid, uid)
        os.setxattr(directory, "user.delegate", b"1")
        yield directory
    finally:
        for path in sorted(directory.rglob("cgroup.procs"), key=lambda p: -len(p.parts)):
            for pid in path.read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        rmdir_tree(directory)


def _as_uid_in(directory: Path | None, uid: int, work: Callable[[], object]) -> dict[str, object]:
    """Fork a child that joins ``directory``, becomes ``uid``, runs ``work``; its result and cgroup."""

    def as_uid() -> dict[str, object]:
        if directory is not None:
            (directory / "cgroup.procs").write_text(str(os.getpid()))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        result = work()
        return {"result": result, "cgroup": Path("/proc/self/cgroup").read_text()}

    answer = in_child(as_uid)
    done: dict[str, object] = answer["result"] if "result" in answer else {"error": answer["error"]}
    return done


def _sleeper_in(directory: Path, uid: int) -> int:
    """Another process of the delegated unit (a wrapper shell, say), already in it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        (directory / "cgroup.procs").write_text(str(os.getpid()))
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        signal.pause()
        os._exit(0)
    return pid


def _v2_line(cgroup: object) -> str:
    assert isinstance(cgroup, str)
    return next(line[3:] for line in cgroup.splitlines() if line.startswith("0::"))


def test_a_systemd_delegation_is_recognised_and_an_unmarked_cgroup_is_not(scope: Path, uid: int) -> None:
    assert marked_delegated(scope)
    answer = _as_uid_in(scope, uid, lambda: is_delegated_to_us(scope))
    assert answer["result"] is True

    os.removexattr(scope, "user.delegate")
    assert not marked_delegated(scope)


def test_the_owner_moves_every_process_of_the_delegated_cgroup_into_a_leaf(scope: Path, uid: int) -> None:
    sleeper = _sleeper_in(scope, uid)
    try:
        answer = _as_uid_in(scope, uid, lambda: str(into_leaf(scope)))

        assert answer.get("error") is None
        assert answer["result"] == str(scope / LEAF)
        assert _v2_line(answer["cgroup"]).endswith(f"/{scope.name}/{LEAF}")
        assert (scope / "cgroup.procs").read_text().split() == []
        assert str(sleeper) in (scope / LEAF / "cgroup.procs").read_text().split()
    finally:
        os.kill(sleeper, signal.SIGKILL)
        os.waitpid(sleeper, 0)


def test_a_marked_delegation_is_taken_over_and_what_it_lacks_is_named(scope: Path, uid: int) -> None:
    # This host's cgroup2 has no memory/pids/cpu: detection finds the delegation, and says what it lacks.
    answer = _as_uid_in(scope, uid, lambda: list(_support_fields(detect_cgroups())))

    assert answer.get("error") is None
    result = answer["result"]
    assert isinstance(result, list)
    version, reason, origin = result
    assert version is None
    assert f"delegated cgroup {scope}" in reason and "memory pids cpu" in reason
    assert "Delegate=cpu memory pids" in reason
    assert origin.startswith("delegated cgroup /")


def test_a_second_detection_uses_the_taken_over_cgroup_instead_of_nesting_deeper(scope: Path, uid: int) -> None:
    # The first detection (or the server that started this one) left the process in the leaf.
    answer = _as_uid_in(
        scope, uid, lambda: [into_leaf(scope) and list(_support_fields(detect_cgroups())) for _ in range(2)]
    )

    assert answer.get("error") is None
    assert _v2_line(answer["cgroup"]).endswith(f"/{scope.name}/{LEAF}")
    assert not (scope / LEAF / LEAF).exists()
    results = answer["result"]
    assert isinstance(results, list)
    assert results[1][1] == results[0][1] and f"delegated cgroup {scope}" in results[1][1]


def test_a_writable_cgroup_that_was_not_delegated_is_left_alone(scope: Path, uid: int) -> None:
    os.removexattr(scope, "user.delegate")
    answer = _as_uid_in(scope, uid, lambda: list(_support_fields(detect_cgroups())))

    assert answer.get("error") is None
    assert _v2_line(answer["cgroup"]) == f"/{scope.name}"  # not moved
    assert not (scope / LEAF).exists()


def _support_fields(support: CgroupSupport) -> tuple[int | None, str, str]:
    return support.version, support.reason, support.origin


def _scope_refusal(env: dict[str, str]) -> str:
    try:
        start_delegated_scope(bus_address(env))
    except SystemdUnavailable as exc:
        return str(exc)
    return "a scope was started"


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """An XDG_RUNTIME_DIR the unprivileged uid can look into (tmp_path is root's, 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="mcp-sandbox-xdg-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def test_without_a_user_manager_the_advice_names_linger_and_systemd_run(runtime_dir: Path, uid: int) -> None:
    _v2_mount()
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    answer = _as_uid_in(None, uid, lambda: _scope_refusal(env))

    advice = answer["result"]
    assert isinstance(advice, str)
    assert f"no systemd user manager for uid {uid}" in advice
    assert f"loginctl enable-linger {uid}" in advice
    assert "systemd-run --user --scope -p Delegate=yes" in advice


def test_a_user_manager_without_a_bus_gets_dbus_user_session_advice(runtime_dir: Path, uid: int) -> None:
    _v2_mount()
    (runtime_dir / "systemd").mkdir()
    (runtime_dir / "systemd" / "private").touch()
    env = {"XDG_RUNTIME_DIR": str(runtime_dir)}
    answer = _as_uid_in(None, uid, lambda: _scope_refusal(env))

    advice = answer["result"]
    assert isinstance(advice, str)
    assert "install dbus-user-session" in advice


def test_root_without_a_system_manager_is_told_to_delegate_to_its_service() -> None:
    if os.geteuid() != 0:
        pytest.skip("the system bus is root's")
    advice = _scope_refusal({"DBUS_SYSTEM_BUS_ADDRESS": "unix:path=/nonexistent/system_bus_socket"})

    assert "no systemd system bus at /nonexistent/system_bus_socket" in advice
    assert "Delegate=yes" in advice


def test_the_bus_is_the_users_own_unless_one_is_named(uid: int) -> None:
    _v2_mount()
    answer = _as_uid_in(
        None,
        uid,
        lambda: [
            bus_address({"XDG_RUNTIME_DIR": "/run/user/1000"}),
            bus_address({"DBUS_SESSION_BUS_ADDRESS": "unix:path=/x/bus"}),
        ],
    )

    assert answer["result"] == ["unix:path=/run/user/1000/bus", "unix:path=/x/bus"]
