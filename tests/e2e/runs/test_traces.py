"""Traces end to end: a server exports one connected trace, under the client's traceparent, to a real OTLP receiver.

`mcp-sandbox serve` runs over stdio as its own process (the tracer provider is process-wide),
with ``otel_endpoint`` at a receiver on loopback built on the collector's official service
definitions (tests/tracing/receiver.py). One code-mode run calls the fixture downstream server, reaches an HTTP
server through the egress proxy, writes a file and has a secret in its environment; the test
plants strings in the code, its output, the file, the response body and the secret, and greps
every exported span for them.
"""

from __future__ import annotations

import json
import secrets
import socket
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import anyio
import httpx2
import pytest
from mcp import Client
from mcp_types import RequestParamsMeta
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from downstream import servers_config, write_servers_config
from mcp_test_helpers import CALL_BOUND, hello_server, http_server, poll, stdio_client, structured
from tracing.receiver import Received, grpc_receiver, http_receiver

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

NAME = socket.gethostname().lower()
CODE_PLANT = "code-plant-5b1f0c"
OUTPUT_PLANT = "output-plant-77d2e9"  # printed, never written in the code whole
FILE_PLANT = "file-plant-c0ffee"
SECRET_PLANT = "secret-plant-9a8b7c6d"
BODY_PLANT = b"body-plant-4e4e4e"
MODERN = "2026-07-28"
TASKS = "io.modelcontextprotocol/tasks"
PLANTS = (CODE_PLANT, OUTPUT_PLANT, FILE_PLANT, SECRET_PLANT, BODY_PLANT.decode())


@pytest.fixture(scope="module")
def web_port() -> Iterator[int]:
    with hello_server(socket.gethostbyname(NAME), BODY_PLANT) as port:
        yield port


@pytest.fixture(scope="module")
def servers_file(module_state_dir: Path) -> Path:
    directory = module_state_dir.parent / "downstream"
    directory.mkdir(parents=True, exist_ok=True)
    config = servers_config(directory, git_repo=directory, include=["fixture"])
    return write_servers_config(directory / "servers.json", config)


def _environment(endpoint: str, protocol: str, web_port: int) -> dict[str, str]:
    return {
        "MCP_SANDBOX_OTEL_ENDPOINT": endpoint,
        "MCP_SANDBOX_OTEL_PROTOCOL": protocol,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms, not the default 5 s: the test waits for it
        "MCP_SANDBOX_DISCOVER_SERVERS": "false",
        "MCP_SANDBOX_EGRESS_ALLOW": NAME,
        "MCP_SANDBOX_EGRESS_ALLOW_PRIVATE": f"{socket.gethostbyname(NAME)}/32",
        "MCP_SANDBOX_EGRESS_PORTS": f"80,443,{web_port}",
    }


@pytest.fixture(scope="module")
async def traced(
    module_state_dir: Path, sandbox_runtime: Path | None, servers_file: Path, web_port: int
) -> AsyncIterator[tuple[Client, Received]]:
    with grpc_receiver() as (endpoint, received):
        env = _environment(endpoint, "grpc", web_port)
        async with stdio_client(
            module_state_dir, sandbox_runtime, "--servers-config", str(servers_file), environment=env
        ) as client:
            yield client, received


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _meta(traceparent: str) -> RequestParamsMeta:
    # mypy does not know PEP 728's extra_items: the trace context keys are extra ones.
    return cast(RequestParamsMeta, {"traceparent": traceparent})


def _in_trace(received: Received, trace_id: str) -> list[Span]:
    return [span for span in received.spans() if span.trace_id.hex() == trace_id]


def _attributes(span: Span) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for attribute in span.attributes:
        kind = attribute.value.WhichOneof("value")
        values[attribute.key] = getattr(attribute.value, kind) if kind is not None else None
    return values


def _run_started(span: Span) -> int:
    """When the code was handed to the sandbox: the one ``mcp_sandbox.run.start`` event of the span the run is told
    on, in it."""
    [started] = [event.time_unix_nano for event in span.events if event.name == "mcp_sandbox.run.start"]
    assert span.start_time_unix_nano <= started <= span.end_time_unix_nano
    return int(started)


