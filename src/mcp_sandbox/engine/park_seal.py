"""The seal at the end of a parked state's file: what makes it this server's, for this conversation.

A park appends a trailer of 56 bytes: a mark, a fresh random nonce, the snapshot's size and a
Poly1305 tag over the snapshot. The tag's key is used once: HMAC-SHA256, keyed by the server
secret's ``parked-state`` key, over the nonce, the conversation's key and its tenant. So one
flipped bit, a truncation, or a file moved to another conversation (another tenant's) fails the
check, as with an HMAC over the whole file, and no two files share a tag key. Why not that HMAC:
a resume checks every byte of the state before anything of it is loaded, on the caller's path,
and Poly1305 (``cryptography``'s) is several times faster than SHA-256, even with the CPU's SHA
instructions (docs/design.md has the figures). States sealed the earlier way (an HMAC-SHA256 trailer of the same
length, its own mark) are still checked, so a state parked before an upgrade resumes after it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.poly1305 import Poly1305

__all__ = ["TRAILER", "Seal", "Sealer"]

_MARK = b"mcp-sandbox-prk2"  # 16 bytes
_HMAC_MARK = b"mcp-sandbox-park"  # the earlier seal: mark, size, HMAC-SHA256 of the whole
_NONCE = 16
TRAILER = len(_MARK) + _NONCE + 8 + 16  # mark, nonce, the snapshot's size, its tag
_READ_CHUNK = 1 << 20


def _framed(value: str) -> bytes:
    data = value.encode("utf-8", "surrogatepass")
    return len(data).to_bytes(8, "big") + data


class Seal:
    """The tag of one snapshot on its way to its file: :meth:`update` with every byte, then :meth:`trailer`."""

    def __init__(self, key: bytes, nonce: bytes) -> None:
        self._poly = Poly1305(key)
        self._nonce = nonce

    def update(self, data: bytes | memoryview) -> None:
        self._poly.update(data)

    def trailer(self, size: int) -> bytes:
        """The trailer vouching for the ``size`` bytes given to :meth:`update` (once)."""
        return _MARK + self._nonce + size.to_bytes(8, "big") + self._poly.finalize()


class Sealer:
    """Seals and checks parked states with ``key`` (the server secret's ``parked-state`` key)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _one_time(self, nonce: bytes, conversation: str, tenant: str) -> bytes:
        message = b"poly1305" + nonce + _framed(conversation) + _framed(tenant)
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def seal(self, conversation: str, tenant: str) -> Seal:
        """A new seal for a snapshot of ``conversation`` (of ``tenant``)."""
        nonce = os.urandom(_NONCE)
        return Seal(self._one_time(nonce, conversation, tenant), nonce)

    def sealed_size(self, fd: int) -> int | None:
        """The size the trailer of the file ``fd`` claims for its snapshot, unchecked (:meth:`check` checks
        it); None if the file has no trailer of either seal, or one that disagrees with the file's size."""
        total = os.fstat(fd).st_size
        if total < TRAILER:
            return None
        trailer = os.pread(fd, TRAILER, total - TRAILER)
        if trailer.startswith(_MARK):
            claimed = int.from_bytes(trailer[len(_MARK) + _NONCE : -16], "big")
        elif trailer.startswith(_HMAC_MARK):
            claimed = int.from_bytes(trailer[len(_HMAC_MARK) : len(_HMAC_MARK) + 8], "big")
        else:
            return None
        return claimed if claimed == total - TRAILER else None

    def check(self, fd: int, conversation: str, tenant: str) -> int | None:
        """The snapshot's size if the trailer of the file ``fd`` vouches for it, else None."""
        total = os.fstat(fd).st_size
        if total < TRAILER:
            return None
        trailer = os.pread(fd, TRAILER, total - TRAILER)
        size = total - TRAILER
        if trailer.startswith(_MARK):
            nonce = trailer[len(_MARK) : len(_MARK) + _NONCE]
            if int.from_bytes(trailer[len(_MARK) + _NONCE : -16], "big") != size:
                return None
            poly = Poly1305(self._one_time(nonce, conversation, tenant))
            if not _read(fd, size, poly.update):
                return None
            try:
                poly.verify(trailer[-16:])
            except InvalidSignature:
                return None
            return size
        if trailer.startswith(_HMAC_MARK):
            if int.from_bytes(trailer[len(_HMAC_MARK) : len(_HMAC_MARK) + 8], "big") != size:
                return None
            mac = hmac.new(self._key, _framed(conversation) + _framed(tenant), hashlib.sha256)
            if not _read(fd, size, mac.update):
                return None
            return size if hmac.compare_digest(mac.digest(), trailer[-32:]) else None
        return None


def _read(fd: int, size: int, into: Callable[[memoryview], None]) -> bool:
    """Feed the first ``size`` bytes of ``fd`` to ``into`` through one reused buffer; False if cut short."""
    buffer = bytearray(min(_READ_CHUNK, size))
    view = memoryview(buffer)
    offset = 0
    while offset < size:
        done = os.preadv(fd, [view[: min(len(buffer), size - offset)]], offset)
        if done <= 0:
            return False
        into(view[:done])
        offset += done
    return True
