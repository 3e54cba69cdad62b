"""The metadata index: tenants, conversations, their files and past executions, in SQLite.

``state_dir/metadata.sqlite3`` (0600, as are its ``-wal`` and ``-shm`` files, which SQLite
creates with the database's mode). It records sizes, times and outcomes, never code,
environment values, tokens, output or raw conversation ids (only their keyed hashes): the
columns below are all there is.

WAL with ``synchronous=NORMAL``: a committed transaction survives the process being killed
(it is in the WAL, which the OS holds); only a power loss may drop the last few commits, never
corrupt the database. That is the right trade for an index the files on disk can rebuild
(retention counts a directory without a row by its mtime).

Migrations are SQL steps applied in order, each in one transaction with the ``user_version``
it leads to; a database newer than this code is refused rather than guessed at.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mcp_sandbox.errors import ConfigError, DiskFullError, WorkspaceError
from mcp_sandbox.state import METADATA_FILE
from mcp_sandbox.workspace.files import DISK_FULL, FileEntry, Usage

__all__ = ["METADATA_FILE", "MIGRATIONS", "ConversationRecord", "ExecutionRecord", "Metadata"]

_BUSY_TIMEOUT_MS = 10_000

# Append only: a released step is never edited, a change is a new step.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE tenants (
            name TEXT PRIMARY KEY,
            created REAL NOT NULL
        ) STRICT""",
        """CREATE TABLE conversations (
            key TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            created REAL NOT NULL,
            last_used REAL NOT NULL,
            bytes INTEGER NOT NULL DEFAULT 0,
            files INTEGER NOT NULL DEFAULT 0
        ) STRICT""",
        "CREATE INDEX conversations_by_last_used ON conversations(last_used)",
        """CREATE TABLE files (
            conversation TEXT NOT NULL REFERENCES conversations(key) ON DELETE CASCADE,
            name TEXT NOT NULL,
            size INTEGER NOT NULL,
            mtime REAL NOT NULL,
            PRIMARY KEY (conversation, name)
        ) STRICT, WITHOUT ROWID""",
        # conversation is not a foreign key: the history outlives the conversation's files.
        """CREATE TABLE executions (
            id TEXT PRIMARY KEY,
            tenant TEXT NOT NULL REFERENCES tenants(name),
            conversation TEXT,
            language TEXT NOT NULL,
            started_at REAL NOT NULL,
            duration_ms INTEGER NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            stdout_bytes INTEGER NOT NULL,
            stderr_bytes INTEGER NOT NULL,
            files_bytes INTEGER NOT NULL
        ) STRICT""",
        "CREATE INDEX executions_by_start ON executions(started_at)",
    ),
    # Retention keeps each tenant's most recent runs.
    ("CREATE INDEX executions_by_tenant ON executions(tenant, started_at)",),
)


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


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation's row: its key, tenant, times (epoch seconds) and recorded usage."""

    key: str
    tenant: str
    created: float
    last_used: float
    bytes: int
    files: int


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (it would use the umask, 0644)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"the metadata database {path} is not a regular file")
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


