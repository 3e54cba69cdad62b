"""`network` over MCP: granted by the deployment's egress settings, refused naming them, said by list_runners.

The host is this machine itself, by its own host name (resolved by the host's resolver; not
``localhost``, which inside the sandbox is the sandbox's own loopback and in ``NO_PROXY``): an
HTTP server the test starts on that name's address, allowed through ``egress_allow_private``
(that address only) and its port.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_test_helpers import CALL_BOUND, hello_server, memory_client, structured, text

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


NAME = socket.gethostname().lower()


@pytest.fixture(scope="module")
def web_port() -> Iterator[int]:
    with hello_server(socket.gethostbyname(NAME), b"hello over the proxy") as port:
        yield port


@pytest.fixture(scope="module")
async def client(module_state_dir: Path, sandbox_runtime: Path | None, web_port: int) -> AsyncIterator[Client]:
    if os.geteuid() != 0 and sandbox_runtime is None:
        pytest.skip("needs the built runtime")
    async with memory_client(
        module_state_dir,
        sandbox_runtime,
        read_timeout=None,
        egress_allow=NAME,
        egress_allow_private=f"{socket.gethostbyname(NAME)}/32",
        egress_ports=f"80,443,{web_port}",
    ) as client:
        yield client


async def test_network_true_reaches_an_allowed_host_and_the_description_says_so(client: Client, web_port: int) -> None:
    code = f"import urllib.request\nprint(urllib.request.urlopen('http://{NAME}:{web_port}/').read().decode())"
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()
        ran = await client.call_tool("run_python", {"code": code, "network": True})
        plain = await client.call_tool("run_python", {"code": code})
        runners = await client.call_tool("list_runners", {})
    description = next(tool.description for tool in listing.tools if tool.name == "run_python")
    assert description is not None and "network if granted" in description
    assert structured(ran)["status"] == "success", structured(ran)
    assert structured(ran)["stdout"] == "hello over the proxy\n"
    assert structured(plain)["status"] == "error"  # without network: no proxy, no route
    reaches = f"{NAME} on ports 80, 443, {web_port}"
    assert structured(runners)["network"] == {"available": True, "reaches": reaches, "secrets": []}
    assert "network" in text(runners)


async def test_patterns_not_allowed_are_refused_naming_the_setting(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        refused = await client.call_tool("run_code", {"code": "1", "language": "python", "network": ["example.com"]})
        malformed = await client.call_tool("run_python", {"code": "1", "network": ["exa mple.com"]})
    assert structured(refused)["status"] == "validation_error"
    assert structured(refused)["error"].startswith("network:") and "egress_allow" in structured(refused)["error"]
    assert structured(malformed)["status"] == "validation_error"
    assert structured(malformed)["error"].startswith("network:")


async def test_a_conversation_with_network_keeps_files_between_its_runs(client: Client, web_port: int) -> None:
    fetch = f"import urllib.request\nopen('got.txt', 'w').write(urllib.request.urlopen('http://{NAME}:{web_port}/').read().decode())"
    with anyio.fail_after(CALL_BOUND * 2):
        first = await client.call_tool("run_python", {"code": fetch, "network": True, "conversationId": "net-1"})
        second = await client.call_tool(
            "run_python", {"code": "print(open('got.txt').read())", "conversationId": "net-1"}
        )
    assert structured(first)["status"] == "success", structured(first)
    assert structured(second)["stdout"] == "hello over the proxy\n"


async def test_a_conversations_first_run_with_network_is_born_of_a_ready_sandbox_and_reaches_the_host(
    client: Client, web_port: int
) -> None:
    # Its interpreter runs `boot.py --ready=...`: the session was born of a session-ready sandbox.
    code = (
        "import urllib.request\n"
        "print(b'--ready=' in open('/proc/self/cmdline', 'rb').read())\n"
        f"print(urllib.request.urlopen('http://{NAME}:{web_port}/').read().decode())"
    )
    deadline = anyio.current_time() + 60  # the first conversation wakes the session-ready pool
    while True:
        with anyio.fail_after(CALL_BOUND):
            ran = structured(
                await client.call_tool(
                    "run_python", {"code": code, "network": True, "conversationId": "net-born", "reset": True}
                )
            )
        assert ran["status"] == "success", ran
        if ran["stdout"].startswith("True\n"):
            break
        assert anyio.current_time() < deadline, "no session with network was born of a session-ready sandbox"
        await anyio.sleep(0.2)
    assert (ran["session"], ran["stdout"]) == ("new", "True\nhello over the proxy\n")
    with anyio.fail_after(CALL_BOUND):
        plain = structured(await client.call_tool("run_python", {"code": code, "conversationId": "net-born"}))
    assert (plain["session"], plain["status"]) == ("kept", "error")  # the grant was that run's only
