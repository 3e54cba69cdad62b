"""Quota reservations: concurrent writes into one conversation cannot pass its quota together.

Each write measured the conversation once, when it began; sixteen uploads started at once each
saw room for themselves and all of them were stored (issue 21). Now every chunk a write streams
is *reserved* under a lock against what all the conversation's writes in progress have
reserved, and the quota is *checked again at commit*, under the conversation's lock, against
what is in the workspace then (writes in progress are outside it, in ``uploads/``, so what it
holds is what is committed); the rename happens under that lock (the conversation's change lock,
:mod:`.changes`, so no commit lands inside an adoption or a fork's copy), so two commits never both
take the last room. A write refused a reservation holds no room from that moment (it is being
aborted).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mcp_sandbox.errors import QuotaExceededError
from mcp_sandbox.workspace.changes import ChangeGate
from mcp_sandbox.workspace.files import Usage

__all__ = ["QuotaBook", "Reservation"]


@dataclass(eq=False)
class Reservation:
    """One write's hold on its conversation's quota (made by :meth:`QuotaBook.open`)."""

    book: QuotaBook
    key: str
    name: str
    base_bytes: int  # the conversation's committed bytes when the write began, less the file it replaces
    used_bytes: int  # its usage then (for messages)
    reserved: int = 0  # bytes this write reserved (what it has written, or is writing)

    def reserve(self, size: int) -> None:
        """Reserve ``size`` more bytes (before writing them).

        Raises:
            QuotaExceededError: with the other writes in progress, the conversation would pass its quota.
        """
        self.book.reserve(self, size)

    @contextlib.contextmanager
    def committing(self, size: int, replaced: int | None) -> Iterator[None]:
        """Hold the conversation's lock while the caller renames the file into place.

        ``size`` is the file's final size; ``replaced`` the size of the file it replaces now (None:
        a new file).

        Raises:
            QuotaExceededError: what is on disk now leaves no room for it.
        """
        with self.book.committing(self, size, replaced):
            yield

    def release(self) -> None:
        """Give the reservation back (after a commit or an abort; idempotent)."""
        self.book.release(self)


class QuotaBook:
    """Reservations of the writes in progress, per conversation key. Thread-safe."""

    def __init__(
        self, quota_bytes: int, quota_files: int, usage: Callable[[str], Usage], gate: ChangeGate | None = None
    ) -> None:
        """``gate``: whose change locks commits hold (:mod:`.changes`; None: a gate of its own)."""
        self.quota_bytes = quota_bytes
        self.quota_files = quota_files
        self._usage = usage
        self._gate = ChangeGate() if gate is None else gate
        self._lock = threading.Lock()
        self._open: dict[str, set[Reservation]] = collections.defaultdict(set)

    def key_lock(self, key: str) -> threading.Lock:
        """The lock commits (and discards) of conversation ``key`` hold: its change lock (:mod:`.changes`)."""
        return self._gate.lock(key)

    def open(self, key: str, name: str, usage: Usage, replaced: int | None) -> Reservation:
        """Register a write of ``name`` that begins now; ``usage`` is the conversation's, as measured."""
        reservation = Reservation(self, key, name, usage.bytes - (replaced or 0), usage.bytes)
        with self._lock:
            self._open[key].add(reservation)
        return reservation

    def reserve(self, reservation: Reservation, size: int) -> None:
        with self._lock:
            others = sum(write.reserved for write in self._open[reservation.key] if write is not reservation)
            total = reservation.base_bytes + others + reservation.reserved + size
            if total > self.quota_bytes:
                # The refused write gives its room back in the same step, not when it has
                # unwound: two writes contending for the last room cannot then both be refused,
                # so of concurrent writes that each fit alone, one always goes on.
                reservation.reserved = 0
                raise self._bytes_exceeded(reservation, reservation.used_bytes + others)
            reservation.reserved += size

    @contextlib.contextmanager
    def committing(self, reservation: Reservation, size: int, replaced: int | None) -> Iterator[None]:
        with self.key_lock(reservation.key):
            usage = self._usage(reservation.key)
            committed_bytes, committed_files = usage.bytes, usage.files
            if committed_bytes - (replaced or 0) + size > self.quota_bytes:
                raise self._bytes_exceeded(reservation, committed_bytes)
            if replaced is None and committed_files + 1 > self.quota_files:
                raise QuotaExceededError(
                    "files",
                    committed_files,
                    self.quota_files,
                    f"{reservation.name}: the conversation has {committed_files} files, its quota {self.quota_files}",
                )
            yield

    def release(self, reservation: Reservation) -> None:
        with self._lock:
            writes = self._open.get(reservation.key)
            if writes is not None:
                writes.discard(reservation)
                if not writes:
                    del self._open[reservation.key]

    def _bytes_exceeded(self, reservation: Reservation, used: int) -> QuotaExceededError:
        quota = self.quota_bytes
        return QuotaExceededError(
            "bytes",
            used,
            quota,
            f"{reservation.name}: the conversation's files would exceed its quota of {quota} bytes "
            f"({used} bytes are used or being uploaded)",
        )
