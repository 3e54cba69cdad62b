# mypy: ignore-errors
# (run by FastMCP 4 in .downstream/fastmcp; the project's venv has no fastmcp)
"""One long run_python call as an MCP task through FastMCP 4's own client and fastmcp-tasks.

Run by bench/long_tasks.py with the interpreter of .downstream/fastmcp and one JSON argument:
``{"url", "token", "arguments", "request_timeout"}``. FastMCP speaks the 2026-07-28 tasks
extension (``io.modelcontextprotocol/tasks``): the server answers the call with a task once it has
run ``task_after``; ``ToolTask.result()`` polls ``tasks/get`` (FastMCP's own backoff up to the
server's ``pollIntervalMs``) to the end, every request bounded by ``request_timeout`` seconds.
Prints one JSON object: the task's id, its last status, the tool result's structured content and
the wall time of every ``tasks/get`` in milliseconds.
"""

import json
import sys
import time

import anyio
import fastmcp_tasks  # noqa: F401 - registers the tasks extension on every Client
from fastmcp import Client
from fastmcp_tasks.client import call_tool_task


async def main(request: dict) -> None:
    polls: list[float] = []
    seen: list[str] = []  # the status each tasks/get answered
    async with Client(request["url"], auth=request["token"], timeout=request["request_timeout"]) as client:
        session = client.session
        send = session.send_request

        async def timed(message, *args, **kwargs):
            if getattr(message, "method", None) != "tasks/get":
                return await send(message, *args, **kwargs)
            began = time.perf_counter()
            answer = await send(message, *args, **kwargs)
            polls.append((time.perf_counter() - began) * 1000)
            seen.append(answer.status)
            return answer

        session.send_request = timed  # every tasks/get the client sends, timed where it sends it
        task = await call_tool_task(client, "run_python", request["arguments"])
        result = await task.result()
    said = {
        "taskId": task.task_id,
        "status": seen[-1] if seen else task.create_result.status,
        "structured": result.structured_content,
        "polls": polls,
    }
    print(json.dumps(said))


anyio.run(main, json.loads(sys.argv[1]))
