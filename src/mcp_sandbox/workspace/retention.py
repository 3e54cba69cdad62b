"""Retention: idle conversations' workspaces are deleted, then, per tenant, the least recently
used ones while that tenant's take more than ``tenant_workspaces_bytes``, then, while all of
them together take more than ``max_workspaces_bytes``, the least recently used of the tenant
that holds the most.

Eviction stays inside the tenant that went over: one tenant filling its conversations never
deletes another's (issue 21), unless the other holds more than it. The metadata rows say when
each conversation was last used, whose it is and how many bytes it holds. A directory without a
row (the server died before writing it) is measured on disk, dated by its mtime, and counted as
a tenant of its own. A conversation in ``busy`` (a live session, a running execution, an
upload) is never touched.

The run history (the ``executions`` table) is pruned in the same sweep: runs older than
``history_ttl``, then each tenant's oldest past its ``history_max_runs`` most recent.
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from mcp_sandbox.config import WorkspaceSettings
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.workspace.executions import prune_executions
from mcp_sandbox.workspace.metadata import Metadata
from mcp_sandbox.workspace.store import WorkspaceStore

__all__ = ["SweepReport", "sweep"]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class SweepReport:
    """What a sweep did: keys deleted for idleness and for space, bytes freed, keys it failed on,
    and the bytes all conversations hold afterwards."""

    idle: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)  # over a tenant's budget or the total, oldest first
    failed: list[str] = field(default_factory=list)
    history_pruned: int = 0  # runs deleted from the history
    freed_bytes: int = 0
    total_bytes: int = 0

    @property
    def removed(self) -> list[str]:
        """Every key deleted, idle ones first."""
        return self.idle + self.evicted

    def summary(self) -> str:
        """One line for the log, e.g. ``2 idle, 1 over the total size (1048576 bytes freed)``."""
        text = f"{len(self.idle)} idle, {len(self.evicted)} over the total size ({self.freed_bytes} bytes freed)"
        text += f"; {self.history_pruned} runs left the history" if self.history_pruned else ""
        return text + (f"; {len(self.failed)} could not be deleted" if self.failed else "")


@dataclass(slots=True)
class _Candidate:
    key: str
    last_used: float
    bytes: int
    recorded: bool
    tenant: str = ""  # "" for a directory without a row


def _candidates(store: WorkspaceStore, metadata: Metadata) -> list[_Candidate]:
    found = {
        row.key: _Candidate(row.key, row.last_used, row.bytes, recorded=True, tenant=row.tenant)
        for row in metadata.conversations_by_last_use()
    }
    for key in store.keys():
        if key in found:
            continue
        try:
            modified = os.lstat(store.directory(key)).st_mtime
            size = store.usage(key).bytes
        except (OSError, WorkspaceError):
            continue  # removed meanwhile, or unreadable: the next sweep sees it again
        found[key] = _Candidate(key, modified, size, recorded=False)
    return sorted(found.values(), key=lambda candidate: (candidate.last_used, candidate.key))


def _delete(
    store: WorkspaceStore,
    metadata: Metadata,
    candidate: _Candidate,
    report: SweepReport,
    forget: Callable[[str], None] | None = None,
) -> bool:
    try:
        if forget is not None:  # the object store's copy first: a failure leaves the row to retry with
            forget(candidate.key)
        store.delete(candidate.key)
        if candidate.recorded:
            metadata.forget_conversation(candidate.key)
    except WorkspaceError as exc:
        logger.warning("retention could not delete a conversation's workspace: %s", exc)
        report.failed.append(candidate.key)
        return False
    report.freed_bytes += candidate.bytes
    return True


def sweep(
    store: WorkspaceStore,
    metadata: Metadata,
    workspaces: WorkspaceSettings,
    now: float,
    busy: Collection[str],
    forget: Callable[[str], None] | None = None,
) -> SweepReport:
    """Prune the run history; delete idle conversations, then the least recently used of a tenant
    over its budget, then of the tenant holding the most while over the total budget.

    ``busy`` holds the keys not to touch; membership is checked just before each deletion, so
    a live set the caller keeps up to date works. Synchronous: run it in a worker thread.
    Failures are logged and listed in the report, not raised. ``forget``, when given, deletes a
    conversation's other copy (the object store's) before its directory and row.
    """
    report = SweepReport()
    history = workspaces
    try:
        report.history_pruned = prune_executions(metadata.database, now - history.history_ttl, history.history_max_runs)
    except WorkspaceError as exc:
        logger.warning("retention could not prune the run history: %s", exc)
    remaining: list[_Candidate] = []
    for candidate in _candidates(store, metadata):
        idle = now - candidate.last_used > workspaces.conversation_ttl
        if idle and candidate.key not in busy and _delete(store, metadata, candidate, report, forget):
            report.idle.append(candidate.key)
        else:
            remaining.append(candidate)
    held: collections.Counter[str] = collections.Counter()
    for candidate in remaining:
        held[candidate.tenant] += candidate.bytes

    def evict(candidate: _Candidate) -> bool:
        if candidate.key in busy or candidate.key in report.failed:
            return False
        if not _delete(store, metadata, candidate, report, forget):
            return False
        report.evicted.append(candidate.key)
        held[candidate.tenant] -= candidate.bytes
        return True

    budget = workspaces.tenant_workspaces_bytes
    if budget is not None:
        for candidate in list(remaining):  # least recently used first, each tenant against its own budget
            if held[candidate.tenant] > budget and evict(candidate):
                remaining.remove(candidate)
    while sum(held.values()) > workspaces.max_workspaces_bytes:
        # The tenant holding the most (that has something left to evict) gives up its oldest.
        for tenant, _ in held.most_common():
            chosen = next((c for c in remaining if c.tenant == tenant and evict(c)), None)
            if chosen is not None:
                remaining.remove(chosen)
                break
        else:
            break  # everything left is busy or failed
    report.total_bytes = sum(held.values())
    return report
