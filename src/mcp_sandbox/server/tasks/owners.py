"""Who runs a task: its owner, ``host:pid:random`` (unique per process start), and whether a
process of this host that owned tasks is gone (:mod:`.runtime` fails such a process's working
tasks at once, without waiting for the lease).
"""

from __future__ import annotations

import os
import secrets
import socket

__all__ = ["gone_here", "new_owner"]


def new_owner() -> str:
    """A new owner name for this process."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}"


def gone_here(owner: str, me: str) -> bool:
    """Whether ``owner`` was a process of this host that is gone (a reused pid reads as alive: the lease decides)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if owner == me or host != me.partition(":")[0] or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # someone else's process: alive
        return False
    return False