async def _wait_for(received: Received, trace_id: str, names: set[str]) -> list[Span]:
    def arrived() -> bool:
        return names <= {span.name for span in _in_trace(received, trace_id)}

    with anyio.fail_after(CALL_BOUND):
        await poll(arrived)
    return _in_trace(received, trace_id)


CODE = """
# {code_plant}
import os, urllib.request
context = await mcp_fixture.trace_context()
print("downstream", context["traceparent"])
print(urllib.request.urlopen("http://{host}:{port}/").read().decode())
try:
    urllib.request.urlopen("http://refused.invalid:{port}/")
except OSError as refused:
    print("refused", refused)
open("planted.txt", "w").write("{file_plant}")
print("-".join(["output", "plant", "77d2e9"]), len(os.environ["API_KEY"]))
"""


async def test_a_code_mode_run_is_one_trace_under_the_clients_traceparent_with_no_planted_string(
    traced: tuple[Client, Received], web_port: int, module_state_dir: Path
) -> None:
    client, received = traced
    trace_id, client_span, traceparent = _traceparent()
    code = CODE.format(code_plant=CODE_PLANT, host=NAME, port=web_port, file_plant=FILE_PLANT)
    arguments = {
        "code": textwrap.dedent(code),
        "language": "python",
        "servers": ["fixture"],
        "network": True,
        "environment": {"API_KEY": SECRET_PLANT},
        "conversationId": "traced-1",
    }
    with anyio.fail_after(CALL_BOUND * 2):
        result = await client.call_tool("run_code", arguments, meta=_meta(traceparent))
    ran = structured(result)
    assert ran["status"] == "success", ran
    assert OUTPUT_PLANT in ran["stdout"] and BODY_PLANT.decode() in ran["stdout"]
    # The downstream server got the trace in its call's _meta, under this trace.
    downstream = next(line for line in ran["stdout"].splitlines() if line.startswith("downstream "))
    assert downstream.split()[1].split("-")[1] == trace_id

    expected = {
        "tools/call run_code",
        "code_mode tools/call",
        "MCP send tools/call trace_context",
        "egress connection",
    }
    spans = await _wait_for(received, trace_id, expected)
    by_id = {span.span_id.hex(): span for span in spans}
    root = next(span for span in spans if span.name == "tools/call run_code")
    assert root.parent_span_id.hex() == client_span  # continued from the client's traceparent
    for span in spans:  # connected: every span's chain of parents ends at the client's span
        seen = span
        while seen.parent_span_id.hex() != client_span:
            parent = seen.parent_span_id.hex()
            assert parent in by_id, f"{span.name}: its parent {parent} is not in the trace"
            seen = by_id[parent]
    named = {span.name: span for span in spans}
    # A run that found a slot free has no admission span; a run its call awaits is told on the call's span.
    assert {span.name for span in spans if span.name.startswith("mcp_sandbox.")} == set()
    placement = _attributes(root)
    assert (placement["gen_ai.tool.name"], placement["mcp_sandbox.language"]) == ("run_code", "python")
    assert placement["mcp_sandbox.placement"] in {"born", "fresh", "warm", "prestarted", "session"}
    assert (placement["mcp_sandbox.run.status"], placement["mcp_sandbox.run.done"]) == ("success", True)
    assert (placement["mcp_sandbox.run.exit_code"], placement["mcp_sandbox.network"]) == (0, True)
    assert _run_started(root) <= named["code_mode tools/call"].start_time_unix_nano
    assert named["code_mode tools/call"].parent_span_id == root.span_id
    call = _attributes(named["code_mode tools/call"])
    assert (call["gen_ai.tool.name"], call["mcp_sandbox.server"]) == ("trace_context", "fixture")
    # The downstream call's own span (the MCP SDK's) is the child of the code-mode call's.
    assert named["MCP send tools/call trace_context"].parent_span_id == named["code_mode tools/call"].span_id
    decisions = {
        (egress["server.address"], egress["server.port"]): egress["mcp_sandbox.egress.verdict"]
        for egress in (_attributes(span) for span in spans if span.name == "egress connection")
    }
    assert decisions == {(NAME, web_port): "allowed", ("refused.invalid", web_port): "refused"}

    wire = received.wire()
    assert [plant for plant in PLANTS if plant.encode() in wire] == []

    # The audit logs name the trace: the run's line and the egress connection's.
    logs = module_state_dir / "logs"
    audit = [json.loads(line) for line in (logs / "audit.jsonl").read_text().splitlines()]
    assert any(line.get("trace_id") == trace_id and line["event"] == "run" for line in audit), audit
    egress_lines = [json.loads(line) for line in (logs / "egress.log").read_text().splitlines()]
    assert any(line.get("trace_id") == trace_id for line in egress_lines), egress_lines


