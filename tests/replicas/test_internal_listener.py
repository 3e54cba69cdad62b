"""The replicas' internal listener (``internal_port``), over mutual TLS, for real: server processes on loopback.

Forwarded calls travel between the replicas' internal ports, each replica listening with its own
certificate and presenting it when it calls another; the public port answers 404 for
``/internal/``. The attacks: a validly signed call sent to the public port, and to the internal
port by a client without a certificate, with one another CA signed, or without TLS; none runs.
"""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp.types import CallToolResult

from mcp_sandbox.replicas.forward import CALL_PATH
from mcp_sandbox.replicas.running import FORWARD_KEY
from mcp_sandbox.replicas.signing import sign
from mcp_sandbox.workspace import derive_key
from mcp_test_helpers import free_port, mcp_sandbox_cli, new_conversation
from postgres_helpers import Cluster
from replica_helpers import InternalHop, Replica, call, lease_rows, replicas_apart, shared_secret
from tls_helpers import certificates

pytestmark = [pytest.mark.e2e, pytest.mark.anyio, pytest.mark.slow]


async def run(replica: Replica, conversation: str, code: str) -> dict[str, Any]:
    result: CallToolResult = await call(replica, "run_python", {"code": code, "conversationId": conversation})
    assert result.structured_content is not None, result
    structured: dict[str, Any] = result.structured_content
    return structured


def _client_tls(ca: Path, identity: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if identity is not None:
        context.load_cert_chain(*identity)
    return context


async def test_replicas_forward_over_mutual_tls_on_their_internal_ports_and_nothing_else_reaches_the_route(
    postgres: Cluster, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    ca, identities = certificates(tmp_path / "replicas", "replicas-test-ca", 2)
    _, [stranger] = certificates(tmp_path / "other", "another-ca")
    url = postgres.create_database()
    async with replicas_apart(2, url, sandbox_runtime, InternalHop(ca, identities)) as (owner, other):
        conversation = new_conversation()
        assert (await run(owner, conversation, "x = 41"))["stdout"] == ""
        forwarded = await run(other, conversation, "x += 1\nprint(x)")

        assert (forwarded["stdout"], forwarded["session"]) == ("42\n", "kept"), forwarded
        assert owner.replica_url.startswith("https://") and owner.replica_url != owner.url
        assert {row[1] for row in lease_rows(url)} == {owner.replica_url}

        marker = "print(open('/workspace/ran.txt', 'a').write('x'))"
        arguments = {"code": marker, "conversationId": conversation}
        body = {"to": owner.replica_url, "from": other.replica_url, "tool": "run_python"}
        content = json.dumps({**body, "tenant": "default", "arguments": arguments}).encode()
        key = derive_key(shared_secret(url), FORWARD_KEY)

        def signed() -> dict[str, str]:
            return {"content-type": "application/json", **sign(key, content, time.time())}

        async with httpx2.AsyncClient(timeout=30) as web:
            public = await web.post(owner.url + CALL_PATH, content=content, headers=signed())
            elsewhere = await web.get(owner.url + "/internal/anything")
            with pytest.raises(httpx2.TransportError):  # the internal port speaks only TLS
                await web.post(
                    owner.replica_url.replace("https", "http") + CALL_PATH, content=content, headers=signed()
                )
        assert (public.status_code, elsewhere.status_code) == (404, 404)

        for identity in (None, stranger):  # no certificate, or one the replicas' CA did not sign
            async with httpx2.AsyncClient(timeout=30, verify=_client_tls(ca, identity)) as web:
                with pytest.raises(httpx2.TransportError):
                    await web.post(owner.replica_url + CALL_PATH, content=content, headers=signed())

        checked = await run(other, conversation, "import os\nprint(os.path.exists('/workspace/ran.txt'), x)")
        assert checked["stdout"] == "False 42\n", checked  # none of them ran

        # The same call with a replica's certificate gets through the TLS, and still needs its signature.
        async with httpx2.AsyncClient(timeout=60, verify=_client_tls(ca, identities[1])) as web:
            unsigned = await web.post(owner.replica_url + CALL_PATH, content=content)
            accepted = await web.post(owner.replica_url + CALL_PATH, content=content, headers=signed())
        assert unsigned.status_code == 401
        assert accepted.status_code == 200, accepted.text
        assert "without internal_port" not in owner.output()


def test_a_certificate_that_cannot_be_loaded_stops_the_start_naming_the_settings(
    state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    (tmp_path / "cert.pem").write_text("not a certificate")
    env = {
        "MCP_SANDBOX_TOKEN": "internal-token-0123456789abcdef",
        "MCP_SANDBOX_DATABASE_URL": "postgresql://app@127.0.0.1:1/app",
        "MCP_SANDBOX_REPLICA_URL": "https://127.0.0.1:1",
        "MCP_SANDBOX_INTERNAL_PORT": str(free_port()),
        "MCP_SANDBOX_INTERNAL_CERT": str(tmp_path / "cert.pem"),
        "MCP_SANDBOX_INTERNAL_KEY": str(tmp_path / "cert.pem"),
    }

    done = mcp_sandbox_cli("serve", "--transport", "http", "--port", str(free_port()), state_dir=state_dir,
                           runtime=sandbox_runtime, env=env)  # fmt: skip

    assert done.returncode == 2, done
    assert "internal_cert" in done.stderr, done.stderr


def test_doctor_warns_when_replicas_have_no_internal_port(state_dir: Path, sandbox_runtime: Path | None) -> None:
    env = {
        "MCP_SANDBOX_DATABASE_URL": "postgresql://app@127.0.0.1:1/app",
        "MCP_SANDBOX_REPLICA_URL": "http://10.0.0.11:8765",
    }

    done = mcp_sandbox_cli("doctor", state_dir=state_dir, runtime=sandbox_runtime, env=env)

    assert "replica: reached by the others at http://10.0.0.11:8765\n  WARNING: no internal_port" in done.stdout
