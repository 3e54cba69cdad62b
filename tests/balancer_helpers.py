"""Replicas of the server behind a real load balancer, on loopback (test set-up, not product).

:func:`replica_set` starts, for one block, beside the session's SeaweedFS (tests/s3_helpers.py,
a new prefix of its bucket per block): Debian's HAProxy running deploy/haproxy.cfg with only its
bind and server addresses changed to free loopback ports (the file docs/scaling.md shows), and N
real ``mcp-sandbox serve --transport http`` processes, each with a state directory of its own and
its own ``replica_url``, the same tokens, server secret, ``database_url`` (a new database of the
caller's PostgreSQL cluster, tests/postgres_helpers.py) and ``object_store_url``. A
:class:`Replica` can be killed with SIGKILL and started again on its port;
:meth:`ReplicaSet.client` calls the tools through the balancer with the SDK's client. HAProxy
gets a parent-death signal, so a pytest killed with ``kill -9`` takes it along.
"""

from __future__ import annotations

import ctypes
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from mcp_sandbox.workspace import remove_tree
from mcp_test_helpers import CALL_BOUND, _server_env, _stop_server, _wait_listening, free_port, private_tmpdir
from s3_helpers import s3_env, store_url

__all__ = [
    "HAPROXY_CONFIG",
    "Replica",
    "ReplicaSet",
    "balancer_config",
    "replica_set",
    "require_haproxy",
]

REPO = Path(__file__).resolve().parents[1]
HAPROXY_CONFIG = REPO / "deploy" / "haproxy.cfg"
# In an ``option httplog`` line: the status, the bytes read, two cookie fields, the termination state.
_HTTPLOG_END = re.compile(r" (?P<status>-?\d+) \d+ \S+ \S+ (?P<flags>\S{4}) \d+/")
ADMIN_SOCKET = "haproxy-admin.sock"  # the runtime API's socket, in the replica set's root
HAPROXY_HINT = "HAProxy is not installed: run `make haproxy` (Debian's haproxy package)"
_PR_SET_PDEATHSIG = 1
_START_BOUND = 90.0
_STORE_BOUND = 60.0
_SECRET_BYTES = 32  # workspace/secret.py


def require_haproxy() -> Path:
    """Debian's ``haproxy``; where it is missing, fail under ``make test`` (``MCP_SANDBOX_TEST_REQUIRE``
    names haproxy), else skip, either way saying how to install it."""
    found = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
    if found is None:
        if "haproxy" in os.environ.get("MCP_SANDBOX_TEST_REQUIRE", "").split(","):
            pytest.fail(HAPROXY_HINT, pytrace=False)
        pytest.skip(HAPROXY_HINT)
    return Path(found)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies (a pytest killed with -9 leaves nothing)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def balancer_config(text: str, bind: str, servers: Sequence[str], admin_socket: Path) -> str:
    """deploy/haproxy.cfg's ``text`` with its ``bind`` address, its servers' addresses (``servers``
    in order) and its runtime API's socket replaced; nothing else changes."""
    text = re.sub(r"(?m)^(\s*stats socket\s+)\S+", rf"\g<1>{admin_socket}", text)
    lines = text.splitlines(keepends=True)
    binds = [i for i, line in enumerate(lines) if re.match(r"\s*bind\s", line)]
    listed = [i for i, line in enumerate(lines) if re.match(r"\s*server\s", line)]
    assert len(binds) == 1 and len(listed) == len(servers), "deploy/haproxy.cfg: one bind, one server per replica"
    lines[binds[0]] = re.sub(r"(\s*bind\s+)\S+", rf"\g<1>{bind}", lines[binds[0]])
    for index, address in zip(listed, servers, strict=True):
        lines[index] = re.sub(r"(\s*server\s+\S+\s+)\S+", rf"\g<1>{address}", lines[index])
    return "".join(lines)


