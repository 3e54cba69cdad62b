"""MCP Tasks: tasks/get, the handle after task_after, cancel to the last process gone, exactly once.

Two real replicas (``mcp-sandbox serve --transport http``) on loopback share a throw-away
PostgreSQL cluster (tests/postgres_helpers.py), with ``task_after`` 1 s. Every request is a plain
JSON-RPC post to ``/mcp`` (curl's way) on a kept-alive client connection per replica.

- ``tasks/get`` of a working task (2026-07-28 revision, the extension): on the replica running
  it, and on the other one, which asks the owner over the internal route; alternating. For
  scale, a ``server/discover`` each round: an HTTP and MCP round trip that reads no database.
- The handle: a ``run_python`` call still running after ``task_after`` is answered with a task;
  how long after ``task_after`` the answer came (the whole call's wall time minus ``task_after``).
- Cancel: a task (2025-11-25 design, ``task: {}``) whose code starts a child process and
  sleeps; once the child is seen in ``/proc``, ``tasks/cancel`` (on the owner, or through the
  other replica, alternating); the time from sending it to no process of the run left (its
  answer comes after they are gone; ``/proc`` is read again to check). The warm pool's size and
  idle sandboxes (``/metrics``) before and after, once refilled: a sandbox a cancel left behind
  would stay counted, and not idle.
- Exactly once: calls with ``_meta.idempotencyKey``, each in a conversation of its own whose code
  appends to a file of its workspace; each sent again with the same key (alternately to the other
  replica), half of them after the first attempt's connection was cut mid-run. A conversation
  whose file holds more than one mark ran its code twice: a duplicate.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from mcp_test_helpers import host_processes
from postgres_helpers import postgres_cluster
from replica_helpers import TOKEN, replicas

RUNTIME = Path(__file__).resolve().parents[1] / ".runtime" / "python"
METRICS_TOKEN = "bench-metrics-token-0123456789ab"
TASK_AFTER = 1.0
LONG = 3600  # seconds a polled task runs (and may: max_timeout)
MODERN = "2026-07-28"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}


async def modern(web: httpx2.AsyncClient, url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("name") if method == "tools/call" else params.get("taskId")
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method, **({"Mcp-Name": name} if name else {})}
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}}
    return answer(await web.post(f"{url}/mcp", json=body, headers=headers))


async def legacy(web: httpx2.AsyncClient, url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return answer(await web.post(f"{url}/mcp", json=body, headers={"MCP-Protocol-Version": "2025-11-25"}))


def answer(reply: httpx2.Response) -> dict[str, Any]:
    message: dict[str, Any] = reply.json()
    if "result" not in message:
        raise RuntimeError(f"unexpected answer: {message}")
    result: dict[str, Any] = message["result"]
    return result


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def child(marker: str) -> str:
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])\n"
        "time.sleep(300)\n"
    )


async def until(condition: Any, bound: float = 60.0, interval: float = 0.001) -> None:
    with anyio.fail_after(bound):
        while not condition():  # noqa: ASYNC110 - /proc has no event to wait on
            await anyio.sleep(interval)


async def pool_size(web: httpx2.AsyncClient, url: str) -> tuple[float, float]:
    """The warm pool's size and idle sandboxes once they stopped changing (refilled), from ``/metrics``."""

    async def read() -> tuple[float, float]:
        text = (await web.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})).text
        values = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("mcp_sandbox_warm_pool_"))
        return float(values["mcp_sandbox_warm_pool_size"]), float(values["mcp_sandbox_warm_pool_idle"])

    last, steady = await read(), 0
    while steady < 5:  # five reads 0.2 s apart that agree
        await anyio.sleep(0.2)
        size = await read()
        steady, last = (steady + 1, last) if size == last else (0, size)
    return last


