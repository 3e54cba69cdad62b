"""One owner per conversation: leases in the metadata database, renewed by their holder, fenced by an epoch.

A lease row says which replica (its ``replica_url``) runs a conversation's session, until when,
and in which epoch. :meth:`LeaseTable.claim` takes a free, released or expired lease (a new
epoch) or renews our own, in one transaction, and otherwise says who holds it. :class:`Leases`
keeps the leases this replica holds: a background task renews them every third of the lease
time, releases those no session nor call uses any more, and fences those it could not renew:
a lease another replica took (its epoch moved on), or one the database could not renew before
it was half gone, has its session ended here, so that two replicas never run one conversation
at once. Times are the replicas' clocks (keep them synchronised: NTP); a release sets the
expiry to 0, so a later claim knows a lease that expired (its holder died: the interpreter's
state is lost) from one given back.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.to_thread

from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace.database import Database, Transaction

__all__ = ["Activity", "Claim", "LeaseTable", "Leases"]

logger = logging.getLogger(__name__)

RELEASED = 0.0  # the expiry of a lease given back
# Why a conversation's interpreter was lost, as its next run says (stateLostReason).
LAPSED_ELSEWHERE = "the replica that ran this conversation stopped or stalled past its lease"
LAPSED_HERE = "this replica lost the conversation's lease for a while (the database or the replica stalled)"
STOPPED = "the replica that ran this conversation was stopped (a restart, a rollout)"
_FOREVER = 1e18  # later than any expiry: release whatever this replica last set


@dataclass(frozen=True, slots=True)
class Claim:
    """What a claim found: who holds the lease now, in which epoch, until when (epoch seconds).

    ``mine``: this replica holds it; ``fresh``: it did not hold it before this claim; ``taken_over``:
    it was taken from another replica whose lease expired (that replica's interpreter is gone).
    """

    owner: str
    epoch: int
    expires: float
    mine: bool
    fresh: bool = False
    taken_over: bool = False


class Activity(Protocol):
    """Which conversations are busy here, and the mark of a call's claim (:class:`.server.busy.Busy`)."""

    def now(self) -> set[str]: ...

    def claiming(self, key: str) -> contextlib.AbstractContextManager[None]: ...


class LeaseTable:
    """The ``leases`` table, as replica ``me`` (its ``replica_url``) sees it. Synchronous: call it
    from a worker thread."""

    def __init__(self, database: Database, me: str) -> None:
        self._db = database
        self.me = me

    def claim(self, key: str, now: float, ttl: float) -> Claim:
        """Take or renew conversation ``key``'s lease until ``now + ttl``, unless another replica holds it.

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """
        for_update = self._db.dialect.for_update

        def claim(tx: Transaction) -> Claim:
            before = tx.query(f"SELECT owner, expires, epoch FROM leases WHERE key = ?{for_update}", (key,))
            tx.execute(
                "INSERT INTO leases (key, owner, expires, epoch) VALUES (?, ?, ?, 1) ON CONFLICT (key) DO UPDATE SET "
                "owner = excluded.owner, expires = excluded.expires, epoch = CASE "
                "WHEN leases.owner = excluded.owner AND leases.expires > ? THEN leases.epoch ELSE leases.epoch + 1 END "
                "WHERE leases.owner = excluded.owner OR leases.expires <= ?",
                (key, self.me, now + ttl, now, now),
            )
            owner, expires, epoch = tx.query("SELECT owner, expires, epoch FROM leases WHERE key = ?", (key,))[0]
            mine = owner == self.me
            held = bool(before) and before[0][0] == self.me and before[0][1] > now
            taken = bool(before) and before[0][0] != self.me and before[0][1] != RELEASED
            if mine and before and RELEASED < before[0][1] <= now:  # it lapsed unreleased: its interpreter is gone
                _mark_lost(tx, [key], LAPSED_HERE if before[0][0] == self.me else LAPSED_ELSEWHERE, now)
            return Claim(str(owner), int(epoch), float(expires), mine, mine and not held, mine and taken)

        return self._db.run(claim)

    def renew(self, held: dict[str, int], now: float, ttl: float) -> set[str]:
        """Renew the leases ``held`` (key: epoch) until ``now + ttl``; the keys still ours.

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """

        def renew(tx: Transaction) -> set[str]:
            sql = "UPDATE leases SET expires = ? WHERE key = ? AND owner = ? AND epoch = ? AND expires > ?"
            return {key for key, epoch in held.items() if tx.execute(sql, (now + ttl, key, self.me, epoch, now))}

        return self._db.run(renew)

    def holder(self, key: str) -> tuple[str, float] | None:
        """Who holds conversation ``key``'s lease as the database says now, and until when; None: no one ever did.

        Raises:
            WorkspaceError: the database cannot be read.
        """
        sql = "SELECT owner, expires FROM leases WHERE key = ?"
        rows = self._db.run(lambda tx: tx.query(sql, (key,)), write=False)
        return (str(rows[0][0]), float(rows[0][1])) if rows else None

    def live(self, now: float) -> set[str]:
        """The keys of the leases some replica holds at ``now`` (neither expired nor given back).

        Raises:
            WorkspaceError: the database cannot be read.
        """
        rows = self._db.run(lambda tx: tx.query("SELECT key FROM leases WHERE expires > ?", (now,)), write=False)
        return {str(key) for (key,) in rows}

    def release(self, held: dict[str, tuple[int, float]], lost: Collection[str] = ()) -> None:
        """Give back the leases ``held`` (key: epoch and the expiry this replica last set) that are
        still ours and not renewed since (a claim racing the release keeps its lease); the
        conversations ``lost`` lose their interpreter with it (the replica stops): marked so.

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """

        def release(tx: Transaction) -> None:
            tx.executemany(
                "UPDATE leases SET expires = ? WHERE key = ? AND owner = ? AND epoch = ? AND expires <= ?",
                [(RELEASED, key, self.me, epoch, expires) for key, (epoch, expires) in held.items()],
            )
            _mark_lost(tx, lost, STOPPED, time.time())

        self._db.run(release)

    def take_lost(self, key: str) -> str | None:
        """Why conversation ``key``'s interpreter was lost since its last run, if it was; the mark is
        taken (said once, on the run that starts the fresh interpreter).

        Raises:
            WorkspaceError: the database refused or cannot be reached (the mark stays).
        """

        def take(tx: Transaction) -> str | None:
            rows = tx.query("SELECT reason FROM state_lost WHERE key = ?", (key,))
            if rows:
                tx.execute("DELETE FROM state_lost WHERE key = ?", (key,))
            return str(rows[0][0]) if rows else None

        return self._db.run(take)


def _mark_lost(tx: Transaction, keys: Iterable[str], reason: str, now: float) -> None:
    """Record that the interpreters of conversations ``keys`` were lost, and why (said on their next run)."""
    tx.executemany(
        "INSERT INTO state_lost (key, reason, at) VALUES (?, ?, ?) "
        "ON CONFLICT (key) DO UPDATE SET reason = excluded.reason, at = excluded.at",
        [(key, reason, now) for key in keys],
    )


@dataclass(slots=True)
class _Held:
    epoch: int
    expires: float  # as far as this replica knows (never later than the database's)
    claimed: float  # when the last claim of it was made


class Leases:
    """The leases this replica holds; :meth:`keep` renews them in the background.

    ``fence(key)`` ends conversation ``key``'s session here (its lease is lost); ``busy`` says which
    conversations are busy here (the server's :class:`~mcp_sandbox.server.busy.Busy`: their leases
    are kept, the others released) and marks a call's claim; ``sessions()`` those with a live
    interpreter here, whose state is lost when their lease is given back (a drain, a shutdown):
    only those are marked so, not one with an upload in flight.
    """

    def __init__(
        self,
        table: LeaseTable,
        ttl: float,
        fence: Callable[[str], Awaitable[object]],
        busy: Activity,
        sessions: Callable[[], set[str]],
    ) -> None:
        self.table = table
        self.ttl = ttl
        self._fence = fence
        self._busy = busy
        self._sessions = sessions
        self._kept_live: set[str] = set()  # kept by a drain with a session: marked lost once given back
        self._held: dict[str, _Held] = {}
        self._releasing: set[str] = set()  # given back by the tick now: a claim asks the database

    @property
    def held(self) -> set[str]:
        """The keys of the leases this replica holds."""
        return set(self._held)

    def holds(self, key: str) -> bool:
        """Whether this replica holds ``key``'s lease (as far as it knows: a claim asks the database)."""
        return key in self._held

    def epoch(self, key: str) -> int:
        """The epoch of ``key``'s lease as this replica holds it (0: not held): the fence of its writes."""
        held = self._held.get(key)
        return 0 if held is None else held.epoch

    def live(self) -> set[str]:
        """The conversations some replica holds the lease of now: in use there (blocks: call it from a
        worker thread).

        Raises:
            WorkspaceError: the database cannot be read.
        """
        return self.table.live(time.time())

    def calling(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Keep ``key``'s lease, once claimed, for the block: a call that claims it, waits for its
        restore and then does its work (the conversation is busy meanwhile).

        Marking only the work left a lease claimed by a call still waiting for its restore looking
        idle, and the tick gave it back; another replica then took it and stored files beside this
        one, each checking the quota against its own copy (issue 37).
        """
        return self._busy.claiming(key)

    async def claim(self, key: str) -> Claim:
        """Claim ``key`` (see :meth:`LeaseTable.claim`); a lease another replica now holds is fenced here.
        A lease held here and renewed within the last half of the lease time is not asked of the database.

        Raises:
            WorkspaceError: the database refused or cannot be reached.
        """
        now = time.time()
        held = self._held.get(key)
        if held is not None and held.expires - now > self.ttl / 2 and key not in self._releasing:
            # Held and renewed within the last half of the lease time: no other replica can hold it,
            # and the renewal keeps it while the call runs (no round trip to the database).
            held.claimed = now
            return Claim(self.table.me, held.epoch, held.expires, mine=True)
        claim = await anyio.to_thread.run_sync(self.table.claim, key, now, self.ttl)
        if claim.mine:
            self._held[key] = _Held(claim.epoch, now + self.ttl, now)
        elif key in self._held:
            await self._lose(key, "another replica took this conversation's lease")
        return claim

    async def keep(self) -> None:
        """Renew, release and fence, every third of the lease time, until cancelled."""
        while True:
            await anyio.sleep(self.ttl / 3)
            await self.tick()

    async def tick(self) -> None:
        """One round of :meth:`keep`."""
        now = time.time()
        active = self._busy.now()
        idle = {k: h for k, h in self._held.items() if k not in active and h.claimed < now - self.ttl / 3}
        busy = {k: h.epoch for k, h in self._held.items() if k not in idle}
        renewed: set[str] | None = None
        with anyio.move_on_after(self.ttl / 3):
            try:
                if idle:
                    given = {k: (h.epoch, h.expires) for k, h in idle.items()}
                    self._releasing = set(idle)
                    try:
                        await anyio.to_thread.run_sync(self.table.release, given, abandon_on_cancel=True)
                    finally:
                        self._releasing = set()
                    for key, held in idle.items():
                        if self._held.get(key) is held and held.claimed < now:  # not claimed again meanwhile
                            del self._held[key]
                if busy:
                    renewed = await anyio.to_thread.run_sync(
                        self.table.renew, busy, now, self.ttl, abandon_on_cancel=True
                    )
            except WorkspaceError as exc:
                logger.error("cannot renew this replica's leases: %s", exc)
        for key, epoch in busy.items():
            kept = self._held.get(key)
            if kept is None or kept.epoch != epoch:
                continue  # released, or taken again in a new epoch meanwhile
            if renewed is not None and key in renewed:
                kept.expires = max(kept.expires, now + self.ttl)
            elif renewed is not None:
                await self._lose(key, "another replica took this conversation's lease")
            elif kept.expires - time.time() < self.ttl / 2:
                await self._lose(key, "this replica could not renew the conversation's lease in time")

    async def _lose(self, key: str, why: str) -> None:
        self._held.pop(key, None)
        logger.warning("conversation %s… is no longer run here: %s", key[:8], why)
        with anyio.CancelScope(shield=True):
            await self._fence(key)

    async def release_all(self, keep: set[str] | None = None) -> None:
        """Give back every lease held but those of ``keep`` (drain, shutdown), bounded by a third
        of the lease time."""
        keep = keep or set()
        live = self._sessions() | self._kept_live  # their interpreters end with this replica
        self._kept_live = keep & live
        held = {k: (h.epoch, _FOREVER) for k, h in self._held.items() if k not in keep}
        self._held = {k: h for k, h in self._held.items() if k in keep}
        if not held:
            return
        lost = set(held) & live
        with anyio.move_on_after(self.ttl / 3, shield=True):
            try:
                await anyio.to_thread.run_sync(self.table.release, held, lost, abandon_on_cancel=True)
            except WorkspaceError as exc:
                logger.error("cannot release this replica's leases (they expire by themselves): %s", exc)
