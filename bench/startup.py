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

``--compare TREE`` also runs another source tree of the package (its ``src/`` on ``PYTHONPATH``),
to compare before/after in one go. Rows are measured round-robin, so a load that drifts during
the run weighs on every row alike. The state directory and ``HOME`` are fresh temporary ones.
``python -c ...`` includes the interpreter's exit (freeing every module), which the served
answers do not: ``initialize`` can come before an ``import mcp`` process has ended.
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
RUN = {
    "jsonrpc": "2.0",
    "id": 3,
    "method": "tools/call",
    "params": {"name": "run_python", "arguments": {"code": "print(1)"}},
}


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def line(label: str, samples: list[float]) -> None:
    median, p95 = quantiles(samples)
    print(f"  {label:<52} {median:8.0f} {p95:8.0f}  n={len(samples)}", flush=True)


def timed_once(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, check=False)
    elapsed = (time.perf_counter() - started) * 1000
    if done.returncode not in (0, 1):  # doctor exits 1 on a weak host; that is an answer too
        raise RuntimeError(f"{argv} failed: {done.stderr.decode()[-2000:]}")
    return elapsed


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


def rows(tree: str, env: dict[str, str], python: str) -> list[tuple[str, Callable[[], list[float]], bool]]:
    """(label, one measurement, is it slow) for one source tree; doctor is measured every third round."""
    server = [python, "-m", "mcp_sandbox"]
    return [
        (f"mcp-sandbox --version{tree}", lambda: [timed_once([*server, "--version"], env)], False),
        (f'mcp-sandbox run -c "print(1)"{tree}', lambda: [timed_once([*server, "run", "-c", "print(1)"], env)], False),
        (f"serve: initialize answered{tree}", lambda: list(serve_once([*server, "serve"], env)), False),
        (f"mcp-sandbox doctor{tree}", lambda: [timed_once([*server, "doctor"], env)], True),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument(
        "--compare", type=Path, metavar="TREE", help="also run another source tree (its src/), e.g. a checkout of main"
    )
    args = parser.parse_args()

    python = sys.executable
    with tempfile.TemporaryDirectory(prefix="mcp-sandbox-bench-") as temp:
        os.chmod(temp, 0o711)  # the sandbox's uid reaches the state dir when root
        env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_SANDBOX_")}
        env.update({"HOME": temp, "MCP_SANDBOX_STATE_DIR": f"{temp}/state"})
        measured: list[tuple[str, Callable[[], list[float]], bool]] = [
            ("python -c pass", lambda: [timed_once([python, "-c", "pass"], env)], False),
            ('python -c "import mcp"', lambda: [timed_once([python, "-c", "import mcp"], env)], False),
            *rows("", env, python),
        ]
        if args.compare is not None:
            other = {**env, "PYTHONPATH": str(args.compare.resolve() / "src")}
            measured += rows(f" [{args.compare.name}]", other, python)
        # Round-robin: every row sees the same machine (its load drifts during a run).
        samples: dict[str, list[list[float]]] = {label: [] for label, _, _ in measured}
        for round_ in range(args.runs):
            for label, measure, slow in measured:
                if not slow or round_ % 3 == 0:
                    samples[label].append(measure())
        print(f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
        print(f"  {'ms from exec':<52} {'median':>8} {'p95':>8}")
        for label, _, _ in measured:
            columns = list(zip(*samples[label], strict=True))
            if label.startswith("serve:"):
                tree = label.removeprefix("serve: initialize answered")
                line(f"serve: initialize answered{tree}", list(columns[0]))
                line(f"serve: tools/list answered{tree}", list(columns[1]))
                line(f"serve: first run_python print(1) answered{tree}", list(columns[2]))
            else:
                line(label, list(columns[0]))


if __name__ == "__main__":
    main()
