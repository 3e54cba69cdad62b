"""The ``tasks`` table of the metadata database: each task's row, from its handle to its purge.

A row is written before the task's handle is returned, and every read names the tenant with
the id: another tenant's task is not found, exactly like one that never existed. A working row
names its ``owner`` (the server process running it) and the last ``heartbeat`` that owner wrote;
:meth:`TaskTable.reap` turns the rows of an owner that stopped writing them into ``failed``
(see :mod:`.runtime` for when it is asked). Synchronous: call it from worker threads.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from mcp_sandbox.errors import ValidationError
from mcp_sandbox.workspace.database import Database, Transaction

__all__ = ["LEASE", "TERMINAL", "KeyReused", "TaskRow", "TaskTable"]

TERMINAL = frozenset({"completed", "failed", "cancelled"})
LEASE = 30.0  # a working task whose owner has not beaten for this long is lost

_COLUMNS = (
    "id, tenant, owner, status, message, created, updated, ttl_ms, expires, heartbeat, idempotency_key, request, result"
)


@dataclass(frozen=True, slots=True)
class TaskRow:
    """One task as the database holds it; ``result`` is the JSON of its tool result or error."""

    id: str
    tenant: str
    owner: str
    status: str
    message: str | None
    created: float
    updated: float
    ttl_ms: int
    expires: float
    heartbeat: float
    idempotency_key: str | None
    request: str  # a digest of what the task runs (tool and arguments): a key names one request
    result: str | None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def of(cls, row: tuple[Any, ...]) -> TaskRow:
        return cls(*row)


class KeyReused(Exception):
    """The tenant's idempotency key names a task of another request (another tool or other arguments)."""


