"""The metadata index's two engines behind one small interface: SQLite (the default) and PostgreSQL.

:class:`~.metadata.Metadata` writes its SQL once, with ``?`` placeholders; what differs between
the engines is here (:class:`Dialect`) or in each engine's module (connections, transactions,
schema versions). Each engine runs a unit of work (a function of a :class:`Transaction`) as one
transaction, serialised against other writers of the same database, from any process: SQLite's
``BEGIN IMMEDIATE`` takes the database's write lock before the first read, PostgreSQL's
``SELECT ... FOR UPDATE`` locks the rows a read-check-write touches (:attr:`Dialect.for_update`).
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

__all__ = ["Database", "Dialect", "Transaction", "describe_url", "redact"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Dialect:
    """The pieces of SQL that differ between the engines."""

    greatest: str  # the two-argument maximum: SQLite's max(), PostgreSQL's GREATEST()
    for_update: str  # appended to a SELECT whose rows the transaction then updates


class Transaction(Protocol):
    """One open transaction of a :class:`Database`: statements with ``?`` placeholders."""

    def execute(self, sql: str, params: Sequence[object] = ()) -> int:
        """Run one statement; return the rows it changed."""
        ...

    def executemany(self, sql: str, rows: Iterable[Sequence[object]]) -> None:
        """Run one statement once per row of parameters."""
        ...

    def query(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """Run one query; return its rows."""
        ...


class Database(Protocol):
    """An engine of the metadata index. Thread-safe; every method may block (call it from a worker thread)."""

    dialect: Dialect
    description: str  # says which database, never a password: "SQLite /path" or "PostgreSQL user@host:port/db"

    @property
    def version(self) -> int:
        """The schema version of the database."""
        ...

    def run(self, work: Callable[[Transaction], T], *, write: bool = True) -> T:
        """Run ``work`` as one transaction and commit it (rolled back when it raises); ``write``:
        it writes (SQLite takes the write lock at its start).

        Raises:
            DiskFullError: the database's disk is full.
            WorkspaceError: the database refused or could not be reached (the message names no
                host path nor server: tenants read it; the log names the database).
        """
        ...

    def close(self) -> None:
        """Close the connection (idempotent)."""
        ...


def describe_url(url: str) -> str:
    """``user@host:port/db`` of a ``postgresql://`` URL: what logs, errors and doctor show, never the password."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    host = parts.hostname or next(iter(query.get("host", [])), "localhost")
    try:
        port = parts.port or int(next(iter(query.get("port", [])), "5432"))
    except ValueError:
        port = 5432
    database = parts.path.lstrip("/") or next(iter(query.get("dbname", [])), "") or (parts.username or "")
    user = f"{parts.username}@" if parts.username else ""
    host = f"[{host}]" if ":" in host else host
    return f"{user}{host}:{port}/{database}"


def redact(message: str, url: str | None) -> str:
    """``message`` with the URL's password (if any) replaced: a driver may echo what it was given."""
    if url is None:
        return message
    parts = urllib.parse.urlsplit(url)
    for secret in (parts.password, urllib.parse.unquote(parts.password or "")):
        if secret:
            message = message.replace(secret, "***")
    query = urllib.parse.parse_qs(parts.query)
    for secret in query.get("password", []):
        if secret:
            message = message.replace(secret, "***")
    return message
