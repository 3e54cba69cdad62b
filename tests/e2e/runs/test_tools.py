"""The MCP tools end to end, on every transport: the SDK's in-memory pairing, a real stdio server and a
real Streamable HTTP server (loopback, bearer token).

The cases whose answer is the server's are shared with tests/server/tools/ (tests/tool_cases.py),
which runs them in memory on the backend test double in `make check`; the ones here alone need a
real sandbox: a timeout's kill, the packaged runtime's pandas and matplotlib, a cancelled call's
process tree, the /workspace and /data mounts.
"""

from __future__ import annotations

import contextlib
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import tool_cases as cases
from mcp_test_helpers import (
    CALL_BOUND,
    host_processes,
    http_client,
    http_server,
    memory_client,
    poll,
    run_python,
    stdio_client,
    structured,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

# Generous bounds: the machines are small and may be busy; every wait below is bounded by one.


@contextlib.asynccontextmanager
async def _stdio_client(state_dir: Path, runtime: Path | None) -> AsyncIterator[Client]:
    async with stdio_client(state_dir, runtime) as client:
        yield client


TOKEN = "tools-e2e-token-0123456789abcdef"


@contextlib.asynccontextmanager
async def _http_client(state_dir: Path, runtime: Path | None) -> AsyncIterator[Client]:
    async with (
        http_server(state_dir, env={"MCP_SANDBOX_TOKEN": TOKEN}, runtime=runtime) as base_url,
        http_client(base_url, TOKEN) as client,
    ):
        yield client


# Every test runs once per transport, as the MCP Python SDK's own interaction tests do: in memory,
# a real `serve` over stdio, and a real `serve --transport http` (one server per module for each).
TRANSPORTS: dict[str, Callable[[Path, Path | None], contextlib.AbstractAsyncContextManager[Client]]] = {
    "http": _http_client,
    "memory": memory_client,
    "stdio": _stdio_client,
}


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def transport(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
async def client(transport: str, module_state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    async with TRANSPORTS[transport](module_state_dir, sandbox_runtime) as client:
        yield client


@pytest.mark.anyio
async def test_tools_list_shows_run_python_with_an_output_schema_and_code_required(client: Client) -> None:
    await cases.tools_list_shows_run_python_with_an_output_schema_and_code_required(client)


@pytest.mark.anyio
async def test_the_whole_tools_list_answer_is_under_1000_tokens(client: Client) -> None:
    await cases.the_whole_tools_list_answer_is_under_1000_tokens(client)


@pytest.mark.anyio
async def test_the_run_tools_link_their_mcp_apps_view_in_a_small_meta(client: Client) -> None:
    await cases.the_run_tools_link_their_mcp_apps_view_in_a_small_meta(client)


@pytest.mark.anyio
@pytest.mark.parametrize(("code", "status", "exit_code", "stdout"), cases.EXECUTIONS, ids=cases.EXECUTION_IDS)
async def test_code_runs_with_the_expected_status_exit_code_and_stdout(
    client: Client, code: str, status: str, exit_code: int, stdout: str
) -> None:
    await cases.code_runs_with_the_expected_status_exit_code_and_stdout(client, code, status, exit_code, stdout)


@pytest.mark.anyio
async def test_success_renders_just_the_stdout(client: Client) -> None:
    await cases.success_renders_just_the_stdout(client)


@pytest.mark.anyio
async def test_an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client: Client) -> None:
    await cases.an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client)


@pytest.mark.anyio
async def test_code_running_past_its_timeout_is_stopped_with_status_timeout(client: Client) -> None:
    result = await run_python(client, {"code": "while True:\n    pass", "timeout": 0.5}, bound=15)

    data = structured(result)
    assert result.is_error is True
    assert data["status"] == "timeout"
    assert data["durationMs"] >= 500


@pytest.mark.anyio
async def test_huge_output_is_truncated_and_says_so(client: Client) -> None:
    await cases.huge_output_is_truncated_and_says_so(client)


@pytest.mark.anyio
async def test_a_huge_output_is_sent_once_in_full_not_again_in_the_text(client: Client) -> None:
    await cases.a_huge_output_is_sent_once_in_full_not_again_in_the_text(client)


@pytest.mark.anyio
async def test_pandas_groupby_runs_in_the_sandbox(client: Client, packaged_runtime: Path) -> None:
    code = textwrap.dedent(
        """
        import numpy as np
        import pandas as pd
        frame = pd.DataFrame({"k": ["a", "b", "a", "b"], "v": np.arange(4)})
        print(frame.groupby("k")["v"].sum().to_dict())
        """
    )
    result = await run_python(client, {"code": code})

    data = structured(result)
    assert data["status"] == "success", data
    assert data["stdout"] == "{'a': 2, 'b': 4}\n"


@pytest.mark.anyio
async def test_matplotlib_with_agg_saves_a_png_into_the_workspace(client: Client, packaged_runtime: Path) -> None:
    code = textwrap.dedent(
        """
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [1, 4, 9])
        plt.savefig("/workspace/plot.png")
        with open("/workspace/plot.png", "rb") as image:
            print(image.read(8) == b"\\x89PNG\\r\\n\\x1a\\n")
        """
    )
    result = await run_python(client, {"code": code})

    data = structured(result)
    assert data["status"] == "success", data
    assert data["stdout"] == "True\n"


@pytest.mark.anyio
async def test_plotting_with_matplotlib_writes_nothing_to_stderr(client: Client, packaged_runtime: Path) -> None:
    code = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\nplt.plot([1, 2])\n"
    code += "plt.savefig('/workspace/plot.png')\n"
    result = await run_python(client, {"code": code})

    assert structured(result)["stderr"] == ""


async def test_images_past_the_cap_are_dropped_and_the_result_says_how_many(client: Client) -> None:
    await cases.images_past_the_cap_are_dropped_and_the_result_says_how_many(client)


@pytest.mark.anyio
@pytest.mark.parametrize(("arguments", "argument"), cases.VALIDATION_CASES, ids=cases.VALIDATION_IDS)
async def test_a_bad_argument_is_a_validation_error_naming_it(
    client: Client, arguments: dict[str, Any] | None, argument: str
) -> None:
    await cases.a_bad_argument_is_a_validation_error_naming_it(client, arguments, argument)


@pytest.mark.anyio
async def test_output_mode_json_renders_the_structured_content_as_json(client: Client) -> None:
    await cases.output_mode_json_renders_the_structured_content_as_json(client)


@pytest.mark.anyio
async def test_output_mode_toon_renders_the_result_as_toon(client: Client) -> None:
    await cases.output_mode_toon_renders_the_result_as_toon(client)


@pytest.mark.anyio
async def test_a_validation_error_is_rendered_in_the_requested_output_mode(client: Client) -> None:
    await cases.a_validation_error_is_rendered_in_the_requested_output_mode(client)


@pytest.mark.anyio
@pytest.mark.slow
async def test_cancelling_a_call_kills_the_sandbox_and_the_server_keeps_serving(
    transport: str, state_dir: Path, sandbox_runtime: Path | None
) -> None:
    marker = f"mcp-sandbox-test-{uuid.uuid4().hex}"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
        time.sleep(1000)
        """
    )

    async with TRANSPORTS[transport](state_dir, sandbox_runtime) as client:

        async def call_until_cancelled() -> None:
            result = await client.call_tool("run_python", {"code": code, "timeout": 100})
            raise AssertionError(f"the call ended instead of being cancelled: {result.structured_content}")

        async with anyio.create_task_group() as group:
            group.start_soon(call_until_cancelled)
            with anyio.fail_after(CALL_BOUND):
                await poll(lambda: bool(host_processes(marker)))
            group.cancel_scope.cancel()

        with anyio.fail_after(10):
            await poll(lambda: not host_processes(marker))

        result = await run_python(client, {"code": "print('still serving')"})
        assert structured(result)["stdout"] == "still serving\n"


@pytest.mark.anyio
async def test_calling_a_tool_that_is_not_listed_is_a_protocol_error(client: Client) -> None:
    await cases.calling_a_tool_that_is_not_listed_is_a_protocol_error(client)


@pytest.mark.anyio
async def test_output_that_is_not_utf8_is_decoded_with_replacement_characters(client: Client) -> None:
    await cases.output_that_is_not_utf8_is_decoded_with_replacement_characters(client)


# --- run_code, upload_file, list_runners, conversations ----------------------------------------


@pytest.mark.parametrize(("arguments", "argument"), cases.RUN_CODE_CASES)
async def test_run_code_refuses_bad_arguments_and_network_naming_the_argument(
    client: Client, arguments: dict[str, Any], argument: str
) -> None:
    await cases.run_code_refuses_bad_arguments_and_network_naming_the_argument(client, arguments, argument)


async def test_null_optional_arguments_mean_not_given_and_an_unknown_one_is_refused(client: Client) -> None:
    await cases.null_optional_arguments_mean_not_given_and_an_unknown_one_is_refused(client)


async def test_run_code_passes_the_environment_to_this_run_only(client: Client) -> None:
    await cases.run_code_passes_the_environment_to_this_run_only(client)


async def test_a_conversation_keeps_files_and_variables_and_lists_files_with_download_urls_only_over_http(
    client: Client, transport: str
) -> None:
    await cases.a_conversation_keeps_files_and_variables_and_lists_files_with_download_urls_only_over_http(
        client, over_http=transport == "http"
    )


async def test_upload_file_stores_bytes_the_next_run_reads_and_refuses_bad_input(
    client: Client, transport: str
) -> None:
    await cases.upload_file_stores_bytes_the_next_run_reads_and_refuses_bad_input(client, over_http=transport == "http")


async def test_list_runners_reports_python_with_its_version_and_packages(client: Client) -> None:
    await cases.list_runners_reports_python_with_its_version_and_packages(client)
