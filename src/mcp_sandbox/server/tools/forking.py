"""``forkFrom``: a new conversation made of a copy of another of the same tenant, files and variables.

A fork is made once its run is admitted (``Engine.execute``'s ``prepare``): a call refused for
capacity copies nothing. Its bytes are reserved first against the tenant's and the server's disk
budgets (:mod:`~mcp_sandbox.workspace.changes`), until the call's answer has recorded them:
concurrent forks cannot pass a budget together. The source is held still (its running call waited
for, within the call's timeout) while its variables are dumped in its own sandbox and its files are
copied, so both are of one moment; the fork's first run loads the variables before its code (see
``SessionManager.holding`` and the runtime's ``fork.py``). The host carries the variables as opaque
bytes, never unpickled, nor held whole: they go from the source's sandbox to a nameless file and
from it to the fork's sandbox (:mod:`~mcp_sandbox.engine.fork_state`), each chunk reserved
against the same budgets as the files (a refusal leaves nothing), and the file is gone once the
fork's runner has read it, or when the call ends.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.to_thread

from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.parking import TAMPERED
from mcp_sandbox.errors import BusyError, QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.protocol import Forked
from mcp_sandbox.server.service import Service
from mcp_sandbox.server.tools.checkpointing import tampered
from mcp_sandbox.workspace.checkpoints import state_key
from mcp_sandbox.workspace.cloning import CloneCounts

__all__ = ["FORK_VARIABLES_BYTES", "Fork", "fork_conversation"]

# The pickled variables a fork carries at most; larger ones are skipped, each named (and a
# snapshot past it is not carried at all, said so).
FORK_VARIABLES_BYTES = 32 << 20


@dataclass(frozen=True)
class Fork:
    """A fork made for a call: where from, the files copied, and the variables to load (or why none)."""

    source: str
    counts: CloneCounts
    state: ForkState | None  # closed with the call (or once the fork's runner read it)
    why_not: str | None  # why no variables are carried, when state is None
    checkpoint: str | None = None  # the source's checkpoint it was made of (reset: <name>)

    def report(self, forked: Forked | None) -> dict[str, Any]:
        """The result's ``fork`` field: what the fork carried, and what not (named, with why)."""
        data: dict[str, Any] = {
            "from": self.source,
            "files": self.counts.files,
            "bytes": self.counts.bytes,
            "reflinked": self.counts.reflinked,
        }
        if self.checkpoint is not None:
            data["checkpoint"] = self.checkpoint
        if forked is not None:
            return {**data, "variables": forked.variables, "modules": forked.modules, "skipped": list(forked.skipped)}
        why = self.why_not or "the fork's run did not load them"
        return {**data, "variables": 0, "modules": 0, "skipped": [f"all variables: {why}"]}