def _spawn(command: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A helper engine (weed, haproxy) that dies with the test process."""
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent)


async def _end(process: subprocess.Popen[bytes], sig: int) -> None:
    """Send ``sig``, wait (bounded), then SIGKILL; shielded from cancellation."""
    with anyio.CancelScope(shield=True):
        if process.poll() is None:
            process.send_signal(sig)
        for _ in range(100):
            if process.poll() is not None:
                return
            await anyio.sleep(0.1)  # a Popen has no awaitable exit
        process.kill()
        await anyio.to_thread.run_sync(process.wait)


@dataclass
class Replica:
    """One ``mcp-sandbox serve --transport http`` on a fixed loopback port, started and killed at will."""

    name: str
    port: int
    state_dir: Path
    env: dict[str, str]
    log_path: Path
    process: anyio.abc.Process | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start it and wait until it listens and ``/readyz`` answers 200 (bounded).

        Raises:
            RuntimeError: it exited first, or was not ready in time; with the end of its log.
        """
        assert self.process is None, f"{self.name} is running"
        command = [
            *(sys.executable, "-m", "mcp_sandbox"),
            *("serve", "--transport", "http", "--host", "127.0.0.1", "--port", str(self.port)),
            *("--state-dir", str(self.state_dir)),
        ]
        self._log = self.log_path.open("ab")
        self.process = await anyio.open_process(
            command, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log, env=self.env, start_new_session=True
        )
        try:
            with anyio.fail_after(_START_BOUND):
                await _wait_listening(self.process, "127.0.0.1", self.port)
                await self._wait_ready()
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.stop()
            raise RuntimeError(f"{self.name} did not start:\n{self.log_tail()}") from None

    async def _wait_ready(self) -> None:
        """Poll ``/readyz`` until 200, as a balancer's or kubelet's check does: it listens before
        its warm pool is up, and a balancer that checked then would take it out. The caller bounds it."""
        async with httpx2.AsyncClient(timeout=5) as web:
            while (await web.get(f"{self.url}/readyz")).status_code != 200:
                if self.process is None or self.process.returncode is not None:
                    raise RuntimeError(f"{self.name} exited")
                await anyio.sleep(0.1)  # readiness has no event to wait on from outside

    async def kill(self) -> None:
        """``kill -9`` of the server process, then of what it left in its process group (as a
        pod's or a machine's death takes its sandboxes too)."""
        assert self.process is not None, f"{self.name} is not running"
        self.process.send_signal(signal.SIGKILL)
        with anyio.fail_after(15):
            await self.process.wait()
        await self.stop()

    async def stop(self) -> None:
        """SIGTERM (the drain), bounded, then SIGKILL to its whole process group."""
        if self.process is not None:
            with anyio.CancelScope(shield=True):
                await _stop_server(self.process, 15.0)
            self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self, *, kill: bool = False) -> None:
        """Stop it (drained, or with ``kill=True`` by SIGKILL) and start it again on its port."""
        await (self.kill() if kill else self.stop())
        await self.start()

    def log_tail(self, limit: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-limit:] if self.log_path.exists() else ""


@dataclass
class ReplicaSet:
    """The running replicas, the balancer's URL in front of them, the store and the tokens."""

    url: str
    replicas: list[Replica]
    store_url: str  # object_store_url, in the session's SeaweedFS (tests/s3_helpers.py)
    database_url: str
    token: str
    metrics_token: str
    root: Path
    fresh: Replica | None = None  # replica_set(fresh=True): the server beside them that takes no lease

    def balancer_failures(self, limit: int = 20) -> list[str]:
        """HAProxy's log lines (``option httplog``) of the requests it did not end normally: a 5xx,
        or a termination state other than ``----`` (``SD``: the server hung up, ``CD``: the client
        did, ...); the last ``limit`` of them."""
        path = self.root / "haproxy.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        failed = []
        for line in lines:
            ended = _HTTPLOG_END.search(line)
            if ended is not None and (ended["flags"] != "----" or ended["status"].startswith(("5", "-"))):
                failed.append(line)
        return failed[-limit:]

    def admin(self, command: str) -> str:
        """What HAProxy's runtime API (the config's ``stats socket``) answers to ``command``."""
        with socket.socket(socket.AF_UNIX) as api:
            api.settimeout(10)
            api.connect(str(self.root / ADMIN_SOCKET))
            api.sendall(f"{command}\n".encode())
            answer = b""
            while chunk := api.recv(65536):
                answer += chunk
        return answer.decode()

    @asynccontextmanager
    async def client(self, mode: str = "auto") -> AsyncIterator[Client]:
        """An SDK client calling ``/mcp`` through the balancer (``mode="legacy"``: the handshake
        era, with a Streamable HTTP session)."""
        headers = {"Authorization": f"Bearer {self.token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=CALL_BOUND) as web,
            Client(
                streamable_http_client(f"{self.url}/mcp", http_client=web), read_timeout_seconds=CALL_BOUND, mode=mode
            ) as client,
        ):
            yield client

    async def runs(self) -> dict[str, float]:
        """Runs each replica has served, from its own ``/metrics`` (``mcp_sandbox_runs_total``);
        a replica that is down counts as absent."""
        counts: dict[str, float] = {}
        headers = {"Authorization": f"Bearer {self.metrics_token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=10) as web:
            for replica in self.replicas:
                if replica.process is None:
                    continue
                page = (await web.get(f"{replica.url}/metrics")).raise_for_status().text
                counts[replica.name] = sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in page.splitlines()
                    if line.startswith("mcp_sandbox_runs_total{")
                )
        return counts


