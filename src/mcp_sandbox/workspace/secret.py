"""The server secret: 32 random bytes in ``state_dir/secret``, and the keys derived from it.

The secret names conversation directories (so a conversation id cannot be turned into a path
without it) and signs download URLs. It is created once, atomically, and reused: losing it
makes every workspace unreachable (retention then deletes them) and every URL invalid.
Replicas of one database share the first one's (``replicas/mirror_opening.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from mcp_sandbox.errors import ConfigError
from mcp_sandbox.state import StateLayout

__all__ = ["SECRET_BYTES", "derive_key", "load_secret"]

SECRET_BYTES = 32


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A 32-byte key for one ``purpose`` (``"workspace"``, ``"url"``): HMAC-SHA256 of the purpose.

    Keys of different purposes are independent, so a signed URL never doubles as a directory name.
    """
    return hmac.new(secret, b"mcp-sandbox key v1\x00" + purpose.encode("utf-8"), hashlib.sha256).digest()


def _read(path: Path) -> bytes:
    """Read an existing secret file, refusing one that is not private or not 32 bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ConfigError(
            f"the server secret {path} cannot be opened ({exc.strerror}); it must be a regular file"
        ) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"the server secret {path} is not a regular file; remove it to create a new one")
        if info.st_mode & 0o077:
            raise ConfigError(
                f"the server secret {path} is accessible to group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                f"run `chmod 600 {path}`, or remove it to create a new one (download URLs and workspaces are lost)"
            )
        data = os.read(fd, SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) != SECRET_BYTES:
        raise ConfigError(
            f"the server secret {path} has {len(data)} bytes instead of {SECRET_BYTES}; "
            "remove it to create a new one (download URLs and workspaces are lost)"
        )
    return data


def _create(path: Path) -> None:
    """Write a new secret next to ``path`` and link it into place unless another start won."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, secrets.token_bytes(SECRET_BYTES))
            os.fsync(fd)
        finally:
            os.close(fd)
        # link, not rename: a server starting at the same moment keeps the secret it already uses.
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_secret(state_dir: Path) -> bytes:
    """Return the server secret in ``state_dir``, creating it (mode 0600) on first start.

    Raises:
        ConfigError: the secret file is not a regular file, is readable or writable by group or
            others, has the wrong size, or cannot be created.
    """
    layout = StateLayout(state_dir)
    path = layout.secret
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    try:
        layout.make_root_private()
        _create(path)
    except OSError as exc:
        raise ConfigError(f"cannot create the server secret {path}: {exc.strerror}") from exc
    return _read(path)
