"""A conversation's named checkpoints: copies of its files at ``checkpoints/<key>/<name>/``.

A checkpoint is a fork's copy (:mod:`.cloning`: reflinked where the filesystem can, never
following a link, owned by the tenant's uid) of the conversation's directory, made under its
change lock (:mod:`.changes`) like every change. Its variables, where it has them, are a parked
state (``engine/parking.py``: HMAC-checked, copied to the object store with replicas) under the
key :func:`state_key` derives from the conversation's key and the name, so they are bound to both
and to the tenant. ``checkpoints/`` is the server's alone (0700): no sandbox sees it.

A checkpoint's bytes (files and state) count in its conversation's usage (``WorkspaceStore.usage``:
its ``quota_bytes``, the tenant's recorded bytes and retention) and are deleted with it
(:func:`delete_checkpoints`). Names are short and plain (:func:`check_checkpoint_name`), so a
name is a directory name as it is; a conversation keeps ``max_checkpoints`` at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from mcp_sandbox.config import WorkspaceSettings
from mcp_sandbox.errors import ValidationError, WorkspaceError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.tenant_uids import TenantUids
from mcp_sandbox.workspace.changes import ChangeGate
from mcp_sandbox.workspace.cloning import FORK_PREFIX, CloneCounts, fork_directory
from mcp_sandbox.workspace.files import DIR_FLAGS, Usage, Walk, disk_error
from mcp_sandbox.workspace.partials import MAX_DEPTH
from mcp_sandbox.workspace.removal import remove_tree

__all__ = [
    "CheckpointCopies",
    "Checkpoints",
    "check_checkpoint_name",
    "checkpoint_bytes",
    "checkpoint_names",
    "delete_checkpoints",
    "state_key",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def check_checkpoint_name(argument: str, value: str) -> str:
    """``value`` if it is a checkpoint's name: 1 to 64 letters, digits, ``.``, ``_`` or ``-``, a letter or digit first.

    Raises:
        ValidationError: (``argument``) it is not.
    """
    if not _NAME.match(value):
        raise ValidationError(
            argument,
            "a checkpoint's name is 1 to 64 letters, digits, '.', '_' or '-', beginning with a letter or digit",
        )
    return value


def state_key(key: str, name: str) -> str:
    """The parked-state key of conversation ``key``'s checkpoint ``name`` (never a conversation's key)."""
    return hashlib.sha256(b"mcp-sandbox checkpoint\0" + key.encode() + b"\0" + name.encode()).hexdigest()


def checkpoint_names(layout: StateLayout, key: str) -> list[str]:
    """The names of conversation ``key``'s checkpoints here, sorted."""
    try:
        with os.scandir(layout.checkpoints / key) as entries:
            return sorted(entry.name for entry in entries if _NAME.match(entry.name) and entry.is_dir())
    except FileNotFoundError:
        return []


def checkpoint_bytes(layout: StateLayout, key: str, quota_files: int) -> int:
    """What conversation ``key``'s checkpoints hold: their files' ``st_size`` and their states' sizes.

    Raises:
        WorkspaceError: they cannot be measured.
    """
    total = 0
    try:
        for name in checkpoint_names(layout, key):
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(layout.parked_state(state_key(key, name))).st_size
        root = os.open(layout.checkpoints / key, DIR_FLAGS)
    except FileNotFoundError:
        return total
    except OSError as exc:
        raise WorkspaceError(f"the conversation's checkpoints cannot be measured: {exc.strerror}") from exc
    try:
        walk = Walk(root, max_depth=MAX_DEPTH + 1, max_entries=(2 * quota_files + 1000) * 16, servable_only=False)
        total += sum(info.st_size for _, info in walk)
    except OSError as exc:
        raise WorkspaceError(f"the conversation's checkpoints cannot be measured: {exc.strerror}") from exc
    finally:
        os.close(root)
    return total


def delete_checkpoints(layout: StateLayout, key: str) -> None:
    """Delete conversation ``key``'s checkpoints here, files and states (the caller deletes the conversation).

    Raises:
        OSError: they could not be removed completely.
    """
    for name in checkpoint_names(layout, key):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(layout.parked_state(state_key(key, name)))
    with contextlib.suppress(FileNotFoundError):
        remove_tree(layout.checkpoints / key)


