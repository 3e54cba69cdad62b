"""A workspace's index of packs written only by its lease holder: conditional writes, epochs, a swept grace.

The index names the packs that hold a workspace's small files (:mod:`.packs`), so whoever writes
it last decides what the workspace is. An owner stalled past its lease between its last fence
check and its index write (a SIGSTOP, a long GC, a cut network) would otherwise replace the new
owner's index with its own: the new owner's acknowledged files gone, and a pack named that the
new owner's restore had deleted as an orphan. Three rules close that window:

* the index is replaced only by a conditional write on the ETag it was read with (``If-Match``;
  ``If-None-Match: *`` where there was none), which S3, MinIO and SeaweedFS honour: of two
  writers that read the same index, one wins; the other learns it lost (412);
* the index records its writer's lease epoch: a writer that reads an index of a later epoch has
  lost the lease, and a replica that takes a conversation over writes its epoch into the index
  (:func:`seal`) before it sweeps anything, so every older writer's conditional write fails;
* the fence is checked again after the index write and before anything is acknowledged, and
  packs no index names are deleted only once older than a grace of several lease times.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import threading
from collections.abc import Iterable

from mcp_sandbox.errors import LeaseLostError, WorkspaceError
from mcp_sandbox.replicas.objects import ObjectStore, StoredObject
from mcp_sandbox.replicas.packs import INDEX, Index
from mcp_sandbox.workspace.fencing import LOST, Check

__all__ = ["STOP_AFTER_INDEX", "STOP_BEFORE_INDEX", "IndexMoved", "aged", "replace", "seal"]

# Tests only: ``<file name>`` makes a replica stop itself (SIGSTOP) just before the index write of a
# write-back that stores that file (:data:`STOP_AFTER_INDEX`: once that write is in the store,
# before the fence is checked again), so a test can resume it after another replica took over.
STOP_BEFORE_INDEX = "MCP_SANDBOX_TEST_STOP_BEFORE_INDEX"
STOP_AFTER_INDEX = "MCP_SANDBOX_TEST_STOP_AFTER_INDEX"


class IndexMoved(WorkspaceError):
    """The index changed in the store while a restore read it: the restore reads it again."""


def stop_point(names: Iterable[str], where: str = STOP_BEFORE_INDEX) -> None:
    """Stop this process here (SIGSTOP) if the tests asked to, at ``where``, for one of ``names``
    (see :data:`STOP_BEFORE_INDEX`)."""
    wanted = os.environ.get(where)
    if wanted and wanted in names:
        # Sent to this thread: a SIGSTOP sent to the process is taken by its main thread, and this one
        # runs on until that thread stops it, long enough to write the index on a busy machine.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def replace(
    objects: ObjectStore, under: str, before: Index, after: Index, epoch: int, fence: Check, names: Iterable[str] = ()
) -> None:
    """Write ``after`` as the index under ``under`` in place of ``before`` (as read, with its ETag),
    marked with lease ``epoch`` (0: one server), then check ``fence`` again; ``names``: the files
    the write-back stores or deletes (for :func:`stop_point`).

    Raises:
        LeaseLostError: a later epoch wrote the index, another write came first, or the fence
            failed after the write (nothing may be acknowledged: the client sends it again).
        WorkspaceError: the store refused or could not be reached.
    """
    if epoch and before.epoch > epoch:
        raise LeaseLostError(LOST)
    after.epoch = max(epoch, before.epoch)
    stop_point(names)
    if not objects.put_if(under + INDEX, after.encode(), before.etag):
        raise LeaseLostError(LOST)
    stop_point(names, STOP_AFTER_INDEX)
    fence()


def seal(objects: ObjectStore, under: str, index: Index, epoch: int) -> None:
    """Write ``epoch`` into the index ``index`` read under ``under`` (a replica that just took the
    conversation's lease in that epoch), so that no writer of an earlier epoch can replace it.

    Raises:
        IndexMoved: the index changed since it was read (read it again).
        LeaseLostError: a later epoch wrote it (this replica lost the lease meanwhile).
        WorkspaceError: the store refused or could not be reached.
    """
    if index.epoch > epoch:
        raise LeaseLostError(LOST)
    if index.epoch == epoch:
        return
    sealed = index.copy()
    sealed.epoch = epoch
    if not objects.put_if(under + INDEX, sealed.encode(), index.etag):
        raise IndexMoved("the workspace's index changed in the object store while it was restored")


def aged(items: Iterable[StoredObject], grace: float, now: float) -> list[str]:
    """The names of ``items`` last written more than ``grace`` seconds before ``now`` (a time the
    store does not give counts as young: kept); every one with no grace (one server: one writer)."""
    if grace <= 0:
        return [item.name for item in items]
    found: list[str] = []
    for item in items:
        with contextlib.suppress(ValueError):
            written = datetime.datetime.fromisoformat(item.modified.replace("Z", "+00:00"))
            if written.tzinfo is not None and written.timestamp() < now - grace:
                found.append(item.name)
    return found
