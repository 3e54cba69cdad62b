"""Parked sessions: an idle interpreter's variables saved beside its conversation, resumed by its next run.

A park is a fork's snapshot (the runtime's ``fork.py``: modules, functions and classes by value,
every picklable variable) written to ``state_dir/parked/<key>.state`` instead of a fork's
nameless file (:mod:`.fork_state`), then the session's sandbox is released. The next run of the
conversation, in a session born of a ready sandbox, gets the file as a fork's first run does
(a read-only descriptor) and says ``session: resumed``, naming what was not kept. The runtime
maps its large buffers copy-on-write (``MAP_PRIVATE``: nothing is copied until the session
writes it, and nothing it writes reaches the file) instead of reading them into place, so once
loaded the file is renamed ``<key>.held`` (:meth:`ParkedStates.hold`: no longer a state to
resume, still counted in the conversation's quota) and deleted when that session's sandbox is
gone (:meth:`ParkedStates.release`; a server's start deletes what an earlier one left). A fork
of a parked conversation gets no mapping: the source's state is not the fork's to hold. The
host never unpickles it: only the tenant's own sandboxes do.

Integrity: the file ends with a seal (:mod:`.park_seal`: a one-time Poly1305 tag, its key
derived from the server secret's ``parked-state`` key, the conversation's key and its tenant): a
file changed on disk or in the object store, or moved to another conversation (another
tenant's), fails it, is refused with a clear error and deleted, and is never loaded. A resume
checks a state over 256 KiB while the session's runtime maps it (:meth:`ParkedStates.resume`):
the runtime loads nothing of it before the host's verdict, and a refused state's sandbox is
killed, never reused; a smaller one, and a fork's state, are checked before they are sent.
``parked/`` is the server's alone (0700): no sandbox sees it (a resumed one gets a read-only
descriptor of its own state, closed before any of it is loaded, see :mod:`.fork_state`). The
file counts in the conversation's quota (``WorkspaceStore.usage``) and is deleted with the
conversation (``WorkspaceStore.delete``).

With replicas (``object_store_url``), each park is copied to the object store (``ParkedCopies``,
``replicas/parked.py``) once it is in place here, and a resume fetches the store's copy, the one
that counts (a replica that takes a conversation over has none of its own, and one that had the
conversation before may hold a stale one): a kill -9 of the owner loses what changed since the
last park, not everything. A loaded or refused state is deleted in both places.

Why not a process checkpoint (CRIU): see docs/design.md, "Parked sessions".
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import anyio
import anyio.to_thread

from mcp_sandbox.config import WorkspaceSettings
from mcp_sandbox.engine.channel import OFF_LOOP_BYTES
from mcp_sandbox.engine.disk import measure
from mcp_sandbox.engine.fork_state import ForkState, spool_cap
from mcp_sandbox.engine.interpreter import Interpreter
from mcp_sandbox.engine.park_seal import Seal, Sealer
from mcp_sandbox.errors import WorkspaceError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace.secret import derive_key

__all__ = ["PARK_VARIABLES_BYTES", "TAMPERED", "ParkedCopies", "ParkedStates", "park_budget"]

logger = logging.getLogger(__name__)

# The pickled variables a park keeps at most; larger ones are left out, each named on resume.
PARK_VARIABLES_BYTES = 256 << 20
_READ_CHUNK = 1 << 20  # a saved state copied through this much at a time


TAMPERED = (
    "the conversation's parked interpreter state failed its integrity check (it was changed or moved "
    "on disk or in the object store): it was not loaded, and is deleted; nothing ran. Run again to start "
    "a fresh interpreter (the conversation's files are unchanged)"
)


@dataclass
class _Writer:
    """A park's snapshot on its way to its file: the runtime's stdout, chunk by chunk, sealed as it goes."""

    fd: int
    seal: Seal
    cap: int
    size: int = 0
    over: bool = False
    failed: OSError | None = None

    def feed(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.cap:
            self.over = True
        if self.over or self.failed is not None:
            return
        self.seal.update(data)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view) :]
        except OSError as exc:
            self.failed = exc


def park_budget(workspaces: WorkspaceSettings, workspace: Path) -> int:
    """The bytes of variables a park of ``workspace``'s session may keep: what its quota leaves."""
    quota = workspaces.quota_bytes
    try:
        used = measure(workspace, 2 * workspaces.quota_files + 1).bytes
    except OSError:
        used = quota
    return max(0, min(PARK_VARIABLES_BYTES, quota - used))


class ParkedCopies(Protocol):
    """Where parked states are copied for other replicas (the object store). Blocking methods.

    Each raises :class:`~mcp_sandbox.errors.WorkspaceError` when the store refused or cannot be reached.
    """

    def upload(self, key: str, path: Path) -> None:
        """Store the file ``path`` as ``key``'s parked state."""

    def download(self, key: str, path: Path) -> bool:
        """Write ``key``'s stored parked state to the new file ``path``; False if there is none."""

    def delete(self, key: str) -> None:
        """Delete ``key``'s stored parked state, if any."""


