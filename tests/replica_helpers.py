"""Real replicas for the tests: ``mcp-sandbox serve`` processes on loopback sharing one PostgreSQL database.

Each replica has its own state directory and port, its ``replica_url`` the loopback URL of that
port (or, with an :class:`InternalHop`, of an internal listener of its own, over mutual TLS when
the hop has certificates), and the same ``database_url`` and token as the others. :class:`Replica` keeps the process,
so a test can stop it cleanly (SIGTERM) or kill it (``kill -9`` of its whole process group), and
start it again (:meth:`Replica.restart`).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import httpx2
import psycopg
from mcp.types import CallToolResult

from mcp_sandbox.workspace import derive_key, remove_tree
from mcp_test_helpers import CALL_BOUND, _server_env, _stop_server, _wait_listening, free_port, http_client

__all__ = [
    "METRICS_TOKEN",
    "TOKEN",
    "InternalHop",
    "Replica",
    "call",
    "conversation_key",
    "lease_rows",
    "long_run",
    "owners",
    "replicas",
    "replicas_apart",
    "run",
    "runs_running",
    "shared_secret",
    "structured_data",
    "until",
]

TOKEN = "replica-token-0123456789abcdef"
METRICS_TOKEN = "replica-metrics-token-0123456789"


def long_run(marker: str) -> str:
    """Code whose run prints ``tick 1`` and works for 300 s, with a child process marked ``marker``."""
    return f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", {marker!r}])
        print("tick 1", flush=True)
        time.sleep(300)
    """


@dataclass(frozen=True)
class InternalHop:
    """Each replica's ``internal_port`` its own; with ``identities`` (one certificate and key per
    replica) and ``ca``, the hop is mutual TLS (``internal_cert``, ``internal_key``, ``replica_ca``)."""

    ca: Path | None = None
    identities: Sequence[tuple[Path, Path]] = ()

    def of(self, n: int, port: int) -> tuple[str, dict[str, str]]:
        """Replica ``n``'s ``replica_url`` on internal ``port``, and its settings."""
        env = {"MCP_SANDBOX_INTERNAL_PORT": str(port)}
        if not self.identities:
            return f"http://127.0.0.1:{port}", env
        certificate, key = self.identities[n]
        env |= {"MCP_SANDBOX_INTERNAL_CERT": str(certificate), "MCP_SANDBOX_INTERNAL_KEY": str(key)}
        if self.ca is not None:
            env["MCP_SANDBOX_REPLICA_CA"] = str(self.ca)
        return f"https://127.0.0.1:{port}", env


