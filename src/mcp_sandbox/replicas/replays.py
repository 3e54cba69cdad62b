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
replica at once: the cost is one insert per forwarded call (a fraction of a millisecond on the
same network), and expired rows are deleted now and then by the same statement's transaction.
"""

from __future__ import annotations

import time

from mcp_sandbox.workspace.database import Database, Transaction

__all__ = ["SeenCalls"]

_SWEEP_EVERY = 60.0  # seconds between deletions of expired rows, per replica


class SeenCalls:
    """The ``forwarded_calls`` table. Synchronous: call it from a worker thread."""

    def __init__(self, database: Database) -> None:
        self._db = database
        self._swept = time.monotonic()

    def first(self, signature: str, until: float, now: float) -> bool:
        """Record ``signature`` until ``until`` (epoch seconds); False when it was recorded before.

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """
        sweep = time.monotonic() - self._swept >= _SWEEP_EVERY
        if sweep:
            self._swept = time.monotonic()

        def record(tx: Transaction) -> bool:
            if sweep:
                tx.execute("DELETE FROM forwarded_calls WHERE expires < ?", (now,))
            inserted = tx.execute(
                "INSERT INTO forwarded_calls (signature, expires) VALUES (?, ?) ON CONFLICT (signature) DO NOTHING",
                (signature, until),
            )
            return inserted == 1

        return self._db.run(record)
