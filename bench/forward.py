"""A forwarded call's overhead: the same ``print(1)`` in one conversation, sent to its owner or to another replica.

Two real replicas (``mcp-sandbox serve --transport http``) on loopback share a throw-away
PostgreSQL cluster (tests/postgres_helpers.py, Debian's ``postgresql``). A conversation is
started on the first replica, which then holds its lease; each round then sends one call to
the owner (direct) and one to the other replica (forwarded to the owner over the internal
route, signed, on a kept-alive HTTP/1.1 connection), alternating, so that a shared machine's
load falls on both. Calls are plain JSON-RPC ``tools/call`` posts to ``/mcp`` (curl's way), one
client connection kept alive per replica. Wall time per call, median and p95 in milliseconds;
the overhead is the difference of the medians, and the median of each round's difference
(the two calls of a round see about the same load). For scale, a ``GET /healthz`` on the owner each
round: one bare HTTP round trip through the same stack (uvicorn and httpx2, both on h11 here),
which a forwarded call adds once; and the same request written by hand on a kept-alive socket,
which tells the client library's share from the server's. ``--baseline SRC`` also starts a
pair of replicas from another source tree (say, ``git archive main src | tar -x -C /tmp/main``),
its rounds interleaved with these, so that a change is compared with what it replaces under the
same load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from postgres_helpers import postgres_cluster
from replica_helpers import TOKEN, replicas

PAIRED = "  the median of each round's difference"
RUNTIME = Path(__file__).resolve().parents[1] / ".runtime" / "python"


def body(conversation: str) -> dict[str, Any]:
    arguments = {"code": "print(1)", "conversationId": conversation}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "run_python", "arguments": arguments}}


async def timed(web: httpx2.AsyncClient, base: str, conversation: str) -> float:
    started = time.perf_counter()
    reply = await web.post(f"{base}/mcp", json=body(conversation))
    elapsed = (time.perf_counter() - started) * 1000
    result = reply.json()["result"]
    if result["structuredContent"]["stdout"] != "1\n":
        raise RuntimeError(f"unexpected result: {result}")
    return elapsed


async def raw_health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> float:
    """``GET /healthz`` written by hand on a kept-alive socket: the round trip without a client library."""
    started = time.perf_counter()
    writer.write(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    await reader.readexactly(length)
    return (time.perf_counter() - started) * 1000


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def paired(samples: dict[str, list[float]], prefix: str) -> float:
    """The median of each round's forwarded minus direct: less moved by load that changes between rounds."""
    pairs = zip(samples[f"{prefix}forwarded"], samples[f"{prefix}direct"], strict=True)
    return statistics.median(forwarded - direct for forwarded, direct in pairs)


async def main(rounds: int, warmup: int, baseline: Path | None) -> None:
    print(f"{platform.platform()}, {len(os.sched_getaffinity(0))} CPUs, Python {platform.python_version()}")
    runtime = RUNTIME if (RUNTIME / "bin" / "python3").exists() else None
    names = ("direct", "forwarded", "bare", "raw", "baseline direct", "baseline forwarded")
    samples: dict[str, list[float]] = {name: [] for name in names}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    conversation = "bench-forward"
    with postgres_cluster() as cluster:
        url = cluster.create_database()
        async with contextlib.AsyncExitStack() as stack:
            pairs = []  # (prefix, the owner's URL and client, the other's URL and client)
            for prefix, source in (("", None), ("baseline ", baseline)):
                if prefix and source is None:
                    continue
                env = {"MCP_SANDBOX_LOG_LEVEL": "WARNING"} | ({"PYTHONPATH": str(source)} if source else {})
                database = cluster.create_database() if prefix else url
                owner, other = await stack.enter_async_context(replicas(2, database, runtime, **env))
                to_owner = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=60))
                to_other = await stack.enter_async_context(httpx2.AsyncClient(headers=headers, timeout=60))
                await timed(to_owner, owner.url, conversation)  # the owner takes the lease
                pairs.append((prefix, owner.url, to_owner, other.url, to_other))
            _, owner_url, to_owner, _, _ = pairs[0]
            host = owner_url.split("//", 1)[1]
            reader, writer = await asyncio.open_connection(*host.split(":"))
            for n in range(warmup + rounds):
                for prefix, here_url, here_web, there_url, there_web in pairs[:: 1 if n % 2 else -1]:
                    here = await timed(here_web, here_url, conversation)
                    there = await timed(there_web, there_url, conversation)
                    if n >= warmup:
                        samples[f"{prefix}direct"].append(here)
                        samples[f"{prefix}forwarded"].append(there)
                started = time.perf_counter()
                (await to_owner.get(f"{owner_url}/healthz")).raise_for_status()
                bare = (time.perf_counter() - started) * 1000
                raw = await raw_health(reader, writer, host)
                if n >= warmup:
                    samples["bare"].append(bare)
                    samples["raw"].append(raw)
            writer.close()
    print(f"print(1) in one conversation, {rounds} calls each ({warmup} warm-up), milliseconds")
    print(f"  {'':<48} {'median':>8} {'p95':>8}")
    rows = (
        ("direct (sent to the owner)", "direct"),
        ("forwarded (sent to the other replica)", "forwarded"),
        ("for scale: one bare HTTP round trip (/healthz)", "bare"),
        ("  the same, written by hand on a socket", "raw"),
    )
    for label, name in rows:
        median, p95 = quantiles(samples[name])
        print(f"  {label:<48} {median:8.2f} {p95:8.2f}")
    overhead = statistics.median(samples["forwarded"]) - statistics.median(samples["direct"])
    print(f"  {'overhead of forwarding (difference of medians)':<48} {overhead:8.2f}")
    print(f"  {PAIRED:<48} {paired(samples, ''):8.2f}")
    if baseline is not None:
        print(f"the same at the same time, replicas from {baseline}")
        for label, name in (("direct", "baseline direct"), ("forwarded", "baseline forwarded")):
            median, p95 = quantiles(samples[name])
            print(f"  {label:<48} {median:8.2f} {p95:8.2f}")
        before = statistics.median(samples["baseline forwarded"]) - statistics.median(samples["baseline direct"])
        print(f"  {'overhead of forwarding (difference of medians)':<48} {before:8.2f}")
        print(f"  {PAIRED:<48} {paired(samples, 'baseline '):8.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--baseline", type=Path, help="a source tree's src/ to run a second pair of replicas from")
    options = parser.parse_args()
    anyio.run(main, options.rounds, options.warmup, options.baseline)
