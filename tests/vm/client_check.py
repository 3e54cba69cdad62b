"""Start the server the way a client config says, as that client would, and use it.

    python client_check.py ENTRY.json

ENTRY.json is what ``mcp-sandbox install claude-code --print`` printed (any JSON holding an
object with ``command``, ``args`` and maybe ``env``). Over stdio: ``initialize``, ``run_python``
of ``print(1)``, then a memory bomb and a fork bomb, each stopped and reported as such.
Exit 0 when all held; prints what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

_BOUND = 600.0  # an emulated guest: slow, and the first call may wait for the warm pool


def _entry(data: Any) -> dict[str, Any]:
    if isinstance(data, dict):
        if isinstance(data.get("command"), str):
            return data
        for value in data.values():
            found = _entry(value)
            if found:
                return found
    if isinstance(data, list):
        for value in data:
            found = _entry(value)
            if found:
                return found
    return {}


async def _check(entry: dict[str, Any]) -> list[str]:
    env = {**os.environ, **(entry.get("env") or {})}  # a client passes its environment on
    params = StdioServerParameters(command=entry["command"], args=list(entry.get("args") or []), env=env)
    problems: list[str] = []
    started = time.monotonic()
    async with Client(params, read_timeout_seconds=_BOUND) as client:
        print(f"initialized after {time.monotonic() - started:.1f} s")
        calls: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
            "print": ("print(1)", lambda s: s["status"] == "success" and s["stdout"] == "1\n"),
            "memory bomb": (
                # 64 MiB at a time, every page touched: past the limit long before the guest's RAM.
                'hog = []\nfor _ in range(40):\n    hog.append(b"\\1" * (64 << 20))\nprint("allocated")',
                lambda s: s["status"] == "error" and "memory" in (s.get("error") or "").lower(),
            ),
            "fork bomb": (
                "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        break\n",
                # Stopped by a limit, and which one said: the process limit, or memory when 128
                # children's copied pages pass it first (as under emulation). The conformance slice
                # proves the process limit on its own.
                lambda s: (
                    s["status"] == "error"
                    and ("process limit" in (s.get("error") or "") or "memory limit" in (s.get("error") or ""))
                ),
            ),
        }
        for name, (code, ok) in calls.items():
            with anyio.fail_after(_BOUND):
                result = await client.call_tool("run_python", {"code": code, "timeout": 120})
            data = result.structured_content or {}
            shown = {k: data.get(k) for k in ("status", "exitCode", "error", "durationMs")}
            print(f"{name}: {json.dumps(shown)}")
            if not ok(data):
                problems.append(f"{name}: {shown}")
    return problems


def main() -> int:
    entry = _entry(json.loads(Path(sys.argv[1]).read_text()))
    if not entry:
        print(f"no server entry (an object with a command) in {sys.argv[1]}")
        return 1
    print(f"starting {entry['command']} {' '.join(entry.get('args') or [])}")
    problems = anyio.run(_check, entry)
    for problem in problems:
        print(f"FAIL {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