async def test_a_failed_run_names_its_trace_and_an_untraced_or_malformed_call_still_runs(
    traced: tuple[Client, Received],
) -> None:
    client, received = traced
    trace_id, _, traceparent = _traceparent()
    # Trace context values of the wrong type (the W3C propagators expect strings): the call starts a trace of its own.
    malformed = cast(RequestParamsMeta, {"traceparent": traceparent, "baggage": 3})
    with anyio.fail_after(CALL_BOUND):
        failed = await client.call_tool("run_python", {"code": "raise SystemExit(3)"}, meta=_meta(traceparent))
        plain = await client.call_tool("run_python", {"code": "print(2)"})
        odd = await client.call_tool("run_python", {"code": "print(4)"}, meta=malformed)
    assert structured(failed)["status"] == "error"
    assert structured(failed)["traceId"] == trace_id
    assert structured(plain)["status"] == "success" and "traceId" not in structured(plain)
    assert structured(odd)["status"] == "success" and structured(odd)["stdout"] == "4\n"
    [root] = await _wait_for(received, trace_id, {"tools/call run_python"})
    run = _attributes(root)
    assert (run["mcp_sandbox.run.status"], run["mcp_sandbox.run.exit_code"]) == ("error", 3)
    assert run["error.type"] == "tool_error" and root.status.code == root.status.STATUS_CODE_ERROR
    _run_started(root)


async def test_a_plain_json_rpc_callers_traceparent_header_is_continued_and_a_tasks_run_has_a_span_of_its_own(
    state_dir: Path, sandbox_runtime: Path | None, web_port: int
) -> None:
    trace_id, client_span, traceparent = _traceparent()
    arguments = {"code": "print(1)"}
    call: dict[str, Any] = {"jsonrpc": "2.0", "id": 7, "method": "tools/call"}
    call["params"] = {"name": "run_python", "arguments": arguments}
    headers = {"traceparent": traceparent, "content-type": "application/json", "accept": "application/json"}
    # A client that declared the tasks extension: its run is a task's, which may outlive the call.
    task_trace, task_parent, task_traceparent = _traceparent()
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
        "traceparent": task_traceparent,
    }
    as_task = {**call, "id": 8, "params": {**call["params"], "_meta": meta}}
    modern = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "run_python",
    }
    with http_receiver() as (endpoint, received):
        # A task_after no run here reaches: the call is answered with its result, not a task.
        env = {**_environment(endpoint, "http/protobuf", web_port), "MCP_SANDBOX_TASK_AFTER": "120s"}
        async with http_server(state_dir, env=env, runtime=sandbox_runtime) as base, httpx2.AsyncClient() as web:
            with anyio.fail_after(CALL_BOUND):
                reply = await web.post(f"{base}/mcp", json=call, headers=headers, timeout=CALL_BOUND)
                assert reply.status_code == 200, reply.text
                assert reply.json()["result"]["structuredContent"]["stdout"] == "1\n"
                tasked = await web.post(f"{base}/mcp", json=as_task, headers=modern, timeout=CALL_BOUND)
                assert tasked.status_code == 200, tasked.text
                assert tasked.json()["result"]["structuredContent"]["stdout"] == "1\n"
                [root] = await _wait_for(received, trace_id, {"tools/call run_python"})
                task_spans = await _wait_for(received, task_trace, {"tools/call run_python", "mcp_sandbox.placement"})
    assert root.parent_span_id.hex() == client_span
    assert _attributes(root)["mcp_sandbox.placement"] in {"warm", "prestarted", "fresh"}
    _run_started(root)
    named = {span.name: span for span in task_spans}
    assert len(task_spans) == 2 and named["tools/call run_python"].parent_span_id.hex() == task_parent
    placed = named["mcp_sandbox.placement"]
    assert placed.parent_span_id == named["tools/call run_python"].span_id
    assert _attributes(placed)["mcp_sandbox.run.status"] == "success"
    assert "mcp_sandbox.placement" not in _attributes(named["tools/call run_python"])
    _run_started(placed)
