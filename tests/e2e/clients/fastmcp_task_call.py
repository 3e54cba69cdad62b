# mypy: ignore-errors
# (run by FastMCP 4 in a venv of its own; the project's venv has no fastmcp)
"""run_python calls as MCP tasks through FastMCP 4's own client and fastmcp-tasks (the 2026-07-28
tasks extension, io.modelcontextprotocol/tasks).

Run by test_tasks_fastmcp.py with the interpreter of an isolated venv holding ``fastmcp`` and
``fastmcp-tasks`` (never the project's venv), and one JSON argument: ``{"url", "token", "code",
"timeout"}``. Each request's timeout is ``timeout`` seconds, shorter than the run. First
``call_tool_task``: the handle (its id, its status while it runs, its result), every request of
it within that timeout. Then a plain ``call_tool``, which FastMCP's resolver drives to the tool's
result under the hood (FastMCP bounds a whole call, tasked or not, by the call's own timeout:
that one is given a minute).
Prints one JSON object: the negotiated protocol version, both calls' structured content, the
handle's task id and the statuses it was seen in.
"""

import json
import sys

import anyio
import fastmcp_tasks  # noqa: F401 - registers the tasks extension on every Client
from fastmcp import Client
from fastmcp_tasks.client import call_tool_task


async def main(request: dict[str, object]) -> None:
    async with Client(request["url"], auth=request["token"], timeout=request["timeout"]) as client:
        arguments = {"code": request["code"]}
        task = await call_tool_task(client, "run_python", arguments)
        seen = [task.create_result.status, (await task.status()).status]
        handled = await task.result()
        seen.append((await task.status()).status)
        plain = await client.call_tool("run_python", arguments, timeout=60)
        protocol = client.session.protocol_version
    said = {
        "protocol": str(protocol),
        "plain": plain.structured_content,
        "taskId": task.task_id,
        "seen": seen,
        "handled": handled.structured_content,
    }
    print(json.dumps(said))


anyio.run(main, json.loads(sys.argv[1]))