def encode_cursor(row: TaskRow) -> str:
    """The opaque cursor of ``tasks/list`` after ``row``."""
    return base64.urlsafe_b64encode(f"{row.created!r}/{row.id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The position a cursor names.

    Raises:
        ValidationError: the cursor is not one this server gave.
    """
    try:
        created, _, task_id = base64.urlsafe_b64decode(cursor.encode()).decode().partition("/")
        return float(created), task_id
    except (ValueError, binascii.Error, UnicodeError):
        raise ValidationError("params.cursor", "not a cursor this server gave") from None


class TaskTable:
    """The ``tasks`` rows of one metadata database (SQLite, or PostgreSQL shared by replicas)."""

    def __init__(self, database: Database) -> None:
        self._db = database

    def insert(self, row: TaskRow) -> TaskRow:
        """Write ``row``; when its tenant already used its idempotency key, return that task instead.

        Raises:
            KeyReused: that task ran another request.
        """

        def insert(tx: Transaction) -> TaskRow:
            if row.idempotency_key is not None:
                found = tx.query(
                    f"SELECT {_COLUMNS} FROM tasks WHERE tenant = ? AND idempotency_key = ?",
                    (row.tenant, row.idempotency_key),
                )
                if found:
                    if (first := TaskRow.of(found[0])).request != row.request:
                        raise KeyReused(row.idempotency_key)
                    return first
            tx.execute(
                f"INSERT INTO tasks ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.id,
                    row.tenant,
                    row.owner,
                    row.status,
                    row.message,
                    row.created,
                    row.updated,
                    row.ttl_ms,
                    row.expires,
                    row.heartbeat,
                    row.idempotency_key,
                    row.request,
                    row.result,
                ),
            )
            return row

        return self._db.run(insert)

    def get(self, tenant: str, task_id: str) -> TaskRow | None:
        """The tenant's task ``task_id``; None when there is none (or it is another tenant's)."""
        rows = self._db.run(
            lambda tx: tx.query(f"SELECT {_COLUMNS} FROM tasks WHERE id = ? AND tenant = ?", (task_id, tenant)),
            write=False,
        )
        return TaskRow.of(rows[0]) if rows else None

    def page(self, tenant: str, after: tuple[float, str] | None, limit: int) -> list[TaskRow]:
        """The tenant's tasks in the order they were created, the first ``limit`` after ``after``."""
        params: list[object] = [tenant]
        if after is None:
            sql = f"SELECT {_COLUMNS} FROM tasks WHERE tenant = ?"
        else:
            sql = f"SELECT {_COLUMNS} FROM tasks WHERE tenant = ? AND (created > ? OR (created = ? AND id > ?))"
            params = [tenant, after[0], after[0], after[1]]
        sql += " ORDER BY created, id LIMIT ?"
        rows = self._db.run(lambda tx: tx.query(sql, (*params, limit)), write=False)
        return [TaskRow.of(row) for row in rows]

    def newest(self, limit: int, tenant: str | None = None, status: str | None = None) -> list[TaskRow]:
        """Every tenant's tasks (or ``tenant``'s, or those in ``status``), the newest first: for operators."""
        sql, params = f"SELECT {_COLUMNS} FROM tasks WHERE 1 = 1", list[object]()
        if tenant is not None:
            sql, params = sql + " AND tenant = ?", [*params, tenant]
        if status is not None:
            sql, params = sql + " AND status = ?", [*params, status]
        sql += " ORDER BY created DESC, id LIMIT ?"
        rows = self._db.run(lambda tx: tx.query(sql, (*params, limit)), write=False)
        return [TaskRow.of(row) for row in rows]

    def finish(self, task_id: str, status: str, message: str | None, result: str | None, now: float) -> bool:
        """End a working task; False when it had already ended (a cancel came first)."""
        changed = self._db.run(
            lambda tx: tx.execute(
                "UPDATE tasks SET status = ?, message = ?, result = ?, updated = ? WHERE id = ? AND status = 'working'",
                (status, message, result, now, task_id),
            )
        )
        return changed > 0

    def beat(self, owner: str, now: float) -> None:
        """Say that ``owner`` still runs its working tasks."""
        self._db.run(
            lambda tx: tx.execute("UPDATE tasks SET heartbeat = ? WHERE owner = ? AND status = 'working'", (now, owner))
        )

    def reap(self, now: float, stale_before: float, gone: Collection[str], message: str) -> int:
        """Fail the working tasks whose owner is in ``gone`` or last beat before ``stale_before``."""

        def reap(tx: Transaction) -> int:
            changed = tx.execute(
                "UPDATE tasks SET status = 'failed', message = ?, updated = ? "
                "WHERE status = 'working' AND heartbeat < ?",
                (message, now, stale_before),
            )
            for owner in gone:
                changed += tx.execute(
                    "UPDATE tasks SET status = 'failed', message = ?, updated = ? "
                    "WHERE status = 'working' AND owner = ?",
                    (message, now, owner),
                )
            return changed

        return self._db.run(reap)

    def cancelled_of(self, owner: str, task_ids: list[str]) -> list[str]:
        """Which of ``task_ids`` (running at ``owner``) another server marked cancelled."""
        if not task_ids:
            return []
        marks = ", ".join("?" for _ in task_ids)
        rows = self._db.run(
            lambda tx: tx.query(
                f"SELECT id FROM tasks WHERE owner = ? AND status = 'cancelled' AND id IN ({marks})", (owner, *task_ids)
            ),
            write=False,
        )
        return [str(row[0]) for row in rows]

    def working_owners(self) -> set[str]:
        """The owners of the working tasks."""
        rows = self._db.run(
            lambda tx: tx.query("SELECT DISTINCT owner FROM tasks WHERE status = 'working'"), write=False
        )
        return {str(row[0]) for row in rows}

    def purge(self, now: float) -> int:
        """Delete the ended tasks whose time to live is over (a working one is kept until it ends)."""
        return self._db.run(
            lambda tx: tx.execute("DELETE FROM tasks WHERE expires < ? AND status <> 'working'", (now,))
        )
