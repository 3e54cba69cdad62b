"""View ids with replicas (:class:`ViewIds`): each names its replica, sealed for its tenant only; a holder
that never answers reads as unreachable within the bound (a real forwarder, a loopback socket)."""

from __future__ import annotations

import base64
import socket
import time

import anyio
import pytest

from mcp_sandbox.replicas.forward import Forwarder
from mcp_sandbox.server.tools.remote_views import RemoteViews, ViewIds, ViewUnreachable

KEY = bytes(range(32))
ME = "https://10.0.0.7:9443"


def test_an_id_names_its_replica_for_its_tenant_and_for_nobody_else() -> None:
    ids = ViewIds(KEY, ME)
    view_id = ids.mint("alice")

    assert ids.holder("alice", view_id) == ME
    assert ViewIds(KEY, "https://elsewhere:1").holder("alice", view_id) == ME  # any replica reads it
    assert ids.holder("bob", view_id) is None  # another tenant's id opens for nobody else
    assert ViewIds(bytes(32), ME).holder("alice", view_id) is None  # only the replicas' key made it
    assert ME not in view_id and "10.0.0.7" not in base64.urlsafe_b64decode(view_id + "==").decode("latin-1")
    assert ids.mint("alice") != view_id


def test_an_altered_or_foreign_id_names_no_replica() -> None:
    ids = ViewIds(KEY, ME)
    view_id = ids.mint("alice")
    raw = bytearray(base64.urlsafe_b64decode(view_id + "=" * (-len(view_id) % 4)))
    raw[15] ^= 1  # the sealed URL, one bit
    altered = base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()

    for candidate in (altered, view_id[:-2], "", "not base64 at all!", "A" * 600, "AAAA" * 7):
        assert ids.holder("alice", candidate) is None, candidate


@pytest.mark.anyio
async def test_a_holder_that_takes_the_connection_and_never_answers_reads_as_unreachable_within_the_bound() -> None:
    ids = ViewIds(KEY, ME)
    with socket.create_server(("127.0.0.1", 0)) as stuck:  # listens, never accepts: a frozen replica
        holder = f"http://127.0.0.1:{stuck.getsockname()[1]}"
        forwarder = Forwarder(ME, KEY, read_timeout=300.0)
        remote = RemoteViews(ids, forwarder.ask, bound=0.5)
        view_id = ViewIds(KEY, holder).mint("alice")
        started = time.monotonic()
        try:
            assert remote.elsewhere("alice", view_id) == holder
            with anyio.fail_after(10), pytest.raises(ViewUnreachable):  # a hang fails here
                await remote.read(holder, "alice", view_id, f"ui://mcp-sandbox/run/{view_id}/state")
            with anyio.fail_after(10), pytest.raises(ViewUnreachable):
                await remote.stop(holder, "alice", view_id)
        finally:
            await forwarder.aclose()
    assert time.monotonic() - started < 5  # two bounded asks, not the read timeout
