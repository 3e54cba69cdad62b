"""The run history: the ``executions`` table of the metadata index, one row per finished run.

Rows hold sizes, times and outcomes only (never code, output or the client's conversation id:
:class:`ExecutionRecord`); they are written from events (``server/history.py``) and pruned by
retention. The table lives in the metadata index's database (:attr:`.metadata.Metadata.database`),
beside the conversations' rows, as the replicas' leases do.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from mcp_sandbox.workspace.database import Database, Transaction

__all__ = ["ExecutionRecord", "prune_executions", "record_execution", "record_executions"]


@dataclass(frozen=True, slots=True)
class ExecutionRecord:
    """One finished execution, as the index keeps it: sizes, times and outcome only."""

    tenant: str
    conversation: str | None  # the workspace key, never the client's conversation id
    language: str
    started_at: float  # seconds since the epoch
    duration_ms: int
    status: str
    exit_code: int | None
    stdout_bytes: int
    stderr_bytes: int
    files_bytes: int = 0
    id: str = field(default_factory=lambda: uuid.uuid4().hex)


def record_execution(database: Database, record: ExecutionRecord) -> None:
    """Add one execution to the history.

    Raises:
        WorkspaceError: the database refused the write (e.g. a duplicate id).
    """
    record_executions(database, (record,))


def record_executions(database: Database, records: Iterable[ExecutionRecord]) -> None:
    """Add executions to the history in one transaction: all of them, or none.

    Raises:
        WorkspaceError: the database refused the write (e.g. a duplicate id).
    """
    records = list(records)

    def record(tx: Transaction) -> None:
        tx.executemany(
            "INSERT INTO tenants (name, created) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(record.tenant, record.started_at) for record in records],
        )
        tx.executemany(
            "INSERT INTO executions (id, tenant, conversation, language, started_at, duration_ms, status, "
            "exit_code, stdout_bytes, stderr_bytes, files_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    record.id,
                    record.tenant,
                    record.conversation,
                    record.language,
                    record.started_at,
                    record.duration_ms,
                    record.status,
                    record.exit_code,
                    record.stdout_bytes,
                    record.stderr_bytes,
                    record.files_bytes,
                )
                for record in records
            ],
        )

    database.run(record)


def prune_executions(database: Database, before: float, keep_per_tenant: int) -> int:
    """Delete the executions started before ``before``, then each tenant's oldest past its
    ``keep_per_tenant`` most recent; return how many were deleted.

    Raises:
        WorkspaceError: the database refused the write.
    """

    def prune(tx: Transaction) -> int:
        aged = tx.execute("DELETE FROM executions WHERE started_at < ?", (before,))
        counted = tx.execute(
            "DELETE FROM executions WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER (PARTITION BY "
            "tenant ORDER BY started_at DESC, id DESC) AS age FROM executions) AS ranked WHERE age > ?)",
            (keep_per_tenant,),
        )
        return aged + counted

    return database.run(prune)
