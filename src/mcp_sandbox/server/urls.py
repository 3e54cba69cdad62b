"""Signed, expiring download URLs for a conversation's files.

``/files/<conversation key>/<expires>/<kind>.<signature>/<name>``, where the signature is an
HMAC-SHA256 under the server's URL key of the key, the expiry and the scope: one file
(``f.``, the URLs in a run's ``files``) or the whole conversation (``c.``, ``FILE_BASE_URL``, so
code can build ``f"{FILE_BASE_URL}/{name}"`` for any file it writes). The conversation key is
itself an HMAC of tenant and conversation id, so a URL names no tenant and no raw id.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import re
from dataclasses import dataclass
from urllib.parse import quote

__all__ = ["FILES_PATH", "UrlSigner", "UrlStatus"]

FILES_PATH = "/files"

_KEY_RE = re.compile(r"^[0-9a-f]{64}$")
_SIG_RE = re.compile(r"^([fc])\.([0-9a-f]{64})$")


@dataclass(frozen=True, slots=True)
class UrlStatus:
    """The verdict on a download URL: ``ok``, ``expired`` or ``invalid``."""

    verdict: str

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"


class UrlSigner:
    """Signs and checks download URLs under one key."""

    def __init__(self, key: bytes, base_url: str, ttl: float) -> None:
        self._key = key
        self._base = base_url.rstrip("/") + FILES_PATH
        self._ttl = ttl

    def _sign(self, conversation: str, expires: int, scope: str) -> str:
        message = f"{conversation}\n{expires}\n{scope}".encode("utf-8", errors="surrogatepass")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def _expiry(self, now: float) -> int:
        return math.ceil(now + self._ttl)

    def file_url(self, conversation: str, name: str, now: float) -> str:
        """A URL for one file, valid for the configured lifetime."""
        expires = self._expiry(now)
        signature = self._sign(conversation, expires, "f:" + name)
        return f"{self._base}/{conversation}/{expires}/f.{signature}/{quote(name)}"

    def base_url(self, conversation: str, now: float) -> str:
        """``FILE_BASE_URL``: append ``/<name>`` for any file of the conversation."""
        expires = self._expiry(now)
        signature = self._sign(conversation, expires, "c:")
        return f"{self._base}/{conversation}/{expires}/c.{signature}"

    def check(self, conversation: str, expires: str, signature: str, name: str, now: float) -> UrlStatus:
        """Whether a URL's parts are genuine and unexpired. Constant-time in the signature."""
        match = _SIG_RE.match(signature)
        if not _KEY_RE.match(conversation) or not expires.isdigit() or len(expires) > 12 or match is None:
            return UrlStatus("invalid")
        kind, given = match.groups()
        scope = "f:" + name if kind == "f" else "c:"
        if not hmac.compare_digest(given, self._sign(conversation, int(expires), scope)):
            return UrlStatus("invalid")
        if int(expires) < now:
            return UrlStatus("expired")
        return UrlStatus("ok")
