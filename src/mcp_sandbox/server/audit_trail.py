"""What the audit log records of the service's events, and the tally of refusals to strangers.

Runs, tool calls, uploads, downloads and unsaved files are a line each, with the event's own
fields (see :mod:`mcp_sandbox.events`). A download refused to someone unknown (a link not signed
with the server's key, an expired one, an earlier runner's link that serves nothing) is not: anyone
who reaches the port can send them, unauthenticated, and a line each would rotate every tenant's
records away; they are summed into one line a minute (and counted in ``mcp_sandbox_downloads_total``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import anyio

from mcp_sandbox.audit import AuditLog, Tally
from mcp_sandbox.events import Event, FileServed, FileStored, FilesUnsaved, RunFinished, ToolCalled

__all__ = ["REFUSALS_INTERVAL", "auditor", "flush_periodically"]

REFUSALS_INTERVAL = 60.0  # seconds between two lines of the tally of refusals to strangers


# Audit lines: event name and the event's own fields (sizes, times, names, outcomes; see events.py),
# less those only the run history reads (the line has its own time).
_AUDITED: dict[type, str] = {
    RunFinished: "run",
    ToolCalled: "tool_call",
    FileStored: "upload",
    FileServed: "download",
    FilesUnsaved: "unsaved_files",
}
_NOT_AUDITED = frozenset({"started_at", "run_ms"})
# Each audited event's fields, named once (asking `dataclasses.fields` for every line cost more than the line's JSON).
_FIELDS: dict[type, tuple[str, ...]] = {
    kind: tuple(field.name for field in dataclasses.fields(kind) if field.name not in _NOT_AUDITED) for kind in _AUDITED
}


def auditor(log: AuditLog, refusals: Tally) -> Callable[[Event], None]:
    """The observer that writes the service's events to ``log``, refusals to strangers to ``refusals``."""

    def record(event: Event) -> None:
        # A refusal to someone unknown (no valid signature, no token: conversation None) is tallied:
        # anyone who reaches the port can cause it, and a line each would rotate everyone's records away.
        if isinstance(event, FileServed) and event.conversation is None and event.status >= 400:
            refusals.note(outcome=event.outcome)
            return
        name = _AUDITED.get(type(event))
        if name is not None:
            # The fields as they are (strings, numbers, tuples of strings): asdict's deep copy is not needed.
            log.record(name, **{field: getattr(event, field) for field in _FIELDS[type(event)]})

    return record


async def flush_periodically(tally: Tally) -> None:
    """Write ``tally``'s line every :data:`REFUSALS_INTERVAL` (for the service's life)."""
    while True:
        await anyio.sleep(REFUSALS_INTERVAL)
        tally.flush()
