"""The peers of bench/alternatives.py: each one opened as the calls to time, or the reason it cannot run here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp import Client
from mcp.client.stdio import StdioServerParameters

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / "bench" / "peers"
IMAGE = "localhost/mcp-sandbox-python:latest"
PYTHON = "/usr/bin/python3"  # `python3` on PATH may be a slow shim: the same interpreter for every peer that takes one
JSON = (
    "import json\n"
    "rows = [{'n': n, 'square': n * n} for n in range(200)]\n"
    "back = json.loads(json.dumps(rows))\n"
    "print(sum(row['square'] for row in back))"
)
WORKLOADS = {"print(1)": "print(1)", "json": JSON}
SECOND = "2nd run"  # a conversation's second run, the third workload
FIRST_CODE, SECOND_CODE, SECOND_OUT = "x = 41", "print(x + 1)", "42\n"
COLUMNS = [*WORKLOADS, SECOND]


class PeerFailed(Exception):
    """A peer's call failed or answered wrongly."""


Call = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class Case:
    """One workload in one way of one peer: ``before`` (untimed), then ``call``, whose output must be ``expected``."""

    peer: str
    way: str
    workload: str
    call: Call
    expected: str
    before: Callable[[], Awaitable[None]] | None = None
    quick: bool = False  # milliseconds a call: repeated in each round, for enough samples


def expected_output(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # our own constant workloads, to know what every peer must print
    return out.getvalue()


def command(argv: list[str], cwd: Path | None = None) -> Call:
    async def call() -> str:
        done = await anyio.run_process(argv, cwd=cwd, check=False)
        if done.returncode != 0:
            raise PeerFailed(f"{Path(argv[0]).name} exited {done.returncode}: {done.stderr.decode()[-600:]}")
        return done.stdout.decode()

    return call


def per_call_cases(
    peer: str, way: str, argv_of: Callable[[str], list[str]], cwd: Path | None = None, *, quick: bool = False
) -> list[Case]:
    return [
        Case(peer, way, name, command(argv_of(code), cwd), expected_output(code), quick=quick)
        for name, code in WORKLOADS.items()
    ]


# mcp-sandbox


@contextlib.asynccontextmanager
async def mcp_sandbox(state_dir: Path) -> AsyncIterator[list[Case]]:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)],
        env={
            "MCP_SANDBOX_DISCOVER_SERVERS": "false",
            "MCP_SANDBOX_SESSION_TTL": "1",  # idle sessions go at once: no eviction lands on a measured first run
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **{name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
        },
    )
    async with Client(params) as client:

        async def run(code: str, conversation: str | None = None) -> str:
            arguments: dict[str, Any] = {"code": code}
            if conversation is not None:
                arguments["conversationId"] = conversation
            result = await client.call_tool("run_python", arguments)
            data: dict[str, Any] = result.structured_content or {}
            if data.get("status") != "success":
                raise PeerFailed(f"run failed: {data}")
            return str(data.get("stdout", ""))

        def first_run(code: str) -> Call:
            return lambda: run(code, uuid.uuid4().hex)

        def warm_run(code: str) -> Call:
            return lambda: run(code)

        conversation: list[str] = []

        async def first() -> None:
            conversation[:] = [uuid.uuid4().hex]
            await run(FIRST_CODE, conversation[0])

        async def second() -> str:
            return await run(SECOND_CODE, conversation[0])

        for _ in range(3):  # the first conversation wakes the session-ready pool
            await run("print(0)", uuid.uuid4().hex)
            await anyio.sleep(1.5)
        way = {"first": "first run of a conversation", "warm": "warm run (no conversation)"}
        cases = [Case("mcp-sandbox", way["first"], n, first_run(c), expected_output(c)) for n, c in WORKLOADS.items()]
        cases += [
            Case("mcp-sandbox", way["warm"], n, warm_run(c), expected_output(c), quick=True)
            for n, c in WORKLOADS.items()
        ]
        cases.append(Case("mcp-sandbox", "a conversation's 2nd run", SECOND, second, SECOND_OUT, first, quick=True))
        yield cases


# the npm peers


