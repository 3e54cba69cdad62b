"""The server end to end on the container backends: the CLI's `run` and `doctor`, and the MCP
tools over a real stdio server, on podman and docker for real (see tests/container_helpers.py)."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import anyio
import pytest

from container_helpers import backend_flags
from mcp_test_helpers import CALL_BOUND, cli_environment, mcp_sandbox_cli, run_python, stdio_client, structured

from .test_runtime_packages import TYPESCRIPT

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture(params=["podman", "docker"])
def container_backend(request: pytest.FixtureRequest, docker_engine: str | None) -> str:
    """A container backend that works here, else skipped (failed when MCP_SANDBOX_TEST_REQUIRE names it)."""
    name: str = request.param
    runtime = backend_flags(name).get("container_runtime")
    reason = docker_engine if name == "docker" else None
    if runtime is None or reason is not None:
        why = reason or f"no {name} here"
        if name in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(f"{name} is required (MCP_SANDBOX_TEST_REQUIRE) but unavailable: {why}")
        pytest.skip(why)
    return name


_SAVE = "import * as fs from 'node:fs';\nfs.writeFileSync('/workspace/out.txt', 'x');\nconsole.log('saved');"


def _backend_env(backend: str) -> dict[str, str]:
    return {
        "MCP_SANDBOX_BACKEND": backend,
        "MCP_SANDBOX_CONTAINER_RUNTIME": str(backend_flags(backend)["container_runtime"]),
        "MCP_SANDBOX_DISCOVER_SERVERS": "false",
    }


def test_run_prints_the_output_from_a_container(
    container_backend: str, state_dir: Path, packaged_runtime: Path
) -> None:
    done = mcp_sandbox_cli(
        "run", "-c", "import pandas; print(pandas.DataFrame({'a': [1, 2]}).a.sum())",
        state_dir=state_dir, runtime=packaged_runtime, env=_backend_env(container_backend),
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert done.stdout == "3\n"


def test_doctor_reports_the_container_backend_and_what_it_enforces(
    container_backend: str, state_dir: Path, packaged_runtime: Path
) -> None:
    done = mcp_sandbox_cli("doctor", state_dir=state_dir, runtime=packaged_runtime, env=_backend_env(container_backend))

    assert done.returncode == 0, done.stdout + done.stderr
    assert f"backend {container_backend}: available" in done.stdout
    for capability in ("seccomp", "memory limit", "pids limit", "unprivileged uid"):
        assert capability in done.stdout
    assert "WEAK" not in done.stdout.split(f"backend {container_backend}:")[1].split("\nbackend ")[0]
    javascript = done.stdout.split("\njavascript runtime:")[1].split("\n\n")[0]
    assert "ok: ran TypeScript in a sandbox" in javascript, done.stdout  # on this backend, for real


async def test_the_earlier_runners_typescript_runs_over_mcp_in_a_container(
    container_backend: str, state_dir: Path, packaged_runtime: Path
) -> None:
    # Its TypeScript runner ran in Docker: the same code, its libraries and a file, on our containers.
    environment = cli_environment(packaged_runtime, _backend_env(container_backend))
    async with stdio_client(state_dir, packaged_runtime, environment=environment) as client:
        with anyio.fail_after(CALL_BOUND):
            ran = await client.call_tool("run_code", {"code": TYPESCRIPT, "language": "typescript"})
            arguments = {"code": _SAVE, "language": "javascript", "conversationId": "ts"}
            saved = await client.call_tool("run_code", arguments)

    result = structured(ran)
    assert result["status"] == "success", result
    assert result["stdout"].splitlines() == [
        '[{"name":"Alice","age":"30"}]',
        '[{"x":"3","y":"4"}]',
        "function function function",
    ]
    kept = structured(saved)
    assert (kept["status"], kept["stdout"]) == ("success", "saved\n"), kept
    assert [f["name"] for f in kept["files"]] == ["out.txt"]


async def test_a_conversation_keeps_its_state_and_files_in_a_warm_container(
    container_backend: str, state_dir: Path, packaged_runtime: Path
) -> None:
    environment = cli_environment(packaged_runtime, _backend_env(container_backend))
    async with stdio_client(state_dir, packaged_runtime, environment=environment) as client:
        upload = await client.call_tool(
            "upload_file",
            {"conversationId": "c1", "filename": "in.txt", "content": base64.b64encode(b"41").decode()},
        )
        assert not upload.is_error
        first = await run_python(client, {"code": "n = int(open('/workspace/in.txt').read())", "conversationId": "c1"})
        second = await run_python(
            client, {"code": "open('/data/out.txt', 'w').write(str(n + 1))\nprint(n + 1)", "conversationId": "c1"}
        )

    assert structured(first)["status"] == "success"
    result = structured(second)
    assert (result["status"], result["stdout"], result.get("session")) == ("success", "42\n", "kept")
    assert [f["name"] for f in result["files"]] == ["in.txt", "out.txt"]
