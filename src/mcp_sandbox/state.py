"""The state directory's layout: every path under ``state_dir``, and the modes they are made with.

::

    <state_dir>/                0711  the server's own: made 0700, opened to traversal (never listing)
                                      so the sandbox uid can reach runs/<name> and workspaces/<key>;
                                      0710 with the sandbox gid as its group when the server is root
                                      (then runs/ and workspaces/ too): other host users cannot
                                      reach a workspace even if a run opened its mode
      secret                    0600  the server secret (workspace/secret.py)
      metadata.sqlite3          0600  the metadata index, with its -wal and -shm (workspace/sqlite_db.py;
                                      none when database_url names PostgreSQL)
      seccomp-<digest>.json           the OCI seccomp profile of container backends, named by content
      tenant-uids.json          0600  each tenant's host uid, assigned once, with its .lock (tenant_uids.py)
      volume.xfs                0600  with workspaces.volume_bytes (as root): a sparse XFS image with
                                      reflinks (volume.py), mounted by one process at a time
      volume.lock               0600    (this lock held)
      volume/                   0711  the image mounted (traversable as the root is): runs/,
                                      workspaces/ and uploads/ are there instead of here
      runs/                     0711  one directory per run or long-lived sandbox, named after the
        <pid>-<hex>/            0700    server's pid (so a new server sweeps a dead one's): scratch
        <pid>-tools-<hex>/      0755    workspaces (the sandbox uid's) and sessions' /tools views;
        <pid>-alias-<hex>/      0700    a container's bind sources as symlinks (container/aliases.py)
        <pid>-etc-<hex>/        0755    the host's /etc entries sandboxes see, copied to be bound
                                        at once (sandbox/backends/bwrap/etc.py)
      workspaces/               0711  conversation directories (workspace/store.py)
        <key>/                  0700    its tenant's host uid's (tenant_uids.py)
      parked/                   0700  parked sessions' interpreter states, one per conversation
        <key>.state             0600    (engine/parking.py), deleted with the conversation
      checkpoints/              0700  conversations' named checkpoints' files (workspace/checkpoints.py;
        <key>/<name>/           0700    their variables are parked states), deleted with the conversation
      uploads/                  0700  files being uploaded, renamed into a workspace when complete
        <pid>-<hex>             0600    (workspace/writing.py); a dead server's are swept at start
      mirror/                   0700  with object_store_url: what the store holds of each workspace and
        <key>.json              0600    library (size, mtime, ETag or pack per file; replicas/mirror.py)
      stubs/                    0711  generated stub packages of downstream tools (bridge/stubs.py)
      logs/                     0700  each stdio downstream server's stderr (bridge/clients.py)
        egress.log              0600  one JSON line per egress connection, rotated (egress/audit.py)
        audit.jsonl             0600    one JSON line per run, upload, download, tool call (audit.py)

Paths only, and the directories of the layout itself: what goes inside them belongs to the
modules named. This module sits with ``config``: every layer above may use it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp_sandbox.config import PathSettings, SandboxSettings, WorkspaceSettings
from mcp_sandbox.volume import VOLUME_DIR, ensure_volume

__all__ = ["METADATA_FILE", "SECRET_FILE", "StateLayout"]

METADATA_FILE = "metadata.sqlite3"
SECRET_FILE = "secret"


@dataclass(frozen=True, slots=True)
class StateLayout:
    """The paths under one state directory (``root``); nothing is created until asked."""

    root: Path
    # The sandbox gid, when the server is root: the traversable directories are then 0710 and its
    # group's, closed to every other host user. (Not root: the sandboxes run as the server's uid,
    # or as a container engine's, which the group cannot name; they stay 0711.)
    group: int | None = None
    # With a reflink volume (its size; 0: none), where runs/, workspaces/ and uploads/ live.
    volume_bytes: int = 0

    @classmethod
    def of(cls, paths: PathSettings, sandbox: SandboxSettings, workspaces: WorkspaceSettings) -> StateLayout:
        """The layout of ``paths.state_dir``, its group ``sandbox``'s gid as root, on ``workspaces``' volume if any."""
        root, volume = paths.state_dir, workspaces.volume_bytes or 0
        return cls(root, sandbox.sandbox_gid if os.geteuid() == 0 else None, volume)

    @property
    def _shared(self) -> Path:
        """Where the directories that must share one filesystem (renamed into each other) live."""
        return self.root / VOLUME_DIR if self.volume_bytes else self.root

    def _open_to_sandbox(self, directory: Path) -> None:
        """Let the sandbox uid traverse ``directory`` (never list it); see :attr:`group`."""
        if self.group is None:
            os.chmod(directory, 0o711, follow_symlinks=False)
            return
        os.chown(directory, -1, self.group, follow_symlinks=False)
        os.chmod(directory, 0o710, follow_symlinks=False)

    def _open_root_to_sandbox(self) -> None:
        """Let the sandbox uid traverse ``root`` and, with a volume, the volume's top."""
        self._open_to_sandbox(self.root)
        if self.volume_bytes:
            self._open_to_sandbox(self._shared)

    # --- paths --------------------------------------------------------------------------------

    @property
    def runs(self) -> Path:
        """Scratch workspaces and sessions' ``/tools`` views, each named after its server's pid."""
        return self._shared / "runs"

    @property
    def workspaces(self) -> Path:
        """Conversation directories, one per keyed hash of tenant and conversation id."""
        return self._shared / "workspaces"

    @property
    def parked(self) -> Path:
        """Parked sessions' interpreter states, one file per conversation key (the server's alone)."""
        return self.root / "parked"

    def parked_state(self, key: str) -> Path:
        """Where conversation ``key``'s parked interpreter state lives (whether or not it exists)."""
        return self.parked / f"{key}.state"

    def held_state(self, key: str) -> Path:
        """Where conversation ``key``'s resumed parked state is kept while its session lives (it may map it)."""
        return self.parked / f"{key}.held"

    @property
    def checkpoints(self) -> Path:
        """Conversations' named checkpoints' files, ``<key>/<name>/`` (the server's alone; beside the
        workspaces, so a copy can be a reflink)."""
        return self._shared / "checkpoints"

    @property
    def uploads(self) -> Path:
        """Files being written into a workspace, out of the sandbox's sight until renamed into it."""
        return self._shared / "uploads"

    @property
    def mirror(self) -> Path:
        """The manifests of the object store's copies (object_store_url)."""
        return self.root / "mirror"

    @property
    def runner_import(self) -> Path:
        """The earlier code runner's conversation directories, imported, until their conversation adopts them."""
        return self.root / "runner-import"

    @property
    def stubs(self) -> Path:
        """Generated stub packages of downstream tools (content-addressed)."""
        return self.root / "stubs"

    @property
    def logs(self) -> Path:
        """The stderr of each stdio downstream server, ``<alias>.log``."""
        return self.root / "logs"

    @property
    def egress_log(self) -> Path:
        """The egress proxy's audit log (one JSON line per connection)."""
        return self.logs / "egress.log"

    @property
    def audit_log(self) -> Path:
        """The audit log (JSON lines, rotated to ``audit.jsonl.1`` ...); no downstream alias ends in ``.jsonl``."""
        return self.logs / "audit.jsonl"

    @property
    def metadata(self) -> Path:
        """The SQLite metadata index."""
        return self.root / METADATA_FILE

    @property
    def secret(self) -> Path:
        """The server secret."""
        return self.root / SECRET_FILE

    @property
    def tenant_uids(self) -> Path:
        """Each tenant's host uid, assigned once (JSON; ``tenant-uids.lock`` beside it serializes assigning)."""
        return self.root / "tenant-uids.json"

    def seccomp_profile(self, digest: str) -> Path:
        """The OCI seccomp profile whose content hashes to ``digest`` (servers sharing ``root`` share it)."""
        return self.root / f"seccomp-{digest}.json"

    def stale_runs(self) -> Iterator[Path]:
        """The entries of ``runs/`` whose server (the pid their name starts with) is no longer alive.

        Several servers may share a state directory: a live one's entries are never yielded.
        """
        return _stale(self.runs)

    def stale_uploads(self) -> Iterator[Path]:
        """The partial uploads in ``uploads/`` of servers no longer alive (none if it is missing)."""
        return _stale(self.uploads) if self.uploads.is_dir() else iter(())

    # --- directories --------------------------------------------------------------------------

    def make_root_private(self) -> None:
        """Create ``root`` (and its parents) 0700 if missing, an existing one keeping its mode; mount its volume.

        Raises:
            OSError: it cannot be created.
            ConfigError: the volume cannot be mounted (see :func:`~mcp_sandbox.volume.ensure_volume`).
        """
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.volume_bytes:
            ensure_volume(self.root, self.volume_bytes)

    def prepare_runs(self) -> Path:
        """Create ``root`` and ``runs/``, both traversable by the sandbox uid (to its own entry). Idempotent.

        Raises:
            OSError: they cannot be created.
        """
        self.make_root_private()
        self.runs.mkdir(exist_ok=True, mode=0o700)
        self._open_root_to_sandbox()
        self._open_to_sandbox(self.runs)
        return self.runs

    def prepare_workspaces(self) -> Path:
        """Create ``root`` and ``workspaces/``, both traversable by the sandbox uid, not listable. Idempotent.

        Raises:
            OSError: they cannot be created.
        """
        self.make_root_private()
        self._open_root_to_sandbox()
        self.workspaces.mkdir(exist_ok=True, mode=0o700)
        self._open_to_sandbox(self.workspaces)
        return self.workspaces

    def prepare_uploads(self) -> Path:
        """Create ``uploads/`` (0700, the server's own) if missing; ``root`` must exist.

        Raises:
            OSError: it cannot be created.
        """
        self.uploads.mkdir(mode=0o700, exist_ok=True)
        return self.uploads

    def prepare_parked(self) -> Path:
        """Create ``root`` and ``parked/`` (0700, the server's own) if missing.

        Raises:
            OSError: they cannot be created.
        """
        self.make_root_private()
        self.parked.mkdir(mode=0o700, exist_ok=True)
        return self.parked

    def prepare_checkpoints(self) -> Path:
        """Create ``checkpoints/`` (0700, the server's own) if missing.

        Raises:
            OSError: it cannot be created.
        """
        self.make_root_private()
        self.checkpoints.mkdir(mode=0o700, exist_ok=True)
        return self.checkpoints

    def prepare_stubs(self) -> Path:
        """Create ``stubs/`` (0711) if missing; ``root`` must exist.

        Raises:
            OSError: it cannot be created.
        """
        self.stubs.mkdir(mode=0o711, exist_ok=True)
        return self.stubs

    def new_scratch(self) -> Path:
        """Create a new, empty scratch workspace in ``runs/`` (0700), named after this server's pid.

        Raises:
            OSError: it cannot be created (call :meth:`prepare_runs` first).
        """
        directory = self.runs / f"{os.getpid()}-{uuid.uuid4().hex}"
        directory.mkdir(mode=0o700)
        return directory

    def new_etc_copy(self) -> Path:
        """Create a new, empty directory for a copy of host ``/etc`` entries in ``runs/`` (0700 until filled).

        Raises:
            OSError: it cannot be created (``runs/`` is made if missing).
        """
        directory = self.prepare_runs() / f"{os.getpid()}-etc-{uuid.uuid4().hex}"
        directory.mkdir(mode=0o700)
        return directory

    def new_tools_view(self) -> Path:
        """Create a new, empty directory for a ``/tools`` view in ``runs/`` (0755, whatever the umask).

        Raises:
            OSError: it cannot be created (call :meth:`prepare_runs` first).
        """
        directory = self.runs / f"{os.getpid()}-tools-{uuid.uuid4().hex}"
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
        return directory


def _stale(directory: Path) -> Iterator[Path]:
    for entry in directory.iterdir():
        owner = entry.name.partition("-")[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            yield entry