async def main(gets: int, handles: int, cancels: int, calls: int) -> None:
    print(f"{platform.platform()}, {len(os.sched_getaffinity(0))} CPUs, Python {platform.python_version()}")
    runtime = RUNTIME if (RUNTIME / "bin" / "python3").exists() else None
    env = {"MCP_SANDBOX_TASK_AFTER": f"{TASK_AFTER:g}", "MCP_SANDBOX_METRICS_TOKEN": METRICS_TOKEN}
    env["MCP_SANDBOX_MAX_TIMEOUT"] = str(LONG)  # the polled tasks outlast every get, however loaded the machine
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with postgres_cluster() as cluster:
        async with (
            replicas(2, cluster.create_database(), runtime, **env) as (owner, other),
            httpx2.AsyncClient(headers=headers, timeout=120) as to_owner,
            httpx2.AsyncClient(headers=headers, timeout=120) as to_other,
        ):
            sides = ((owner.url, to_owner), (other.url, to_other))
            run = {"name": "run_python", "arguments": {"code": f"import time; time.sleep({LONG})", "timeout": LONG}}

            handed: list[float] = []
            started: list[str] = []
            for _ in range(handles):
                began = time.perf_counter()
                created = await modern(to_owner, owner.url, "tools/call", run)
                handed.append((time.perf_counter() - began - TASK_AFTER) * 1000)
                started.append(created["taskId"])

            samples: dict[str, list[float]] = {"owner": [], "other": [], "ping": []}
            for n in range(gets):
                began = time.perf_counter()
                await modern(to_owner, owner.url, "server/discover", {})
                samples["ping"].append((time.perf_counter() - began) * 1000)
                for side, (url, web) in (("owner", sides[0]), ("other", sides[1]))[:: 1 if n % 2 else -1]:
                    began = time.perf_counter()
                    task = await modern(web, url, "tasks/get", {"taskId": started[0]})
                    samples[side].append((time.perf_counter() - began) * 1000)
                    if task["status"] != "working":
                        raise RuntimeError(f"the task is no longer working: {task}")
            for task_id in started:
                await modern(to_owner, owner.url, "tasks/cancel", {"taskId": task_id})

            before = await pool_size(to_owner, owner.url)
            stops: dict[str, list[float]] = {"owner": [], "other": []}
            for n in range(cancels):
                marker = f"bench-cancel-{uuid.uuid4().hex}"
                call = {"name": "run_python", "arguments": {"code": child(marker)}, "task": {}}
                task_id = (await legacy(to_owner, owner.url, "tools/call", call))["task"]["taskId"]
                await until(lambda marker=marker: bool(host_processes(marker)))
                side = ("owner", "other")[n % 2]
                url, web = sides[n % 2]
                began = time.perf_counter()
                cancelled = await legacy(web, url, "tasks/cancel", {"taskId": task_id})
                await until(lambda marker=marker: not host_processes(marker))
                stops[side].append((time.perf_counter() - began) * 1000)
                if cancelled["status"] != "cancelled":
                    raise RuntimeError(f"not cancelled: {cancelled}")
            after = await pool_size(to_owner, owner.url)

            duplicates, cut = await exactly_once(sides, calls)

    print(f"task_after {TASK_AFTER:g} s, two replicas on PostgreSQL, milliseconds")
    print(f"  {'':<58} {'median':>8} {'p99':>8}")
    rows = (
        (f"tasks/get on the replica running the task ({gets})", samples["owner"]),
        (f"tasks/get through the other replica ({gets})", samples["other"]),
        (f"  for scale: server/discover on the same replica ({gets})", samples["ping"]),
        (f"handle after task_after ({handles} calls)", handed),
        (f"cancel to last process gone, on the owner ({len(stops['owner'])})", stops["owner"]),
        (f"cancel to last process gone, through the other ({len(stops['other'])})", stops["other"]),
    )
    for label, values in rows:
        median, p99 = quantiles(values)
        print(f"  {label:<58} {median:8.2f} {p99:8.2f}")
    print(f"  warm pool before and after {cancels} cancels (sandboxes, idle): {before} and {after}")
    print(f"  duplicate runs in {calls} calls sent twice with one key ({cut} after a cut mid-run): {duplicates}")


async def exactly_once(sides: tuple[tuple[str, httpx2.AsyncClient], ...], calls: int) -> tuple[int, int]:
    """Each call sent twice with one key, every other one after its first attempt was cut mid-run;
    the duplicate runs found in the conversations' files, and how many were cut."""
    code = "import time; open('/workspace/runs', 'a').write('x'); time.sleep(0.5); print('ran')"
    conversations, cut = [], 0
    for n in range(calls):
        conversation = f"bench-once-{uuid.uuid4().hex}"
        key = {"idempotencyKey": f"key-{uuid.uuid4().hex}"}
        call = {"name": "run_python", "arguments": {"code": code, "conversationId": conversation}, "_meta": key}
        first_url, first_web = sides[0]
        again_url, again_web = sides[n % 2]
        if n % 2:
            async with anyio.create_task_group() as group:
                group.start_soon(legacy, first_web, first_url, "tools/call", call)
                await anyio.sleep(0.25)  # the run has started (it takes 0.5 s)
                group.cancel_scope.cancel()  # the client hangs up mid-run
            cut += 1
        else:
            await legacy(first_web, first_url, "tools/call", call)
        again = await legacy(again_web, again_url, "tools/call", call)
        if again["structuredContent"]["stdout"] != "ran\n":
            raise RuntimeError(f"unexpected result: {again}")
        conversations.append(conversation)
    duplicates = 0
    count = "print(len(open('/workspace/runs').read()))"
    for conversation in conversations:
        read = {"name": "run_python", "arguments": {"code": count, "conversationId": conversation}}
        counted = await legacy(sides[0][1], sides[0][0], "tools/call", read)
        duplicates += int(counted["structuredContent"]["stdout"]) - 1
    return duplicates, cut


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gets", type=int, default=200, help="tasks/get on each replica")
    parser.add_argument("--handles", type=int, default=10, help="calls answered with a task after task_after")
    parser.add_argument("--cancels", type=int, default=50)
    parser.add_argument("--calls", type=int, default=100, help="idempotent calls, each sent twice")
    options = parser.parse_args()
    anyio.run(main, options.gets, options.handles, options.cancels, options.calls)