async def fork_conversation(
    service: Service,
    tenant: str,
    source_id: str,
    key: str,
    held: contextlib.ExitStack,
    *,
    python: bool,
    wait: float,
    checkpoint: str | None = None,
) -> Fork:
    """Copy ``tenant``'s conversation ``source_id`` (or its ``checkpoint``) into the new conversation
    ``key``; bytes reserved, and the variables' file held, on ``held``.

    Raises:
        ValidationError: ``key`` exists, the source does not (for this tenant), it is over quota,
            or its copy (its files, or its variables as they are spooled) would take the tenant or
            the server past a disk budget; nothing was copied, nothing of them is left.
        BusyError: the source was still running a call after ``wait`` seconds; nothing was copied.
        WorkspaceError: the copy failed (a full disk), or the source's parked interpreter state failed
            its integrity check; nothing of it is left.
    """
    store = service.workspaces
    source = store.key(tenant, source_id)
    live = service.engine.live_sessions()

    def look() -> tuple[bool, bool]:  # one worker thread's hop for the three looks at the disk
        exists = store.directory(key).is_dir() or service.metadata.has_conversation(key)
        return exists, store.directory(source).is_dir()

    exists, source_exists = await anyio.to_thread.run_sync(look)
    if exists or key in live:
        raise ValidationError("conversationId", "that conversation exists; a fork makes a new one (choose a new id)")
    if not source_exists and source not in live:
        raise ValidationError("forkFrom", f"no conversation {source_id!r}")
    if checkpoint is not None:
        return await _fork_checkpoint(service, tenant, source_id, source, checkpoint, key, held)
    size, holding = await anyio.to_thread.run_sync(_measure, service, tenant, source)
    budgets = (service.workspace_settings.tenant_workspaces_bytes, service.workspace_settings.max_workspaces_bytes)
    try:
        reservation = held.enter_context(store.gate.reserving(tenant, size, holding, budgets))
    except QuotaExceededError as exc:
        raise ValidationError("forkFrom", f"{exc}; nothing was copied") from exc
    sessions = service.sessions.sessions
    budget = FORK_VARIABLES_BYTES if python and sessions else None
    counts: CloneCounts | None = None
    taken: ForkState | str | None = None
    try:
        with anyio.move_on_after(wait):
            async with service.engine.fork_source(source, budget, reservation.grow, tenant=tenant) as taken:
                if isinstance(taken, ForkState):
                    held.callback(taken.close)
                with anyio.CancelScope(shield=True):  # once begun, the copy finishes or fails by itself
                    counts = await service.storage.fork(source, key, tenant)
    except QuotaExceededError as exc:
        raise ValidationError("forkFrom", f"{exc}; nothing was copied") from exc
    if counts is None:
        raise BusyError("the conversation to fork was still running a call at the timeout; nothing was copied")
    state = taken if isinstance(taken, ForkState) else None
    why_not = taken if isinstance(taken, str) else None
    if taken is None:
        if not python or not sessions:
            why_not = "only a Python run in a session carries them"
        else:
            why_not = "the conversation forked had no live interpreter nor a parked one"
    return Fork(source_id, counts, state, why_not)


def _measure(service: Service, tenant: str, source: str) -> tuple[int, tuple[int, int]]:
    """The source's bytes, and what the tenant's and all conversations hold (as last recorded)."""
    return service.workspaces.usage(source).bytes, service.metadata.bytes_held(tenant)


async def _fork_checkpoint(
    service: Service, tenant: str, source_id: str, source: str, name: str, key: str, held: contextlib.ExitStack
) -> Fork:
    """Copy checkpoint ``name`` of ``source`` (``tenant``'s ``source_id``) into the new conversation ``key``."""
    checkpoints = service.checkpoints

    def look() -> tuple[list[str], int, tuple[int, int]]:
        return checkpoints.names(source), checkpoints.held(source, name), service.metadata.bytes_held(tenant)

    names, size, holding = await anyio.to_thread.run_sync(look)
    if name not in names:
        raise ValidationError(
            "reset", f"no checkpoint {name!r} in {source_id!r} (it has: {', '.join(names) or 'none'})"
        )
    budgets = (service.workspace_settings.tenant_workspaces_bytes, service.workspace_settings.max_workspaces_bytes)
    try:
        held.enter_context(service.workspaces.gate.reserving(tenant, size, holding, budgets))
    except QuotaExceededError as exc:
        raise ValidationError("forkFrom", f"{exc}; nothing was copied") from exc
    try:
        state = await service.parked.open(state_key(source, name), tenant)
    except WorkspaceError as exc:
        if str(exc) == TAMPERED:
            raise WorkspaceError(tampered(name)) from exc
        raise
    if state is not None:
        held.callback(state.close)
    with anyio.CancelScope(shield=True):  # once begun, the copy finishes or fails by itself
        counts = await service.storage.fork_checkpoint(source, name, key, tenant)
    why_not = None if state is not None else "the checkpoint has none"
    return Fork(source_id, counts, state, why_not, checkpoint=name)
