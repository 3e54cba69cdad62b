"""Audit logs: one JSON object per line, rotated by size, for whatever a module wants on record.

    log = AuditLog.open(StateLayout.of(settings).audit_log)
    log.record("run", tenant="alice", outcome="success", duration_ms=12)
    log.close()

Each line is ``{"time": <ISO 8601 UTC>, "event": <name>, ...fields}``; fields are whatever the
caller passes (JSON-serialisable: strings, numbers, booleans, None, lists, dicts). What to put
in a line is the caller's choice and responsibility: this module adds no content of its own.
Files rotate at ``max_bytes`` keeping ``backups`` old ones (``audit.jsonl.1`` ...), through the
standard library's :class:`logging.handlers.RotatingFileHandler`, each file made 0600 in a 0700 directory.
Writing is synchronous and small (one ``write`` of one line); a failing disk is reported by the
logging module and never raises into the caller.
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


class _JsonLines(logging.Formatter):
    """The record's ``audit`` dict as one JSON line, with its time first."""

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, Any] = {"time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z")}
        line.update(getattr(record, "audit", {}))
        return json.dumps(line, ensure_ascii=False, separators=(",", ":"), default=str)


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating file whose every new file (after each rotation too) is made 0600, whatever the umask."""

    def format(self, record: logging.LogRecord) -> str:
        # The handler formats each record twice (to decide on rotation, then to write it): once is enough.
        line: str | None = getattr(record, "audit_line", None)
        if line is None:
            line = super().format(record)
            record.audit_line = line
        return line

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
        # Records go straight to the handler, through no logger: audit lines never reach the
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
        handler = _PrivateRotatingFile(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
        handler.setFormatter(_JsonLines())
        return cls(path, handler)

    def record(self, event: str, **fields: Any) -> None:
        """Append one line: ``event`` and ``fields``. Never raises for a failing disk."""
        record = logging.LogRecord("mcp_sandbox.audit", logging.INFO, "", 0, event, None, None)
        record.audit = {"event": event, **fields}
        self._handler.handle(record)  # its lock, rotation and errors (reported, never raised) as before

    def close(self) -> None:
        self._handler.close()