class CheckpointCopies(Protocol):
    """Where checkpoints' files are copied for other replicas (the object store). Blocking methods.

    Each raises :class:`~mcp_sandbox.errors.WorkspaceError` when the store refused or cannot be reached.
    """

    def upload(self, key: str, name: str, directory: Path) -> None:
        """Store ``directory`` as ``key``'s checkpoint ``name``."""

    def download(self, key: str, name: str, directory: Path) -> bool:
        """Make the new ``directory`` ``key``'s stored checkpoint ``name``; False if there is none."""

    def names(self, key: str) -> list[str]:
        """The names of ``key``'s stored checkpoints."""

    def delete(self, key: str, names: Iterable[str]) -> None:
        """Delete ``key``'s stored checkpoints ``names``, if there."""


class Checkpoints:
    """The checkpoints' files of every conversation of one state directory; with ``copies``, each
    also kept there for other replicas, and fetched from there when not here. Blocking methods
    (worker threads)."""

    def __init__(
        self,
        workspaces: WorkspaceSettings,
        layout: StateLayout,
        uids: TenantUids,
        gate: ChangeGate,
        copies: CheckpointCopies | None = None,
    ) -> None:
        """``workspaces``: the quotas; ``layout`` and ``uids``: the server's, shared with its workspace store."""
        self._workspaces = workspaces
        self._layout = layout
        self._gate = gate
        self._uids = uids
        self._copies = copies

    def names(self, key: str) -> list[str]:
        """The names of conversation ``key``'s checkpoints (here, and in the object store), sorted."""
        here = checkpoint_names(self._layout, key)
        if self._copies is None:
            return here
        try:
            return sorted({*here, *self._copies.names(key)})
        except WorkspaceError as exc:
            logger.warning("the object store's checkpoints could not be listed (this replica's are): %s", exc)
            return here

    def fetch(self, key: str, name: str) -> None:
        """Bring checkpoint ``name`` of conversation ``key`` here from the object store if it is not here.

        Raises:
            WorkspaceError: the store could not give it.
        """
        path = self.path(key, name)
        if self._copies is None or path.is_dir():
            return
        try:
            self._layout.prepare_checkpoints()
            path.parent.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, "cannot create the conversation's checkpoints") from exc
        made = path.parent / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        try:
            if self._copies.download(key, name, made):
                with contextlib.suppress(FileExistsError, OSError):  # fetched meanwhile: that one is as good
                    os.rename(made, path)
        finally:
            with contextlib.suppress(OSError):
                remove_tree(made)

    def bytes(self, key: str) -> int:
        """What conversation ``key``'s checkpoints hold (see :func:`checkpoint_bytes`)."""
        return checkpoint_bytes(self._layout, key, self._workspaces.quota_files)

    def path(self, key: str, name: str) -> Path:
        """Where checkpoint ``name`` of conversation ``key`` keeps its files (whether or not it exists)."""
        return self._layout.checkpoints / key / name

    def _quota(self) -> Usage:
        return Usage(bytes=self._workspaces.quota_bytes, files=self._workspaces.quota_files)

    def measure(self, directory: Path) -> Usage:
        """The regular files below ``directory`` and their ``st_size`` (nothing when it does not exist).

        Raises:
            WorkspaceError: it cannot be read.
        """
        try:
            root = os.open(directory, DIR_FLAGS)
        except FileNotFoundError:
            return Usage(bytes=0, files=0)
        except OSError as exc:
            raise WorkspaceError(f"the conversation's files cannot be measured: {exc.strerror}") from exc
        try:
            walk = Walk(root, max_depth=MAX_DEPTH, max_entries=2 * self._quota().files + 1000, servable_only=False)
            total = files = 0
            for _, info in walk:
                total += info.st_size
                files += 1
        except OSError as exc:
            raise WorkspaceError(f"the conversation's files cannot be measured: {exc.strerror}") from exc
        finally:
            os.close(root)
        return Usage(bytes=total, files=files, complete=walk.complete)

    def held(self, key: str, name: str) -> int:
        """What checkpoint ``name`` of conversation ``key`` holds, files and state (0: none; fetched
        from the object store first where it is not here).

        Raises:
            WorkspaceError: it cannot be measured, or fetched.
        """
        self.fetch(key, name)
        try:
            state = os.lstat(self._layout.parked_state(state_key(key, name))).st_size
        except FileNotFoundError:
            state = 0
        return state + self.measure(self.path(key, name)).bytes

    def save(self, key: str, name: str, tenant: str) -> CloneCounts:
        """Copy conversation ``key``'s files as its checkpoint ``name``, replacing one of that name; no
        upload lands meanwhile.

        Raises:
            WorkspaceError: the copy failed (a full disk); the checkpoint of that name is as it was.
        """
        workspace = self._layout.workspaces / key
        try:
            self._layout.prepare_checkpoints()
            (self._layout.checkpoints / key).mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise disk_error(exc, "cannot create the conversation's checkpoints") from exc
        made = self._layout.checkpoints / key / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        with self._gate.changing(key):
            if not workspace.is_dir():
                try:
                    os.mkdir(made, 0o700)
                except OSError as exc:
                    raise disk_error(exc, "cannot create the checkpoint") from exc
                counts = CloneCounts()
            else:
                files = self.measure(workspace)
                counts = fork_directory(
                    workspace, made, self._uids.ids(tenant), files, self._quota(), max_depth=MAX_DEPTH
                )
        if self._copies is not None:  # the new copy, still this call's alone
            try:
                self._copies.upload(key, name, made)
            except WorkspaceError as exc:  # saved here all the same; only a takeover would miss it
                logger.warning("a checkpoint's files could not be copied to the object store: %s", exc)
            except BaseException:
                with contextlib.suppress(OSError):
                    remove_tree(made)
                raise
        with self._gate.changing(key):  # no fork or restore is reading the one it replaces
            _replace(made, self.path(key, name))
        return counts

    def restore(self, key: str, name: str, tenant: str) -> CloneCounts:
        """Make conversation ``key``'s files its checkpoint ``name``'s again; no upload lands meanwhile.
        No sandbox may be running in the conversation (the caller holds its session, stopped).

        Raises:
            WorkspaceError: the copy failed; the conversation's files are as they were.
        """
        workspace = self._layout.workspaces / key
        made = self._layout.workspaces / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        self.fetch(key, name)
        with self._gate.changing(key):
            counts = self.copy(key, name, made, tenant)
            _replace(made, workspace)
        return counts

    def delete(self, key: str, name: str) -> int | None:
        """Delete checkpoint ``name`` of conversation ``key``: its files and its variables here, its
        files in the object store (its variables there are a parked state: the caller's); the bytes
        freed here, None if it had none here nor there. No fork or restore is reading it meanwhile.

        Raises:
            WorkspaceError: it could not be removed, or the object store refused.
        """
        stored = self._copies is not None and name in self._copies.names(key)
        path = self.path(key, name)
        aside = path.parent / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
        with self._gate.changing(key):
            try:
                os.rename(path, aside)
                here = True
            except FileNotFoundError:
                here = False
            except OSError as exc:
                raise disk_error(exc, "cannot delete the checkpoint") from exc
        state = self._layout.parked_state(state_key(key, name))
        try:
            freed = self.measure(aside).bytes if here else 0
            with contextlib.suppress(FileNotFoundError):
                freed += os.lstat(state).st_size
                os.unlink(state)
                here = True
            if aside.exists():
                remove_tree(aside)
        except OSError as exc:
            raise disk_error(exc, "cannot delete the checkpoint") from exc
        if self._copies is not None and stored:
            self._copies.delete(key, [name])
        return freed if here or stored else None

    def fork(self, key: str, name: str, target: str, tenant: str) -> CloneCounts:
        """Copy checkpoint ``name`` of conversation ``key`` as the new conversation ``target``'s files.

        Raises:
            WorkspaceError: ``target`` exists, or the copy failed; nothing is left of it.
        """
        self.fetch(key, name)
        with self._gate.changing(key, target):
            return self.copy(key, name, self._layout.workspaces / target, tenant)

    def copy(self, key: str, name: str, target: Path, tenant: str) -> CloneCounts:
        """Copy checkpoint ``name`` of conversation ``key`` to the new directory ``target`` (a fork's).

        Raises:
            WorkspaceError: ``target`` exists, or the copy failed; nothing is left of it.
        """
        usage = Usage(bytes=0, files=0)  # its bytes were counted when it was saved
        return fork_directory(
            self.path(key, name), target, self._uids.ids(tenant), usage, self._quota(), max_depth=MAX_DEPTH
        )


def _replace(made: Path, path: Path) -> None:
    """Put directory ``made`` at ``path``, removing what was there (moved aside first, back on a failure)."""
    aside = path.parent / f"{FORK_PREFIX}{os.getpid()}-{secrets.token_hex(8)}"
    moved = False
    try:
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, aside)
            moved = True
        try:
            os.rename(made, path)
        except OSError:
            if moved:
                os.rename(aside, path)
            raise
    except OSError as exc:
        with contextlib.suppress(OSError):
            remove_tree(made)
        raise disk_error(exc, "cannot put the copied files in place") from exc
    if moved:
        with contextlib.suppress(OSError):
            remove_tree(aside)
