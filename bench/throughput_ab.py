"""Fresh-state runs per second with 1, 4 and 16 callers of ``print(1)``: configurations side by side.

Each configuration is an ``mcp-sandbox serve`` over stdio (the warm pool on, ``pool_size`` 4)
measured with bench/run.py's ``throughput``, then the next, twice in alternation (A B A B), so
a shared machine's load falls on both. ``--env NAME=VALUE,...`` adds a configuration (its
environment); the default compares ``pool_preload`` as configured with nothing preloaded.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from run import call, server_params, throughput


def prepare(scratch: Path) -> Path:
    """The servers file (none) in ``scratch``, opened to the sandbox uid (it reaches the state directory)."""
    scratch.chmod(0o711)
    servers = scratch / "servers.json"
    servers.write_text(json.dumps({"mcpServers": {}}))
    return servers


async def measure(label: str, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-ab-") as scratch:
        servers = prepare(Path(scratch))
        async with Client(server_params(Path(scratch) / "state", servers, **env)) as client:
            deadline = time.monotonic() + 5  # the pool starts
            while time.monotonic() < deadline:
                await call(client, "print(1)")
            print(f"{label}  ({' '.join(f'{k}={v}' for k, v in env.items()) or 'defaults'})")
            await throughput(client)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE,NAME=VALUE: one configuration")
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    configurations = [dict(item.split("=", 1) for item in spec.split(",") if item) for spec in options.env] or [
        {},
        {"MCP_SANDBOX_POOL_PRELOAD": ""},
    ]
    for round_ in range(options.rounds):
        for index, env in enumerate(configurations):
            await measure(f"[{round_ + 1}] {chr(ord('A') + index)}", env)


if __name__ == "__main__":
    anyio.run(main)