class ParkedStates:
    """The parked states of one state directory, signed with the server secret's ``parked-state`` key;
    with ``copies``, each also kept there for other replicas."""

    def __init__(self, layout: StateLayout, secret: bytes, copies: ParkedCopies | None = None) -> None:
        self._layout = layout
        self._sealer = Sealer(derive_key(secret, "parked-state"))
        self._copies = copies

    def exists(self, key: str) -> bool:
        """Whether conversation ``key`` has a parked state."""
        return self._layout.parked_state(key).is_file()

    async def park(self, key: str, tenant: str, interpreter: Interpreter, budget: int) -> str | None:
        """Save ``interpreter``'s variables (about ``budget`` bytes at most) as ``key``'s parked state,
        replacing any earlier one; None when saved, else why not (nothing is left of it then).
        The caller bounds it; cut short, the interpreter is killed (it cannot serve a run)."""
        parked = await anyio.to_thread.run_sync(self._layout.prepare_parked)
        partial = parked / f".{key}.{uuid.uuid4().hex}"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        writer = _Writer(os.open(partial, flags, 0o600), self._sealer.seal(key, tenant), spool_cap(budget))
        kept = False
        try:
            try:
                dumped = await interpreter.snapshot(budget, writer.feed)
            except BaseException:
                await interpreter.kill()
                raise
            if writer.over:
                return f"the snapshot passed the limit of {budget >> 20} MiB of variables"
            if writer.failed is not None:
                return f"the server could not write it ({os.strerror(writer.failed.errno or 0)})"
            if not dumped or not writer.size:
                return "the interpreter could not dump its variables"
            trailer = writer.seal.trailer(writer.size)
            path = self._layout.parked_state(key)
            await anyio.to_thread.run_sync(_finish, writer.fd, trailer, partial, path)
            kept = True
            if self._copies is not None:
                try:
                    await anyio.to_thread.run_sync(self._copies.upload, key, path)
                except WorkspaceError as exc:  # parked here all the same; only a takeover would miss it
                    logger.warning("a parked session's state could not be copied to the object store: %s", exc)
            return None
        finally:
            os.close(writer.fd)
            if not kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)

    async def save(self, key: str, tenant: str, state: ForkState) -> None:
        """Keep ``state`` (a snapshot as a fork carries it: another key's state, opened, or a live
        session's, spooled) as ``key``'s parked state, signed for ``key`` and ``tenant``, replacing any;
        copied to the object store as a park is (a checkpoint, saved or restored).

        Raises:
            WorkspaceError: it cannot be written here (nothing is left of it).
        """
        path = await anyio.to_thread.run_sync(self._save, key, tenant, state)
        if self._copies is not None:
            try:
                await anyio.to_thread.run_sync(self._copies.upload, key, path)
            except WorkspaceError as exc:  # kept here all the same; only a takeover would miss it
                logger.warning("a saved interpreter state could not be copied to the object store: %s", exc)

    def _save(self, key: str, tenant: str, state: ForkState) -> Path:
        try:
            partial = self._layout.prepare_parked() / f".{key}.{uuid.uuid4().hex}"
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(partial, flags, 0o600)
        except OSError as exc:
            raise WorkspaceError(f"the interpreter state cannot be saved: {exc.strerror}") from exc
        writer = _Writer(fd, self._sealer.seal(key, tenant), state.size)
        kept = False
        try:
            while writer.size < state.size and (chunk := state.read(writer.size, _READ_CHUNK)):
                writer.feed(chunk)
            if writer.failed is not None or writer.size != state.size:
                why = "it was cut short" if writer.failed is None else os.strerror(writer.failed.errno or 0)
                raise WorkspaceError(f"the interpreter state cannot be saved: {why}")
            path = self._layout.parked_state(key)
            _finish(fd, writer.seal.trailer(writer.size), partial, path)
            kept = True
            return path
        except OSError as exc:
            raise WorkspaceError(f"the interpreter state cannot be saved: {exc.strerror}") from exc
        finally:
            os.close(fd)
            if not kept:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(partial)

    async def open(self, key: str, tenant: str, *, mapped: bool = False) -> ForkState | None:
        """``key``'s parked state, checked, as a fork's state to send into its resumed session (the
        caller closes it); None when there is none. The file stays until :meth:`discard` or
        :meth:`hold`. ``mapped``: the session may map it (its run's caller holds it, see :meth:`hold`).

        Raises:
            WorkspaceError: it failed its integrity check (:data:`TAMPERED`; the file is deleted),
                or it cannot be read.
        """
        state = await anyio.to_thread.run_sync(self._open, key, tenant, True)
        if state is not None:
            state.mapped = mapped
        return state

    async def resume(self, key: str, tenant: str) -> ForkState | None:
        """``key``'s parked state for its resumed session to map. One of 256 KiB or less is checked
        now, as :meth:`open` checks it (microseconds: less than a frame's round trip); a larger one's
        ``verdict`` checks it (every byte, in a worker thread) while the session's runtime maps it,
        which loads nothing of it before the host's verdict (:meth:`.Interpreter.run`); a state that
        fails is deleted either way. None when there is none; the caller closes it.

        Raises:
            WorkspaceError: a small state failed its check, or its trailer is no seal at all
                (:data:`TAMPERED`; deleted), or it cannot be read.
        """
        state = await anyio.to_thread.run_sync(self._open, key, tenant, False)
        if state is not None:
            state.mapped = True
            if state.size > OFF_LOOP_BYTES:
                state.verdict = functools.partial(self._verdict, key, tenant, state)
        return state

    async def _verdict(self, key: str, tenant: str, state: ForkState) -> bool:
        """Whether ``state`` (:meth:`resume`'s, still open) is ``key``'s, sealed by this server; if not, deleted.
        In a worker thread: ``cryptography``'s Poly1305 holds the GIL for each update, but not the reads
        between them, so other runs' frames are served meanwhile (on the loop, 50 MB would hold them
        for all of its 13 ms of CPU). A file that cannot be read is refused but kept, with the reason
        in ``state.unreadable``: an I/O error says nothing of what the file holds."""
        try:
            checked = await anyio.to_thread.run_sync(self._sealer.check, state.fd, key, tenant)
        except OSError as exc:
            state.unreadable = _unreadable(exc)
            return False
        if checked == state.size:
            return True
        await anyio.to_thread.run_sync(self.discard, key)
        return False

    def _open(self, key: str, tenant: str, check: bool) -> ForkState | None:
        """``key``'s parked state, opened; checked if ``check`` or if it is small (else its check is the caller's)."""
        path = self._layout.parked_state(key)
        try:
            if self._copies is not None and not self._fetch(key, path):
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise WorkspaceError(_unreadable(exc)) from exc
        try:
            size = self._sealer.sealed_size(fd)
            if size is not None and (check or size <= OFF_LOOP_BYTES):
                size = self._sealer.check(fd, key, tenant)
        except OSError as exc:
            os.close(fd)
            raise WorkspaceError(_unreadable(exc)) from exc
        except BaseException:
            os.close(fd)
            raise
        if size is None:
            os.close(fd)
            self.discard(key)
            raise WorkspaceError(TAMPERED)
        return ForkState(fd, size)

    def _fetch(self, key: str, path: Path) -> bool:
        """Make ``path`` the object store's copy of ``key``'s parked state; whether there is one.

        With replicas the store's copy is the one: another replica may have resumed and parked the
        conversation since this one last did, so a copy here may be stale (it is deleted when the
        store has none). Where the store cannot be reached, the copy here is used, if any.
        """
        assert self._copies is not None
        partial = self._layout.prepare_parked() / f".{key}.{uuid.uuid4().hex}"
        try:
            try:
                found = self._copies.download(key, partial)
            except WorkspaceError as exc:
                logger.warning("a parked state could not be fetched (the local one is used): %s", exc)
                return path.exists()
            if not found:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                return False
            os.replace(partial, path)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    def discard(self, key: str) -> None:
        """Delete ``key``'s parked state, if any (loaded, reset, or refused), here and in the object store
        (where the store cannot be reached, logged: a takeover could then resume that state)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._layout.parked_state(key))
        if self._copies is not None:
            try:
                self._copies.delete(key)
            except WorkspaceError as exc:
                logger.warning("a parked session's state could not be deleted from the object store: %s", exc)

    def hold(self, key: str) -> None:
        """``key``'s resumed session loaded its parked state (and may map it): keep the file as
        ``<key>.held`` until :meth:`release`, counted in the quota, and delete it everywhere else."""
        with contextlib.suppress(FileNotFoundError):
            os.replace(self._layout.parked_state(key), self._layout.held_state(key))
        self.discard(key)

    async def release(self, key: str) -> None:
        """Delete what :meth:`hold` kept of ``key``: its session's sandbox is gone (shielded from cancellation)."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_unlink, self._layout.held_state(key))

    def sweep(self) -> None:
        """Delete every state held for a session (a server's start: no session is live)."""
        with contextlib.suppress(FileNotFoundError), os.scandir(self._layout.parked) as entries:
            for entry in entries:
                if entry.name.endswith(".held"):
                    _unlink(Path(entry.path))


def _unreadable(error: OSError) -> str:
    return f"the conversation's parked interpreter state cannot be read: {error.strerror or error}"


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _finish(fd: int, trailer: bytes, partial: os.PathLike[str], path: os.PathLike[str]) -> None:
    """Append the trailer, make the file durable, and put it in place atomically."""
    os.write(fd, trailer)
    os.fsync(fd)
    os.replace(partial, path)
