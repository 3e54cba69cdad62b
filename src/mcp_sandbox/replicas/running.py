"""A replica's leases and forwarding, opened for the server's life and given back at its end."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import anyio

from mcp_sandbox.config import HttpSettings, LimitSettings, ReplicaSettings
from mcp_sandbox.replicas.forward import Forwarder, Router
from mcp_sandbox.replicas.leases import Activity, Leases, LeaseTable
from mcp_sandbox.replicas.replays import SeenCalls
from mcp_sandbox.replicas.signing import Verifier
from mcp_sandbox.workspace.database import Database
from mcp_sandbox.workspace.secret import derive_key

__all__ = ["FORWARD_KEY", "open_replica", "replica_leases"]

FORWARD_KEY = "replica-forward"  # the purpose of the key that signs forwarded calls
# A forwarded call may run for the longest time limit, and its answer then be written.
_ANSWER_SLACK = 60.0


def replica_leases(
    replicas: ReplicaSettings,
    database: Database,
    fence: Callable[[str], Awaitable[object]],
    busy: Activity,
    sessions: Callable[[], set[str]],
) -> Leases:
    """The leases of replica ``replicas.replica_url`` (see :class:`.Leases` for ``fence``,
    ``busy`` and ``sessions``)."""
    me = replicas.replica_url
    if me is None:
        raise RuntimeError("replica_leases needs replica_url")
    return Leases(LeaseTable(database, me), replicas.replica_lease, fence, busy, sessions)


@contextlib.asynccontextmanager
async def open_replica(
    replicas: ReplicaSettings,
    http: HttpSettings,
    limits: LimitSettings,
    leases: Leases,
    secret: bytes,
    restore: Callable[[str, int], Awaitable[None]],
) -> AsyncIterator[Router]:
    """The router of replica ``replicas.replica_url`` over ``leases``, which are released (bounded)
    when the block exits. The caller runs ``leases.keep()`` in a task group of its own meanwhile.

    ``http``: the internal hop's keep-alive, CA and certificate; ``limits``: the longest run it forwards.
    """
    me, url = replicas.replica_url, replicas.database_url
    if me is None or url is None:
        raise RuntimeError("open_replica needs replica_url and database_url")
    key = derive_key(secret, FORWARD_KEY)
    # An idle connection to a peer is kept for half the keep-alive every replica closes it after.
    idle = http.keep_alive_timeout / 2
    identity = (http.internal_cert, http.internal_key) if http.internal_cert and http.internal_key else None
    forwarder = Forwarder(me, key, limits.max_timeout + _ANSWER_SLACK, idle, http.replica_ca, identity)
    seen = SeenCalls(url)
    try:
        yield Router(leases, forwarder, Verifier(key, seen=seen), restore)
    finally:
        with anyio.CancelScope(shield=True):
            await leases.release_all()
            await forwarder.aclose()
            await seen.aclose()
