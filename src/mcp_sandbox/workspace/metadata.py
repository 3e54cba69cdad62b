"""The metadata index: tenants, conversations and their files (past executions: :mod:`.executions`).

In SQLite (``state_dir/metadata.sqlite3``, :mod:`.sqlite_db`) unless ``database_url`` names a
PostgreSQL database (:mod:`.postgres_db`); the SQL is written once here, what differs between
the engines is behind :class:`~.database.Database`. It records sizes, times and outcomes, never
code, environment values, tokens, output or raw conversation ids (only their keyed hashes): the
columns of :mod:`.schema` are all there is. The files on disk can rebuild it (retention counts
a directory without a row by its mtime).

Migrations (:mod:`.schema`) are applied in order at open, each leading to its schema version; a
database newer than this code is refused rather than guessed at.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.errors import LeaseLostError, QuotaExceededError, WorkspaceError
from mcp_sandbox.state import METADATA_FILE
from mcp_sandbox.workspace.database import Database, Transaction
from mcp_sandbox.workspace.fencing import Check, Fence, hold, unfenced
from mcp_sandbox.workspace.files import FileEntry, Usage
from mcp_sandbox.workspace.schema import MIGRATIONS
from mcp_sandbox.workspace.writing import Admit

__all__ = ["METADATA_FILE", "MIGRATIONS", "ConversationRecord", "Metadata"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation's row: its key, tenant, times (epoch seconds) and recorded usage."""

    key: str
    tenant: str
    created: float
    last_used: float
    bytes: int
    files: int


