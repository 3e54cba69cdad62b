"""Writing one file into a workspace atomically, checking the byte quota while it streams.

The data goes to a temporary file in ``state_dir/uploads/`` (named after the server's pid, out
of the sandbox's sight and out of the quota's count), is fsynced, and is renamed over the old
file in the workspace (the same filesystem): until then the old content is intact, and
concurrent writers of one name never tear it (the last rename wins). A server killed
mid-write leaves its partial file in ``uploads/``, which the next start deletes
(:meth:`WorkspaceStore.sweep_partials`). Every operation is on a directory fd and the file's
own fd, never a path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable

from mcp_sandbox.errors import QuotaExceededError, WorkspaceError
from mcp_sandbox.workspace.files import FileEntry, disk_error
from mcp_sandbox.workspace.reservations import Reservation

__all__ = ["Admit", "PendingWrite"]

Admit = Callable[[FileEntry], None]  # see PendingWrite.commit


class PendingWrite:
    """A file being written: ``write`` chunks, then ``commit``; leaving without commit discards it.

    Build it with :meth:`WorkspaceStore.begin_write`. Not thread-safe: one writer per object.
    """

    def __init__(
        self,
        parent_fd: int,
        leaf: str,
        name: str,
        *,
        staging_fd: int,
        reservation: Reservation,
        owner: tuple[int, int] | None,
        reopen: Callable[[], int] | None = None,
    ) -> None:
        """Create the temporary file in ``staging_fd`` (``uploads/``, on the workspace's filesystem).

        Takes ownership of ``parent_fd``, ``staging_fd`` and ``reservation``. ``reopen``, when
        given, opens the parent afresh at commit, under the conversation's change lock: a born
        session's adoption may have moved the conversation's directory since (the old one is gone).

        ``reservation`` holds this write's share of the conversation's quota: every chunk is
        reserved before it is written, and the quota is checked again at commit (see
        :mod:`mcp_sandbox.workspace.reservations`).

        Raises:
            WorkspaceError: the temporary file cannot be created.
        """
        self.name = name
        self._parent = parent_fd
        self._reopen = reopen
        self._staging = staging_fd
        self._leaf = leaf
        self._reservation = reservation
        self._written = 0
        self._ahead = 0  # bytes reserved by expect() that no chunk has used yet
        # The pid lets a later server tell a dead server's leftovers from a live one's.
        self._temporary = f"{os.getpid()}-{secrets.token_hex(12)}"
        self._fd: int | None = None
        try:
            self._fd = os.open(
                self._temporary,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                0o600,
                dir_fd=staging_fd,
            )
            os.fchmod(self._fd, 0o600)  # whatever the umask; only the sandbox uid and root need it
            if owner is not None:
                os.fchown(self._fd, *owner)  # so sandboxed code can change it
        except OSError as exc:
            self.abort()
            raise disk_error(exc, f"{name}: cannot write in the workspace") from exc

    @property
    def written(self) -> int:
        """Bytes written so far."""
        return self._written

    def expect(self, size: int) -> None:
        """Reserve ``size`` bytes at once, before any arrive (an upload's declared length).

        Concurrent uploads that together would pass the quota are then refused when they begin,
        first come first served, instead of each reserving part of the room chunk by chunk until
        none can finish. Chunks past ``size`` are reserved as they come, as without it.

        Raises:
            QuotaExceededError: no room for ``size`` bytes; the temporary file is deleted.
        """
        try:
            self._reservation.reserve(size)
        except QuotaExceededError:
            self.abort()
            raise
        self._ahead += size

    def write(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append ``chunk``.

        Raises:
            QuotaExceededError: the conversation would go past its byte quota; the temporary
                file is deleted and nothing stored has changed.
            WorkspaceError: the write failed (disk full, ...); the same holds.
        """
        if self._fd is None:
            raise WorkspaceError(f"{self.name}: this write is already finished")
        view = memoryview(chunk).cast("B")
        covered = min(self._ahead, view.nbytes)  # reserved ahead by expect()
        self._ahead -= covered
        try:
            self._reservation.reserve(view.nbytes - covered)
        except QuotaExceededError:
            self.abort()
            raise
        try:
            while view:
                done = os.write(self._fd, view)
                view = view[done:]
                self._written += done
        except OSError as exc:
            self.abort()
            raise disk_error(exc, f"{self.name}: cannot write in the workspace") from exc

    def commit(self, admit: Admit | None = None) -> FileEntry:
        """Flush the file to disk and rename it over ``name``; return what was stored.

        ``admit(entry)``, when given, runs once the local quota check passed, just before the rename
        (under the conversation's lock): among replicas it records the file in the metadata
        database, fenced by the lease and within the quota there; raising refuses the file.

        Raises:
            QuotaExceededError: what the conversation holds now (other writes committed meanwhile)
                leaves no room for the file; nothing stored has changed.
            LeaseLostError: ``admit`` found the conversation's lease lost; the same holds.
            WorkspaceError: the file could not be flushed or renamed (e.g. ``name`` became a
                directory meanwhile); nothing stored has changed.
        """
        if self._fd is None:
            raise WorkspaceError(f"{self.name}: this write is already finished")
        try:
            os.fsync(self._fd)
            info = os.fstat(self._fd)
            with self._reservation.committing(info.st_size, self._replaced_size()):
                if admit is not None:
                    admit(FileEntry(name=self.name, size=info.st_size, mtime=info.st_mtime))
                if self._reopen is not None:
                    fresh = self._reopen()
                    os.close(self._parent)
                    self._parent = fresh
                os.rename(self._temporary, self._leaf, src_dir_fd=self._staging, dst_dir_fd=self._parent)
        except WorkspaceError:  # over the quota, or the lease lost: the file never enters the workspace
            self.abort()
            raise
        except OSError as exc:
            self.abort()
            raise disk_error(exc, f"{self.name}: cannot store the file") from exc
        with contextlib.suppress(OSError):
            os.fsync(self._parent)  # the rename itself survives a crash
        self._close()
        return FileEntry(name=self.name, size=info.st_size, mtime=info.st_mtime)

    def _replaced_size(self) -> int | None:
        """The size of the regular file this one replaces now, or None."""
        try:
            old = os.stat(self._leaf, dir_fd=self._parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        return old.st_size if stat.S_ISREG(old.st_mode) else None

    def abort(self) -> None:
        """Delete the temporary file and release the fds (idempotent)."""
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temporary, dir_fd=self._staging)
        self._close()

    def _close(self) -> None:
        self._reservation.release()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        for fd in (self._parent, self._staging):
            if fd >= 0:
                os.close(fd)
        self._parent = self._staging = -1

    def __enter__(self) -> PendingWrite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.abort()
