"""``mcp-sandbox tasks``: the MCP Tasks in the metadata database, every tenant's, for an operator.

It reads the database the server uses (the state directory's SQLite file, or ``database_url``)
and prints each task's id, tenant, status, times and owner; never a task's result (that is the
tenant's). A working task shows how long ago its owner last beat: past the lease, the next look
through the server fails it as lost.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

from mcp_sandbox.config import Settings
from mcp_sandbox.server.tasks.table import LEASE, TERMINAL, TaskRow, TaskTable
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import Metadata

# Not the runtime (it imports the MCP SDK): the CLI adds this parser before `serve` answers a
# stdio client's initialize, which must come before the SDK is imported (server/transport/stdio_early).
__all__ = ["add_tasks_parser", "run_tasks"]

_STATUSES = ("working", *sorted(TERMINAL))


def add_tasks_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Add ``tasks`` to the CLI's subcommands."""
    tasks = commands.add_parser("tasks", parents=[common], help="list the server's MCP Tasks (every tenant's)")
    tasks.add_argument("--tenant", help="only this tenant's tasks")
    tasks.add_argument("--status", choices=_STATUSES, help="only the tasks in this status")
    tasks.add_argument("--limit", type=int, default=100, help="at most this many, the newest first (default 100)")
    tasks.add_argument("--json", action="store_true", help="print the tasks as JSON lines")


def _when(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _line(row: TaskRow, now: float, lease: float) -> str:
    state = row.status
    if row.status == "working":
        ago = now - row.heartbeat
        state += f" (beat {ago:.0f} s ago{', lost' if ago > lease else ''})"
    elif row.message:
        state += f": {row.message}"
    return f"{row.id}  {row.tenant}  {_when(row.created)}  {_when(row.updated)}  {row.owner}  {state}"


def run_tasks(settings: Settings, args: argparse.Namespace) -> int:
    """List the tasks; 0."""
    metadata = Metadata.open(
        StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).metadata, settings.replicas.database_url
    )
    try:
        rows = TaskTable(metadata.database).newest(max(args.limit, 1), args.tenant, args.status)
    finally:
        metadata.close()
    now = time.time()
    if args.json:
        for row in rows:
            fields = {
                "taskId": row.id,
                "tenant": row.tenant,
                "status": row.status,
                "statusMessage": row.message,
                "created": row.created,
                "updated": row.updated,
                "owner": row.owner,
                "heartbeat": row.heartbeat,
                "ttlMs": row.ttl_ms,
            }
            print(json.dumps(fields))
        return 0
    if not rows:
        print("no tasks")
    # With replicas the servers beat and judge by replica_lease (server/service.py).
    lease = settings.replicas.replica_lease if settings.replicas.replica_url else LEASE
    for row in rows:
        print(_line(row, now, lease))
    return 0
