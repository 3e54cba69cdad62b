"""Start-up latency: how soon each command answers, against bare Python and ``import mcp``.

MCP clients start their servers on every launch (some on every call), so this is time a user
waits. Every command runs as a fresh process, N times, one after the other; wall time from
``exec`` to the answer, median and p95 in milliseconds:

- ``python -c pass`` and ``python -c "import mcp"``: the peers (the interpreter, and the SDK
  every MCP server in Python imports);
- ``mcp-sandbox --version``; ``mcp-sandbox run -c "print(1)"`` (the whole run, a cold sandbox);
- ``serve`` until its answer to ``initialize`` is read (stdio, the client's first request);
  then until a ``tools/list`` answer, and until a first ``run_python`` ``print(1)`` answer
  (which goes cold when the warm pool has not filled yet);
- ``mcp-sandbox doctor`` (fewer runs: it starts sandboxes on purpose).

``--src DIR`` runs another source tree of the package (``PYTHONPATH``), to compare before/after
in one go on the same machine. The state directory and ``HOME`` are fresh temporary ones.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
RUN = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "run_python", "arguments": {"code": "print(1)"}}}


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def line(label: str, samples: list[float]) -> None:
    median, p95 = quantiles(samples)
    print(f"  {label:<46} {median:8.0f} {p95:8.0f}  n={len(samples)}", flush=True)


def timed(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        samples.append((time.perf_counter() - started) * 1000)
        if done.returncode not in (0, 1):  # doctor exits 1 on a weak host; that is an answer too
            raise RuntimeError(f"{argv} failed: {done.stderr.decode()[-2000:]}")
    return samples


def serve_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Milliseconds from exec to the answers of initialize, tools/list and a first run_python."""
    started = time.perf_counter()
    server = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert server.stdin is not None and server.stdout is not None
    stdin, stdout = server.stdin, server.stdout

    def ask(message: dict[str, object]) -> float:
        stdin.write(json.dumps(message).encode() + b"\n")
        stdin.flush()
        while True:
            reply = stdout.readline()
            if not reply:
                raise RuntimeError("the server closed its stdout")
            if json.loads(reply).get("id") == message["id"]:
                return (time.perf_counter() - started) * 1000

    try:
        initialized = ask(INITIALIZE)
        stdin.write(json.dumps(INITIALIZED).encode() + b"\n")
        listed = ask(LIST_TOOLS)
        ran = ask(RUN)
    finally:
        stdin.close()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return initialized, listed, ran


def repeat(call: Callable[[], tuple[float, float, float]], runs: int) -> list[tuple[float, float, float]]:
    return [call() for _ in range(runs)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--src", type=Path, help="a source tree (its src/) to run instead of the installed package")
    args = parser.parse_args()

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as temp:
        os.chmod(temp, 0o711)  # the sandbox's uid reaches the state dir when root
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
        env.update({"HOME": temp, "MCP_SANDBOX_STATE_DIR": f"{temp}/state"})
        if args.src is not None:
            env["PYTHONPATH"] = str(args.src.resolve() / "src")
        server = [python, "-m", "mcp_sandbox"]
        which = f" ({args.src})" if args.src else ""
        print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}{which}")
        print(f"  {'ms from exec':<46} {'median':>8} {'p95':>8}")
        line("python -c pass", timed([python, "-c", "pass"], env, args.runs))
        line('python -c "import mcp"', timed([python, "-c", "import mcp"], env, args.runs))
        line("mcp-sandbox --version", timed([*server, "--version"], env, args.runs))
        line('mcp-sandbox run -c "print(1)"', timed([*server, "run", "-c", "print(1)"], env, args.runs))
        served = repeat(lambda: serve_once([*server, "serve"], env), args.runs)
        line("serve: initialize answered", [s[0] for s in served])
        line("serve: tools/list answered", [s[1] for s in served])
        line("serve: first run_python print(1) answered", [s[2] for s in served])
        line("mcp-sandbox doctor", timed([*server, "doctor"], env, max(3, args.runs // 3)))


if __name__ == "__main__":
    main()
