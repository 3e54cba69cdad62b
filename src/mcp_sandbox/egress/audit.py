"""The egress audit log: one JSON line per connection a run opened (or tried), rotated.

A line holds when, whose run (tenant, conversation, run id), where to (host, port, the address
connected to), how many bytes each way, the verdict (``allowed``, ``refused``, ``cut``) and the
rule that decided. Never a header, a path, a query or a body: those may carry secrets.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

__all__ = ["AuditLog", "AuditRecord", "Verdict"]

Verdict = Literal["allowed", "refused", "cut"]

_MAX_LOG_BYTES = 10 << 20
_BACKUPS = 5


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One connection as the audit log keeps it."""

    tenant: str
    conversation: str | None
    run: str
    host: str
    port: int
    verdict: Verdict
    rule: str
    address: str | None = None
    sent: int = 0  # bytes from the sandbox
    received: int = 0  # bytes to the sandbox
    method: str = "CONNECT"


class AuditLog:
    """Appends :class:`AuditRecord` lines to ``path`` (0600, rotated at 10 MiB, 5 kept)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=_MAX_LOG_BYTES, backupCount=_BACKUPS, encoding="utf-8", delay=True
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))
        self._path = path
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def write(self, record: AuditRecord) -> None:
        """Append one line (its file made 0600 when new)."""
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **asdict(record)}
        entry = logging.LogRecord("mcp_sandbox.egress.audit", logging.INFO, "", 0, json.dumps(line), None, None)
        with self._lock:
            fresh = not self._path.exists()
            self._handler.emit(entry)
            # Closed after each line (emit reopens it in append mode): no file is left open by an
            # engine that is dropped without closing, and rotation by another process is seen.
            self._handler.close()
            if fresh:
                os.chmod(self._path, 0o600)

    def close(self) -> None:
        self._handler.close()
