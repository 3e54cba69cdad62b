"""A resumed session's state checked while its sandbox maps it (issue 48), attacked through the tools on
real bwrap: a state whose seal fails is mapped by the runtime but nothing of it is built, no code runs,
the run is refused with the clear error, and the sandbox that mapped it is killed, never kept.

The tripwire is a variable whose unpickling writes a file into the conversation's workspace: a
resume of the intact state trips it (the control), so its absence after the tampered one means
the runtime built nothing of that state. The tag alone is altered: the snapshot is the intact one,
byte for byte, so a runtime that loaded before the host's verdict would build it all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_sandbox.config import load_settings
from mcp_sandbox.state import StateLayout
from mcp_sandbox.workspace import load_secret
from mcp_test_helpers import memory_client, poll, run_in
from settings_helpers import store_of

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

_PARK_WAIT = 60.0  # a test's own bound on seeing a park land (the machine may be loaded)

# 32 MiB of padding, mapped by the runtime while the host checks it (as a DataFrame's columns are).
_TRIPWIRE = """
import numpy as np
class Tripwire:
    def __reduce__(self):
        return (eval, ("open('/workspace/unpickled.txt', 'a').write('built') and 'tripped'",))
tripwire = Tripwire()
padding = np.zeros(4 << 20)
"""


@pytest.fixture
async def parking(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    """A service that parks a session idle for a second."""
    async with memory_client(state_dir, sandbox_runtime, session_park_after=1.0) as client:
        yield client


def _paths(state_dir: Path, conversation: str) -> tuple[Path, Path]:
    """The default tenant's ``conversation``: where its state is parked, and its workspace directory."""
    settings = load_settings(env={}, flags={"state_dir": str(state_dir)})
    store = store_of(settings, load_secret(state_dir))
    key = store.key("default", conversation)
    return StateLayout.of(settings.paths, settings.sandbox, settings.workspaces).parked_state(key), store.directory(key)


def _holding(directory: Path) -> list[int]:
    """The processes with ``directory`` mounted (a sandbox's ``/workspace``); the test runs as root."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if f"/{directory.name} /workspace " in (entry / "mountinfo").read_text():
                    pids.append(int(entry.name))
    return pids


async def test_a_state_whose_seal_fails_is_mapped_but_never_built_and_its_sandbox_is_killed(
    parking: Client, state_dir: Path
) -> None:
    conversation = f"verdict-{uuid.uuid4().hex}"
    assert (await run_in(parking, _TRIPWIRE, conversation))["status"] == "success"
    state, workspace = _paths(state_dir, conversation)
    with anyio.fail_after(_PARK_WAIT):
        await poll(state.exists)
    control = await run_in(parking, "import os\nprint(tripwire, open('unpickled.txt').read())", conversation)
    live = _holding(workspace)
    (workspace / "unpickled.txt").unlink()
    with anyio.fail_after(_PARK_WAIT):
        await poll(lambda: state.exists() and not _holding(workspace))  # parked again, its sandbox gone
    data = bytearray(state.read_bytes())
    data[-1] ^= 0x01  # one bit of the seal's tag: the snapshot is intact
    state.write_bytes(bytes(data))

    refused = await run_in(parking, "open('ran.txt', 'w').write('ran')", conversation)
    built, ran = (workspace / "unpickled.txt").exists(), (workspace / "ran.txt").exists()
    holding = _holding(workspace)
    deleted = not state.exists()
    listed = await run_in(parking, "print('tripwire' in globals(), 'padding' in globals())", conversation)

    assert (control["session"], control["stdout"]) == ("resumed", "tripped built\n"), control
    assert live  # the check sees a live sandbox's /workspace
    assert refused["status"] == "error", refused
    assert "failed its integrity check" in refused["error"] and "nothing ran" in refused["error"]
    assert not built and not ran
    assert holding == []  # the sandbox that mapped it was killed with the refusal, not kept as the session's
    assert deleted
    assert (listed["session"], listed["stdout"]) == ("new", "False False\n")


@pytest.mark.parametrize("padding", [1 << 20, 1 << 10], ids=["checked-while-mapped", "checked-first"])
async def test_a_state_that_cannot_be_read_during_its_check_is_refused_by_name_kept_and_resumed_later(
    parking: Client, state_dir: Path, monkeypatch: pytest.MonkeyPatch, padding: int
) -> None:
    # The disk fails while the host checks the seal (overlapped with the sandbox's mapping for a state
    # over 256 KiB, before the EXEC for a smaller one): EIO from the host's reads of that file alone,
    # as a failing disk would give them.
    conversation = f"unreadable-{uuid.uuid4().hex}"
    assert (await run_in(parking, f"kept = 41\npadding = bytes({padding})", conversation))["status"] == "success"
    state, workspace = _paths(state_dir, conversation)
    with anyio.fail_after(_PARK_WAIT):
        await poll(lambda: state.exists() and not _holding(workspace))
    read = os.preadv

    def failing(fd: int, buffers: Sequence[memoryview], offset: int) -> int:
        if os.path.realpath(f"/proc/self/fd/{fd}") == str(state.resolve()):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return read(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", failing)
    refused = await run_in(parking, "open('ran.txt', 'w').write('ran')", conversation)
    holding, ran, kept = _holding(workspace), (workspace / "ran.txt").exists(), state.exists()
    monkeypatch.undo()
    resumed = await run_in(parking, "print(kept + 1, len(padding))", conversation)

    assert refused["status"] == "error", refused
    assert "parked interpreter state cannot be read: Input/output error" in refused["error"], refused
    assert "integrity" not in refused["error"]  # an I/O error says nothing of what the file holds
    assert not ran and holding == []
    assert kept  # not deleted: the next call resumes it
    assert (resumed["session"], resumed["stdout"]) == ("resumed", f"42 {padding}\n"), resumed