class Metadata:
    """The metadata database. Synchronous and thread-safe (one connection behind a lock):
    call it from worker threads (``anyio.to_thread.run_sync``)."""

    def __init__(self, path: Path) -> None:
        """Open (creating and migrating) the database at ``path``.

        Raises:
            ConfigError: the file is not a database, cannot be opened, or was written by a
                newer mcp-sandbox (its ``user_version`` is past the known migrations).
        """
        self.path = path
        self._lock = threading.Lock()
        try:
            _create_private(path)
            self._db = sqlite3.connect(
                path, timeout=_BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
            )
        except OSError as exc:
            raise ConfigError(f"cannot open the metadata database {path}: {exc.strerror}") from exc
        except sqlite3.Error as exc:
            raise ConfigError(f"cannot open the metadata database {path}: {exc}") from exc
        try:
            self._db.execute(f"PRAGMA busy_timeout = {_BUSY_TIMEOUT_MS}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._migrate()
        except sqlite3.Error as exc:
            self._db.close()
            raise ConfigError(
                f"the metadata database {path} cannot be used ({exc}); move it away to start a new one"
            ) from exc
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open(cls, path: Path) -> Metadata:
        """Open the database at ``path`` (normally ``StateLayout.metadata``).

        Raises:
            ConfigError: see the constructor.
        """
        return cls(path)

    @property
    def version(self) -> int:
        """The schema version of the database (its ``user_version``)."""
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        for number, step in enumerate(MIGRATIONS, start=1):
            # Another server may migrate the same file: re-read the version inside the lock.
            with self._transaction_locked():
                current = int(self._db.execute("PRAGMA user_version").fetchone()[0])
                if current > len(MIGRATIONS):
                    raise ConfigError(
                        f"the metadata database {self.path} has schema version {current}, newer than this "
                        f"mcp-sandbox knows ({len(MIGRATIONS)}): upgrade mcp-sandbox, or move the file away"
                    )
                if current >= number:
                    continue
                for statement in step:
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {number}")

    @contextlib.contextmanager
    def _transaction_locked(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._lock:
            try:
                with self._transaction_locked():
                    yield
            except sqlite3.Error as exc:
                # Tenants read this message: the database's reason, never its path.
                if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise DiskFullError(DISK_FULL) from exc
                raise WorkspaceError(f"the metadata database refused a write: {exc}") from exc

    def touch_conversation(self, key: str, tenant: str, now: float) -> None:
        """Record that ``tenant``'s conversation ``key`` was used at ``now`` (creating its row).

        Raises:
            WorkspaceError: the database refused the write.
        """
        with self._transaction():
            self._db.execute("INSERT INTO tenants (name, created) VALUES (?, ?) ON CONFLICT DO NOTHING", (tenant, now))
            self._db.execute(
                "INSERT INTO conversations (key, tenant, created, last_used) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET last_used = max(last_used, excluded.last_used)",
                (key, tenant, now, now),
            )

    def record_files(self, key: str, entries: Iterable[FileEntry], usage: Usage | None = None) -> None:
        """Replace conversation ``key``'s recorded files and usage (after a run or an upload).

        ``usage`` is what :meth:`WorkspaceStore.usage` measured (it also counts the files a
        listing hides); without it, the listed entries' sizes and count are recorded.

        Raises:
            WorkspaceError: the conversation has no row (call :meth:`touch_conversation` first),
                or the database refused the write.
        """
        entries = list(entries)
        if usage is None:
            usage = Usage(bytes=sum(entry.size for entry in entries), files=len(entries))
        with self._transaction():
            updated = self._db.execute(
                "UPDATE conversations SET bytes = ?, files = ? WHERE key = ?", (usage.bytes, usage.files, key)
            )
            if updated.rowcount == 0:
                raise WorkspaceError("no such conversation in the metadata database")
            self._db.execute("DELETE FROM files WHERE conversation = ?", (key,))
            self._db.executemany(
                "INSERT INTO files (conversation, name, size, mtime) VALUES (?, ?, ?, ?)",
                ((key, entry.name, entry.size, entry.mtime) for entry in entries),
            )

    def record_execution(self, record: ExecutionRecord) -> None:
        """Add one execution to the history.

        Raises:
            WorkspaceError: the database refused the write (e.g. a duplicate id).
        """
        self.record_executions((record,))

    def record_executions(self, records: Iterable[ExecutionRecord]) -> None:
        """Add executions to the history in one transaction: all of them, or none.

        Raises:
            WorkspaceError: the database refused the write (e.g. a duplicate id).
        """
        records = list(records)
        with self._transaction():
            self._db.executemany(
                "INSERT INTO tenants (name, created) VALUES (?, ?) ON CONFLICT DO NOTHING",
                ((record.tenant, record.started_at) for record in records),
            )
            self._db.executemany(
                "INSERT INTO executions (id, tenant, conversation, language, started_at, duration_ms, status, "
                "exit_code, stdout_bytes, stderr_bytes, files_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
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
                ),
            )

    def prune_executions(self, before: float, keep_per_tenant: int) -> int:
        """Delete the executions started before ``before``, then each tenant's oldest past its
        ``keep_per_tenant`` most recent; return how many were deleted.

        Raises:
            WorkspaceError: the database refused the write.
        """
        with self._transaction():
            aged = self._db.execute("DELETE FROM executions WHERE started_at < ?", (before,)).rowcount
            counted = self._db.execute(
                "DELETE FROM executions WHERE id IN (SELECT id FROM (SELECT id, row_number() OVER "
                "(PARTITION BY tenant ORDER BY started_at DESC, id DESC) AS age FROM executions) WHERE age > ?)",
                (keep_per_tenant,),
            ).rowcount
        return int(aged) + int(counted)

    def conversations_by_last_use(self) -> list[ConversationRecord]:
        """Every conversation, least recently used first.

        Raises:
            WorkspaceError: the database cannot be read.
        """
        with self._lock:
            try:
                rows = self._db.execute(
                    "SELECT key, tenant, created, last_used, bytes, files FROM conversations ORDER BY last_used, key"
                ).fetchall()
            except sqlite3.Error as exc:
                raise WorkspaceError(f"the metadata database {self.path} cannot be read: {exc}") from exc
        return [ConversationRecord(*row) for row in rows]

    def forget_conversation(self, key: str) -> None:
        """Delete conversation ``key``'s row and its files' rows (its executions stay).

        Raises:
            WorkspaceError: the database refused the write.
        """
        with self._transaction():
            self._db.execute("DELETE FROM conversations WHERE key = ?", (key,))

    def close(self) -> None:
        """Close the connection (idempotent)."""
        with self._lock:
            self._db.close()
