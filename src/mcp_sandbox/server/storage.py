"""A conversation's storage as calls see it: its directory, its metadata rows, its object-store copy.

Each step reaches a disk, a database or the object store, so each runs in a worker thread
here: the tools, the routes and the service's retention await :class:`Storage`'s methods.
Among replicas, what a call records is fenced by the lease it runs under
(:mod:`mcp_sandbox.workspace.fencing`); the earlier code runner's imported files are adopted by
the conversation that first names them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from pathlib import Path

import anyio
import anyio.to_thread

from mcp_sandbox import tracing
from mcp_sandbox.config import WorkspaceSettings
from mcp_sandbox.engine.parking import ParkedStates
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.events import EventHub, FilesUnsaved
from mcp_sandbox.replicas.leases import Leases
from mcp_sandbox.replicas.mirror import Changes, Mirror
from mcp_sandbox.replicas.runner_records import record_names
from mcp_sandbox.server.busy import Busy
from mcp_sandbox.workspace import ConversationRecord, FileEntry, Listing, Metadata, WorkspaceStore, sweep
from mcp_sandbox.workspace.checkpoints import Checkpoints
from mcp_sandbox.workspace.cloning import CloneCounts
from mcp_sandbox.workspace.fencing import Fence
from mcp_sandbox.workspace.runner_data import RunnerData
from mcp_sandbox.workspace.writing import Admit

__all__ = ["Storage"]

logger = logging.getLogger(__name__)


class Storage:
    """The conversations' files and records (built by :func:`.openers.open_storage`). ``secret``: the
    server's (shared through the database when database_url is set): keys derive from it;
    ``mirror``: the object store's copy (None: local disk only); ``leases``: this replica's, which
    fence what calls record (None: one server); ``runner_data``: the earlier runner's data,
    imported at start; ``parked``: the parked interpreter states (sessions idle, and checkpoints'
    variables), signed; ``checkpoints``: the checkpoints' files."""

    def __init__(
        self,
        workspaces: WorkspaceStore,
        metadata: Metadata,
        events: EventHub,
        busy: Busy,
        *,
        secret: bytes,
        mirror: Mirror | None,
        leases: Leases | None,
        runner_data: RunnerData | None,
        parked: ParkedStates,
        checkpoints: Checkpoints,
    ) -> None:
        self.workspaces = workspaces
        self.metadata = metadata
        self.secret = secret
        self.mirror = mirror
        self.leases = leases
        self.runner_data = runner_data
        self.parked = parked
        self.checkpoints = checkpoints
        self._events = events
        self._busy = busy

    def fence(self, key: str) -> Fence | None:
        """The lease conversation ``key``'s writes are fenced by now (:mod:`.workspace.fencing`); None: one server."""
        return None if self.leases is None else Fence(self.leases.table.me, self.leases.epoch(key))

    async def touch(self, key: str, tenant: str, conversation: str | None = None) -> Path:
        """Create the conversation's directory if needed and mark it used now (call it within
        :meth:`.Busy.using`); ``conversation``, its id, adopts the earlier runner's files imported for it.

        Raises:
            WorkspaceError: either could not be done (a full disk): a directory this call made
                is removed again, so no conversation has a directory without its row.
        """
        existed = await anyio.to_thread.run_sync(self.workspaces.directory(key).is_dir)
        # First seen here: another server of the store may have written it (replicas restore per lease).
        if not existed and self.mirror is not None and self.leases is None:
            restored = await anyio.to_thread.run_sync(
                self.workspaces.gate.run, key, self.mirror.restore_new, key, tenant
            )
            self._count_unsaved(key, restored)
        directory = await anyio.to_thread.run_sync(self.workspaces.ensure, key, tenant)
        try:
            await anyio.to_thread.run_sync(self.metadata.touch_conversation, key, tenant, time.time())
        except WorkspaceError:
            if not existed and self._busy.calls(key) <= 1:  # no other request of this conversation in flight
                with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                    await anyio.to_thread.run_sync(os.rmdir, directory)  # only while empty
            raise
        if conversation is not None and self.runner_data is not None:
            await self._adopt(key, tenant, conversation, self.runner_data)
        return directory

    async def _adopt(self, key: str, tenant: str, conversation: str, data: RunnerData) -> None:
        adopted = await anyio.to_thread.run_sync(data.adopt, tenant, conversation, key)
        if adopted and self.mirror is not None:  # its old links answer through every replica
            digest = data.digest(conversation)
            names = await anyio.to_thread.run_sync(data.names_of, digest)
            with contextlib.suppress(WorkspaceError):  # the store's refusal is logged; they stay local
                if names is not None:  # first: a replica finding the link finds what it may serve
                    await anyio.to_thread.run_sync(record_names, self.mirror.objects, digest, names)
                await anyio.to_thread.run_sync(self.mirror.record_link, digest, key)

    async def refresh_files(self, key: str, fence: Fence | None = None) -> list[FileEntry]:
        """List the conversation's files (never following the sandbox's symlinks) and record them, fenced
        by ``fence`` (default: :meth:`fence`; LeaseLostError: the lease is lost, nothing was recorded).

        A listing the metadata database cannot record (a full disk) is still returned: the index
        is brought up to date by the next listing, and retention measures the disk anyway.
        """
        lease = fence or self.fence(key)
        return await anyio.to_thread.run_sync(self.metadata.record_listing, key, self.workspaces.list_files, lease)

    async def write_back(self, key: str, fence: Fence | None = None) -> tuple[str, ...]:
        """Copy conversation ``key``'s changed files to the object store (no-op without one), fenced by
        ``fence`` (default: :meth:`fence`); call it before answering a run or acknowledging an upload.
        Returns the files it could not store (counted): the rest are stored, and the index with them.

        Raises:
            WorkspaceError: the store refused or could not be reached; LeaseLostError: the lease is lost.
        """
        if self.mirror is None:
            return ()
        check = self.metadata.fence_check(key, lease := fence or self.fence(key))
        with tracing.span("mcp_sandbox.write_back") as span:
            changes = await anyio.to_thread.run_sync(self.mirror.write_back, key, check, lease.epoch if lease else 0)
            if span is not None:
                span.set_attributes(_moved(changes))
        self._count_unsaved(key, changes)
        return changes.unsaved

    async def restore_files(self, key: str, epoch: int) -> None:
        """Make conversation ``key``'s local directory equal to the object store's copy (no-op without
        one): a replica taking over a conversation another one served calls it first, in lease ``epoch``.

        Raises:
            WorkspaceError: the store or the disk refused.
        """
        if self.mirror is not None:
            tenant = await anyio.to_thread.run_sync(self.metadata.tenant_of, key)
            restore = functools.partial(self.mirror.restore, key, tenant, epoch)
            restored = await anyio.to_thread.run_sync(self.workspaces.gate.run, key, restore)
            self._count_unsaved(key, restored)

    async def sweep(self, limits: WorkspaceSettings) -> None:
        """Apply the retention policy now; conversations busy here (:class:`.Busy`), or leased by any
        replica, are spared."""
        forget = None if self.mirror is None else self.mirror.forget
        try:
            leased = set() if self.leases is None else await anyio.to_thread.run_sync(self.leases.live)
        except WorkspaceError as exc:
            logger.warning("retention skipped: the conversations other replicas use cannot be read: %s", exc)
            return
        busy = self._busy.from_thread(leased)
        report = await anyio.to_thread.run_sync(
            lambda: sweep(self.workspaces, self.metadata, limits, time.time(), busy, forget)
        )
        if report.removed or report.failed or report.history_pruned:
            logger.info("retention: %s", report.summary())

    # One step each, one hop each: what the tools and the routes read and change.

    async def conversations_of(self, tenant: str) -> list[ConversationRecord]:
        """``tenant``'s conversations, most recently used first (WorkspaceError: the database refused)."""
        return await anyio.to_thread.run_sync(self.metadata.conversations_of, tenant)

    async def list_files(self, key: str) -> Listing:
        """The conversation's files on disk, nothing recorded (:meth:`refresh_files` records them)."""
        return await anyio.to_thread.run_sync(self.workspaces.list_files, key)

    async def write_file(self, key: str, name: str, content: bytes, admit: Admit | None) -> FileEntry:
        """Store ``content`` as ``name``, atomically, admitted by ``admit`` (:meth:`.WorkspaceStore.write_file`)."""
        return await anyio.to_thread.run_sync(self.workspaces.write_file, key, name, iter([content]), None, admit)

    async def take_state_lost(self, key: str) -> str | None:
        """Why conversation ``key``'s interpreter was lost since its last run (a lease lapsed, its replica
        stopped), taken: said once; None when it was not, or on one server.

        Raises:
            WorkspaceError: the database cannot say now (the mark stays).
        """
        return None if self.leases is None else await anyio.to_thread.run_sync(self.leases.table.take_lost, key)

    async def checkpoint_names(self, key: str) -> list[str]:
        return await anyio.to_thread.run_sync(self.checkpoints.names, key)

    async def save_checkpoint(self, key: str, name: str, tenant: str) -> CloneCounts:
        return await anyio.to_thread.run_sync(self.checkpoints.save, key, name, tenant)

    async def restore_checkpoint(self, key: str, name: str, tenant: str) -> CloneCounts:
        return await anyio.to_thread.run_sync(self.checkpoints.restore, key, name, tenant)

    async def delete_checkpoint(self, key: str, name: str) -> int | None:
        """Delete checkpoint ``name`` of ``key``; the bytes freed, None: no such checkpoint."""
        return await anyio.to_thread.run_sync(self.checkpoints.delete, key, name)

    async def fork(self, source: str, key: str, tenant: str) -> CloneCounts:
        """Copy conversation ``source``'s files into the new conversation ``key``."""
        return await anyio.to_thread.run_sync(self.workspaces.fork, source, key, tenant)

    async def fork_checkpoint(self, source: str, name: str, key: str, tenant: str) -> CloneCounts:
        """Copy checkpoint ``name`` of ``source`` as the new conversation ``key``'s files."""
        return await anyio.to_thread.run_sync(self.checkpoints.fork, source, name, key, tenant)

    async def discard_parked(self, key: str) -> None:
        """Delete the parked state ``key`` (a conversation's, or a checkpoint's), here and in the object store."""
        await anyio.to_thread.run_sync(self.parked.discard, key)

    def _count_unsaved(self, key: str, changes: Changes) -> None:
        if changes.unsaved:
            self._events.emit(FilesUnsaved(key, "write_back", len(changes.unsaved)))
        if changes.lost:
            self._events.emit(FilesUnsaved(key, "restore", len(changes.lost)))


def _moved(changes: Changes) -> dict[str, tracing.AttributeValue]:
    """A write-back span's attributes: counts only (never a file's name or contents)."""
    return {
        "mcp_sandbox.files.transferred": changes.transferred,
        "mcp_sandbox.files.bytes": changes.bytes,
        "mcp_sandbox.files.deleted": changes.deleted,
        "mcp_sandbox.files.unsaved": len(changes.unsaved),
    }
