"""The proxy's kept connections to a secret's host: reused by the next sandbox connection, never another tenant's.

In-process like test_terminate.py (one run's proxy on its Unix socket, a client thread speaking
``CONNECT`` and TLS to it, the real HTTPS test host behind it); the tenant attack also in a real
sandbox. The test host's ``/peer`` answers the port of the connection a request came on, so the
same number twice is one connection of the proxy's reused.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio.to_thread
import pytest

from mcp_sandbox.config import load_settings
from mcp_sandbox.egress import Authority, hosts_resolver, serve_egress
from mcp_sandbox.egress.listener import SOCKET_NAME
from mcp_sandbox.engine.startup import tenant_egress

from .conftest import EgressEngine, HostNet, execute
from .test_secrets import OTHER, REAL, flags, grant, hashed
from .test_terminate import ENV, HOST

pytestmark = pytest.mark.anyio

Answers = list[tuple[int, str]]


def exchange(path: Path, trusted: bytes, requests: list[str], unread: bool = False) -> Answers:
    """``requests`` ("METHOD /target") on one new connection through the proxy at ``path``, the last
    with ``Connection: close`` (a one-shot client's): each answer's status and body. ``unread``: the
    last answer's head is read, its body not, and the connection closed."""
    answers: Answers = []
    with socket.socket(socket.AF_UNIX) as raw:
        raw.settimeout(20)
        raw.connect(str(path))
        raw.sendall(f"CONNECT {HOST}:443 HTTP/1.1\r\nHost: {HOST}:443\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += raw.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200"), answer
        with ssl.create_default_context(cadata=trusted.decode()).wrap_socket(raw, server_hostname=HOST) as tls:
            for index, request in enumerate(requests):
                method, target = request.split(" ")
                last = index == len(requests) - 1
                closing = "Connection: close\r\n" if last and not unread else ""
                tls.sendall(f"{method} {target} HTTP/1.1\r\nHost: {HOST}\r\n{closing}\r\n".encode())
                response = http.client.HTTPResponse(tls, method=method)
                response.begin()
                if last and unread:
                    return [*answers, (response.status, "")]
                answers.append((response.status, response.read().decode()))
    return answers


Run = Callable[..., Awaitable[Answers]]


@pytest.fixture
async def runs_of(test_net: HostNet, tmp_path: Path) -> AsyncIterator[tuple[Authority, Run]]:
    """The server's CA (and its pool, closed afterwards) and ``await run(tenant, requests, unread=False)``:
    one run of ``tenant`` sending ``requests`` on one connection through its own proxy."""
    given = flags(test_net, tmp_path)
    authority = Authority(Path(given["egress_upstream_ca"]))
    egress = tenant_egress(load_settings(env=ENV, flags={"state_dir": str(tmp_path / "state"), **given}))
    (runs := tmp_path / "runs").mkdir()

    async def run(tenant: str, requests: list[str], unread: bool = False) -> Answers:
        made = egress.grant(tenant, True, None)
        assert made is not None
        resolver = hosts_resolver(test_net.hosts)
        async with serve_egress(runs, made, None, resolver=resolver, authority=authority) as (_proxy, directory):
            path = directory / SOCKET_NAME
            return await anyio.to_thread.run_sync(exchange, path, authority.trusted(), requests, unread)

    yield authority, run
    await authority.pool.aclose()


async def test_new_connections_and_runs_of_a_tenant_reuse_one_connection_to_the_host(
    runs_of: tuple[Authority, Run],
) -> None:
    authority, run = runs_of
    [(status, port)] = await run("default", ["GET /peer"])
    assert status == 200 and len(authority.pool) == 1
    # Another connection, another run: bodiless answers (HEAD, 204) keep the connection too.
    again = await run("default", ["GET /peer", "HEAD /peer", "GET /empty", "GET /peer", "GET /auth"])
    assert again == [(200, port), (200, ""), (204, ""), (200, port), (200, hashed(f"Bearer {REAL}"))]
    assert len(authority.pool) == 0  # /auth's answer said Connection: close: not kept


async def test_a_connection_the_host_closed_is_not_reused_and_the_request_still_succeeds(
    runs_of: tuple[Authority, Run],
) -> None:
    authority, run = runs_of
    [(_, dropped)] = await run("default", ["GET /drop"])  # answered as if kept, then closed by the host
    [(status, port)] = await run("default", ["GET /peer"])
    assert status == 200 and port != dropped
    [(_, unframed)] = await run("default", ["GET /unframed"])  # no length: its end is the connection's
    assert unframed == port and len(authority.pool) == 0  # the kept one served it, then ended with it
    [(status, fresh), (_, said)] = await run("default", ["GET /peer", "GET /says-close"])  # the host keeps it open
    assert status == 200 and fresh not in (port, dropped) and said == fresh and len(authority.pool) == 0
    [(status, last)] = await run("default", ["GET /peer"])
    assert status == 200 and last != fresh


async def test_an_answer_the_sandbox_left_unread_does_not_leave_its_connection_kept(
    runs_of: tuple[Authority, Run],
) -> None:
    authority, run = runs_of
    [(_, port)] = await run("default", ["GET /peer"])
    [(status, _)] = await run("default", ["GET /peer?size=2000000"], unread=True)
    assert status == 200 and len(authority.pool) == 0
    [(_, after)] = await run("default", ["GET /peer"])
    assert after != port  # the connection with 2 MB unread was closed, not kept


async def test_another_tenant_never_gets_a_connection_kept_for_this_one(runs_of: tuple[Authority, Run]) -> None:
    authority, run = runs_of
    [(_, port)] = await run("default", ["GET /peer"])
    [(_, bobs)] = await run("bob", ["GET /peer"])  # bob's own secret, on the same host
    assert bobs != port
    assert len(authority.pool) == 2
    [(_, mine)] = await run("default", ["GET /peer"])
    assert mine == port  # still kept, for default alone


@pytest.mark.sandbox
async def test_another_tenants_code_never_rides_a_connection_kept_for_this_one(
    egress_engine: EgressEngine, test_net: HostNet, tmp_path: Path
) -> None:
    code = """
        import json, urllib.request
        get = lambda: urllib.request.urlopen("https://api.web.test/peer-auth", timeout=10).read().decode().split()
        print(json.dumps([get(), get()]))  # each a new connection; the last one's kept by the proxy
    """
    env = {
        "API_KEY_VALUE": REAL,
        "OTHER_VALUE": OTHER,
        "MCP_SANDBOX_SECRET_API": '{ value_from = "env:API_KEY_VALUE", hosts = ["api.web.test"] }',
        "MCP_SANDBOX_SECRET_BOBS": '{ tenant = "bob", value_from = "env:OTHER_VALUE", hosts = ["api.web.test"] }',
    }
    async with egress_engine(env=env, **flags(test_net, tmp_path)) as (engine, egress):
        mine = await execute(engine, code, grant(egress))
        bobs = await execute(engine, code, grant(egress, "bob"), tenant="bob")
    assert mine.status == bobs.status == "success", (mine, bobs)
    [(port, answer), again], [(bobs, bob_answer), bob_again] = json.loads(mine.stdout), json.loads(bobs.stdout)
    assert again == [port, answer]  # the run's second connection rode the proxy's kept one
    assert bob_again == [bobs, bob_answer] and bobs != port  # bob's own, never the default tenant's
    assert (answer, bob_answer) == (hashed(f"Bearer {REAL}"), hashed(f"Bearer {OTHER}"))
