"""The run views' store (server/tools/run_views.py) and page (resources.py), without a sandbox."""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from mcp_sandbox.server.tools.resources import RESOURCE_NOT_FOUND, VIEW_MIME, read_resource, view_page
from mcp_sandbox.server.tools.run_views import (
    ENDED_UNANSWERED,
    LIVE_LINES,
    OPENED,
    VIEW_URI,
    RunViews,
    UnknownView,
    stop_request,
)

pytestmark = pytest.mark.anyio


async def test_a_tenant_keeps_only_its_last_runs() -> None:
    views = RunViews(per_tenant=3)
    made = [views.open("alice", "run_python", {"code": str(i)}) for i in range(5)]
    other = views.open("bob", "run_python", {"code": "x"})
    with pytest.raises(UnknownView):
        views.get("alice", made[0].id)
    assert views.get("alice", made[4].id) is made[4]
    assert views.get("bob", other.id) is other  # bob's run is not one of alice's three


async def test_kept_results_stay_within_the_tenants_bytes() -> None:
    views = RunViews(tenant_bytes=1000)
    first, second, third = (views.open("alice", "run_python", {"code": str(i)}) for i in range(3))
    other = views.open("bob", "run_python", {"code": "x"})
    views.finish(other, {"content": [{"type": "text", "text": "b" * 900}]})
    views.finish(first, {"content": [{"type": "image", "data": "a" * 600}]})
    views.finish(second, {"structuredContent": {"stdout": "a" * 300, "stderr": "a" * 300}})
    with pytest.raises(UnknownView):
        views.get("alice", first.id)  # the oldest ended one went
    assert views.get("alice", second.id).weight == 600
    assert views.get("alice", third.id).result is None  # a running one stays
    views.finish(third, {"content": [{"type": "text", "text": "a" * 5000}]})
    assert views.get("alice", third.id).weight == 5000  # the one just ended is kept, alone
    with pytest.raises(UnknownView):
        views.get("alice", second.id)
    assert views.get("bob", other.id).weight == 900


async def test_a_run_left_without_a_result_ends_its_view() -> None:
    views = RunViews()
    view = views.open("alice", "run_python", {"code": "x"})
    with anyio.CancelScope() as cancelled, views.ending(view):
        cancelled.cancel()  # as a client's notifications/cancelled does
        await anyio.sleep_forever()
    state = view.state()
    assert state["status"] == "ended"
    assert state["result"]["structuredContent"]["error"] == ENDED_UNANSWERED
    answered = views.open("alice", "run_python", {"code": "y"})
    with views.ending(answered):
        views.finish(answered, {"content": []})
    assert answered.result == {"content": []}


async def test_another_tenants_id_is_unknown_and_cannot_be_stopped() -> None:
    views = RunViews()
    view = views.open("alice", "run_python", {"code": "1"})
    with pytest.raises(UnknownView):
        views.get("bob", view.id)
    with pytest.raises(UnknownView):
        views.stop("bob", view.id)
    assert not view.scope.cancel_called


async def test_ended_views_expire_and_stop_says_a_run_had_ended() -> None:
    views = RunViews()
    view = views.open("alice", "run_python", {"code": "1"})
    assert views.stop("alice", view.id)
    views.finish(view, {"content": []})
    assert not views.stop("alice", view.id)
    views = RunViews(keep_seconds=0.0)
    view = views.open("alice", "run_python", {"code": "1"})
    views.finish(view, {"content": []})
    views.open("alice", "run_python", {"code": "2"})  # expires the ended one
    with pytest.raises(UnknownView):
        views.get("alice", view.id)


async def test_the_state_keeps_what_run_again_needs_and_never_the_environment() -> None:
    raw = {"code": "print(1)", "language": "python", "environment": [{"name": "K", "value": "secret"}], "reset": True}
    view = RunViews().open("alice", "run_code", raw)
    assert view.state()["arguments"] == {"code": "print(1)", "language": "python"}
    assert "secret" not in json.dumps(view.state())


async def test_live_lines_are_the_last_ones_cut_at_their_ends() -> None:
    view = RunViews().open("alice", "run_python", {"code": "x"})
    view.feed("stdout", b"one\ntw")
    view.feed("stdout", b"o\n" + b"".join(b"%d\n" % i for i in range(LIVE_LINES + 5)))
    state = view.state()
    assert state["status"] == "running"
    assert state["lines"][-1] == str(LIVE_LINES + 4)
    assert len(state["lines"]) == LIVE_LINES
    assert state["skipped"] == 7


async def test_a_preopened_view_is_taken_by_its_tenants_run_once() -> None:
    views = RunViews()
    opened = views.open("alice", "run_python", {"code": "x"})
    token = OPENED.set(opened)
    try:
        assert views.open("bob", "run_python", None) is not opened
        assert views.open("alice", "run_python", None) is opened
        assert views.open("alice", "run_python", None) is not opened
    finally:
        OPENED.reset(token)


async def test_stop_is_asked_in_meta_only() -> None:
    assert stop_request({"_meta": {"mcp-sandbox/stop": "abc"}}) == "abc"
    assert stop_request({"arguments": {"mcp-sandbox/stop": "abc"}}) is None
    assert stop_request({"_meta": {"mcp-sandbox/stop": 3}}) is None
    assert stop_request(None) is None


async def test_the_page_carries_the_state_inertly_and_a_strict_policy() -> None:
    page = view_page({"stdout": "</script><script>alert(1)</script>"})
    data = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', page, re.S)
    assert data is not None and json.loads(data.group(1)) == {"stdout": "</script><script>alert(1)</script>"}
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert policy is not None
    assert "default-src 'none'" in policy.group(1) and "unsafe-inline" not in policy.group(1)
    assert "http" not in policy.group(1)  # nothing fetched from anywhere


async def test_reading_views_checks_the_tenant() -> None:
    views = RunViews()
    view = views.open("alice", "run_python", {"code": "x"})

    async def read(uri: str, tenant: str) -> types.ReadResourceResult:
        return await read_resource(None, types.ReadResourceRequestParams(uri=uri), views, tenant)

    page = await read(view.uri, "alice")
    assert page.contents[0].mime_type == VIEW_MIME
    assert view.id in page.contents[0].text  # type: ignore[union-attr]
    meta: Any = page.contents[0].meta
    assert meta["ui"]["csp"] == {"connectDomains": [], "resourceDomains": []}
    state = await read(f"{view.uri}/state", "alice")
    assert json.loads(state.contents[0].text)["id"] == view.id  # type: ignore[union-attr]
    assert "null" in (await read(VIEW_URI, "bob")).contents[0].text  # type: ignore[union-attr]
    for uri in (view.uri, f"{view.uri}/state", f"{view.uri}/other", "ui://mcp-sandbox/other"):
        with pytest.raises(MCPError) as refused:
            await read(uri, "bob")
        assert refused.value.error.code == RESOURCE_NOT_FOUND


async def test_a_stopped_view_cancels_its_scope() -> None:
    views = RunViews()
    view = views.open("alice", "run_python", {"code": "x"})
    with view.scope:
        views.stop("alice", view.id)
        await anyio.sleep_forever()
    assert view.scope.cancelled_caught
