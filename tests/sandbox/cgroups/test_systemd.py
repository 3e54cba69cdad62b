"""Asking systemd for a delegated scope over a real D-Bus bus, from a forked server process.

A real ``dbus-daemon`` runs on a private socket; a small manager owns ``org.freedesktop.systemd1``
on it and answers ``StartTransientUnit`` the way systemd does for a scope: it makes the scope's
cgroup under this host's cgroup2 and moves the listed pids into it. The request's wire form
(name, mode, ``PIDs``, ``Delegate``) and our wait for the move are what is checked here; the real
systemd answers it in the guest of ``make vm-test``. The bus, like the system bus, lets any user
in: a system service run as a user of its own asks it which unit it is in (``GetUnitByPID``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.sandbox.cgroups import support
from mcp_sandbox.sandbox.cgroups.delegation import marked_delegated
from mcp_sandbox.sandbox.cgroups.hierarchy import mounts, rmdir_tree
from mcp_sandbox.sandbox.cgroups.systemd import SystemdUnavailable, Unit, start_delegated_scope, unit_of

from ..children import in_child

_BOUND = 10.0


def _v2_mount() -> Path:
    point = next((Path(p) for p, fstype, _ in mounts() if fstype == "cgroup2"), None)
    if point is None or os.geteuid() != 0 or shutil.which("dbus-daemon") is None:
        pytest.skip("needs root, a cgroup2 mount and dbus-daemon")
    return point


class _Manager:
    """Owns org.freedesktop.systemd1 on the bus; makes scopes under ``parent`` as systemd would."""

    def __init__(self, address: str, parent: Path, v2: Path) -> None:
        from jeepney.bus_messages import message_bus
        from jeepney.io.blocking import open_dbus_connection

        self.requests: list[tuple[Any, ...]] = []
        self.units: dict[int, tuple[str, bool]] = {}  # pid -> (unit name, Delegate=)
        self.any_pid: tuple[str, bool, str] | None = None  # (name, Delegate=, ControlGroup) for every other pid
        self._parent, self._v2 = parent, v2
        self._connection = open_dbus_connection(bus=address)
        self._connection.send_and_get_reply(message_bus.RequestName("org.freedesktop.systemd1"), timeout=_BOUND)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        from jeepney.wrappers import new_error, new_method_return

        while not self._stop.is_set():
            try:
                message = self._connection.receive(timeout=0.1)
            except TimeoutError:
                continue
            method = message.header.fields.get(3)  # HeaderFields.member
            if method == "StartTransientUnit":
                self.requests.append((message.header.fields.get(1), *message.body))  # HeaderFields.path
                name, _, properties, _ = message.body
                scope = self._parent / name
                scope.mkdir()
                for key, (_, value) in properties:
                    if key == "PIDs":
                        for pid in value:
                            (scope / "cgroup.procs").write_text(str(pid))
                self._connection.send(new_method_return(message, "o", ("/org/freedesktop/systemd1/job/1",)))
            elif method == "GetUnitByPID" and (message.body[0] in self.units or self.any_pid is not None):
                self._connection.send(
                    new_method_return(message, "o", (f"/org/freedesktop/systemd1/unit/{message.body[0]}",))
                )
            elif method == "GetUnitByPID":
                self._connection.send(
                    new_error(message, "org.freedesktop.systemd1.NoUnitForPID", "s", ("no unit for that pid",))
                )
            elif method == "Get":
                pid = int(str(message.header.fields.get(1)).rsplit("/", 1)[-1])
                known = (*self.units[pid], "") if pid in self.units else None
                name, delegate, cgroup = known or self.any_pid or ("", False, "")
                interface, key = message.body
                values: dict[tuple[str, str], tuple[str, object]] = {
                    ("org.freedesktop.systemd1.Unit", "Id"): ("s", name),
                    ("org.freedesktop.systemd1.Service", "Delegate"): ("b", delegate),
                    ("org.freedesktop.systemd1.Service", "MainPID"): ("u", pid),
                    ("org.freedesktop.systemd1.Scope", "Delegate"): ("b", delegate),
                    ("org.freedesktop.systemd1.Service", "ControlGroup"): ("s", cgroup),
                }
                self._connection.send(new_method_return(message, "v", (values[(interface, key)],)))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_BOUND)
        self._connection.close()


# A session bus's configuration, but open to every user (as the system bus is to systemd's queries).
_BUS_CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:tmpdir=/tmp</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""


@pytest.fixture
def bus() -> Iterator[tuple[str, Path, _Manager]]:
    v2 = _v2_mount()
    parent = v2 / f"mcp-sandbox-test-{uuid.uuid4().hex[:8]}.slice"
    parent.mkdir()
    directory = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bus-"))
    directory.chmod(0o755)  # reachable by the unprivileged uid, as the system bus is
    address = f"unix:path={directory / 'bus'}"
    config = directory / "bus.conf"
    config.write_text(_BUS_CONFIG)
    daemon = subprocess.Popen(
        ["dbus-daemon", f"--config-file={config}", f"--address={address}", "--nofork"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    manager: _Manager | None = None
    try:
        deadline = time.monotonic() + _BOUND
        while manager is None:
            # The socket's file exists from bind(), a moment before the daemon listens on it.
            try:
                manager = _Manager(address, parent, v2)
            except (FileNotFoundError, ConnectionRefusedError):
                assert time.monotonic() < deadline, "dbus-daemon did not start"
                time.sleep(0.01)
        yield address, parent, manager
    finally:
        if manager is not None:
            manager.close()
        daemon.terminate()
        daemon.wait(_BOUND)
        for procs in sorted(parent.rglob("cgroup.procs"), key=lambda p: -len(p.parts)):
            for pid in procs.read_text().split():
                os.kill(int(pid), signal.SIGKILL)
        rmdir_tree(parent)
        shutil.rmtree(directory)


def test_the_server_asks_for_a_delegated_scope_of_its_own_pid_and_waits_until_it_is_in_it(
    bus: tuple[str, Path, _Manager],
) -> None:
    address, parent, manager = bus
    answer = in_child(lambda: start_delegated_scope(address))

    assert answer.get("error") is None
    (path, name, mode, properties, auxiliary) = manager.requests[0]
    assert path == "/org/freedesktop/systemd1"
    assert name.startswith(f"mcp-sandbox-{answer['pid']}-") and name.endswith(".scope")
    assert mode == "fail" and auxiliary == []
    sent = {key: value for key, (_, value) in properties}
    assert sent["PIDs"] == [answer["pid"]]
    assert sent["Delegate"] is True
    assert answer["result"] == f"/{parent.name}/{name}"


def test_a_refusal_by_the_manager_names_its_dbus_error(bus: tuple[str, Path, _Manager]) -> None:
    address, _, _ = bus
    with pytest.raises(SystemdUnavailable, match="NoUnitForPID"):
        unit_of(os.getpid(), address)


def test_the_unit_of_a_process_says_its_name_delegation_and_main_pid(bus: tuple[str, Path, _Manager]) -> None:
    address, _, manager = bus
    manager.units[os.getpid()] = ("app-editor.service", False)
    manager.units[os.getpid() + 1] = ("mcp.scope", True)

    assert unit_of(os.getpid(), address) == Unit("app-editor.service", delegate=False, main_pid=os.getpid())
    assert unit_of(os.getpid() + 1, address) == Unit("mcp.scope", delegate=True, main_pid=None)


_DELEGATED_FILES = ("cgroup.procs", "cgroup.subtree_control", "cgroup.threads")


def _own_unit_as_the_service_user(cgroup: Path, system_bus: str) -> dict[str, Any]:
    """In a child that joins ``cgroup`` and becomes the sandbox uid, with no user manager: what
    the server's detection learns of its unit, and whether it can read the delegation mark."""
    uid = load_settings(env={}, flags={}).sandbox.sandbox_uid
    runtime = Path(tempfile.mkdtemp(prefix="mcp-sandbox-xdg-"))  # no bus in it: no user manager
    runtime.chmod(0o755)

    def work() -> dict[str, Any]:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        os.environ.update({"XDG_RUNTIME_DIR": str(runtime), "DBUS_SYSTEM_BUS_ADDRESS": system_bus})
        os.environ.pop("DBUS_SESSION_BUS_ADDRESS", None)
        unit = support._own_unit()
        return {"marked": marked_delegated(cgroup), "unit": None if unit is None else list(_fields(unit))}

    try:
        return in_child(work)
    finally:
        shutil.rmtree(runtime)


