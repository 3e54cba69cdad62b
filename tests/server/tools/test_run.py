"""``run_python`` and ``run_code`` in memory on the backend test double: what the server makes of a call.

Most cases are tests/tool_cases.py's, which tests/e2e/runs/test_tools.py runs on real sandboxes
over every transport (tests/server/test_tool_results.py has a few more: the text of a success,
truncation, JSON); here they run in `make check`, with a cancelled call, a reset, a clamped
timeout, the earlier bridge's TOON block, each run's history row and a session kept, parked and
resumed (a graceful stop, the session cap). Left to the e2e modules: a timeout's kill of a busy
loop, pandas and matplotlib (the packaged runtime), a cancelled call's sandbox (the double kills
the runner's session, not a namespace or a container), the sandbox's /workspace and /data
mounts (the double runs in the workspace directory itself), and parking at idle (a wait).
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

import tool_cases as cases
from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import load_secret
from mcp_test_helpers import CALL_BOUND, memory_client, own_processes, poll, run_python, structured, text
from postgres_helpers import MetadataTarget
from settings_helpers import store_of

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("code", "status", "exit_code", "stdout"), cases.EXECUTIONS, ids=cases.EXECUTION_IDS)
async def test_code_runs_with_the_expected_status_exit_code_and_stdout(
    client: Client, code: str, status: str, exit_code: int, stdout: str
) -> None:
    await cases.code_runs_with_the_expected_status_exit_code_and_stdout(client, code, status, exit_code, stdout)


async def test_an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client: Client) -> None:
    await cases.an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client)


async def test_a_huge_output_is_sent_once_in_full_not_again_in_the_text(client: Client) -> None:
    await cases.a_huge_output_is_sent_once_in_full_not_again_in_the_text(client)


async def test_images_past_the_cap_are_dropped_and_the_result_says_how_many(client: Client) -> None:
    await cases.images_past_the_cap_are_dropped_and_the_result_says_how_many(client)


async def test_output_that_is_not_utf8_is_decoded_with_replacement_characters(client: Client) -> None:
    await cases.output_that_is_not_utf8_is_decoded_with_replacement_characters(client)


@pytest.mark.parametrize(("arguments", "argument"), cases.VALIDATION_CASES, ids=cases.VALIDATION_IDS)
async def test_a_bad_argument_is_a_validation_error_naming_it(
    client: Client, arguments: dict[str, Any] | None, argument: str
) -> None:
    await cases.a_bad_argument_is_a_validation_error_naming_it(client, arguments, argument)


@pytest.mark.parametrize(("arguments", "argument"), cases.RUN_CODE_CASES)
async def test_run_code_refuses_bad_arguments_and_network_naming_the_argument(
    client: Client, arguments: dict[str, Any], argument: str
) -> None:
    await cases.run_code_refuses_bad_arguments_and_network_naming_the_argument(client, arguments, argument)


async def test_null_optional_arguments_mean_not_given_and_an_unknown_one_is_refused(client: Client) -> None:
    await cases.null_optional_arguments_mean_not_given_and_an_unknown_one_is_refused(client)


async def test_run_code_passes_the_environment_to_this_run_only(client: Client) -> None:
    await cases.run_code_passes_the_environment_to_this_run_only(client)


async def test_output_mode_toon_renders_the_result_as_toon(client: Client) -> None:
    await cases.output_mode_toon_renders_the_result_as_toon(client)


async def test_a_validation_error_is_rendered_in_the_requested_output_mode(client: Client) -> None:
    await cases.a_validation_error_is_rendered_in_the_requested_output_mode(client)


async def test_a_conversation_keeps_files_and_variables_and_lists_its_files_without_urls(client: Client) -> None:
    await cases.a_conversation_keeps_files_and_variables_and_lists_files_with_download_urls_only_over_http(
        client, over_http=False, written="out.txt", read="out.txt"
    )


async def test_a_timeout_above_the_maximum_is_clamped_and_said(client: Client) -> None:
    result = await run_python(client, {"code": "print('ran')", "timeout": 100000})

    data = structured(result)
    assert data["status"] == "success", data
    assert data["timeoutClamped"] == {"requested": 100000, "used": 120}
    assert "timeout 100000 s is above this server's maximum: the run had 120 s" in text(result)


async def test_a_reset_starts_the_conversation_afresh(client: Client) -> None:
    await run_python(client, {"code": "x = 1", "conversationId": "reset-me"})
    result = await run_python(client, {"code": "print('x' in globals())", "conversationId": "reset-me", "reset": True})

    assert structured(result)["stdout"] == "False\n"


async def test_a_cancelled_call_ends_its_runs_processes_and_the_server_keeps_serving(client: Client) -> None:
    marker = f"mcp-sandbox-test-{uuid.uuid4().hex}"
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", {marker!r}])
        time.sleep(1000)
        """
    )

    async def call_until_cancelled() -> None:
        result = await client.call_tool("run_python", {"code": code, "timeout": 100})
        raise AssertionError(f"the call ended instead of being cancelled: {result.structured_content}")

    with anyio.fail_after(CALL_BOUND):
        async with anyio.create_task_group() as group:
            group.start_soon(call_until_cancelled)
            await poll(lambda: bool(own_processes(marker)))
            group.cancel_scope.cancel()
        await poll(lambda: not own_processes(marker))

    assert structured(await run_python(client, {"code": "print('still serving')"}))["stdout"] == "still serving\n"