def prepare_peers(directory: Path) -> str | None:
    """Install the pinned npm peers into ``directory`` unless already there; why not, or None."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        return "node and npm are not installed"
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PEERS / "pyodide_runner.mjs", directory / "pyodide_runner.mjs")  # beside its node_modules
    wanted = (PEERS / "package.json").read_text()
    manifest = directory / "package.json"
    if manifest.exists() and manifest.read_text() == wanted and (directory / "node_modules").is_dir():
        return None
    manifest.write_text(wanted)
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--no-package-lock"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        manifest.unlink()
        return f"`npm install` failed: {done.stderr[-600:]}"
    return None


def npm_version(directory: Path, package: str) -> str:
    try:
        return str(json.loads((directory / "node_modules" / package / "package.json").read_text())["version"])
    except (OSError, ValueError, KeyError):
        return "not installed"


def srt_cases(directory: Path, scratch: Path) -> list[Case] | str:
    srt = directory / "node_modules" / ".bin" / "srt"
    missing = [tool for tool in ("bwrap", "rg", "socat") if shutil.which(tool) is None]
    if not srt.exists():
        return "not installed (see `npm install` above)"
    if missing:
        return f"needs {', '.join(missing)} (Debian: bubblewrap, ripgrep, socat)"
    settings = scratch / "srt-settings.json"
    policy: dict[str, dict[str, list[str]]] = {
        "network": {"allowedDomains": [], "deniedDomains": []},
        "filesystem": {"denyRead": [], "allowWrite": [], "denyWrite": []},
    }
    settings.write_text(json.dumps(policy))
    work = scratch / "srt-cwd"
    work.mkdir()

    def argv(code: str) -> list[str]:
        return [str(srt), "--settings", str(settings), "-c", shlex.join([PYTHON, "-I", "-c", code])]

    return per_call_cases("srt", "a sandbox per call", argv, work)


@contextlib.asynccontextmanager
async def pyodide_runner(directory: Path) -> AsyncIterator[list[Case] | str]:
    runner = directory / "pyodide_runner.mjs"
    if not (directory / "node_modules" / "pyodide").is_dir():
        yield "not installed (see `npm install` above)"
        return
    cases = per_call_cases("Pyodide", "a node process per call", lambda code: ["node", str(runner), "--once", code])
    async with await anyio.open_process(["node", str(runner)], cwd=directory) as process:
        assert process.stdin is not None and process.stdout is not None
        lines = BufferedByteReceiveStream(process.stdout)

        async def answer() -> dict[str, Any]:
            data: dict[str, Any] = json.loads(await lines.receive_until(b"\n", 1 << 20))
            return data

        async def run(code: str) -> str:
            assert process.stdin is not None
            await process.stdin.send(json.dumps({"code": code}).encode() + b"\n")
            data = await answer()
            if "error" in data:
                raise PeerFailed(str(data["error"])[-600:])
            return str(data["stdout"])

        try:
            with anyio.fail_after(600):  # loading Pyodide takes seconds, tens of them on a loaded machine
                await answer()
        except (TimeoutError, anyio.EndOfStream, anyio.IncompleteRead, ValueError) as exc:
            yield f"the kept instance did not start: {exc!r}"
            return

        async def first() -> None:
            await run(FIRST_CODE)

        def kept(code: str) -> Call:
            return lambda: run(code)

        way = "one kept instance"
        cases += [Case("Pyodide", way, n, kept(c), expected_output(c), quick=True) for n, c in WORKLOADS.items()]
        cases.append(Case("Pyodide", way, SECOND, lambda: run(SECOND_CODE), SECOND_OUT, first, quick=True))
        try:
            yield cases
        finally:
            await stop(process)


async def stop(process: Process) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(10):
        if process.stdin is not None:
            await process.stdin.aclose()
        await process.wait()
    if process.returncode is None:
        process.kill()


# containers and the floor


def tests_helpers() -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    import container_helpers

    return container_helpers


@contextlib.contextmanager
def container_cases(name: str) -> Iterator[list[Case] | str]:
    if os.geteuid() != 0 or shutil.which(name) is None:
        yield f"needs root and {name} (run as the tests do, through tests/containers/{name}-wrapper)"
        return
    helpers = tests_helpers()
    cli = str(helpers.DOCKER_WRAPPER if name == "docker" else helpers.PODMAN_WRAPPER)
    with helpers.docker_daemon() if name == "docker" else contextlib.nullcontext() as why:
        if why is not None:
            yield str(why)
            return
        if subprocess.run([cli, "image", "inspect", IMAGE], capture_output=True, check=False).returncode != 0:
            yield f"no image {IMAGE} (`make image`)"
            return

        def argv(code: str) -> list[str]:
            return [cli, "run", "--rm", "--network", "none", IMAGE, "python3", "-I", "-c", code]

        yield per_call_cases(name, "`run --rm` per call", argv)


def floor_cases() -> list[Case] | str:
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    sandbox = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    sandbox += ["--unshare-all", "--die-with-parent", "--new-session"]
    cases = per_call_cases("floor", "bare bwrap + python", lambda c: [*sandbox, PYTHON, "-I", "-c", c], quick=True)
    return cases + per_call_cases("floor", "python, no sandbox", lambda c: [PYTHON, "-I", "-c", c], quick=True)
