"""The tenant's library (saved tools, memories) through ``run_python``, in memory on the backend test double.

Code saves and loads through the host, over the runner's channel, which the double runs as a
sandbox does: what is kept, what later runs get and what is refused are the server's.
tests/e2e/runs/test_library.py checks on real sandboxes what only isolation gives: tenants kept
apart, the library's files out of the sandbox's reach, and TypeScript's side of it.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from doubles.sandbox import PlainProcessBackend
from mcp_test_helpers import memory_client, run_python, structured

pytestmark = pytest.mark.anyio

SAVE = """
def double(x):
    '''Twice x.'''
    return 2 * x

print(save_tool(double))
save_memory("config", {"region": "north", "limit": 3})
"""

USE = "print(saved.double(21), load_memory('config'), list_memories(), list_saved_tools())"

OVER = """
from mcp import runtime
try:
    save_memory("big", "x" * 5000)
except runtime.MCPError as error:
    print(error.kind, "library_bytes" in str(error))
for n in range(10):
    try:
        save_memory(f"k{n}", n)
    except runtime.MCPError as error:
        print(n, error.kind, "library_entries" in str(error))
        break
print(load_memory("config")["region"], load_memory("big", "absent"))
for bad in (lambda: save_memory("../escape", 1), lambda: save_memory("k", object()), lambda: runtime.save_tool(print)):
    try:
        bad()
    except (runtime.MCPError, TypeError) as error:
        print(type(error).__name__)
"""


async def _stdout(state_dir: Path, *codes: str) -> list[str]:
    """The stdout of each of ``codes`` run in turn by one server on ``state_dir``; each must succeed."""
    backend, runtime = PlainProcessBackend(), Path(sys.prefix)
    outputs = []
    async with memory_client(
        state_dir, runtime, backend=backend, prestart_size=0, library_bytes=4096, library_entries=5
    ) as client:
        for code in codes:
            data = structured(await run_python(client, {"code": textwrap.dedent(code)}))
            assert data["status"] == "success", data
            outputs.append(data["stdout"])
    return outputs


async def test_a_saved_tool_and_memory_serve_later_runs_and_outlast_a_restart(state_dir: Path) -> None:
    saved, used = await _stdout(state_dir, SAVE, USE)
    [again] = await _stdout(state_dir, "print(saved.double(5), load_memory('config')['region'])")

    assert saved == "Tool 'double' saved: later runs call it as saved.double(...).\n"
    assert used == (
        "42 {'region': 'north', 'limit': 3} ['config'] "
        "[{'name': 'double', 'language': 'python', 'description': 'Twice x.'}]\n"
    )
    assert again == "10 north\n"


async def test_the_library_quota_and_bad_names_or_values_are_refused_and_keep_what_was_there(state_dir: Path) -> None:
    _, over = await _stdout(state_dir, SAVE, OVER)

    # config and the tool: two of the five entries taken, so k0..k2 fit and k3 is refused.
    assert over.splitlines() == [
        "denied True",
        "3 denied True",
        "north absent",
        "MCPError",
        "TypeError",
        "TypeError",
    ], over
