"""Secrets end to end: tenants of a real ``serve --transport http`` over Streamable HTTP, the test host behind.

A secret of alice's goes to the test host (by its address: the server resolves names by DNS, in
which the test names are not). Alice's ``run_python`` with ``network: true`` reaches it with the
real value in the header while seeing only a placeholder; ``list_runners`` names the secret
only; a fork of alice's conversation gets a placeholder of its own; bob's run to the same host,
even with alice's placeholder, carries no value; after a restart the proxy's CA is a new one,
and a client trusting only the old one is refused. Nothing the server says (its log, the audit
log, ``/metrics``) holds the value.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from mcp_test_helpers import auth_tokens, bearer_web, http_client, http_server, new_conversation, run_over_http

from .conftest import HostNet
from .test_secrets import REAL, hashed

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.anyio]

ALICE = "alice-token-secrets-0123456789ab"
BOB = "bob-token-secrets-0123456789abcd"
METRICS = "metrics-token-secrets-0123456789"

GET = """
import json, os, shutil, ssl, urllib.request
def get(url, headers={}, context=None):
    try:
        request = urllib.request.Request(url, headers=headers)
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.read().decode()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
"""


def config(test_net: HostNet, directory: Path) -> Path:
    ca = directory / "upstream-ca.pem"
    ca.write_text(test_net.ca)
    path = directory / "secrets.toml"
    path.write_text(
        textwrap.dedent(f"""
        pool_size = 1
        pool_preload = []
        metrics_token = "{METRICS}"
        egress_allow = ["{test_net.address}"]
        egress_allow_private = ["{test_net.address}/32"]
        egress_upstream_ca = "{ca}"

        [[secrets]]
        name = "api"
        tenant = "alice"
        value_from = "env:E2E_API_VALUE"
        hosts = ["{test_net.address}"]
        placeholder_env = "API_KEY"
        """)
        + auth_tokens({"alice": ALICE, "bob": BOB})
    )
    return path


async def run(base: str, token: str, code: str, **arguments: Any) -> dict[str, Any]:
    data = await run_over_http(base, token, GET + textwrap.dedent(code), network=True, **arguments)
    assert data["status"] == "success", data
    return json.loads(data["stdout"])  # type: ignore[no-any-return]


async def test_a_tenants_secret_reaches_its_host_over_mcp_and_a_restart_makes_a_new_ca(
    test_net: HostNet, state_dir: Path, sandbox_runtime: Path | None, tmp_path: Path
) -> None:
    url, conversation = f"https://{test_net.address}/auth", new_conversation()
    flags, env, logs = ("--config", str(config(test_net, tmp_path))), {"E2E_API_VALUE": REAL}, tmp_path / "logs"
    logs.mkdir()
    async with http_server(state_dir, *flags, env=env, runtime=sandbox_runtime, log_path=logs / "1") as base:
        async with http_client(base, ALICE) as client:
            listed = (await client.call_tool("list_runners", {})).structured_content
        async with http_client(base, BOB) as client:
            bobs_list = (await client.call_tool("list_runners", {})).structured_content
        first = await run(
            base,
            ALICE,
            f"""
            shutil.copy(os.environ["NODE_EXTRA_CA_CERTS"], "old-ca.pem")
            kept = os.environ["API_KEY"]
            print(json.dumps({{"key": kept, "auth": get("{url}")}}))
            """,
            conversationId=conversation,
        )
        fork = await run(
            base,
            ALICE,
            f"""print(json.dumps({{"key": os.environ["API_KEY"], "kept": kept, "auth": get("{url}")}}))""",
            conversationId=new_conversation(),
            forkFrom=conversation,
        )
        stolen = await run(
            base,
            BOB,
            f"""
            context = ssl.create_default_context(cadata={test_net.ca!r})
            stolen = {{"Authorization": "Bearer {first["key"]}"}}
            print(json.dumps({{"key": os.environ.get("API_KEY"), "auth": get("{url}", stolen, context)}}))
            """,
        )
        async with bearer_web(METRICS) as web:
            metrics = (await web.get(f"{base}/metrics")).text
    assert listed is not None and listed["network"]["secrets"] == ["api"] and REAL not in json.dumps(listed)
    assert bobs_list is not None and bobs_list["network"]["secrets"] == []
    assert first["key"].startswith("mcpsbx-secret-api-") and first["auth"] == hashed(f"Bearer {REAL}")
    assert fork["kept"] == first["key"] != fork["key"]  # its variables are the source's; its placeholder its own
    assert fork["key"].startswith("mcpsbx-secret-api-") and fork["auth"] == hashed(f"Bearer {REAL}")
    assert stolen["key"] is None and stolen["auth"] == hashed(f"Bearer {first['key']}")  # no value put in
    async with http_server(state_dir, *flags, env=env, runtime=sandbox_runtime, log_path=logs / "2") as base:
        after = await run(
            base,
            ALICE,
            f"""
            old = ssl.create_default_context(cafile="old-ca.pem")
            same = open("old-ca.pem").read() == open(os.environ["NODE_EXTRA_CA_CERTS"]).read()
            print(json.dumps({{"old": get("{url}", context=old), "new": get("{url}"), "same": same}}))
            """,
            conversationId=conversation,
        )
    assert after["same"] is False and "CERTIFICATE_VERIFY_FAILED" in after["old"], after
    assert after["new"] == hashed(f"Bearer {REAL}")
    audit = (state_dir / "logs" / "egress.log").read_text()
    lines = [json.loads(line) for line in audit.splitlines()]
    assert {(line["tenant"], tuple(line.get("secrets", ()))) for line in lines} == {("alice", ("api",)), ("bob", ())}
    for said in (metrics, audit, (logs / "1").read_text(), (logs / "2").read_text()):
        assert REAL not in said
