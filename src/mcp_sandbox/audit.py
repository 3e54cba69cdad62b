"""Audit logs: one JSON object per line, rotated by size, for whatever a module wants on record.

    log = AuditLog.open(layout.audit_log)  # the state directory's StateLayout
    log.record("run", tenant="alice", outcome="success", duration_ms=12)
    log.close()

:meth:`AuditLog.record` writes ``{"time": <ISO 8601 UTC>, "event": <name>, ...fields}``; a caller
with its own line (the egress log, :mod:`mcp_sandbox.egress.audit`) hands it to :meth:`AuditLog.write`.
What to put in a line is the caller's choice: this module adds only the ``trace_id`` of a line
written inside a traced call (:mod:`mcp_sandbox.tracing`), the key from a line to its trace. Files rotate
at ``max_bytes`` keeping ``backups`` old ones (``audit.jsonl.1`` ...), through the standard library's
:class:`logging.handlers.RotatingFileHandler`, each file made 0600 in a 0700 directory. Writing is
synchronous and small; a failing disk is reported by the logging module and never raises into the caller.
Each line is flushed to the file as it is written. The file stays open between lines (opening and
closing it for each was most of a line's cost, on every run's path); as the standard library's
:class:`~logging.handlers.WatchedFileHandler` does, a line finds the file at ``path`` by its device
and inode and reopens it when another process has moved or removed it, and a log dropped without
:meth:`AuditLog.close` closes its file when it is collected.
What anyone can cause unauthenticated goes through a :class:`Tally`: one summary line per interval
with a count, never a line per request, so nobody can rotate everyone's records out of the files.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import logging.handlers
import os
import stat
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_sandbox import tracing

__all__ = ["AuditLog", "Tally"]

DEFAULT_MAX_BYTES = 10 << 20
DEFAULT_BACKUPS = 5

# One encoder for every line: `json.dumps` with options builds a new one for each call.
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """A rotating file of ready-made lines; every new file (after each rotation too) is 0600, whatever the umask."""

    _opened: tuple[int, int] | None = None  # the (device, inode) of the open stream's file
    _found: os.stat_result | None = None  # what reopen_if_moved found at the path for this line, if it kept it

    def format(self, record: logging.LogRecord) -> str:
        return str(record.msg)  # the line as the caller made it, never %-formatted

    def _open(self) -> Any:
        stream = open(  # the handler owns the stream and closes it
            self.baseFilename,
            self.mode,
            encoding=self.encoding,
            errors=self.errors,
            opener=lambda path, flags: os.open(path, flags | os.O_CLOEXEC, 0o600),
        )
        opened = os.fstat(stream.fileno())
        self._opened = (opened.st_dev, opened.st_ino)
        return stream

    def reopen_if_moved(self) -> None:
        """Close the stream (the next line reopens ``baseFilename``) if its file is no longer there."""
        self._found = None
        if self.stream is None:
            return
        try:
            there = os.stat(self.baseFilename)
        except FileNotFoundError:
            there = None
        if there is None or (there.st_dev, there.st_ino) != self._opened:
            self.close()
        else:
            self._found = there

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        """As the standard library decides, from the ``stat`` :meth:`reopen_if_moved` just made when it
        kept the stream: the file's size (other writers' lines included) instead of two more
        ``stat`` calls, a seek and a tell for every line."""
        found, self._found = self._found, None
        if found is None:
            return bool(super().shouldRollover(record))
        if not stat.S_ISREG(found.st_mode):  # as the standard library: never roll over anything else
            return False
        return self.maxBytes > 0 and found.st_size + len(self.format(record)) + 1 >= self.maxBytes


class AuditLog:
    """An append-only JSON-lines log at ``path``; see the module docstring."""

    def __init__(self, path: Path, handler: _PrivateRotatingFile) -> None:
        self.path = path
        # Lines go straight to the handler, through no logger: audit lines never reach the
        # console log, and a line costs no logger's work (levels, the caller's frame, propagation).
        self._handler = handler
        self._closer = weakref.finalize(self, handler.close)  # an owner that never closed it
        # One record for every line, its text set under the handler's lock (building a LogRecord,
        # with its caller's file name, thread and process, cost more than writing the line).
        self._record = logging.LogRecord("mcp_sandbox.audit", logging.INFO, "", 0, "", None, None)

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
        if (trace := tracing.trace_id()) is not None:  # written inside a traced call: its trace, to look it up by
            line["trace_id"] = trace
        self.write(_ENCODE(line))

    def write(self, line: str) -> None:
        """Append ``line`` (one JSON object, no newline) as it is. Never raises for a failing disk."""
        handler = self._handler
        handler.acquire()
        try:
            record = self._record
            record.msg = line
            handler.reopen_if_moved()  # rotated or removed by another process: a line goes to the file at path
            # Its rotation, the flush and errors (reported, never raised); `handle` would add only the
            # handler's filters (it has none) and its lock (held here).
            handler.emit(record)
            if not self._closer.alive:  # written after close(): the file is not left open
                handler.close()
        finally:
            handler.release()

    def close(self) -> None:
        self._closer()


class Tally:
    """Events of one kind counted by key, and written as one ``event`` line per key and interval.

    The first event after a quiet interval is written at once (``count`` 1); the rest of the
    interval's are counted and written by :meth:`flush` (called on the next event past the
    interval, and by the owner periodically and at close) as ``{"count": N, "seconds": S, **key}``.
    """

    def __init__(self, log: AuditLog, event: str, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._log = log
        self._event = event
        self._interval = interval
        self._clock = clock
        self._counts: collections.Counter[tuple[tuple[str, str], ...]] = collections.Counter()
        self._since = clock()
        self._next = self._since  # nothing written yet: the first event is written at once

    def note(self, **key: str) -> None:
        """Count one event of ``key``; write the counts if the interval has passed."""
        self._counts[tuple(sorted(key.items()))] += 1
        if self._clock() >= self._next:
            self.flush()

    def flush(self) -> None:
        """Write a line per key counted since the last flush (none if nothing was)."""
        now = self._clock()
        if not self._counts:
            self._since = now  # the next event, after this quiet, is written at once
            return
        seconds = round(now - self._since, 3)
        for key, count in sorted(self._counts.items()):
            self._log.record(self._event, count=count, seconds=seconds, **dict(key))
        self._counts.clear()
        self._since = now
        self._next = now + self._interval
