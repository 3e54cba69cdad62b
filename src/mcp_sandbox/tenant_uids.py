"""Each tenant's own host uid where the server runs as root, drawn from ``tenant_uid_range`` and kept.

The kernel counts inotify instances and watches, pipe buffer pages, processes (RLIMIT_NPROC),
user keyrings and POSIX message queue bytes per host uid: tenants whose sandboxes share one uid
share each of these pools, and one tenant exhausting a pool hurts every other. So each tenant's
sandboxes run as a uid of its own. The ``default`` tenant (stdio, a tokenless server, ``token``)
keeps ``sandbox_uid``; every other tenant takes a uid of the range, first tried at a place its
name hashes to, the next free one on a collision, and recorded in ``state_dir/tenant-uids.json``
(under a lock, replaced atomically), so it never changes across restarts and servers sharing the
state directory agree. The gid stays ``sandbox_gid``: no kernel counter is per group, and the
state directory's traversable directories are that group's (a workspace is 0700 to its uid).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pwd
import threading
from pathlib import Path

from mcp_sandbox.config import DEFAULT_TENANT, SandboxSettings
from mcp_sandbox.errors import ConfigError
from mcp_sandbox.state import StateLayout

__all__ = ["TenantUids", "check_tenant_uids", "subordinate_ranges"]

SUBUID_FILE = Path("/etc/subuid")


class TenantUids:
    """The host uid and gid of each tenant's sandboxes; see the module docstring.

    Thread-safe: the workspace store asks from worker threads, the engine from the event loop.
    """

    def __init__(self, sandbox: SandboxSettings, layout: StateLayout) -> None:
        """``sandbox``: the uids and the range; ``layout``: the state directory the assignments are kept in."""
        self._sandbox = sandbox
        self._range = sandbox.tenant_uids
        self.layout = layout
        self._known: dict[str, int] = {}
        self._lock = threading.Lock()

    @property
    def separate(self) -> bool:
        """Whether tenants other than ``default`` get uids of their own (a root server, a range set)."""
        return os.geteuid() == 0 and len(self._range) > 0

    def ids(self, tenant: str) -> tuple[int, int] | None:
        """The host uid and gid ``tenant``'s sandboxes and files have; None: the server's own (not root).

        Raises:
            ConfigError: ``tenant`` is new and every uid of the range is taken.
            OSError: the assignment table cannot be read or written.
        """
        if os.geteuid() != 0:
            return None
        return self.uid(tenant), self._sandbox.sandbox_gid

    def uid(self, tenant: str) -> int:
        """``tenant``'s host uid when the server is root (see :meth:`ids`)."""
        if not self.separate or tenant == DEFAULT_TENANT:
            return self._sandbox.sandbox_uid
        with self._lock:
            known = self._known.get(tenant)
            if known is None:
                known = self._known[tenant] = self._assign(tenant)
            return known

    def known(self, tenant: str) -> int | None:
        """``tenant``'s host uid if this object has already given it, without waiting (None: ask :meth:`uid`)."""
        return self._known.get(tenant)  # one dict lookup: atomic, never blocked by an assignment in progress

    def is_default(self, tenant: str) -> bool:
        """Whether ``tenant``'s sandboxes run as ``sandbox_uid`` (and take ``sandbox_uid``'s warm sandboxes)."""
        return not self.separate or tenant == DEFAULT_TENANT

    def _assign(self, tenant: str) -> int:
        self.layout.make_root_private()
        table_path = self.layout.tenant_uids
        lock = os.open(table_path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            table = {name: uid for name, uid in _read(table_path).items() if uid in self._range}
            if tenant in table:
                return table[tenant]
            taken = set(table.values())
            size = len(self._range)
            start = int.from_bytes(hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).digest()[:8], "big") % size
            for offset in range(size):
                uid = self._range[(start + offset) % size]
                if uid not in taken:
                    break
            else:
                raise ConfigError(
                    f"tenant_uid_range: all {size} uids of {self._sandbox.tenant_uid_range} are taken "
                    "by other tenants; widen it"
                )
            table[tenant] = uid
            _write(table_path, table)
            return uid
        finally:
            os.close(lock)


def _read(path: Path) -> dict[str, int]:
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise OSError(f"{path}: the tenants' uid table cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise OSError(f"{path}: the tenants' uid table is not an object")
    return {str(name): uid for name, uid in data.items() if type(uid) is int}


def _write(path: Path, table: dict[str, int]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(table, handle, sort_keys=True, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def subordinate_ranges(path: Path = SUBUID_FILE) -> list[tuple[str, range]]:
    """The subordinate uid ranges of ``path`` (``/etc/subuid``): each owner and its range."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        owner, _, rest = line.strip().partition(":")
        first, _, count = rest.partition(":")
        if owner and not owner.startswith("#") and first.isdigit() and count.isdigit():
            found.append((owner, range(int(first), int(first) + int(count))))
    return found


def check_tenant_uids(sandbox: SandboxSettings, tenants: int, *, subuid: Path = SUBUID_FILE) -> None:
    """Refuse a ``tenant_uid_range`` that could give one of ``tenants`` tenants an id someone else has
    (a root server only).

    Raises:
        ConfigError: the range includes the server's uid, a user's of the password database or a
            subordinate one of ``subuid``, or holds fewer uids than the server has tenants.
    """
    uids = sandbox.tenant_uids
    if os.geteuid() != 0 or not uids:
        return
    where = f"tenant_uid_range: {sandbox.tenant_uid_range}"
    if os.geteuid() in uids:
        raise ConfigError(f"{where} includes the server's own uid ({os.geteuid()})")
    for user in pwd.getpwall():
        if user.pw_uid in uids:
            raise ConfigError(f"{where} includes uid {user.pw_uid}, user {user.pw_name}'s; choose a range of no user's")
    for owner, ids in subordinate_ranges(subuid):
        if ids.start < uids.stop and uids.start < ids.stop:
            raise ConfigError(
                f"{where} overlaps {owner}'s subordinate uids {ids.start}-{ids.stop - 1} ({subuid}); "
                "choose a range outside them"
            )
    if len(uids) < tenants:
        raise ConfigError(f"{where} holds {len(uids)} uids, fewer than the {tenants} tenants")
