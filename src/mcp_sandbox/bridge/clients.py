"""One warm MCP client per downstream server, each owned by exactly one task.

A connection starts on first use: its owner task enters the SDK ``Client`` (``mode="auto"``,
so servers of both protocol eras work), lists the tools, and then holds the connection open
until it is told to stop. Callers in any task use the open client concurrently; they never
enter or exit its context managers. A call that finds the connection closed (the server
crashed or exited, or broke the framing of its stdio: see stdio.py) ends the owner task, so the
next use starts the server again; a server that keeps breaking is started again after a growing
pause (``restart_delay``). Closing the pool stops every owner within a bound, then cancels
whatever is left.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import anyio
import anyio.to_thread
from anyio.abc import TaskGroup

from mcp_sandbox.bridge.discovery import ServerSpec
from mcp_sandbox.bridge.stdio import stdio_transport
from mcp_sandbox.errors import DownstreamError

# The SDK is imported when the first connection starts, not with this module: importing it takes
# longer than the rest of a `mcp-sandbox run` (pydantic builds its models), and a run or a server
# that calls no downstream server never needs it (bench/startup.py).
if TYPE_CHECKING:
    import mcp_types as types
    from mcp import Client

__all__ = ["ClientPool", "open_client_pool"]

logger = logging.getLogger(__name__)

# A server that lists more pages than this is looping; stop asking.
_MAX_TOOL_PAGES = 100
# A server that failed to start is not tried again sooner than this (seconds): the requests of
# one run (stubs, then calls) should not each wait for it to fail again.
RETRY_AFTER = 5.0
# The pause before starting again a server whose connection broke `n` times in a row (seconds).
_FIRST_RESTART_DELAY = 0.5
_MAX_RESTART_DELAY = 30.0


def restart_delay(breaks: int) -> float:
    """No pause after one break (the next call should just work), then doubling up to a bound."""
    return 0.0 if breaks <= 1 else min(_FIRST_RESTART_DELAY * 2 ** (breaks - 2), _MAX_RESTART_DELAY)


@dataclass(eq=False)
class _Connection:
    """One downstream connection's life, from start to stop. Never reused after it ends."""

    spec: ServerSpec
    ready: anyio.Event = field(default_factory=anyio.Event)
    stop: anyio.Event = field(default_factory=anyio.Event)
    finished: anyio.Event = field(default_factory=anyio.Event)
    client: Client | None = None
    tools: tuple[types.Tool, ...] = ()
    failure: str | None = None
    failed_at: float = 0.0
    broken: str | None = None  # why the transport ended the connection (framing, size), if it did
    delay: float = 0.0  # how long to wait before starting the server


