"""``tools/list`` and the tools answered beside the runs (upload_file, list_runners, an unknown
tool), in memory on the backend test double.

The cases are tests/tool_cases.py's, which tests/e2e/runs/test_tools.py runs on real sandboxes
over every transport; here they run in `make check`. Left to the e2e module: the download URLs
(HTTP only) and the packaged runtime's packages in list_runners.
"""

from __future__ import annotations

import anyio
import pytest
from mcp import Client

import tool_cases as cases
from mcp_test_helpers import CALL_BOUND, text

pytestmark = pytest.mark.anyio


async def test_tools_list_shows_run_python_with_an_output_schema_and_code_required(client: Client) -> None:
    await cases.tools_list_shows_run_python_with_an_output_schema_and_code_required(client)


async def test_the_whole_tools_list_answer_is_under_1000_tokens(client: Client) -> None:
    await cases.the_whole_tools_list_answer_is_under_1000_tokens(client)


async def test_the_run_tools_link_their_mcp_apps_view_in_a_small_meta(client: Client) -> None:
    await cases.the_run_tools_link_their_mcp_apps_view_in_a_small_meta(client)


async def test_calling_a_tool_that_is_not_listed_is_a_protocol_error(client: Client) -> None:
    await cases.calling_a_tool_that_is_not_listed_is_a_protocol_error(client)


async def test_search_tools_is_not_listed_or_answered_without_downstream_servers(client: Client) -> None:
    with anyio.fail_after(CALL_BOUND):
        listed = {tool.name for tool in (await client.list_tools()).tools}
    assert listed == {"run_python", "run_code", "upload_file", "list_runners"}
    await cases.calling_a_tool_that_is_not_listed_is_a_protocol_error(client, "search_tools", {"query": "time"})


async def test_upload_file_stores_bytes_the_next_run_reads_and_refuses_bad_input(client: Client) -> None:
    await cases.upload_file_stores_bytes_the_next_run_reads_and_refuses_bad_input(client, over_http=False)


@pytest.mark.parametrize(
    ("arguments", "argument"),
    [
        ({"conversationId": "c", "filename": "../escape", "content": ""}, "filename"),
        ({"conversationId": "c", "filename": "a.txt", "content": "not base64!"}, "content"),
        ({"filename": "a.txt", "content": ""}, "conversationId"),
        ({"conversationId": "c", "filename": "a.txt", "content": "", "mode": "x"}, "mode"),
    ],
    ids=["escaping-name", "not-base64", "no-conversation", "unknown-argument"],
)
async def test_a_refused_upload_names_the_argument(client: Client, arguments: dict[str, str], argument: str) -> None:
    with anyio.fail_after(CALL_BOUND):
        result = await client.call_tool("upload_file", arguments)

    assert result.is_error is True
    assert text(result).startswith(f"{argument}:")


async def test_list_runners_reports_python_with_its_version_and_packages(client: Client) -> None:
    # The double's Python is this one: pytest is among its packages, the runtime's are not.
    await cases.list_runners_reports_python_with_its_version_and_packages(client, packages=frozenset({"pytest"}))
