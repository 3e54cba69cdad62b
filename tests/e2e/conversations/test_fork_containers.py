"""``forkFrom`` on the container backends: what a fork carries, what it keeps apart and what it
starts without (the warm-residue red team), through the tools on podman and docker for real.

test_fork.py's own tests, collected here again with a ``client`` of a service whose sessions are
containers (tests/container_helpers.py), and its residue check as a container allows the attack;
a backend that does not run here is skipped (failed when ``MCP_SANDBOX_TEST_REQUIRE`` names it).
"""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from container_helpers import backend_flags
from engine.test_warm import _FRESH_STATE, _SCHEDULING_ATTACK
from mcp_sandbox.config import load_settings
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service
from mcp_test_helpers import CALL_BOUND, new_conversation, run_ok

from ..runs.test_containers_e2e import container_backend
from .test_fork import (
    test_a_fork_sees_the_sources_variables_functions_modules_and_files,
    test_writes_after_a_fork_stay_on_their_side,
)

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

__all__ = [
    "container_backend",
    "test_a_fork_sees_the_sources_variables_functions_modules_and_files",
    "test_writes_after_a_fork_stay_on_their_side",
]


@pytest.fixture
async def client(container_backend: str, state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    """A client of the whole service in this process, its sandboxes on ``container_backend``."""
    flags: dict[str, object] = {"state_dir": str(state_dir), "discover_servers": False, "backend": container_backend}
    flags.update(backend_flags(container_backend))
    if sandbox_runtime is not None:
        flags["python_runtime"] = str(sandbox_runtime)
    settings = load_settings(env={}, flags=flags)
    async with (
        open_service(settings, http=False) as service,
        Client(build_server(service), read_timeout_seconds=CALL_BOUND) as client,
    ):
        yield client


# The warm-residue attack (issue 21, finding 9), except that a step the container refuses outright
# is recorded, not raised: /tmp and /dev/shm are root's there, so their xattrs and modes are not
# the run's to change.
_STEPS = """\
for directory in ("/tmp", "/dev/shm", "/workspace"):
    os.setxattr(directory, "user.note", b"for the next tenant")
    os.chmod(directory, 0o777)
"""
_TRIED_STEPS = """\
for directory in ("/tmp", "/dev/shm", "/workspace"):
    attempt(f"xattr {directory}", lambda: os.setxattr(directory, "user.note", b"for the next tenant"))
    attempt(f"chmod {directory}", lambda: os.chmod(directory, 0o777))
"""
_ATTACK = textwrap.dedent(_SCHEDULING_ATTACK).replace(_STEPS, _TRIED_STEPS)
assert _ATTACK != textwrap.dedent(_SCHEDULING_ATTACK), "the attack's xattr and chmod steps moved"


async def test_a_fork_starts_in_the_state_of_a_new_conversation_whatever_its_source_did(client: Client) -> None:
    # The source's scheduling policy, xattrs, directory modes and descriptor flags are its
    # container's: what the attack changed stays in the source, and the fork starts as a new one.
    source, fork = new_conversation(), new_conversation()
    attack = await run_ok(client, _ATTACK, source)
    left = await run_ok(client, textwrap.dedent(_FRESH_STATE), source)  # what the attack left there
    fresh = await run_ok(client, textwrap.dedent(_FRESH_STATE), new_conversation())
    forked = await run_ok(client, textwrap.dedent(_FRESH_STATE), fork, forkFrom=source)

    tried, in_source, new = eval(attack["stdout"]), eval(left["stdout"]), eval(fresh["stdout"])
    assert tried["xattr /workspace"] is None  # the one xattr a copy of the files could carry was set
    assert in_source["xattrs"][2] == ["user.note"]
    assert in_source != new
    assert eval(forked["stdout"]) == new
    assert new["xattrs"] == [[], [], []]