@asynccontextmanager
async def _haproxy(config: str, root: Path, bind_port: int) -> AsyncIterator[str]:
    """HAProxy in the foreground (``-db``) on ``config``, checked first; its URL once it listens."""
    haproxy = str(require_haproxy())
    path = root / "haproxy.cfg"
    path.write_text(config)
    checked = await anyio.run_process([haproxy, "-c", "-f", str(path)], check=False)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode(errors="replace")
    with (root / "haproxy.log").open("ab") as log:
        process = _spawn([haproxy, "-f", str(path), "-db"], log)
        try:
            with anyio.fail_after(_START_BOUND):
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(f"haproxy exited with {process.returncode}")
                    try:
                        await (await anyio.connect_tcp("127.0.0.1", bind_port)).aclose()
                        break
                    except OSError:
                        await anyio.sleep(0.05)  # nothing to wait on but the port itself
            yield f"http://127.0.0.1:{bind_port}"
        finally:
            await _end(process, signal.SIGTERM)


@asynccontextmanager
async def replica_set(
    database_url: str,
    s3_endpoint: str,
    *,
    count: int = 3,
    runtime: Path | None = None,
    env: Mapping[str, str] | None = None,
    small_disk: str | None = None,
    fresh: bool = False,
) -> AsyncIterator[ReplicaSet]:
    """``count`` replicas sharing ``database_url`` and a new prefix of the store at ``s3_endpoint``
    behind HAProxy (see the module's docstring); everything is stopped and removed when the block ends.
    ``small_disk`` (a tmpfs ``size=``, as root): the last replica's state directory is a tmpfs of
    that size, so a test can fill its disk. ``fresh``: one more server, started and stopped with
    the replicas, not behind the balancer: a state directory of its own, the same token, server
    secret, database and store, and no ``replica_url`` (it takes no lease), so each conversation it
    is asked about is restored from the store alone."""
    require_haproxy()
    root = private_tmpdir("replicas-")
    token = secrets.token_urlsafe(24)
    metrics_token = secrets.token_urlsafe(24)
    server_secret = secrets.token_bytes(_SECRET_BYTES)
    bind_port = free_port()
    balancer_url = f"http://127.0.0.1:{bind_port}"
    replicas: list[Replica] = []
    servers: list[Replica] = []  # the replicas and the fresh one
    spare: Replica | None = None
    mounted: list[Path] = []
    try:
        store = store_url("replicas-")
        for index in range(1, count + 1):
            home = root / f"replica{index}"
            home.mkdir(mode=0o711)
            state_dir = home / "state"
            state_dir.mkdir(mode=0o700)
            if small_disk is not None and index == count:
                await anyio.run_process(
                    ["mount", "-t", "tmpfs", "-o", f"size={small_disk},mode=0700", "tmpfs", str(state_dir)]
                )
                mounted.append(state_dir)
            # The same server secret on every replica: links signed by one open on another.
            secret = state_dir / "secret"
            secret.write_bytes(server_secret)
            secret.chmod(0o600)
            port = free_port()
            shared = {
                "MCP_SANDBOX_TOKEN": token,
                "MCP_SANDBOX_METRICS_TOKEN": metrics_token,
                "MCP_SANDBOX_DATABASE_URL": database_url,
                "MCP_SANDBOX_PUBLIC_URL": balancer_url,
                # Three servers on two cores: small pools.
                "MCP_SANDBOX_POOL_SIZE": "1",
                "MCP_SANDBOX_PRESTART_SIZE": "0",
                **s3_env(s3_endpoint),
                "MCP_SANDBOX_OBJECT_STORE_URL": store,
                "MCP_SANDBOX_REPLICA_URL": f"http://127.0.0.1:{port}",
                **(env or {}),
            }
            replicas.append(
                Replica(f"replica{index}", port, state_dir, _server_env(runtime, shared), home / "server.log")
            )
        if fresh:
            home = root / "fresh"
            home.mkdir(mode=0o711)
            (home / "state").mkdir(mode=0o700)
            (home / "state" / "secret").write_bytes(server_secret)
            (home / "state" / "secret").chmod(0o600)
            alone = {
                "MCP_SANDBOX_TOKEN": token,
                "MCP_SANDBOX_DATABASE_URL": database_url,
                "MCP_SANDBOX_OBJECT_STORE_URL": store,
                "MCP_SANDBOX_POOL_SIZE": "1",
                "MCP_SANDBOX_PRESTART_SIZE": "0",
                **s3_env(s3_endpoint),
            }
            spare = Replica("fresh", free_port(), home / "state", _server_env(runtime, alone), home / "server.log")
        servers = [*replicas, *([spare] if spare is not None else [])]
        async with anyio.create_task_group() as group:
            for server in servers:
                group.start_soon(server.start)
        config = balancer_config(
            HAPROXY_CONFIG.read_text(),
            f"127.0.0.1:{bind_port}",
            [f"127.0.0.1:{r.port}" for r in replicas],
            root / ADMIN_SOCKET,
        )
        async with _haproxy(config, root, bind_port) as url:
            yield ReplicaSet(url, replicas, store, database_url, token, metrics_token, root, spare)
    finally:
        with anyio.CancelScope(shield=True):
            async with anyio.create_task_group() as group:
                for server in servers:
                    group.start_soon(server.stop)
            for state_dir in mounted:
                await anyio.run_process(["umount", "-l", str(state_dir)])
        remove_tree(root)
