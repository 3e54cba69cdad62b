"""Audit logs: one JSON object per line, rotated by size, for whatever a module wants on record.

    log = AuditLog.open(StateLayout.of(settings).audit_log)
    log.record("run", tenant="alice", outcome="success", duration_ms=12)
    log.close()

:meth:`AuditLog.record` writes ``{"time": <ISO 8601 UTC>, "event": <name>, ...fields}``; a caller
with its own line (the egress log, :mod:`mcp_sandbox.egress.audit`) hands it to :meth:`AuditLog.write`.
What to put in a line is the caller's choice: this module adds no content of its own. Files rotate
at ``max_bytes`` keeping ``backups`` old ones (``audit.jsonl.1`` ...), through the standard library's
:class:`logging.handlers.RotatingFileHandler`, each file made 0600 in a 0700 directory. Writing is
synchronous and small; a failing disk is reported by the logging module and never raises into the caller.
"""

from __future__ import annotations

import datetime
import json
import logging
import logging.handlers
import os
from pathlib import Path
from typing import Any

__all__ = ["AuditLog"]

DEFAULT_MAX_BYTES = 10 << 20
DEFAULT_BACKUPS = 5


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating file of ready-made lines; every new file (after each rotation too) is 0600, whatever the umask."""

    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)  # the line as the caller made it, never %-formatted

    def _open(self) -> Any:
        return open(  # the handler owns the stream and closes it
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=lambda path, flags: os.open(path, flags | os.O_CLOEXEC, 0o600),
        )


class AuditLog:
    """An append-only JSON-lines log at ``path``; see the module docstring."""

    def __init__(self, path: Path, handler: logging.Handler) -> None:
        self.path = path
        # Lines go straight to the handler, through no logger: audit lines never reach the
        # console log, and a line costs no logger's work (levels, the caller's frame, propagation).
        self._handler = handler

    @classmethod
    def open(cls, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS) -> AuditLog:
        """Open (create 0600, in a 0700 directory if missing) the log at ``path``.

        Raises:
            OSError: the directory or the file cannot be created.
        """
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        if path.exists():
            path.chmod(0o600)  # one made by an older version, or by hand
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        handler = _PrivateRotatingFile(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        return cls(path, handler)

    def record(self, event: str, **fields: Any) -> None:
        """Append one line: the time, ``event`` and ``fields``. Never raises for a failing disk."""
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        line = {"time": when, "event": event, **fields}
        self.write(json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str))

    def write(self, line: str) -> None:
        """Append ``line`` (one JSON object, no newline) as it is. Never raises for a failing disk."""
        record = logging.LogRecord("mcp_sandbox.audit", logging.INFO, "", 0, line, None, None)
        handler = self._handler
        handler.acquire()
        try:
            handler.handle(record)  # its rotation and errors (reported, never raised)
            # Closed after each line (the next one reopens it in append mode): no file is left
            # open by an owner dropped without closing, and a rotation by another process is seen.
            handler.close()
        finally:
            handler.release()

    def close(self) -> None:
        self._handler.close()
