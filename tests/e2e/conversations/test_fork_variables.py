"""A fork's variables travel through a file, never whole in the server (issue 43), through the tools on real bwrap.

The service runs in this process, so its memory is this process's: its peak resident set is
reset before a fork (``/proc/self/clear_refs``) and read after it. A snapshot the disk budgets
refuse is refused like a copy of files (nothing made, nothing left), and a hostile source that
floods its snapshot past the cap gets a fork without variables, said so, the server none the
bigger for it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from mcp import Client

from mcp_test_helpers import memory_client, new_conversation, run_in

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

VARIABLES = 30 << 20  # of the source's variables: what issue 43 forked (+159 MiB of server memory then)
GROWTH_BOUND = 16 << 20  # the server's growth allowed: well under the snapshot's 40 MiB of base64
BUDGET = 64 << 20  # tenant_workspaces_bytes: such a snapshot fits, with 30 MiB of files beside it not


@pytest.fixture
async def client(state_dir: Path, sandbox_runtime: Path | None) -> AsyncIterator[Client]:
    async with memory_client(state_dir, sandbox_runtime, tenant_workspaces_bytes=BUDGET) as client:
        yield client


def _status(field: str) -> int:
    """A field of this process's /proc status, in bytes (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0]) << 10
    raise AssertionError(f"no {field} in /proc/self/status")


def _peak_from_now() -> int:
    """Reset this process's peak resident set to its current one (``VmHWM`` from now on); that size."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status("VmRSS")


def _spools(state_dir: Path) -> list[str]:
    """The fork spools this process holds open, or that have a name in ``runs/``."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor, closed since
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    named = [entry.name for entry in (state_dir / "runs").iterdir()] if (state_dir / "runs").exists() else []
    return [path for path in held + named if "-fork-" in path]


_SOURCE = f"import hashlib, os\nblob = os.urandom({VARIABLES})\ndigest = hashlib.sha256(blob).hexdigest()"


async def test_a_fork_of_30_mib_of_variables_does_not_grow_the_servers_memory_with_them(
    client: Client, state_dir: Path
) -> None:
    source = new_conversation()
    assert (await run_in(client, _SOURCE, source))["status"] == "success"

    before = _peak_from_now()
    forked = await run_in(
        client, "print(hashlib.sha256(blob).hexdigest() == digest)", new_conversation(), forkFrom=source
    )
    growth = _status("VmHWM") - before

    assert (forked["status"], forked["stdout"]) == ("success", "True\n"), forked
    assert (forked["fork"]["variables"], forked["fork"]["skipped"]) == (4, [])
    assert growth < GROWTH_BOUND, f"the server grew by {growth >> 20} MiB forking {VARIABLES >> 20} MiB of variables"
    assert _spools(state_dir) == []


async def test_a_snapshot_past_the_tenants_disk_budget_is_refused_and_leaves_nothing(
    client: Client, state_dir: Path
) -> None:
    # The files (30 MiB) fit the budget; with the snapshot of the variables (40 MiB) spooled beside them they do not.
    source, fork = new_conversation(), new_conversation()
    made = await run_in(client, _SOURCE + "\nopen('/workspace/data', 'wb').write(blob)", source)
    assert made["status"] == "success", made

    refused = await run_in(client, "print('ran')", fork, forkFrom=source)
    after = await run_in(client, "print(len(blob), len(os.listdir('.')))", source)
    fresh = await run_in(client, "import os\nprint(os.listdir('.'), 'blob' in globals())", fork)

    assert refused["status"] == "validation_error", refused
    assert "tenant_workspaces_bytes" in refused["error"] and "nothing was copied" in refused["error"]
    assert (after["session"], after["stdout"]) == ("kept", f"{VARIABLES} 1\n")  # the source is as it was
    assert fresh["stdout"] == "[] False\n"  # the fork's id was never made
    assert _spools(state_dir) == []


# A hostile source: its runtime's dump replaced by one that writes far past the fork's cap.
_FLOOD = """
import sys
from mcp_sandbox_runtime import fork
def flood(namespace, budget, rebound=frozenset()):
    for _ in range(80):
        sys.stdout.write("A" * (1 << 20))
    return "B"
fork.dump = flood
x = 1
"""


async def test_a_source_flooding_its_snapshot_past_the_cap_forks_without_variables_and_the_server_stays_small(
    client: Client, state_dir: Path
) -> None:
    source = new_conversation()
    assert (await run_in(client, _FLOOD, source))["status"] == "success"

    before = _peak_from_now()
    forked = await run_in(client, "print('x' in globals())", new_conversation(), forkFrom=source)
    growth = _status("VmHWM") - before

    assert (forked["status"], forked["stdout"]) == ("success", "False\n"), forked
    assert forked["fork"]["variables"] == 0
    assert forked["fork"]["skipped"] == ["all variables: their snapshot passed the fork's limit of 32 MiB of variables"]
    assert growth < GROWTH_BOUND, f"the server grew by {growth >> 20} MiB for an 80 MiB snapshot"
    assert _spools(state_dir) == []
