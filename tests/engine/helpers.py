"""Helpers of the engine suite: bounded runs, marked background processes, the host's process table."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Any

import anyio

from mcp_sandbox.engine import Engine, ExecutionRequest, ExecutionResult
from mcp_test_helpers import host_processes, own_processes, poll

__all__ = [
    "HOST_BOUND",
    "execute",
    "host_processes",
    "our_cgroups",
    "own_processes",
    "poll",
    "spawn_marked",
    "wait_until_gone",
]

# Added to a run's own timeout to bound the test's wait: start-up, teardown, a busy 2-core host.
HOST_BOUND = 20.0
# How long a process of a killed sandbox may take to disappear from the host's process table.
GONE_BOUND = 5.0


async def execute(
    engine: Engine, code: str, *, session: str | None = None, time_limit: float = 10.0, **fields: Any
) -> ExecutionResult:
    """Run dedented ``code`` (in ``session``) with timeout ``time_limit``; the wait is bounded."""
    request = ExecutionRequest(code=textwrap.dedent(code), timeout=time_limit, session=session, **fields)
    with anyio.fail_after(time_limit + HOST_BOUND):
        return await engine.execute(request)


def spawn_marked(marker: str, *, keep_output: bool = False) -> str:
    """Sandboxed code that starts a background ``sleep`` whose argv[0] is ``marker`` and sees it running.

    With ``keep_output`` the process inherits the run's stdout/stderr; otherwise they are /dev/null.
    """
    streams = "" if keep_output else ", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL"
    return textwrap.dedent(f"""
        import subprocess, time
        marked = subprocess.Popen([{marker!r}, "300"], executable="/bin/sleep"{streams})
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if {marker.encode()!r} in open(f"/proc/{{marked.pid}}/cmdline", "rb").read():
                break
            time.sleep(0.01)
    """)


async def wait_until_gone(marker: str, bound: float = GONE_BOUND) -> list[int]:
    """Poll (bounded) until no host process carries ``marker``; return those still there."""
    with anyio.move_on_after(bound):
        await poll(lambda: not host_processes(marker))
    return host_processes(marker)


def our_cgroups(engine: Engine) -> list[str]:
    """The cgroups of this server's sandboxes that exist now (not those of first processes kept
    ahead of the starts by a running bwrap backend: no sandbox has run in them)."""
    cgroups = getattr(engine.backend, "cgroups", None)
    if cgroups is None:
        return []
    prefix = f"mcp-sandbox-{os.getpid()}-"
    bases: list[Path] = list(cgroups.bases.values())
    spare: frozenset[Path] = getattr(engine.backend, "spare_cgroups", frozenset())
    return [p.name for base in bases for p in base.iterdir() if p.name.startswith(prefix) and p not in spare]
