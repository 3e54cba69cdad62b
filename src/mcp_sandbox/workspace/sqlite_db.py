"""The metadata index in SQLite: ``state_dir/metadata.sqlite3``, the default engine.

The file is 0600, as are its ``-wal`` and ``-shm`` files, which SQLite creates with the
database's mode. WAL with ``synchronous=NORMAL``: a committed transaction survives the process
being killed (it is in the WAL, which the OS holds); only a power loss may drop the last few
commits, never corrupt the database. One connection behind a lock; a write transaction begins
``IMMEDIATE``, taking the database's write lock before its first read, so a read-check-write
(a quota) is serialised against every other writer, in this process or another.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mcp_sandbox.errors import ConfigError, DiskFullError, WorkspaceError
from mcp_sandbox.workspace.database import Dialect, Transaction
from mcp_sandbox.workspace.files import DISK_FULL
from mcp_sandbox.workspace.schema import MIGRATIONS

__all__ = ["SqliteDatabase", "read_version"]

T = TypeVar("T")

_BUSY_TIMEOUT_MS = 10_000
_DIALECT = Dialect(greatest="max", for_update="")


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


def read_version(path: Path) -> int:
    """The schema version of the database at ``path``, read only (doctor: nothing is created).

    Raises:
        sqlite3.Error: the file cannot be read as a database.
    """
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_MS / 1000)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return int(self._db.execute(sql, params).rowcount)

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        self._db.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._db.execute(sql, params).fetchall()]


class SqliteDatabase:
    """The SQLite file at ``path``, opened (created, migrated) when made."""

    dialect = _DIALECT

    def __init__(self, path: Path) -> None:
        """Raises:
        ConfigError: the file is not a database, cannot be opened, or was written by a newer
            mcp-sandbox (its ``user_version`` is past the known migrations).
        """
        self.path = path
        self.description = f"SQLite {path}"
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

    @property
    def version(self) -> int:
        with self._lock:
            return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def _migrate(self) -> None:
        for number, step in enumerate(MIGRATIONS, start=1):
            # Another server may migrate the same file: re-read the version inside the write lock.
            def apply(tx: Transaction, number: int = number, step: tuple[str, ...] = step) -> None:
                current = int(tx.query("PRAGMA user_version")[0][0])
                if current > len(MIGRATIONS):
                    raise ConfigError(
                        f"the metadata database {self.path} has schema version {current}, newer than this "
                        f"mcp-sandbox knows ({len(MIGRATIONS)}): upgrade mcp-sandbox, or move the file away"
                    )
                if current < number:
                    for statement in step:
                        tx.execute(statement)
                    tx.execute(f"PRAGMA user_version = {number}")

            self._transaction(apply, write=True)

    def _transaction(self, work: Callable[[Transaction], T], *, write: bool) -> T:
        self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(_Transaction(self._db))
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return result

    def run(self, work: Callable[[Transaction], T], *, write: bool = True) -> T:
        with self._lock:
            try:
                return self._transaction(work, write=write)
            except sqlite3.Error as exc:
                # Tenants read this message: the database's reason, never its path.
                if getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
                    raise DiskFullError(DISK_FULL) from exc
                verb = "refused a write" if write else "cannot be read"
                raise WorkspaceError(f"the metadata database {verb}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._db.close()
