"""The proxy's own TLS to a secret's host: verified once, then resumed, never across tenants; both handshakes' failures.

In-process (no sandbox adds anything here): one run's proxy on its Unix socket, a client thread
speaking ``CONNECT`` and TLS to it, the real HTTPS test host behind it.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio.to_thread
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.egress import Authority, hosts_resolver, serve_egress
from mcp_sandbox.egress.listener import SOCKET_NAME
from mcp_sandbox.engine.startup import tenant_egress

from .conftest import HostNet
from .test_secrets import REAL, flags, hashed

pytestmark = pytest.mark.anyio

HOST = "api.web.test"
ENV = {
    "KEY": REAL,
    "MCP_SANDBOX_SECRET_API": f'{{ value_from = "env:KEY", hosts = ["{HOST}"] }}',
    "MCP_SANDBOX_SECRET_BOBS": f'{{ tenant = "bob", value_from = "env:KEY", hosts = ["{HOST}"] }}',
}


def fetch(path: Path, trusted: bytes, pause: float = 0.0) -> str:
    """``GET /auth`` through the proxy at ``path``, a new connection, sent ``pause`` seconds after the
    handshake: the body, the status and rule, or "untrusted"."""
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(20)
        raw.connect(str(path))
        raw.sendall(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += raw.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        client = ssl.create_default_context(cadata=trusted.decode())
        try:
            tls = client.wrap_socket(raw, server_hostname=HOST)
        except ssl.SSLCertVerificationError:
            return "untrusted"
        with tls:
            time.sleep(pause)
            tls.sendall(f"GET /auth HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n".encode())
            response = http.client.HTTPResponse(tls)
            response.begin()
            body = response.read().decode()
    return body if response.status == 200 else f"{response.status} {response.getheader('X-Egress-Rule')}"


def runs_of(
    test_net: HostNet, tmp_path: Path, upstream_ca: bool = True
) -> tuple[Authority, Callable[..., Awaitable[str]]]:
    """A CA (trusting the test host's CA for upstreams, or not) and ``await run(tenant, trusted)``: one run of
    ``tenant`` fetching through its own proxy, trusting ``trusted`` (None: the CA's certificates)."""
    given = flags(test_net, tmp_path)
    authority = Authority(Path(given["egress_upstream_ca"]) if upstream_ca else None)
    settings = load_settings(env=ENV, flags={"state_dir": str(tmp_path / "state"), **given})
    egress = tenant_egress(settings)
    (runs := tmp_path / "runs").mkdir()

    async def run(tenant: str, trusted: bytes | None = None, pause: float = 0.0) -> str:
        grant = egress.grant(tenant, True, None)
        assert grant is not None
        resolver = hosts_resolver(test_net.hosts)
        async with serve_egress(runs, grant, None, resolver=resolver, authority=authority) as (_proxy, directory):
            return await anyio.to_thread.run_sync(fetch, directory / SOCKET_NAME, trusted or authority.trusted(), pause)

    return authority, run


async def test_the_proxy_resumes_its_tls_to_a_host_for_the_same_tenant_only(test_net: HostNet, tmp_path: Path) -> None:
    authority, run = runs_of(test_net, tmp_path)
    assert await run("default", None) == hashed(f"Bearer {REAL}")
    kept = authority.sessions.get(("default", HOST, 443))
    assert kept is not None and authority.sessions.get(("bob", HOST, 443)) is None  # never offered to bob
    assert await run("default", None) == hashed(f"Bearer {REAL}")
    assert authority.sessions.get(("default", HOST, 443)) is kept  # resumed: no new full handshake
    assert await run("bob", None) == hashed(f"Bearer {REAL}")
    assert authority.sessions.get(("bob", HOST, 443)) is not None  # his own, from a full handshake


async def test_an_untrusted_host_is_answered_502_and_a_client_not_trusting_the_ca_gets_nothing(
    test_net: HostNet, tmp_path: Path
) -> None:
    authority, run = runs_of(test_net, tmp_path, upstream_ca=False)
    assert await run("default", None) == "502 upstream_certificate"
    # A client slow to send its request still gets the answer, not a connection closed under it.
    assert await run("default", None, 0.5) == "502 upstream_certificate"
    assert authority.sessions.get(("default", HOST, 443)) is None
    assert await run("default", Authority().trusted()) == "untrusted"  # another start's CA
