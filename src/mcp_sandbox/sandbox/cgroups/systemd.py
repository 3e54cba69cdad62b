"""Asking systemd for a delegated cgroup: a transient scope with ``Delegate=yes``.

An ordinary user's MCP server sits in a cgroup its user manager owns (``user@UID.service/app.slice
/...``), which it must not write to. It asks that manager, over the user's D-Bus bus, for a
scope of its own (``StartTransientUnit``, as podman and crun do): systemd moves the server's
process there and hands the scope's cgroup to the user, with the controllers ``user@.service``
delegates (Debian 12, systemd 252: ``cpu memory pids``). As root the same call goes to the
system manager. A system service run as a user of its own (``User=``, ``Delegate=yes``) has no
user manager: the system manager says which unit it is in (:func:`own_system_unit`). ``jeepney``
speaks D-Bus (pure Python, blocking; this runs once at start-up).

Every failure is a :class:`SystemdUnavailable` whose message says what to do about it.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SystemdUnavailable",
    "Unit",
    "bus_address",
    "own_system_unit",
    "start_delegated_scope",
    "system_bus_address",
    "unit_of",
]

_SYSTEMD = "org.freedesktop.systemd1"
_MANAGER_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_CALL_SECONDS = 10.0
_MOVE_SECONDS = 10.0  # a slow (emulated) host takes a while to run the job that moves us
_MOVE_POLL = 0.01


class SystemdUnavailable(Exception):
    """No service manager to ask, or it refused; the message says what to do about it."""


def bus_address(env: dict[str, str] | None = None) -> str:
    """The D-Bus address of the manager of the user we run as: the user bus, or the system bus as root."""
    env = dict(os.environ) if env is None else env
    if os.geteuid() == 0:
        return system_bus_address(env)
    address = env.get("DBUS_SESSION_BUS_ADDRESS", "")
    if address.startswith("unix:"):
        return address
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.geteuid()}"
    return f"unix:path={runtime}/bus"


def _missing_bus_advice(address: str) -> str:
    path = address.removeprefix("unix:path=").split(",", 1)[0]
    if os.geteuid() == 0:
        return (
            f"no systemd system bus at {path} (systemd is not PID 1 here, e.g. a container or WSL without "
            "systemd): run the server as a systemd service with Delegate=yes, or in a container given "
            "its own cgroup (docker/podman --cgroupns=private), or on a host with systemd"
        )
    runtime = Path(path).parent
    if (runtime / "systemd" / "private").exists():
        return (
            f"your systemd user manager runs but has no D-Bus bus at {path}: install dbus-user-session "
            "(apt install dbus-user-session; log in again), or start the server as "
            "`systemd-run --user --scope -p Delegate=yes mcp-sandbox serve`"
        )
    return (
        f"no systemd user manager for uid {os.geteuid()} (no bus at {path}; a container, WSL without "
        "systemd, or a login without a systemd session): log in through systemd-logind, or run "
        f"`loginctl enable-linger {os.geteuid()}` as root to keep user@{os.geteuid()}.service running, "
        "or start the server as `systemd-run --user --scope -p Delegate=yes mcp-sandbox serve`"
    )


def _call(address: str, path: str, interface: str, method: str, signature: str, body: tuple[Any, ...]) -> Any:
    """One method call to systemd on ``address``; the reply's body.

    Raises:
        SystemdUnavailable: no bus there, or the call failed (its D-Bus error named).
    """
    socket_path = address.removeprefix("unix:path=").split(",", 1)[0]
    if address.startswith("unix:path=") and not Path(socket_path).exists():
        raise SystemdUnavailable(_missing_bus_advice(address))
    from jeepney import DBusAddress, new_method_call
    from jeepney.io.blocking import open_dbus_connection
    from jeepney.wrappers import DBusErrorResponse, unwrap_msg

    target = DBusAddress(path, bus_name=_SYSTEMD, interface=interface)
    try:
        connection = open_dbus_connection(bus=address)
    except (OSError, RuntimeError, ValueError) as exc:
        if isinstance(exc, (FileNotFoundError, ConnectionRefusedError)):
            raise SystemdUnavailable(_missing_bus_advice(address)) from exc
        raise SystemdUnavailable(f"cannot connect to D-Bus at {address}: {exc}") from exc
    try:
        with connection:
            reply = connection.send_and_get_reply(
                new_method_call(target, method, signature, body), timeout=_CALL_SECONDS
            )
            return unwrap_msg(reply)
    except DBusErrorResponse as exc:
        raise SystemdUnavailable(f"systemd refused {method}: {exc.name}: {' '.join(map(str, exc.data))}") from exc
    except (OSError, TimeoutError) as exc:
        raise SystemdUnavailable(f"D-Bus call {method} at {address} failed: {exc}") from exc


def system_bus_address(env: dict[str, str] | None = None) -> str:
    """The D-Bus address of the system manager."""
    env = dict(os.environ) if env is None else env
    return env.get("DBUS_SYSTEM_BUS_ADDRESS") or "unix:path=/run/dbus/system_bus_socket"


@dataclass(frozen=True, slots=True)
class Unit:
    """The systemd unit a process belongs to: its name, ``Delegate=``, main pid (services), and
    its cgroup (``ControlGroup``, when asked for)."""

    name: str
    delegate: bool
    main_pid: int | None
    control_group: str | None = None


def _property(address: str, unit_path: str, interface: str, name: str) -> Any:
    (value,) = _call(address, unit_path, "org.freedesktop.DBus.Properties", "Get", "ss", (interface, name))
    return value[1]  # a variant: (signature, value)


def unit_of(pid: int, address: str | None = None, *, cgroup: bool = False) -> Unit:
    """The unit ``pid`` belongs to, as its manager sees it (with its cgroup when ``cgroup``).

    Raises:
        SystemdUnavailable: no manager to ask, or ``pid`` is in none of its units.
    """
    address = address or bus_address()
    (unit_path,) = _call(address, _MANAGER_PATH, _MANAGER, "GetUnitByPID", "u", (pid,))
    name = str(_property(address, unit_path, f"{_SYSTEMD}.Unit", "Id"))
    kind = name.rsplit(".", 1)[-1]
    if kind not in ("service", "scope", "socket", "mount", "swap"):
        return Unit(name, delegate=False, main_pid=None)
    interface = f"{_SYSTEMD}.{kind.capitalize()}"
    delegate = bool(_property(address, unit_path, interface, "Delegate"))
    main_pid = int(_property(address, unit_path, interface, "MainPID")) if kind == "service" else None
    control_group = str(_property(address, unit_path, interface, "ControlGroup")) if cgroup else None
    return Unit(name, delegate=delegate, main_pid=main_pid, control_group=control_group)


def own_system_unit(address: str | None = None) -> Unit | None:
    """The system manager's unit whose cgroup is exactly this process's; None when it is another's.

    A system service with ``User=`` and ``Delegate=yes`` has no user manager to ask, and systemd
    252 marks the delegation with ``trusted.delegate``, which only root may read; the system
    manager answers any user. Only a unit whose own cgroup is ours counts: a process deeper in a
    unit's tree (a user manager's, ``user@UID.service``) is in cgroups that unit manages.

    Raises:
        SystemdUnavailable: no system manager to ask, or it knows no unit of this process.
    """
    unit = unit_of(os.getpid(), address or system_bus_address(), cgroup=True)
    return unit if unit.control_group == _own_v2_path() else None


def _own_v2_path() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line[3:]
    return ""


def start_delegated_scope(address: str | None = None) -> str:
    """Move this process into a new transient scope with ``Delegate=yes``; return its cgroup path.

    Only this process moves (its children stay where they are). Returns once the kernel shows
    the move in ``/proc/self/cgroup``.

    Raises:
        SystemdUnavailable: no manager to ask, it refused, or the move did not happen in time.
    """
    address = address or bus_address()
    name = f"mcp-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}.scope"
    properties = [
        ("PIDs", ("au", [os.getpid()])),
        ("Delegate", ("b", True)),
        ("Description", ("s", "mcp-sandbox server (delegated cgroup for its sandboxes' limits)")),
        ("CollectMode", ("s", "inactive-or-failed")),
    ]
    _call(address, _MANAGER_PATH, _MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))", (name, "fail", properties, []))
    deadline = time.monotonic() + _MOVE_SECONDS
    while time.monotonic() < deadline:
        path = _own_v2_path()
        if path.rstrip("/").endswith("/" + name):
            return path
        time.sleep(_MOVE_POLL)
    raise SystemdUnavailable(f"systemd started {name} but did not move this process into it within {_MOVE_SECONDS} s")