class Metadata:
    """The metadata database. Synchronous and thread-safe (one connection behind a lock):
    call it from worker threads (``anyio.to_thread.run_sync``)."""

    def __init__(self, path: Path, database_url: str | None = None) -> None:
        """Open (creating and migrating) the database: PostgreSQL at ``database_url`` when
        given, else the SQLite file at ``path``.

        Raises:
            ConfigError: the database cannot be opened or reached (the message names it, never
                a password), is not a database, or was written by a newer mcp-sandbox.
        """
        self.path = path
        self._db: Database
        if database_url is None:
            from mcp_sandbox.workspace.sqlite_db import SqliteDatabase

            self._db = SqliteDatabase(path)
        else:
            from mcp_sandbox.workspace.postgres_db import PostgresDatabase

            self._db = PostgresDatabase(database_url)
        self._sql = self._db.dialect
        self._guard = threading.Lock()
        self._listings: dict[str, tuple[threading.Lock, int]] = {}  # key: its lock and how many use it

    @classmethod
    def open(cls, path: Path, database_url: str | None = None) -> Metadata:
        """Open the database at ``database_url`` when set, else the SQLite file at ``path``; raises as constructing."""
        return cls(path, database_url)

    @property
    def description(self) -> str:
        """Which database this is, for logs and doctor: ``SQLite <path>`` or ``PostgreSQL user@host:port/db``."""
        return self._db.description

    @property
    def database(self) -> Database:
        """The engine underneath, for the tables other modules keep in it (leases, the shared secret)."""
        return self._db

    @property
    def version(self) -> int:
        """The schema version of the database."""
        return self._db.version

    def touch_conversation(self, key: str, tenant: str, now: float) -> None:
        """Record that ``tenant``'s conversation ``key`` was used at ``now`` (creating its row).

        Raises:
            WorkspaceError: the database refused the write.
        """

        def touch(tx: Transaction) -> None:
            tx.execute("INSERT INTO tenants (name, created) VALUES (?, ?) ON CONFLICT DO NOTHING", (tenant, now))
            tx.execute(
                "INSERT INTO conversations (key, tenant, created, last_used) VALUES (?, ?, ?, ?) ON CONFLICT (key) "
                f"DO UPDATE SET last_used = {self._sql.greatest}(conversations.last_used, excluded.last_used)",
                (key, tenant, now, now),
            )

        self._db.run(touch)

    def record_files(
        self, key: str, entries: Iterable[FileEntry], usage: Usage | None = None, fence: Fence | None = None
    ) -> None:
        """Replace conversation ``key``'s recorded files and usage (after a run or an upload), if
        ``fence`` (when given) still holds its lease (:mod:`.fencing`).

        ``usage`` is what :meth:`WorkspaceStore.usage` measured (it also counts the files a
        listing hides); without it, the listed entries' sizes and count are recorded.

        Raises:
            LeaseLostError: ``fence`` no longer holds the lease; nothing was recorded.
            WorkspaceError: the conversation has no row (call :meth:`touch_conversation` first),
                or the database refused the write.
        """
        entries = list(entries)
        if usage is None:
            usage = Usage(bytes=sum(entry.size for entry in entries), files=len(entries))
        measured = usage

        def record(tx: Transaction) -> None:
            hold(tx, self._sql, key, fence)
            updated = tx.execute(
                "UPDATE conversations SET bytes = ?, files = ? WHERE key = ?", (measured.bytes, measured.files, key)
            )
            if updated == 0:
                raise WorkspaceError("no such conversation in the metadata database")
            tx.execute("DELETE FROM files WHERE conversation = ?", (key,))
            tx.executemany(
                "INSERT INTO files (conversation, name, size, mtime) VALUES (?, ?, ?, ?)",
                [(key, entry.name, entry.size, entry.mtime) for entry in entries],
            )

        self._db.run(record)

    def record_listing(
        self, key: str, list_files: Callable[[str], Iterable[FileEntry]], fence: Fence | None = None
    ) -> list[FileEntry]:
        """List conversation ``key``'s files with ``list_files(key)`` and :meth:`record_files` them
        (fenced by ``fence``); return the listing, also when the database refused it (logged: the
        next listing records).

        One listing and its record at a time per conversation: two uploads each listing and
        recording afterwards interleaved, and the one that listed first, recording last, replaced
        the index's count with a listing that lacked the other's file (issue 37).

        Raises:
            LeaseLostError: ``fence`` no longer holds the lease; nothing was recorded.
            WorkspaceError: the workspace cannot be listed.
        """
        with self._guard:
            lock, users = self._listings.get(key, (threading.Lock(), 0))
            self._listings[key] = (lock, users + 1)
        try:
            with lock:
                listing = list(list_files(key))
                try:
                    self.record_files(key, listing, fence=fence)
                except LeaseLostError:
                    raise
                except WorkspaceError as exc:
                    logger.warning("could not record a conversation's files in the metadata database: %s", exc)
                return listing
        finally:
            with self._guard:
                users = self._listings[key][1] - 1
                if users:
                    self._listings[key] = (lock, users)
                else:
                    del self._listings[key]

    def record_file_within_quota(
        self, key: str, entry: FileEntry, quota_bytes: int, quota_files: int, fence: Fence | None = None
    ) -> bool:
        """Record ``entry`` (new, or replacing the file of its name) in conversation ``key`` if its
        recorded usage then stays within ``quota_bytes`` and ``quota_files`` and ``fence`` (when
        given) still holds its lease; return whether it fitted.

        The checks and the write are one transaction that locks the lease's row and then the
        conversation's (see :mod:`.database`): of writers that together would pass the quota, on
        any number of servers sharing the database, only those that fit are recorded, and none of
        a replica that lost the lease.

        Raises:
            LeaseLostError: ``fence`` no longer holds the lease; nothing was recorded.
            WorkspaceError: the conversation has no row, or the database refused the write.
        """

        def claim(tx: Transaction) -> bool:
            hold(tx, self._sql, key, fence)
            rows = tx.query(f"SELECT bytes, files FROM conversations WHERE key = ?{self._sql.for_update}", (key,))
            if not rows:
                raise WorkspaceError("no such conversation in the metadata database")
            used_bytes, used_files = int(rows[0][0]), int(rows[0][1])
            old = tx.query("SELECT size FROM files WHERE conversation = ? AND name = ?", (key, entry.name))
            new_bytes = used_bytes - (int(old[0][0]) if old else 0) + entry.size
            new_files = used_files + (0 if old else 1)
            if new_bytes > quota_bytes or new_files > quota_files:
                return False
            tx.execute("UPDATE conversations SET bytes = ?, files = ? WHERE key = ?", (new_bytes, new_files, key))
            tx.execute(
                "INSERT INTO files (conversation, name, size, mtime) VALUES (?, ?, ?, ?) ON CONFLICT (conversation, "
                "name) DO UPDATE SET size = excluded.size, mtime = excluded.mtime",
                (key, entry.name, entry.size, entry.mtime),
            )
            return True

        return self._db.run(claim)

    def admitting(self, key: str, fence: Fence | None, quota_bytes: int, quota_files: int) -> Admit | None:
        """What an upload's commit calls among replicas (:meth:`PendingWrite.commit`): records its file
        with :meth:`record_file_within_quota`, refusing it when that does not fit (None without a fence)."""
        if fence is None:
            return None

        def admit(entry: FileEntry) -> None:
            if self.record_file_within_quota(key, entry, quota_bytes, quota_files, fence):
                return
            query = "SELECT bytes, files FROM conversations WHERE key = ?"
            used, files = self._db.run(lambda tx: tx.query(query, (key,)), write=False)[0]
            if files >= quota_files:
                message = f"{entry.name}: the conversation has {files} files, its quota is {quota_files}"
                raise QuotaExceededError("files", int(files), quota_files, message)
            quota = f"its quota of {quota_bytes} bytes ({used} are used)"
            message = f"{entry.name}: the conversation's files would exceed {quota}"
            raise QuotaExceededError("bytes", int(used), quota_bytes, message)

        return admit

    def fence_check(self, key: str, fence: Fence | None) -> Check:
        """A check that ``fence`` still holds conversation ``key``'s lease (none without a fence), for a
        write-back to call before it puts objects and before its manifest.

        The check raises LeaseLostError when it does not, WorkspaceError when the database cannot be reached.
        """
        if fence is None:
            return unfenced
        return lambda: self._db.run(lambda tx: hold(tx, self._sql, key, fence), write=False)

    def conversations_by_last_use(self) -> list[ConversationRecord]:
        """Every conversation, least recently used first.

        Raises:
            WorkspaceError: the database cannot be read.
        """
        rows = self._db.run(
            lambda tx: tx.query(
                "SELECT key, tenant, created, last_used, bytes, files FROM conversations ORDER BY last_used, key"
            ),
            write=False,
        )
        return [ConversationRecord(*row) for row in rows]

    def bytes_held(self, tenant: str) -> tuple[int, int]:
        """The bytes ``tenant``'s conversations and all conversations hold, as last recorded (or WorkspaceError)."""
        sums = "SELECT SUM(CASE WHEN tenant = ? THEN bytes ELSE 0 END), SUM(bytes) FROM conversations"
        [(mine, everyone)] = self._db.run(lambda tx: tx.query(sums, (tenant,)), write=False)
        return int(mine or 0), int(everyone or 0)  # NULL: no conversations

    def conversations_of(self, tenant: str) -> list[ConversationRecord]:
        """``tenant``'s conversations, most recently used first (no other tenant's row).

        Raises:
            WorkspaceError: the database cannot be read.
        """
        rows = self._db.run(
            lambda tx: tx.query(
                "SELECT key, tenant, created, last_used, bytes, files FROM conversations WHERE tenant = ? "
                "ORDER BY last_used DESC, key",
                (tenant,),
            ),
            write=False,
        )
        return [ConversationRecord(*row) for row in rows]

    def tenant_of(self, key: str) -> str | None:
        """The tenant of conversation ``key``, or None when it has no row.

        Raises:
            WorkspaceError: the database cannot be read.
        """
        rows = self._db.run(lambda tx: tx.query("SELECT tenant FROM conversations WHERE key = ?", (key,)), write=False)
        return str(rows[0][0]) if rows else None

    def has_conversation(self, key: str) -> bool:
        """Whether conversation ``key`` has a row (it was used and not yet removed by retention).

        Raises:
            WorkspaceError: the database cannot be read.
        """
        rows = self._db.run(lambda tx: tx.query("SELECT 1 FROM conversations WHERE key = ?", (key,)), write=False)
        return bool(rows)

    def forget_conversation(self, key: str) -> None:
        """Delete conversation ``key``'s row, its files' rows and its mark of a lost interpreter (its executions stay).

        Raises:
            WorkspaceError: the database refused the write.
        """

        def forget(tx: Transaction) -> None:
            tx.execute("DELETE FROM conversations WHERE key = ?", (key,))
            tx.execute("DELETE FROM state_lost WHERE key = ?", (key,))

        self._db.run(forget)

    def close(self) -> None:
        """Close the connection (idempotent)."""
        self._db.close()
