"""Which conversations are busy: one answer for the leases and for retention."""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from mcp_sandbox.server.busy import Busy

pytestmark = pytest.mark.anyio


def test_a_conversation_is_busy_with_a_session_a_call_in_flight_or_files_not_written_back() -> None:
    sessions = {"session"}
    busy = Busy(lambda: sessions)
    busy.unsaved.add("unsaved")

    with busy.using("call"), busy.using("call"), busy.using(None):
        assert busy.now() == {"session", "call", "unsaved"}
        assert (busy.in_flight(), busy.calls("call")) == ({"call"}, 2)
    sessions.clear()

    assert busy.now() == {"unsaved"}
    assert (busy.in_flight(), busy.calls("call")) == (set(), 0)


def test_a_call_claiming_its_lease_is_in_flight_but_not_working_on_the_conversation() -> None:
    busy = Busy(set)

    with busy.claiming("claimed"):
        claiming = (busy.now(), busy.in_flight(), busy.calls("claimed"))
        with busy.using("claimed"):
            working = busy.calls("claimed")

    assert claiming == ({"claimed"}, {"claimed"}, 0)
    assert working == 1
    assert (busy.now(), busy.in_flight()) == (set(), set())


async def test_retention_reads_the_busy_conversations_live_from_its_worker_thread() -> None:
    busy = Busy(set)
    seen = busy.from_thread({"leased elsewhere"})

    with busy.using("call"), busy.claiming("claim"):
        during = await anyio.to_thread.run_sync(lambda: ("claim" in seen, sorted(seen), len(seen)))
    after = await anyio.to_thread.run_sync(lambda: "call" in seen)

    assert during == (True, ["call", "claim", "leased elsewhere"], 3)
    assert after is False
