"""Forwarded calls seen, recorded in the shared database: a captured call runs once, across restarts.

A forwarded call is signed with the replicas' shared key and a timestamp, and accepted within
:data:`~mcp_sandbox.replicas.signing.WINDOW` of it. A memory of the signatures seen is lost when the
process ends, while the window is not: a call captured on the internal hop could be sent again
to its owner just restarted (a rollout restarts every replica) and run twice. So each accepted
signature is also inserted into ``forwarded_calls`` (its primary key: the unique index), kept
until its window is over; an insert that finds it there is a replay.

Why the database and not a boot id: a per-start id (with a counter) in the signed body lets a
receiver refuse what was signed for an earlier start, but only if every sender learns the
receiver's current id first, a round trip or a column the lease table would have to carry, and
the receiver's clock would still decide. The database is already shared by every replica (the
leases live there), outlives every process, and answers "seen before?" atomically, for every
replica at once. The cost is one statement per forwarded call, on an asynchronous connection of
its own in autocommit: one round trip, no worker thread to wake, never waiting behind the
metadata index's lock (docs/performance.md). Expired rows are deleted now and then.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace.database import redact
from mcp_sandbox.workspace.postgres_db import connect_async, driver

__all__ = ["SeenCalls"]

_SWEEP_EVERY = 60.0  # seconds between deletions of expired rows, per replica


class SeenCalls:
    """The ``forwarded_calls`` table of the PostgreSQL database at ``url``, on one connection of its
    own (opened at the first call, again when the server drops it; closed by :meth:`aclose`)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._lock = anyio.Lock()
        self._connection: Any = None
        self._swept = time.monotonic()

    async def first(self, signature: str, until: float, now: float) -> bool:
        """Record ``signature`` until ``until`` (epoch seconds); False when it was recorded before.

        A connection the server dropped is opened again once; an insert whose answer was lost
        may then find its own row, and the call is refused as a replay (never run twice).

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """
        psycopg = driver()
        async with self._lock:
            for attempt in (1, 2):
                try:
                    if self._connection is None or self._connection.closed:
                        self._connection = await connect_async(self._url)
                    if time.monotonic() - self._swept >= _SWEEP_EVERY:
                        await self._connection.execute("DELETE FROM forwarded_calls WHERE expires < %s", (now,))
                        self._swept = time.monotonic()
                    cursor = await self._connection.execute(
                        "INSERT INTO forwarded_calls (signature, expires) VALUES (%s, %s)"
                        " ON CONFLICT (signature) DO NOTHING",
                        (signature, until),
                    )
                    return bool(cursor.rowcount == 1)
                except psycopg.Error as exc:
                    await self._drop()
                    if attempt == 2 or not isinstance(exc, psycopg.OperationalError):
                        reason = redact(" ".join(str(exc).split()), self._url)
                        raise WorkspaceError(f"the database cannot record forwarded calls: {reason}") from exc
        raise AssertionError("unreachable")

    async def _drop(self) -> None:
        if self._connection is not None:
            with anyio.CancelScope(shield=True):
                await self._connection.close()
            self._connection = None

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop()