@dataclass
class Replica:
    url: str  # where clients reach it; also its replica_url unless it has an internal listener
    state: Path
    process: anyio.abc.Process
    log: IO[bytes] = field(repr=False)
    launch: Callable[[], Awaitable[anyio.abc.Process]] = field(repr=False)
    replica_url: str = ""

    def __post_init__(self) -> None:
        self.replica_url = self.replica_url or self.url

    async def restart(self) -> None:
        """Start it again once stopped: the same URL, state directory and settings (a rollout's restart)."""
        self.process = await self.launch()

    async def kill(self) -> None:
        """``kill -9`` of the server and everything in its process group (its sandboxes); back once
        the server is dead. Not before: a busy machine takes a while to tear a large process down,
        and a call sent to it meanwhile on a kept-alive connection reaches it and is lost with it
        (its answer rightly says the code may or may not have run), where the test means a call
        made after the crash."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with anyio.fail_after(15):
            await self.process.wait()

    async def stop(self, bound: float = 30.0) -> int | None:
        """SIGTERM; its exit status once it is gone (bounded)."""
        self.process.send_signal(signal.SIGTERM)
        with anyio.fail_after(bound):
            await self.process.wait()
        return self.process.returncode

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


@contextlib.contextmanager
def _state_dirs(count: int) -> Iterator[list[Path]]:
    parent = Path(tempfile.mkdtemp(prefix="mcp-sandbox-test-replicas-"))
    parent.chmod(0o711)  # the sandbox's uid traverses to its workspace
    try:
        yield [parent / f"replica-{n}" for n in range(count)]
    finally:
        remove_tree(parent)


async def _launch(
    url: str, state: Path, log: IO[bytes], database_url: str, runtime: Path | None, env: dict[str, str]
) -> anyio.abc.Process:
    """The replica at ``url`` started, with ``state`` and ``log``; returned once it listens (else stopped)."""
    port = int(url.rsplit(":", 1)[1])
    command = [sys.executable, "-m", "mcp_sandbox", "serve", "--transport", "http", "--port", str(port)]
    command += ["--state-dir", str(state)]
    environment = {
        "MCP_SANDBOX_TOKEN": TOKEN,
        "MCP_SANDBOX_DATABASE_URL": database_url,
        "MCP_SANDBOX_POOL_MIN": "0",
        "MCP_SANDBOX_PRESTART_SIZE": "0",
        "MCP_SANDBOX_SESSION_READY": "0",
        "MCP_SANDBOX_SHUTDOWN_GRACE": "5",
        "MCP_SANDBOX_LOG_LEVEL": "INFO",
        **env,
    }
    process = await anyio.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=_server_env(runtime, environment),
        start_new_session=True,
    )
    try:
        with anyio.fail_after(90):
            await _wait_listening(process, "127.0.0.1", port)
    except BaseException:
        log.seek(0)
        print(log.read().decode(errors="replace")[-4000:])
        with anyio.CancelScope(shield=True):
            await _stop_server(process, 15)
        raise
    return process


@contextlib.asynccontextmanager
async def replicas(count: int, database_url: str, runtime: Path | None, **env: str) -> AsyncIterator[list[Replica]]:
    """``count`` replicas started together (see the module docstring); each stopped at the end."""
    async with _replicas(count, database_url, runtime, None, env) as started:
        yield started


@contextlib.asynccontextmanager
async def replicas_apart(
    count: int, database_url: str, runtime: Path | None, hop: InternalHop, **env: str
) -> AsyncIterator[list[Replica]]:
    """As :func:`replicas`, each with an internal listener of its own (``hop``)."""
    async with _replicas(count, database_url, runtime, hop, env) as started:
        yield started


@contextlib.asynccontextmanager
async def _replicas(
    count: int, database_url: str, runtime: Path | None, hop: InternalHop | None, env: dict[str, str]
) -> AsyncIterator[list[Replica]]:
    with _state_dirs(count) as states, contextlib.ExitStack() as logs:
        slots: list[Replica | None] = [None] * count

        async def start(n: int) -> None:
            url, log = f"http://127.0.0.1:{free_port()}", logs.enter_context(tempfile.TemporaryFile())
            replica_url, own = hop.of(n, free_port()) if hop is not None else (url, {})
            own["MCP_SANDBOX_REPLICA_URL"] = replica_url

            def launch() -> Awaitable[anyio.abc.Process]:
                return _launch(url, states[n], log, database_url, runtime, {**own, **env})

            slots[n] = Replica(url, states[n], await launch(), log, launch, replica_url)

        try:
            # The first alone: it makes the database's tables and the shared secret the others read.
            await start(0)
            async with anyio.create_task_group() as group:
                for n in range(1, count):
                    group.start_soon(start, n)
            yield [replica for replica in slots if replica is not None]
        except BaseException:
            for replica in slots:
                if replica is not None:
                    print(f"--- {replica.url} ---\n{replica.output()[-3000:]}")
            raise
        finally:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as group:
                    for replica in slots:
                        if replica is not None:
                            group.start_soon(_stop_server, replica.process, 15)


async def call(replica: Replica, tool: str, arguments: dict[str, Any], bound: float = CALL_BOUND) -> CallToolResult:
    """``tool`` called on ``replica`` by a client of its own (a balancer sending each call anywhere)."""
    async with http_client(replica.url, TOKEN) as client:
        with anyio.fail_after(bound):
            return await client.call_tool(tool, arguments)


def structured_data(result: CallToolResult) -> dict[str, Any]:
    """A tool result's structured content (asserted present)."""
    assert result.structured_content is not None, result
    structured: dict[str, Any] = result.structured_content
    return structured


async def run(replica: Replica, conversation: str, code: str, bound: float = 60.0) -> dict[str, Any]:
    """``code`` run in ``conversation`` through ``replica``: the result's structured content."""
    return structured_data(await call(replica, "run_python", {"code": code, "conversationId": conversation}, bound))


def owners(database_url: str, conversation: str | None = None) -> set[str]:
    """The replicas holding a live lease: on ``conversation`` of the default tenant, or on any."""
    now = time.time()
    key = None if conversation is None else conversation_key(database_url, conversation)
    return {owner for held, owner, expires, _epoch in lease_rows(database_url) if expires > now and key in (None, held)}


def conversation_key(database_url: str, conversation: str) -> str:
    """The key of the default tenant's ``conversation`` (its lease, index row and store prefix)."""
    key = derive_key(shared_secret(database_url), "workspace")
    framed = b"".join(len(part).to_bytes(8, "big") + part for part in (b"default", conversation.encode()))
    return hmac.new(key, framed, hashlib.sha256).hexdigest()


def lease_rows(database_url: str) -> list[tuple[str, str, float, int]]:
    """Every lease: key, owner, expiry, epoch."""
    with psycopg.connect(database_url, autocommit=True) as db:
        rows = db.execute("SELECT key, owner, expires, epoch FROM leases").fetchall()
    return [(str(key), str(owner), float(expires), int(epoch)) for key, owner, expires, epoch in rows]


def shared_secret(database_url: str) -> bytes:
    with psycopg.connect(database_url, autocommit=True) as db:
        row = db.execute("SELECT secret FROM server_secret").fetchone()
    assert row is not None
    return bytes.fromhex(row[0])


async def runs_running(web: httpx2.AsyncClient, replica: Replica) -> float:
    """The runs going on on ``replica`` now, from its ``/metrics`` (started with ``METRICS_TOKEN``)."""
    reply = await web.get(f"{replica.url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    for line in reply.text.splitlines():
        if line.startswith("mcp_sandbox_runs_running "):
            return float(line.split()[1])
    raise AssertionError(reply.text)


async def until(check: Callable[[], Awaitable[bool]], bound: float) -> None:
    """Poll another process's HTTP answers: there is nothing to wait on but the answer itself."""
    with anyio.fail_after(bound):
        while True:
            if await check():
                return
            await anyio.sleep(0.05)
