"""The server secret of replicas (``database_url``): one secret in the database, the same on every replica.

Workspace keys, download links, saved tools and the replicas' signed forwarding all derive from
the server secret, so replicas must share it. The first replica to start stores its own (the
local ``state_dir/secret``, made if missing: an existing single server's secret carries over)
in the one row of ``server_secret``; every other replica adopts the stored one and writes it to
its local file, so whatever reads the file reads the shared secret. A local secret that differs
is kept beside it as ``secret.previous`` (its workspaces and links are no longer reachable), and
the log says so. Anyone who can read the database can read the secret: guard it as the secret.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from mcp_sandbox.errors import ConfigError
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace.database import Database, Transaction
from mcp_sandbox.workspace.secret import SECRET_BYTES, load_secret

__all__ = ["load_shared_secret"]

logger = logging.getLogger(__name__)


def _stored(database: Database, mine: bytes) -> bytes:
    """The stored secret, storing ``mine`` first when there is none (the unique row decides a race)."""

    def take(tx: Transaction) -> str:
        tx.execute("INSERT INTO server_secret (id, secret) VALUES (1, ?) ON CONFLICT DO NOTHING", (mine.hex(),))
        return str(tx.query("SELECT secret FROM server_secret WHERE id = 1")[0][0])

    stored = database.run(take)
    try:
        value = bytes.fromhex(stored)
    except ValueError:
        value = b""
    if len(value) != SECRET_BYTES:
        raise ConfigError(f"the server secret stored in the metadata database {database.description} is malformed")
    return value


def _replace_local(path: Path, value: bytes, keep: bool) -> None:
    """Write ``value`` as the local secret (0600, atomically); with ``keep``, the one it replaces is kept
    as ``.previous``."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, value)
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep:
        os.replace(path, path.with_name(f"{path.name}.previous"))
    os.replace(temporary, path)


def load_shared_secret(database: Database, state_dir: Path) -> bytes:
    """The replicas' server secret, from ``database``; the local secret in ``state_dir`` made equal to it.

    Raises:
        ConfigError: the local secret cannot be read or made (see :func:`load_secret`), or the
            stored one is malformed, or the local one cannot be replaced.
        WorkspaceError: the database refused or cannot be reached.
    """
    path = StateLayout(state_dir).secret
    existed = path.exists()
    local = load_secret(state_dir)  # made now when missing: stored if this replica is the first
    shared = _stored(database, local)
    if shared == local:
        return shared
    try:
        _replace_local(path, shared, existed)
    except OSError as exc:
        raise ConfigError(f"cannot write the shared server secret to {path}: {exc.strerror}") from exc
    if existed:
        logger.warning(
            "the server secret in %s differed from the replicas' shared one (in the metadata database): replaced, "
            "the old one kept as %s.previous (its conversations and links are not reachable with the new one)",
            path,
            path.name,
        )
    return shared
