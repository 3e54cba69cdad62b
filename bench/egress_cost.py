"""What network costs a run: a fresh sandbox without network, with network, and with one fetch through the proxy.

Python runs on bwrap with no warm pool (every run a fresh sandbox), interleaved so load drifts
hit every kind alike:

- plain: ``import urllib.request`` without network;
- network: the same with ``network`` granted (the egress seccomp rule, the proxy's socket, the relay);
- fetch: with network, one ``urlopen`` of a small page from an HTTP server of the benchmark's own
  on this host's loopback, through the relay and the proxy (its name resolved by a table, allowed
  with ``egress_allow_private = 127.0.0.1/32``).

Medians and p95 in milliseconds, then ratios to plain. Nothing is asserted; absolute numbers drift
+-30% between runs on a shared 2-core machine.

Run: `.venv/bin/python bench/egress_cost.py [--runs N]`.
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio

from mcp_sandbox import load_settings
from mcp_sandbox.egress import EgressGrant, hosts_resolver
from mcp_sandbox.engine import Engine, ExecutionRequest
from mcp_sandbox.engine.startup import backend_for, engine_for, tenant_egress
from mcp_sandbox.workspace import remove_tree

_REPO = Path(__file__).resolve().parents[1]
_NAME = "bench.egress.invalid"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


async def _measure(engine: Engine, grant: EgressGrant, port: int, runs: int) -> dict[str, list[float]]:
    imports = "import urllib.request\n"
    kinds = {
        "plain": (imports, None),
        "network": (imports, grant),
        "fetch": (imports + f"urllib.request.urlopen('http://{_NAME}:{port}/').read()\n", grant),
    }
    times: dict[str, list[float]] = {kind: [] for kind in kinds}
    for index in range(runs + 2):
        for kind, (code, granted) in kinds.items():
            started = time.perf_counter()
            result = await engine.execute(ExecutionRequest(code=code, timeout=30, egress=granted))
            if result.status != "success":
                raise SystemExit(f"{kind}: {result.error or result.stderr}")
            if index >= 2:  # the first two rounds warm the page cache
                times[kind].append((time.perf_counter() - started) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    runtime = _REPO / ".runtime" / "python"
    parent = Path(tempfile.mkdtemp(prefix="mcp-sandbox-bench-"))
    parent.chmod(0o711)
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page) as server:
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            flags: dict[str, object] = {
                "state_dir": str(parent / "state"),
                "pool_size": 0,
                "pool_min": 0,
                "egress_allow": _NAME,
                "egress_allow_private": "127.0.0.1/32",
                "egress_ports": f"80,443,{port}",
            }
            if (runtime / "bin" / "python3").exists():
                flags["python_runtime"] = str(runtime)
            settings = load_settings(env={}, flags=flags)
            engine = engine_for(
                settings, backend_for(settings, "bwrap"), egress_resolver=hosts_resolver({_NAME: ["127.0.0.1"]})
            )
            engine.prepare()
            grant = tenant_egress(settings).grant("default", True, None)
            assert grant is not None
            times = anyio.run(_measure, engine, grant, port, runs)
        finally:
            server.shutdown()
            remove_tree(parent)
    plain = statistics.median(times["plain"])
    print(f"egress, {runs} runs each (ms)", file=sys.stderr)
    for kind, values in times.items():
        median = statistics.median(values)
        p95 = sorted(values)[max(0, int(len(values) * 0.95) - 1)]
        print(f"{kind:<8} median {median:7.1f}  p95 {p95:7.1f}  x{median / plain:.2f} of plain")


if __name__ == "__main__":
    main()
