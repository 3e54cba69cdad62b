"""A forwarding replica's client against an owner's internal route, both real (uvicorn on loopback)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
import uvicorn

from mcp_sandbox.errors import ConfigError
from mcp_sandbox.replicas.forward import TASK_PATH, Forwarder
from mcp_sandbox.replicas.internal_route import with_internal_route
from mcp_sandbox.replicas.signing import Verifier
from tls_helpers import certificates

pytestmark = pytest.mark.anyio

KEY = b"k" * 32
BOUND = 10.0


async def _nothing_else(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


@contextlib.asynccontextmanager
async def owner(
    calls: list[dict[str, Any] | None], tls: tuple[Path, Path] | None = None, asked: list[dict[str, Any]] | None = None
) -> AsyncIterator[str]:
    listening = socket.create_server(("127.0.0.1", 0))  # listening before the server starts: no wait
    url = f"{'https' if tls else 'http'}://127.0.0.1:{listening.getsockname()[1]}"

    async def serve(tool: str, arguments: dict[str, Any] | None, tenant: str) -> types.CallToolResult:
        calls.append(arguments)
        await anyio.sleep(0.05)  # both calls are in flight at once
        return types.CallToolResult(content=[types.TextContent(type="text", text="ran")])

    async def serve_task(request: dict[str, Any]) -> tuple[int, bytes]:
        assert asked is not None
        asked.append(request)
        return 200, b'{"status": "working"}'

    app = with_internal_route(
        _nothing_else, url, Verifier(KEY), "default".__eq__, serve, 1 << 20, serve_task if asked is not None else None
    )
    certificate, private_key = tls or (None, None)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", ssl_certfile=certificate, ssl_keyfile=private_key)
    server = uvicorn.Server(config)
    with listening:
        async with anyio.create_task_group() as group:
            group.start_soon(server.serve, [listening])
            yield url
            server.should_exit = True


async def test_two_identical_calls_forwarded_at_once_both_run_and_neither_is_taken_for_a_replay() -> None:
    calls: list[dict[str, Any] | None] = []
    results: list[types.CallToolResult] = []
    async with owner(calls) as url:
        forwarder = Forwarder("http://127.0.0.1:1", KEY, BOUND)
        try:

            async def forward() -> None:
                results.append(await forwarder.forward(url, "run_python", {"code": "print(1)"}, "default"))

            with anyio.fail_after(BOUND):
                await forward()  # a kept-alive connection: the next call is signed and sent at once
                async with anyio.create_task_group() as group:
                    group.start_soon(forward)
                    group.start_soon(forward)  # the same body, signed in the same millisecond
        finally:
            await forwarder.aclose()

    assert [result.is_error for result in results] == [False] * 3, results
    assert calls == [{"code": "print(1)"}] * 3


async def test_an_https_replica_url_is_reached_through_the_configured_ca_and_no_other(tmp_path: Path) -> None:
    ca, [(certificate, private_key)] = certificates(tmp_path / "ours", "replicas-test-ca")
    other_ca, _ = certificates(tmp_path / "theirs", "another-ca", 0)
    calls: list[dict[str, Any] | None] = []
    async with owner(calls, (certificate, private_key)) as url:
        assert url.startswith("https://")
        trusting = Forwarder("https://127.0.0.1:1", KEY, BOUND, ca=ca)
        stranger = Forwarder("https://127.0.0.1:1", KEY, BOUND, ca=other_ca)
        system = Forwarder("https://127.0.0.1:1", KEY, BOUND)  # the default bundle does not know ours
        try:
            with anyio.fail_after(BOUND):
                ran = await trusting.forward(url, "run_python", {"code": "print(1)"}, "default")
                again = await trusting.forward(url, "run_python", {"code": "print(2)"}, "default")  # kept alive
                for forwarder in (stranger, system):  # unverified: no connection, nothing sent
                    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
                        await forwarder.forward(url, "run_python", {"code": "print(3)"}, "default")
        finally:
            for forwarder in (trusting, stranger, system):
                await forwarder.aclose()
    assert (ran.is_error, again.is_error) == (False, False), (ran, again)
    assert calls == [{"code": "print(1)"}, {"code": "print(2)"}]


def test_a_replica_ca_that_is_not_a_pem_file_is_refused_naming_the_setting(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match="replica_ca"):
        Forwarder("https://127.0.0.1:1", KEY, BOUND, ca=tmp_path / "ca.pem")


async def test_a_task_request_is_answered_only_when_signed_for_this_replica_and_a_known_tenant() -> None:
    asked: list[dict[str, Any]] = []
    request = {"op": "cancel", "tenant": "default", "taskId": "t", "owner": "o"}
    async with owner([], asked=asked) as url:
        forwarder = Forwarder("http://127.0.0.1:1", KEY, BOUND)
        forger = Forwarder("http://127.0.0.1:1", b"x" * 32, BOUND)  # signs with another key
        try:
            with anyio.fail_after(BOUND):
                answered = await forwarder.ask(url, request)
                stranger = await forwarder.ask(url, {**request, "tenant": "mallory"})
                forged = await forger.ask(url, request)
                async with httpx2.AsyncClient() as web:
                    unsigned = await web.post(url + TASK_PATH, json={**request, "to": url})
                misdirected = await forwarder.ask(url + "/", request)  # signed for another replica URL
        finally:
            await forwarder.aclose()
            await forger.aclose()

    assert (answered.status, answered.body) == (200, b'{"status": "working"}')
    assert (stranger.status, forged.status, unsigned.status_code, misdirected.status) == (400, 401, 401, 400)
    assert asked == [{**request, "to": url, "from": "http://127.0.0.1:1", "n": 0}]  # only the signed, valid one
