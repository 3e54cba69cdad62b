# mypy: ignore-errors
# (run by python-sdk 1.x in .downstream/sdk1; mypy checks this tree against the 2.x the project uses)
"""One long run_python call as an MCP task through python-sdk 1.x's own client (the 2025-11-25 design).

Run by bench/long_tasks.py with the interpreter of .downstream/sdk1 and one JSON argument:
``{"url", "token", "arguments", "request_timeout", "ttl_ms"}``. The session's request timeout is
``request_timeout`` seconds (shorter than the run); the task is polled with the client's own
``poll_task`` (at the server's ``pollInterval``) and its result read with ``tasks/result``.
Prints one JSON object: the task's id, its last status, the tool result's structured content and
the wall time of every ``tasks/get`` in milliseconds.
"""

import json
import sys
import time
from datetime import timedelta

import anyio
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.types import CallToolResult


async def main(request: dict) -> None:
    headers = {"Authorization": f"Bearer {request['token']}"}
    timeout = timedelta(seconds=request["request_timeout"])
    polls: list[float] = []
    seen: list[str] = []  # the status each tasks/get answered
    async with streamablehttp_client(request["url"], headers=headers) as (read, write, _):
        async with ClientSession(read, write, read_timeout_seconds=timeout) as session:
            send = session.send_request

            async def timed(message, *args, **kwargs):
                if message.root.method != "tasks/get":
                    return await send(message, *args, **kwargs)
                began = time.perf_counter()
                answer = await send(message, *args, **kwargs)
                polls.append((time.perf_counter() - began) * 1000)
                seen.append(answer.status)
                return answer

            session.send_request = timed  # every tasks/get the client sends, timed where it sends it
            await session.initialize()
            created = await session.experimental.call_tool_as_task(
                "run_python", request["arguments"], ttl=request["ttl_ms"]
            )
            task_id = created.task.taskId
            async for _ in session.experimental.poll_task(task_id):
                pass
            result = await session.experimental.get_task_result(task_id, CallToolResult)
    said = {
        "taskId": task_id,
        "status": seen[-1] if seen else created.task.status,
        "structured": result.structuredContent,
        "polls": polls,
    }
    print(json.dumps(said))


anyio.run(main, json.loads(sys.argv[1]))