async def test_toon_output_is_the_earlier_bridges_fenced_block_with_a_summary_and_lines(client: Client) -> None:
    await cases.toon_output_is_the_earlier_bridges_fenced_block_with_a_summary_and_lines(client)


async def test_each_run_is_in_the_history_once_with_its_conversation_status_and_exit_code(state_dir: Path) -> None:
    backend = PlainProcessBackend()
    async with memory_client(state_dir, Path(sys.prefix), backend=backend, prestart_size=0) as own:
        await run_python(own, {"code": "print(1)", "conversationId": "recorded"})
        await run_python(own, {"code": "import sys\nsys.exit(3)"})
        with anyio.fail_after(CALL_BOUND):
            await own.call_tool("run_code", {"code": "1", "language": "python", "timeout": -1})
    # Closed as soon as the last call was answered: its row is written before the service closes.

    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    metadata = StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).metadata
    rows = MetadataTarget("sqlite", metadata).query(
        "SELECT tenant, conversation, language, status, exit_code FROM executions ORDER BY started_at"
    )
    key = store_of(settings, load_secret(state_dir)).key("default", "recorded")  # the column holds the key
    assert rows == [
        ("default", key, "python", "success", 0),
        ("default", None, "python", "error", 3),
        ("default", None, "python", "validation_error", None),
    ]


# --- a conversation's session: kept, parked, resumed ----------------------------------------------


def _parked(state_dir: Path) -> list[Path]:
    parked = state_dir / "parked"
    return sorted(parked.glob("*.state")) if parked.is_dir() else []


def _state(state_dir: Path, conversation: str) -> Path:
    """Where the server parks the default tenant's ``conversation``."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    key = store_of(settings, load_secret(state_dir)).key("default", conversation)
    return StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(key)


async def _in(client: Client, code: str, conversation: str, **arguments: Any) -> dict[str, Any]:
    return structured(await run_python(client, {"code": code, "conversationId": conversation, **arguments}))


async def test_a_graceful_stop_parks_the_session_and_the_next_server_resumes_it_or_a_reset_drops_it(
    state_dir: Path,
) -> None:
    runtime, backend = Path(sys.prefix), PlainProcessBackend()
    async with memory_client(state_dir, runtime, backend=backend, prestart_size=0) as own:
        first = await _in(own, "total = sum(range(10))", "parked-1")
        await _in(own, "dropped = True", "parked-2")
        kept = await _in(own, "print(total)", "parked-1")
    parked = _parked(state_dir)
    dropped_state = _state(state_dir, "parked-2")

    async with memory_client(state_dir, runtime, backend=backend, prestart_size=0) as own:
        resumed = await _in(own, "print(total)", "parked-1")
        fresh = await _in(own, "print('dropped' in globals())", "parked-2", reset=True)
        dropped = not dropped_state.exists()

    assert (first["session"], kept["session"], kept["stdout"]) == ("new", "kept", "45\n")
    assert len(parked) == 2 and dropped_state in parked
    assert (resumed["status"], resumed["stdout"], resumed["session"]) == ("success", "45\n", "resumed"), resumed
    assert (fresh["session"], fresh["stdout"], dropped) == ("new", "False\n", True)


async def test_conversations_past_the_session_cap_are_parked_and_each_resumes_its_own_variables(
    state_dir: Path,
) -> None:
    own_values = {f"capped-{index}": index for index in range(2)}
    flags: dict[str, Any] = {"prestart_size": 0, "max_sessions": 1, "session_park_after": 300.0}
    async with memory_client(state_dir, Path(sys.prefix), backend=PlainProcessBackend(), **flags) as own:
        for conversation, index in own_values.items():
            assert (await _in(own, f"mine = {index}", conversation))["status"] == "success"
        parked = len(_parked(state_dir))
        resumed = {conversation: await _in(own, "print(mine)", conversation) for conversation in own_values}

    assert parked == 1
    assert {conversation: result["stdout"] for conversation, result in resumed.items()} == {
        conversation: f"{index}\n" for conversation, index in own_values.items()
    }
    assert [result["session"] for result in resumed.values()] == ["resumed", "resumed"]  # each parks the other
