"""``checkpoint`` and ``reset: <name>``: a conversation's files and variables saved by name, and gone back to.

A checkpoint is made as a fork is (:mod:`.forking`), once the call's run is admitted and before its
code runs: the conversation held still (its running call waited for, within the call's timeout),
its variables dumped in its own sandbox (or its parked state, checked, taken as it is), its files
copied (:mod:`~mcp_sandbox.workspace.checkpoints`, under the change lock), the bytes reserved first
against the tenant's and the server's disk budgets (:mod:`~mcp_sandbox.workspace.changes`) and
checked against the conversation's ``quota_bytes``, which counts its checkpoints. The variables
are kept as a parked state (``engine/parking.py``: signed for the checkpoint and the tenant,
copied to the object store with replicas), never unpickled by the host.

A restore holds the conversation the same way, checks the checkpoint's state first (a state
altered on disk or in the store is refused, nothing changed), stops the live interpreter, puts
the checkpoint's files in place and its state as the conversation's parked one: the call's run
then resumes it (``session: resumed``) in a fresh sandbox with every guarantee of a new session.

``checkpoint: "-<name>"`` deletes one (a name begins with a letter or digit, so the form is free, and
an argument's new value costs ``tools/list`` nothing): its files moved aside under the change lock
(no fork or restore of it is reading them), then removed with its variables, here and in the object
store; its bytes leave the conversation's usage, and so its quota and its tenant's disk budget.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread

from mcp_sandbox.engine.fork_state import ForkState
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.parking import PARK_VARIABLES_BYTES, TAMPERED
from mcp_sandbox.errors import BusyError, QuotaExceededError, ValidationError, WorkspaceError
from mcp_sandbox.server.service import Service
from mcp_sandbox.workspace.checkpoints import state_key

__all__ = ["delete_checkpoint", "restore_checkpoint", "save_checkpoint", "tampered"]


def tampered(name: str) -> str:
    """The error of a checkpoint whose saved variables failed their integrity check."""
    return (
        f"checkpoint {name!r}: its saved interpreter state failed its integrity check (it was changed on disk "
        "or in the object store): it was not loaded, and is deleted; nothing was restored and nothing ran"
    )


def _budgets(service: Service) -> tuple[int | None, int]:
    workspaces = service.workspace_settings
    return workspaces.tenant_workspaces_bytes, workspaces.max_workspaces_bytes


async def save_checkpoint(
    service: Service, tenant: str, key: str, name: str, *, python: bool, wait: float
) -> dict[str, Any]:
    """Save ``tenant``'s conversation ``key``'s files and variables as its checkpoint ``name`` (replacing
    one of that name); what was saved, for the result.

    Raises:
        ValidationError: (``checkpoint``) the conversation keeps ``max_checkpoints`` already, or the
            copy would pass its quota or a disk budget; nothing was saved.
        BusyError: the conversation was still running a call after ``wait`` seconds; nothing was saved.
        WorkspaceError: the copy failed, or the conversation's parked state failed its integrity check.
    """
    store, checkpoints, limits = service.workspaces, service.checkpoints, service.workspace_settings

    def look() -> tuple[list[str], int, int, int, tuple[int, int]]:
        files = checkpoints.measure(store.directory(key))
        replaced = checkpoints.held(key, name)
        return (
            checkpoints.names(key),
            store.usage(key).bytes,
            files.bytes,
            replaced,
            service.metadata.bytes_held(tenant),
        )

    names, used, files, replaced, held = await anyio.to_thread.run_sync(look)
    limit = limits.max_checkpoints
    if name not in names and len(names) >= limit:
        raise ValidationError(
            "checkpoint",
            f"the conversation keeps {len(names)} checkpoints, the most it may (max_checkpoints {limit}): "
            f"save over one of {', '.join(names)}, or delete one with checkpoint '-<name>'; nothing was saved",
        )
    quota = limits.quota_bytes
    room = quota - (used - replaced) - files
    if room < 0:
        raise ValidationError(
            "checkpoint",
            f"the conversation holds {used} bytes (files, checkpoints, parked variables); a copy of its {files} "
            f"bytes of files would pass its quota of {quota} (quota_bytes); nothing was saved",
        )
    budget = min(PARK_VARIABLES_BYTES, room) if python and service.sessions.sessions else None
    report: dict[str, Any] | None = None
    try:
        with store.gate.reserving(tenant, files, held, _budgets(service)) as reservation, anyio.move_on_after(wait):
            async with service.engine.fork_source(key, budget, reservation.grow, tenant=tenant) as taken:
                try:
                    if isinstance(taken, ForkState) and taken.size > room:  # a parked one, or a spool's last frame
                        raise ValidationError(
                            "checkpoint",
                            f"its variables ({taken.size} bytes) beside its files would pass the conversation's "
                            f"quota of {quota} (quota_bytes); nothing was saved",
                        )
                    with anyio.CancelScope(shield=True):  # once begun, the save finishes or fails by itself
                        counts = await service.storage.save_checkpoint(key, name, tenant)
                        if isinstance(taken, ForkState):
                            await service.parked.save(state_key(key, name), tenant, taken)
                        else:
                            await service.storage.discard_parked(state_key(key, name))
                finally:
                    if isinstance(taken, ForkState):
                        taken.close()
                report = {"name": name, "files": counts.files, "bytes": counts.bytes}
                report["variables"] = isinstance(taken, ForkState)
                if not isinstance(taken, ForkState):
                    report["notKept"] = [f"all variables: {taken or 'the conversation had no live interpreter'}"]
    except QuotaExceededError as exc:
        raise ValidationError("checkpoint", f"{exc}; nothing was saved") from exc
    if report is None:
        raise BusyError("the conversation was still running a call at the timeout; no checkpoint was saved")
    report["checkpoints"] = await service.storage.checkpoint_names(key)
    return report


async def restore_checkpoint(service: Service, tenant: str, key: str, name: str, *, wait: float) -> dict[str, Any]:
    """Make ``tenant``'s conversation ``key``'s files and variables its checkpoint ``name``'s (its live
    interpreter is stopped; the next run resumes the checkpoint's variables); what was restored.

    Raises:
        ValidationError: (``reset``) no such checkpoint of this conversation, or its files would
            pass the conversation's quota or a disk budget; nothing changed.
        BusyError: the conversation was still running a call after ``wait`` seconds; nothing changed.
        WorkspaceError: the checkpoint's state failed its integrity check (deleted), or the copy
            failed; the conversation's files are as they were.
    """
    store, checkpoints, limits = service.workspaces, service.checkpoints, service.workspace_settings

    def look() -> tuple[list[str], int, int, int, tuple[int, int]]:
        names = checkpoints.names(key)
        if name in names:
            checkpoints.fetch(key, name)  # from the object store, where it was saved by another replica
        files = checkpoints.measure(store.directory(key)).bytes
        saved = checkpoints.measure(checkpoints.path(key, name)).bytes
        return names, store.usage(key).bytes, files, saved, service.metadata.bytes_held(tenant)

    names, used, files, saved, held = await anyio.to_thread.run_sync(look)
    if name not in names:
        raise ValidationError(
            "reset", f"no checkpoint {name!r} in this conversation (it has: {', '.join(names) or 'none'})"
        )
    quota = limits.quota_bytes
    if used - files + saved > quota:
        raise ValidationError(
            "reset",
            f"the checkpoint's {saved} bytes of files, with the conversation's checkpoints, would pass its quota "
            f"of {quota} (quota_bytes); nothing was restored",
        )
    report: dict[str, Any] | None = None
    try:
        with store.gate.reserving(tenant, max(0, saved - files), held, _budgets(service)), anyio.move_on_after(wait):
            async with service.engine.holding(key) as interpreter:
                with anyio.CancelScope(shield=True):
                    report = await _restore(service, tenant, key, name, interpreter)
    except QuotaExceededError as exc:
        raise ValidationError("reset", f"{exc}; nothing was restored") from exc
    if report is None:
        raise BusyError("the conversation was still running a call at the timeout; nothing was restored")
    return report


async def delete_checkpoint(service: Service, key: str, name: str) -> dict[str, Any]:
    """Delete conversation ``key``'s checkpoint ``name`` (files and variables, here and in the object
    store); what was deleted, for the result. ``key`` is the caller's tenant's: another tenant's
    checkpoint of the same conversation id is not found.

    Raises:
        ValidationError: (``checkpoint``) no such checkpoint of this conversation; nothing was deleted.
        WorkspaceError: it could not be removed, or the object store refused.
    """
    storage = service.storage
    freed = await storage.delete_checkpoint(key, name)
    if freed is None:
        names = await storage.checkpoint_names(key)
        raise ValidationError(
            "checkpoint",
            f"no checkpoint {name!r} to delete in this conversation (it has: {', '.join(names) or 'none'})",
        )
    await storage.discard_parked(state_key(key, name))  # the object store's copy
    names = await storage.checkpoint_names(key)
    return {"name": name, "bytes": freed, "checkpoints": names}


async def _restore(
    service: Service, tenant: str, key: str, name: str, interpreter: Interpreter | None
) -> dict[str, Any]:
    """The restore itself, the conversation held: the state checked first, then ``interpreter`` (its
    live one) stopped, then its files and parked state replaced."""
    try:
        state = await service.parked.open(state_key(key, name), tenant)
    except WorkspaceError as exc:
        if str(exc) == TAMPERED:
            raise WorkspaceError(tampered(name)) from exc
        raise
    try:
        if interpreter is not None:
            await interpreter.kill()
        counts = await service.storage.restore_checkpoint(key, name, tenant)
        if state is not None:
            await service.parked.save(key, tenant, state)
        else:
            await service.storage.discard_parked(key)
    finally:
        if state is not None:
            state.close()
    return {"name": name, "files": counts.files, "bytes": counts.bytes, "variables": state is not None}