def _fields(unit: Unit) -> tuple[str, bool, int | None, str | None]:
    return unit.name, unit.delegate, unit.main_pid, unit.control_group


def _service_cgroup(parent: Path, name: str) -> Path:
    """A cgroup as systemd makes one for a service with ``User=`` and ``Delegate=yes``: chowned to
    the user, marked with ``trusted.delegate`` (systemd 252), which only root can read."""
    uid = load_settings(env={}, flags={}).sandbox.sandbox_uid
    directory = parent / name
    directory.mkdir(parents=True)
    for path in (directory, *(directory / entry for entry in _DELEGATED_FILES)):
        os.chown(path, uid, uid)
    os.setxattr(directory, "trusted.delegate", b"1")
    return directory


def test_a_system_service_run_as_its_own_user_learns_its_delegated_unit_from_the_system_manager(
    bus: tuple[str, Path, _Manager],
) -> None:
    address, parent, manager = bus
    service = _service_cgroup(parent, "mcp-sandbox.service")
    manager.any_pid = ("mcp-sandbox.service", True, f"/{parent.name}/mcp-sandbox.service")

    answer = _in_child_result(_own_unit_as_the_service_user(service, address))

    assert answer["marked"] is False  # the mark is there, but not for this user to read
    name, delegate, main_pid, control_group = answer["unit"]
    assert (name, delegate, control_group) == ("mcp-sandbox.service", True, f"/{parent.name}/mcp-sandbox.service")
    assert main_pid is not None


def test_a_unit_whose_cgroup_is_not_the_servers_own_is_not_taken_for_it(bus: tuple[str, Path, _Manager]) -> None:
    """A process deep in a user manager's tree: the system manager names user@UID.service, whose
    Delegate=yes is the user manager's, not the server's."""
    address, parent, manager = bus
    app = _service_cgroup(parent, "user@999.service/app.slice/editor.service")
    manager.any_pid = ("user@999.service", True, f"/{parent.name}/user@999.service")

    answer = _in_child_result(_own_unit_as_the_service_user(app, address))

    assert answer["unit"] is None


def _in_child_result(answer: dict[str, Any]) -> dict[str, Any]:
    assert answer.get("error") is None, answer
    result: dict[str, Any] = answer["result"]
    return result
