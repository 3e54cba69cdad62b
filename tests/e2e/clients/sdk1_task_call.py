# mypy: ignore-errors
# (run by python-sdk 1.x; mypy checks this tree against the 2.x the project uses)
"""One run_python call as an MCP task through python-sdk 1.x's own client (its experimental Tasks API).

Run by test_tasks_sdk1.py with the interpreter of an isolated venv holding ``mcp`` 1.x (never the
project's venv, whose ``mcp`` is 2.x), and one JSON argument: ``{"url", "token", "code",
"timeout"}``. The session's request timeout is ``timeout`` seconds, shorter than the run: a
blocking call times out (tried first), the task is polled to its end. Prints one JSON object:
how the blocking call ended, the task's id, the statuses it was seen in, and the tool result's
structured content.
"""

import json
import sys
from datetime import timedelta

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.exceptions import McpError
from mcp.types import CallToolResult


async def main(request: dict[str, object]) -> None:
    headers = {"Authorization": f"Bearer {request['token']}"}
    timeout = timedelta(seconds=request["timeout"])
    async with streamablehttp_client(request["url"], headers=headers) as (read, write, _):
        async with ClientSession(read, write, read_timeout_seconds=timeout) as session:
            await session.initialize()
            try:
                await session.call_tool("run_python", {"code": request["code"]})
                blocking = "answered"
            except McpError as exc:
                blocking = "timed out" if "Timed out" in str(exc) else f"failed: {exc}"
            created = await session.experimental.call_tool_as_task("run_python", {"code": request["code"]}, ttl=600_000)
            task_id = created.task.taskId
            seen = [created.task.status]
            seen.extend([status.status async for status in session.experimental.poll_task(task_id)])
            result = await session.experimental.get_task_result(task_id, CallToolResult)
    said = {"blocking": blocking, "taskId": task_id, "seen": seen, "structured": result.structuredContent}
    print(json.dumps(said))


anyio.run(main, json.loads(sys.argv[1]))