def _describe(exc: BaseException) -> str:
    from mcp.shared.exceptions import MCPError
    from pydantic import ValidationError as PydanticValidationError

    if isinstance(exc, MCPError):
        return exc.message
    if isinstance(exc, ExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    if isinstance(exc, PydanticValidationError):
        return f"the server sent a malformed message ({exc.error_count()} validation errors)"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class ClientPool:
    """Downstream MCP clients by alias. Build with :func:`open_client_pool`."""

    def __init__(
        self,
        servers: Mapping[str, ServerSpec],
        group: TaskGroup,
        *,
        connect_timeout: float,
        call_timeout: float,
        log_dir: Path | None = None,
        max_message_bytes: int = 64 << 20,
    ) -> None:
        self.servers = dict(servers)
        self._max_message_bytes = max_message_bytes
        self._breaks: dict[str, int] = {}  # connections broken in a row, by key
        self._log_dir = log_dir
        self._group = group
        self._connect_timeout = connect_timeout
        self._call_timeout = call_timeout
        self._connections: dict[str, _Connection] = {}
        self._closing = False

    def _spec(self, alias: str) -> ServerSpec:
        try:
            return self.servers[alias]
        except KeyError:
            raise DownstreamError(alias, f"no downstream server is called {alias!r}") from None

    async def _connection(self, alias: str, tenant: str | None = None) -> _Connection:
        """The live connection to ``alias``, started if it is not running.

        A ``per_tenant`` server has a connection (a process) per ``tenant``, and one more, which
        no call reaches, to list its tools.

        Raises:
            DownstreamError: the server could not be started or did not list its tools in time.
        """
        spec = self._spec(alias)
        if self._closing:
            raise DownstreamError(spec.name, "the server is shutting down")
        key = f"{alias}\0{tenant}" if spec.per_tenant and tenant is not None else alias
        connection = self._connections.get(key)
        if connection is not None and connection.failure is not None:
            if anyio.current_time() - connection.failed_at < RETRY_AFTER:
                raise DownstreamError(spec.name, f"server {spec.name!r} is unavailable: {connection.failure}")
        # A connection told to stop (its server crashed) is dead even while its owner winds down.
        if connection is None or connection.stop.is_set() or connection.failure is not None:
            connection = _Connection(spec.instance_for(tenant) if key != alias and tenant is not None else spec)
            connection.delay = restart_delay(self._breaks.get(key, 0))
            self._connections[key] = connection
            self._group.start_soon(self._own, connection, name=f"downstream {spec.name}")
        await connection.ready.wait()
        if connection.failure is not None:
            raise DownstreamError(spec.name, f"server {spec.name!r} is unavailable: {connection.failure}")
        return connection

    async def _own(self, connection: _Connection) -> None:
        """The owner task: open the client, list its tools, hold it until told to stop."""
        from mcp import Client

        spec = connection.spec
        try:
            if connection.delay:
                logger.info("downstream %s broke again; starting it in %g s", spec.name, connection.delay)
                await anyio.sleep(connection.delay)
            # The deadline covers start-up and listing only; it is lifted once the server is ready.
            with anyio.CancelScope(deadline=anyio.current_time() + self._connect_timeout) as scope:
                async with contextlib.AsyncExitStack() as stack:
                    target = await self._target(connection, stack)
                    client = await stack.enter_async_context(Client(target, mode="auto"))
                    connection.tools = await self._list_tools(client)
                    connection.client = client
                    scope.deadline = math.inf
                    connection.ready.set()
                    logger.info("downstream %s is up (%d tools)", spec.name, len(connection.tools))
                    await connection.stop.wait()
            if scope.cancelled_caught and not connection.ready.is_set():
                connection.failure = f"it did not start within {self._connect_timeout:g} s"
        except Exception as exc:  # anything a broken server or its transport throws ends this connection
            connection.failure = connection.failure or _describe(exc)
            logger.warning("downstream %s failed: %s", spec.name, connection.failure)
        finally:
            connection.client = None
            if not connection.ready.is_set():
                connection.failure = connection.failure or "it exited during start-up"
            if connection.failure is not None:
                connection.failed_at = anyio.current_time()
            connection.finished.set()
            connection.ready.set()

    async def _target(self, connection: _Connection, stack: contextlib.AsyncExitStack) -> Any:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        spec = connection.spec

        if spec.url is not None:
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=dict(spec.headers), timeout=httpx2.Timeout(30.0, read=300.0))
            )
            return streamable_http_client(spec.url, http_client=http)
        assert spec.command is not None  # discovery guarantees a command or a url

        def on_break(reason: str) -> None:
            logger.warning("downstream %s broke the protocol: %s", spec.name, reason)
            connection.broken = reason

        # The server's stderr goes to its own log, not into the output of whoever runs us.
        log = None
        if self._log_dir is not None:
            log = stack.enter_context(await anyio.to_thread.run_sync(self._open_log, spec.alias))
        return stdio_transport(
            spec.command,
            list(spec.args),
            dict(spec.env),
            spec.cwd,
            **({} if log is None else {"errlog": log}),
            max_message_bytes=self._max_message_bytes,
            on_break=on_break,
        )

    def _open_log(self, alias: str) -> TextIO:
        assert self._log_dir is not None
        self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return open(self._log_dir / f"{alias}.log", "a", encoding="utf-8")  # closed by the owner's exit stack

    @staticmethod
    async def _list_tools(client: Client) -> tuple[types.Tool, ...]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(_MAX_TOOL_PAGES):
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        return tuple(tools)

    async def tools(self, alias: str) -> tuple[types.Tool, ...]:
        """The tools ``alias`` lists (cached while its connection lives).

        Raises:
            DownstreamError: the server could not be started.
        """
        return (await self._connection(alias)).tools

    async def call(
        self, alias: str, tool: str, arguments: dict[str, Any], tenant: str | None = None
    ) -> types.CallToolResult:
        """Call ``tool`` on ``alias`` with the per-call timeout, as ``tenant`` (see :meth:`_connection`).

        Raises:
            DownstreamError: the server is unavailable, closed the connection, timed out or
                answered with a protocol error. (A tool that fails returns ``is_error``.)
        """
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT
        from pydantic import ValidationError as PydanticValidationError

        connection = await self._connection(alias, tenant)
        client = connection.client
        name = connection.spec.name
        if client is None:  # it ended between ready and now
            raise DownstreamError(name, f"server {name!r} closed the connection", tool)
        key = next((key for key, known in self._connections.items() if known is connection), alias)
        try:
            result = await client.call_tool(tool, arguments, read_timeout_seconds=self._call_timeout)
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                connection.stop.set()  # restart on next use
                if connection.broken is not None:
                    self._breaks[key] = self._breaks.get(key, 0) + 1
                    broken = f"server {name!r} broke the protocol: {connection.broken}"
                    raise DownstreamError(name, f"{broken}; it is restarted for the next call", tool) from exc
                raise DownstreamError(name, f"server {name!r} closed the connection (did it crash?)", tool) from exc
            if exc.code == REQUEST_TIMEOUT:
                raise DownstreamError(name, f"no answer within {self._call_timeout:g} s", tool) from exc
            raise DownstreamError(name, exc.message, tool) from exc
        except PydanticValidationError as exc:
            raise DownstreamError(name, _describe(exc), tool) from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            connection.stop.set()
            raise DownstreamError(name, f"lost the connection to {name!r}: {_describe(exc)}", tool) from exc
        self._breaks.pop(key, None)
        return result

    async def all_tools(self) -> dict[str, tuple[types.Tool, ...] | DownstreamError]:
        """Every server's tools, started concurrently; a server that fails gives its error."""
        found: dict[str, tuple[types.Tool, ...] | DownstreamError] = {}

        async def one(alias: str) -> None:
            try:
                found[alias] = await self.tools(alias)
            except DownstreamError as exc:
                found[alias] = exc

        async with anyio.create_task_group() as group:
            for alias in self.servers:
                group.start_soon(one, alias)
        return {alias: found[alias] for alias in self.servers}

    async def restart(self, alias: str) -> None:
        """Stop ``alias``'s connections (if any); the next use starts the server again."""
        for key, connection in self._connections.items():
            if key == alias or key.startswith(f"{alias}\0"):
                connection.stop.set()

    async def aclose(self, grace: float) -> None:
        """Stop every connection, waiting at most ``grace`` seconds for them to end."""
        self._closing = True
        for connection in self._connections.values():
            connection.stop.set()
        with anyio.move_on_after(grace):
            for connection in self._connections.values():
                await connection.finished.wait()


@contextlib.asynccontextmanager
async def open_client_pool(
    servers: Mapping[str, ServerSpec],
    *,
    connect_timeout: float = 30.0,
    call_timeout: float = 60.0,
    shutdown_timeout: float = 5.0,
    log_dir: Path | None = None,
    max_message_bytes: int = 64 << 20,
) -> AsyncIterator[ClientPool]:
    """A pool whose owner tasks live in this context; leaving it stops every server.

    With ``log_dir``, each stdio server's stderr goes to ``<log_dir>/<alias>.log``; else to ours.
    A stdio server that sends one message over ``max_message_bytes`` is restarted.
    """
    async with anyio.create_task_group() as group:
        pool = ClientPool(
            servers,
            group,
            connect_timeout=connect_timeout,
            call_timeout=call_timeout,
            log_dir=log_dir,
            max_message_bytes=max_message_bytes,
        )
        try:
            yield pool
        finally:
            with anyio.CancelScope(shield=True):
                await pool.aclose(shutdown_timeout)
            group.cancel_scope.cancel()
