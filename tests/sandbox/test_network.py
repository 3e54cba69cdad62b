"""Network attacks: the sandbox reaches nothing, not even the host's loopback.

The policy denies the network twice: an empty network namespace, and a seccomp filter that
allows only AF_UNIX sockets. Each test asserts the attempt failed and, where the host holds
the other end, that nothing arrived there.
"""

from __future__ import annotations

import socket
import uuid

import pytest

from .harness import SandboxRunner

pytestmark = [pytest.mark.sandbox, pytest.mark.anyio]

# A socket refused by the filter (bwrap: EAFNOSUPPORT) or by a missing privilege.
SOCKET_DENIED = {"OSError:EAFNOSUPPORT", "PermissionError:EPERM", "PermissionError:EACCES"}
# Where a backend lets an IP socket be created, the empty namespace still refuses the connection.
CONNECT_DENIED = SOCKET_DENIED | {"ConnectionRefusedError:ECONNREFUSED", "OSError:ENETUNREACH", "TimeoutError"}


def _host_address() -> str | None:
    """This host's address on its default route (no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: connect() on UDP only picks a route
        except OSError:
            return None
        address: str = probe.getsockname()[0]
    return address


def _something_arrived(sock: socket.socket) -> bool:
    """Whether ``sock`` has a connection or a datagram pending (checked without waiting)."""
    sock.setblocking(False)
    try:
        if sock.type == socket.SOCK_STREAM:
            connection, _ = sock.accept()
            connection.close()
        else:
            sock.recvfrom(64)
    except BlockingIOError:
        return False
    return True


async def test_tcp_connect_to_host_loopback_is_refused(sandbox: SandboxRunner) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("0.0.0.0", 0))  # loopback and the external address alike
        listener.listen()
        port = listener.getsockname()[1]
        targets = ["127.0.0.1"] + [a for a in [_host_address()] if a and a != "127.0.0.1"]
        report = await sandbox.report(f"""
            import socket
            for target in {targets!r}:
                report[target] = outcome(lambda: socket.create_connection((target, {port}), timeout=2))
        """)
        arrived = _something_arrived(listener)
    assert not arrived
    assert set(report) == set(targets)
    assert set(report.values()) <= CONNECT_DENIED, report


async def test_udp_sendto_host_loopback_does_not_arrive(sandbox: SandboxRunner) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind(("127.0.0.1", 0))
        port = receiver.getsockname()[1]
        report = await sandbox.report(f"""
            import socket
            def send():
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(b"escaped", ("127.0.0.1", {port}))
            report["sendto"] = outcome(send)
        """)
        arrived = _something_arrived(receiver)
    assert not arrived
    assert report["sendto"] in CONNECT_DENIED


async def test_dns_resolution_fails(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        import socket
        report["getaddrinfo"] = outcome(lambda: socket.getaddrinfo("example.com", 443))
    """)
    assert report["getaddrinfo"].split(":")[0] == "gaierror"


async def test_localhost_names_loopback_and_no_host_name_shows(sandbox: SandboxRunner) -> None:
    # A client told to reach localhost (directly, or NO_PROXY-style) finds the sandbox's own loopback,
    # not a resolution failure; the host's own names and addresses (its /etc/hosts) stay unseen.
    report = await sandbox.report("""
        import socket
        report["localhost"] = sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, socket.AF_INET)})
        report["hosts"] = open("/etc/hosts").read()
    """)
    assert report["localhost"] == ["127.0.0.1"]
    lines = [line.split() for line in report["hosts"].splitlines() if line.strip() and not line.startswith("#")]
    # loopback, and the IPv6 names docker's own file adds (ip6-localnet, ip6-allnodes...)
    assert {fields[0] for fields in lines} <= {"127.0.0.1", "::1", "fe00::0", "ff00::0", "ff02::1", "ff02::2"}
    assert socket.gethostname() not in {name for fields in lines for name in fields[1:]}


@pytest.mark.parametrize(
    ("family", "kind", "protocol"),
    [
        pytest.param("AF_NETLINK", "SOCK_RAW", 0, id="netlink-route"),
        pytest.param("AF_PACKET", "SOCK_RAW", 0x0300, id="packet-raw"),  # htons(ETH_P_ALL)
        pytest.param("AF_INET", "SOCK_RAW", 1, id="inet-raw-icmp"),
        pytest.param("AF_INET6", "SOCK_STREAM", 0, id="inet6-stream"),
    ],
)
async def test_non_unix_socket_cannot_be_created(sandbox: SandboxRunner, family: str, kind: str, protocol: int) -> None:
    report = await sandbox.report(f"""
        import socket
        report["socket"] = outcome(lambda: socket.socket(socket.{family}, socket.{kind}, {protocol}))
    """)
    assert report["socket"] in SOCKET_DENIED


async def test_only_the_loopback_interface_exists(sandbox: SandboxRunner) -> None:
    report = await sandbox.report("""
        with open("/proc/net/dev") as dev:
            report["interfaces"] = sorted(line.split(":")[0].strip() for line in dev.readlines()[2:])
        report["sys_class_net"] = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else None
    """)
    assert report["interfaces"] == ["lo"]
    assert report["sys_class_net"] in (None, ["lo"])


async def test_unix_connect_to_host_abstract_socket_is_refused(sandbox: SandboxRunner) -> None:
    # Abstract unix sockets belong to the network namespace; a shared one would reach the host's.
    name = f"\0mcp-sandbox-conformance-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(name)
        listener.listen()
        report = await sandbox.report(f"""
            import socket
            def connect():
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.connect({name!r})
            report["connect"] = outcome(connect)
        """)
        arrived = _something_arrived(listener)
    assert not arrived
    assert report["connect"] == "ConnectionRefusedError:ECONNREFUSED"
