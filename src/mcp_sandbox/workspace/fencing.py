"""Writes fenced by a lease's epoch: what a replica records for a conversation, only while it holds its lease.

Among replicas (``replica_url``) a conversation's lease says which replica runs it, and in which
epoch; another replica that takes an expired lease starts a new epoch. A replica stalled past its
lease (stopped, cut off from the database) may wake up in the middle of an upload or a run: what
it then records (a file and its room in the quota, a run's listing, a write-back's manifest)
would sit beside the new owner's. So each such write carries the :class:`Fence` of the lease it
was made under, and the transaction that writes first locks the lease's row (``FOR UPDATE``: a
claim of it waits) and goes on only if this replica still holds it, in that epoch, unexpired.
One server (no ``replica_url``) has no leases and records without a fence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from mcp_sandbox.errors import LeaseLostError
from mcp_sandbox.workspace.database import Dialect, Transaction

__all__ = ["LOST", "Check", "Fence", "hold", "unfenced"]

Check = Callable[[], object]  # raises LeaseLostError once the lease a write was made under is lost

LOST = (
    "this replica no longer runs the conversation (another one took it over while this request was under way): "
    "what it wrote may or may not be kept; send the request again"
)


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a write was made under: its holder (``replica_url``) and epoch (0: none held)."""

    owner: str
    epoch: int


def hold(tx: Transaction, dialect: Dialect, key: str, fence: Fence | None) -> None:
    """Lock conversation ``key``'s lease row for the transaction, and check that ``fence`` is still its
    holder, epoch and unexpired (no check without a fence).

    Raises:
        LeaseLostError: it is not (the transaction is rolled back by the caller's raising).
    """
    if fence is None:
        return
    rows = tx.query(
        f"SELECT 1 FROM leases WHERE key = ? AND owner = ? AND epoch = ? AND expires > ?{dialect.for_update}",
        (key, fence.owner, fence.epoch, time.time()),
    )
    if not rows:
        raise LeaseLostError(LOST)


def unfenced() -> None:
    """The check of a write made under no lease (one server): it always may."""
