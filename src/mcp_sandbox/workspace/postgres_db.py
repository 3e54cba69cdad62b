"""The metadata index in PostgreSQL (``database_url``), through psycopg 3.

One connection behind a lock, as the SQLite engine has: :class:`~.metadata.Metadata` is called
from worker threads, one short transaction at a time. A connection the server dropped (the
database restarted, a failover) is replaced and the unit of work run once more on the new one:
Metadata's units are upserts, replacements and deletes, safe to repeat if the first commit did
land; an execution's id is its key, so one recorded twice is refused, never doubled.
Transactions are READ COMMITTED; a read-check-write locks its rows (``FOR UPDATE``), so two
writers, in two processes or on two hosts, cannot both take the last of a quota. The schema
version is the one row of ``mcp_sandbox_schema``; migrations run under an advisory lock, so
servers starting together migrate once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from mcp_sandbox.errors import ConfigError, DiskFullError, UnavailableError, WorkspaceError
from mcp_sandbox.workspace.database import Dialect, Transaction, describe_url, redact
from mcp_sandbox.workspace.files import DISK_FULL
from mcp_sandbox.workspace.schema import POSTGRES_MIGRATIONS

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresDatabase", "connect_async", "driver", "read_version"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_SECONDS = 5
_DIALECT = Dialect(greatest="GREATEST", for_update=" FOR UPDATE")
# pg_advisory_xact_lock's key for the migrations: any constant no other user of the database takes.
_MIGRATION_LOCK = 0x6D63_7073_616E_6462  # "mcpsandb"
_SCHEMA_TABLE = "CREATE TABLE IF NOT EXISTS mcp_sandbox_schema (version INTEGER NOT NULL)"


def _driver() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise ConfigError(
            "database_url names PostgreSQL, but psycopg is not installed: pip install 'mcp-sandbox[postgres]'"
        ) from exc
    return psycopg


def driver() -> Any:
    """psycopg, for a caller with a connection of its own (:func:`connect`).

    Raises:
        ConfigError: psycopg is missing.
    """
    return _driver()


async def connect_async(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    """An asynchronous connection of its own to ``url``, in autocommit (for a statement on the
    request's path: no worker thread to wake), with the metadata index's timeout and name.

    Raises:
        ConfigError: psycopg is missing. psycopg.Error: the database cannot be reached.
    """
    connection: psycopg.AsyncConnection[tuple[Any, ...]] = await _driver().AsyncConnection.connect(
        url, autocommit=True, connect_timeout=CONNECT_SECONDS, application_name="mcp-sandbox"
    )
    return connection


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    connection: psycopg.Connection[tuple[Any, ...]] = _driver().connect(
        url, autocommit=True, connect_timeout=CONNECT_SECONDS, application_name="mcp-sandbox"
    )
    return connection


def read_version(url: str) -> int:
    """The schema version of the database at ``url`` (0: none yet), nothing created (doctor).

    Raises:
        ConfigError: psycopg is missing. psycopg.Error: the database cannot be reached or read.
    """
    with _connect(url) as connection:
        exists = connection.execute("SELECT to_regclass('mcp_sandbox_schema') IS NOT NULL").fetchone()
        if exists is None or not exists[0]:
            return 0
        row = connection.execute("SELECT max(version) FROM mcp_sandbox_schema").fetchone()
        return int(row[0]) if row is not None and row[0] is not None else 0


class _Transaction:
    def __init__(self, connection: psycopg.Connection[tuple[Any, ...]]) -> None:
        self._connection = connection

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        return self._connection.execute(sql.replace("?", "%s"), params).rowcount

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        with self._connection.cursor() as cursor:
            cursor.executemany(sql.replace("?", "%s"), rows)

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._connection.execute(sql.replace("?", "%s"), params).fetchall()


class PostgresDatabase:
    """The PostgreSQL database at ``url``, connected and migrated when made."""

    dialect = _DIALECT

    def __init__(self, url: str) -> None:
        """Raises:
        ConfigError: psycopg is missing, the database cannot be reached (the message names it,
            never the password), or its schema is newer than this mcp-sandbox.
        """
        self._url = url
        self.description = f"PostgreSQL {describe_url(url)}"
        self._lock = threading.Lock()
        self._connection: psycopg.Connection[tuple[Any, ...]] | None = None
        driver = _driver()
        try:
            self._connection = _connect(url)
            self._run(self._migrate)
        except driver.Error as exc:
            self.close()
            raise ConfigError(f"cannot use the metadata database {self.description}: {self._reason(exc)}") from exc
        except BaseException:
            self.close()
            raise

    def _reason(self, exc: BaseException) -> str:
        return redact(" ".join(str(exc).split()), self._url)

    def _migrate(self, tx: Transaction) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
        tx.execute(_SCHEMA_TABLE)
        rows = tx.query("SELECT version FROM mcp_sandbox_schema")
        if not rows:
            tx.execute("INSERT INTO mcp_sandbox_schema (version) VALUES (0)")
        current = int(rows[0][0]) if rows else 0
        known = len(POSTGRES_MIGRATIONS)
        if current > known:
            raise ConfigError(
                f"the metadata database {self.description} has schema version {current}, newer than this "
                f"mcp-sandbox knows ({known}): upgrade mcp-sandbox"
            )
        for number, step in enumerate(POSTGRES_MIGRATIONS, start=1):
            if current < number:
                for statement in step:
                    tx.execute(statement)
        tx.execute("UPDATE mcp_sandbox_schema SET version = ?", (max(current, known),))

    @property
    def version(self) -> int:
        return int(self.run(lambda tx: tx.query("SELECT version FROM mcp_sandbox_schema")[0][0], write=False))

    def _run(self, work: Callable[[Transaction], T]) -> T:
        if self._connection is None or self._connection.closed:
            self._connection = _connect(self._url)
        with self._connection.transaction():
            return work(_Transaction(self._connection))

    def _drop_broken(self) -> bool:
        """Close the connection if the server dropped it; say whether it did."""
        if self._connection is None:
            return True
        if not (self._connection.broken or self._connection.closed):
            return False
        self._connection.close()
        self._connection = None
        return True

    def run(self, work: Callable[[Transaction], T], *, write: bool = True) -> T:
        driver = _driver()
        with self._lock:
            for attempt in (1, 2):
                try:
                    return self._run(work)
                except driver.errors.DiskFull as exc:
                    raise DiskFullError(DISK_FULL) from exc
                except driver.OperationalError as exc:
                    if not self._drop_broken():
                        raise self._refused(exc, write) from exc
                    if attempt == 1:
                        continue  # the server restarted or failed over: once more, on a new connection
                    # The operator reads the log; tenants read that the index is unreachable, not where it is.
                    logger.error("the metadata database %s cannot be reached: %s", self.description, self._reason(exc))
                    raise UnavailableError("the metadata database") from exc
                except driver.Error as exc:
                    self._drop_broken()
                    raise self._refused(exc, write) from exc
        raise AssertionError("unreachable")

    def _refused(self, exc: BaseException, write: bool) -> WorkspaceError:
        verb = "refused a write" if write else "cannot be read"
        return WorkspaceError(f"the metadata database {verb}: {self._reason(exc)}")

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None
