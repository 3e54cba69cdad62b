"""Requests between replicas, signed: an HMAC of the timestamp and the body with a key of the shared secret.

Only replicas hold the server secret (the database shares it, :mod:`.shared_secret`),
so only they can sign. A signature is accepted within :data:`WINDOW` seconds of its timestamp
(the replicas' clocks agree within that) and once: a replayed request is refused, and the body
names the replica it is for, so it cannot be replayed at another. Once means across restarts
too: besides the memory of this process, each accepted signature is recorded in the shared
database (:mod:`.replays`), which a restarted replica still reads.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import hmac
from typing import Protocol

from mcp_sandbox.errors import WorkspaceError

__all__ = ["SIGNATURE_HEADER", "TIME_HEADER", "WINDOW", "Seen", "Verifier", "sign"]

TIME_HEADER = "x-mcp-sandbox-time"
SIGNATURE_HEADER = "x-mcp-sandbox-signature"
WINDOW = 30.0


@functools.lru_cache(maxsize=4)
def _keyed(key: bytes) -> hmac.HMAC:
    """The HMAC state after ``key``, computed once per key and copied per request."""
    return hmac.new(key, digestmod=hashlib.sha256)


def _mac(key: bytes, stamp: str, body: bytes) -> str:
    mac = _keyed(key).copy()
    mac.update(stamp.encode("ascii") + b"\n")
    mac.update(body)
    return mac.hexdigest()


def sign(key: bytes, body: bytes, now: float) -> dict[str, str]:
    """The headers that sign ``body`` at ``now`` (epoch seconds)."""
    stamp = f"{now:.3f}"
    return {TIME_HEADER: stamp, SIGNATURE_HEADER: _mac(key, stamp, body)}


class Seen(Protocol):
    async def first(self, signature: str, until: float, now: float) -> bool:
        """Record ``signature`` until ``until``; False when it was recorded before (a replay)."""
        ...


class Verifier:
    """Checks signed requests; remembers the signatures seen within the window (no replays), in
    this process and, with ``seen``, where every replica and every later start sees them."""

    def __init__(self, key: bytes, window: float = WINDOW, seen: Seen | None = None) -> None:
        self._key = key
        self._window = window
        self._recorded = seen
        self._seen: set[str] = set()
        # The signatures seen, in the order they came, each kept until its timestamp cannot be in
        # the window any more (two windows after it came: the sender's clock may be one ahead);
        # dropped from the front, so a check costs the same however many calls came.
        self._expiries: collections.deque[tuple[float, str]] = collections.deque()

    def refusal(self, stamp: str | None, signature: str | None, body: bytes, now: float) -> str | None:
        """Why the request is refused (for the log, not the caller), or None when it is signed, fresh and new."""
        if not stamp or not signature:
            return "not signed"
        try:
            sent = float(stamp)
        except ValueError:
            return "a malformed timestamp"
        if not abs(now - sent) <= self._window:
            return "a timestamp outside the replay window (are the replicas' clocks synchronised?)"
        if not hmac.compare_digest(_mac(self._key, stamp, body), signature):
            return "a wrong signature (do the replicas share the server secret?)"
        expiries = self._expiries
        while expiries and expiries[0][0] < now:
            self._seen.discard(expiries.popleft()[1])
        if signature in self._seen:
            return "a replayed request"
        self._seen.add(signature)
        expiries.append((now + 2 * self._window, signature))
        return None

    async def check(self, stamp: str | None, signature: str | None, body: bytes, now: float) -> str | None:
        """:meth:`refusal`, then (for a request it accepts) whether the signature was recorded before,
        by this replica before a restart or by another one; a database that cannot say refuses it."""
        why = self.refusal(stamp, signature, body, now)
        if why is not None or self._recorded is None or stamp is None or signature is None:
            return why
        # Kept while any replica could accept it: the sender's clock may be a window ahead.
        until = float(stamp) + 2 * self._window
        try:
            first = await self._recorded.first(signature, until, now)
        except WorkspaceError as exc:
            return f"a request that could not be recorded against replays ({exc})"
        return None if first else "a replayed request (seen before this replica restarted, or by another)"
