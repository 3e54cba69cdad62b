"""The conversations' storage facade of a whole service (on the sandbox test double): retention."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from doubles.sandbox import PlainProcessBackend
from mcp_sandbox.config import load_settings
from mcp_sandbox.server.service import open_service

pytestmark = pytest.mark.anyio


async def test_retention_spares_a_conversation_whose_call_claims_its_lease_or_works_on_it(state_dir: Path) -> None:
    settings = load_settings(env={}, flags={"state_dir": str(state_dir), "discover_servers": False})
    async with open_service(settings, http=False, backend=PlainProcessBackend()) as service:
        storage, busy = service.storage, service.busy
        claimed, working, idle = (service.workspaces.key("alice", name) for name in ("claimed", "working", "idle"))
        with anyio.fail_after(30), busy.claiming(claimed), busy.using(working):
            for key in (claimed, working, idle):  # idle since 1970
                service.workspaces.ensure(key, "alice")
                service.metadata.touch_conversation(key, "alice", 0.0)
            await storage.sweep(settings.workspaces)
            during = {key: service.workspaces.directory(key).is_dir() for key in (claimed, working, idle)}
        with anyio.fail_after(30):
            await storage.sweep(settings.workspaces)
        after = {key: service.workspaces.directory(key).is_dir() for key in (claimed, working, idle)}

    assert during == {claimed: True, working: True, idle: False}
    assert after == {claimed: False, working: False, idle: False}
