"""Where a call runs: here when this replica holds the conversation's lease, else forwarded to its owner.

:class:`Router` claims the lease of the call's conversation and returns a decision the caller
acts on; it never runs the call itself. Ours: :class:`Here`, with the lease's epoch, and the
caller runs the call (the workspace's files are restored first when the lease is new here; a
lease taken after it lapsed marks the interpreter lost, which the next run says: :mod:`.leases`).
Another replica's: the call is posted to that replica's internal route (:data:`CALL_PATH`),
signed, and :class:`Forwarded` carries its tool result unchanged (progress notifications are not
forwarded); the owner's side decides with :meth:`Router.accept`. An owner that cannot be reached
(connection refused: it died) is waited out until its lease expires, bounded by the lease time;
then this replica takes the lease and runs the call. An owner that stops answering in the
middle of a call is not retried: the code may have run, so the result says so. An owner that is
frozen (stopped, paused) keeps its connection open and answers nothing: while a call is
forwarded, its lease is read again each time it should have been renewed, and once it expired
unrenewed the hop is cancelled and the call taken over as after a death (the frozen owner's
writes are fenced by the lease it lost), so a frozen owner holds a call about ``replica_lease``,
not the forwarded call's whole read timeout.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pydantic

from mcp_sandbox import tracing
from mcp_sandbox.errors import LeaseLostError, WorkspaceError
from mcp_sandbox.replicas.leases import Leases
from mcp_sandbox.replicas.peers import PeerError, Peers, Reply, Unreachable
from mcp_sandbox.replicas.refusals import refusal_meta
from mcp_sandbox.replicas.restores import Restores
from mcp_sandbox.replicas.signing import Verifier, sign

__all__ = [
    "CALL_PATH",
    "FORWARDED_TOOLS",
    "STATE_LOST_NOTE",
    "TASK_PATH",
    "Forwarded",
    "Forwarder",
    "Here",
    "Moved",
    "Owner",
    "Router",
    "error_result",
]

logger = logging.getLogger(__name__)

CALL_PATH = "/internal/v1/call"
TASK_PATH = "/internal/v1/task"  # tasks/get and tasks/cancel of a task another replica runs (server/tasks/remote.py)
FORWARDED_TOOLS = frozenset({"run_python", "run_code", "upload_file"})
STATE_LOST_NOTE = (
    "{reason}: its interpreter's state (variables, imports) is lost and this run started a fresh one;"
    " the workspace's files are kept"
)
_CONNECT_SECONDS = 2.0
_ATTEMPTS = 4
_KNOWN_OWNERS = 4096  # owners remembered from claims, to forward without asking the database
_LAPSE_MARGIN = 0.1  # read a forwarded call's lease this long after its expiry (a renewal just made is seen)


class Moved(Exception):
    """The replica asked does not hold the conversation's lease (any more)."""


class _Unreachable(Exception):
    """The owner refused the connection or could not be reached: nothing was sent."""


class _Lapsed(Exception):
    """The owner's lease expired unrenewed while a call was forwarded to it: it is frozen or gone."""


def error_result(message: str, meta: dict[str, Any] | None = None) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True, _meta=meta)


class Forwarder:
    """Posts calls to other replicas on kept-alive HTTP/1.1 connections (:mod:`.peers`), for the server's life.

    ``idle``: how long an idle connection is kept for the next call (less than the replicas' keep-alive);
    ``ca``: the CAs that vouch for https replicas (``replica_ca``), else the system's; ``identity``:
    the certificate and key this replica presents to https replicas (``internal_cert``, ``internal_key``).

    Raises:
        ConfigError: ``ca`` is not a readable PEM file of CA certificates, or ``identity`` not a
            certificate and its key.
    """

    def __init__(
        self,
        me: str,
        key: bytes,
        read_timeout: float,
        idle: float = 2.5,
        ca: Path | None = None,
        identity: tuple[Path, Path] | None = None,
    ) -> None:
        self._me = me
        self._sequence = itertools.count()  # two identical calls in one millisecond: two signatures
        self._key = key
        self._peers = Peers(_CONNECT_SECONDS, read_timeout, idle, ca=ca, identity=identity)

    async def aclose(self) -> None:
        await self._peers.aclose()

    async def forward(
        self, owner: str, tool: str, arguments: dict[str, Any] | None, tenant: str
    ) -> types.CallToolResult:
        """``tool`` called on replica ``owner`` as ``tenant``; its tool result.

        Raises:
            Moved: the owner no longer holds the lease. _Unreachable: the owner cannot be reached.
        """
        call = {"to": owner, "from": self._me, "n": next(self._sequence), "tool": tool, "tenant": tenant}
        body = json.dumps({**call, "arguments": arguments})
        content = body.encode("utf-8")
        headers = [("content-type", "application/json"), *sign(self._key, content, time.time()).items()]
        with tracing.span("mcp_sandbox.forward", {"gen_ai.tool.name": tool}, tracing.SpanKind.CLIENT) as span:
            if span is not None:  # the owner continues this trace (replicas/internal_route.py)
                carrier: dict[str, str] = {}
                tracing.inject(carrier)
                headers += carrier.items()
            try:
                reply = await self._peers.post(owner.rstrip("/") + CALL_PATH, content, headers)
            except Unreachable as exc:
                raise _Unreachable(str(exc)) from exc
            except PeerError as exc:
                logger.error("the replica %s stopped answering a forwarded %s call: %s", owner, tool, exc)
                said = (
                    "the replica running this conversation stopped answering during the call: the code may or may"
                    " not have run, and the interpreter's state (variables, imports) is lost; the workspace's files"
                    " are kept"
                )
                # Refused as a lost lease: an upload sent again (503) reaches the replica that takes it over.
                return error_result(said, refusal_meta(LeaseLostError(said)))
            if span is not None:
                span.set_attribute("http.response.status_code", reply.status)
        if reply.status == 409:
            raise Moved(owner)
        if reply.status != 200:
            logger.error("the replica %s refused a forwarded %s call: HTTP %d", owner, tool, reply.status)
            return error_result("the replica running this conversation refused the call (the server's log says why)")
        try:
            return types.CallToolResult.model_validate_json(reply.body)
        except pydantic.ValidationError as exc:  # a peer of another version, or not a replica of ours
            logger.error("the replica %s answered a forwarded %s call with no tool result: %s", owner, tool, exc)
            return error_result(
                "the replica running this conversation answered the call with no tool result: the code may or may"
                " not have run (the server's log says why)"
            )

    async def ask(self, owner: str, request: dict[str, Any]) -> Reply:
        """``request`` (a task's, :data:`TASK_PATH`) posted to replica ``owner``, signed; its answer.

        Raises:
            PeerError: no whole answer came (Unreachable: nothing was sent).
        """
        body = json.dumps({**request, "to": owner, "from": self._me, "n": next(self._sequence)}).encode("utf-8")
        headers = [("content-type", "application/json"), *sign(self._key, body, time.time()).items()]
        return await self._peers.post(owner.rstrip("/") + TASK_PATH, body, headers)


@dataclass(frozen=True)
class Here:
    """Run the call here: this replica holds the conversation's lease in ``epoch``, its files restored."""

    epoch: int


@dataclass(frozen=True)
class Owner:
    """Replica ``url`` holds the conversation's lease, until ``expires`` as far as its claim said."""

    url: str
    expires: float


@dataclass(frozen=True)
class Forwarded:
    """The call was sent to replica ``owner``: ``result`` is its answer (or why none came)."""

    owner: str
    result: types.CallToolResult


class Router:
    """Decides where a call of a conversation runs (see the module docstring); the caller acts on it.

    The caller keeps the lease for the whole call: ``with router.calling(key):`` around the
    decision and the work done on it.
    """

    def __init__(
        self, leases: Leases, forwarder: Forwarder, verifier: Verifier, restore: Callable[[str, int], Awaitable[None]]
    ) -> None:
        self.leases = leases
        self.verifier = verifier  # checks the calls other replicas forward here
        self.me = leases.table.me
        self._forwarder = forwarder
        self._restores = Restores(restore)
        self._owners: dict[str, tuple[str, float]] = {}  # key: the owner a claim found, and until when

    def _remember(self, key: str, owner: str, expires: float) -> None:
        if len(self._owners) >= _KNOWN_OWNERS:
            now = time.time()
            self._owners = {k: known for k, known in self._owners.items() if known[1] > now}
            if len(self._owners) >= _KNOWN_OWNERS:
                self._owners.clear()
        self._owners[key] = (owner, expires)

    async def ask(self, owner: str, request: dict[str, Any]) -> Reply:
        """A task's ``request`` asked of replica ``owner`` (:meth:`Forwarder.ask`).

        Raises:
            PeerError: no whole answer came.
        """
        return await self._forwarder.ask(owner, request)

    def calling(self, key: str) -> contextlib.AbstractContextManager[None]:
        """Keep ``key``'s lease, once claimed, until the block ends (:meth:`.Leases.calling`)."""
        return self.leases.calling(key)

    async def place(self, key: str) -> Here | Owner:
        """Claim conversation ``key``'s lease: :class:`Here` once its files are here for the lease's
        epoch (see :mod:`.restores`), else the :class:`Owner` that holds it.

        Raises:
            WorkspaceError: the database cannot be reached, or the restore failed.
        """
        claim = await self.leases.claim(key)
        if not claim.mine:
            return Owner(claim.owner, claim.expires)
        self._restores.prune(self.leases.held)
        await self._restores.ready(key, claim.epoch)
        return Here(claim.epoch)

    async def route(self, key: str, tool: str, arguments: dict[str, Any] | None, tenant: str) -> Here | Forwarded:
        """:class:`Here` when this replica holds (or takes) conversation ``key``'s lease, else the call
        :class:`Forwarded` to its owner with the owner's answer.

        Raises:
            WorkspaceError: the database cannot be reached (the lease cannot be claimed), or the restore failed.
        """
        known = self._owners.get(key)
        if known is not None and known[1] - time.time() > self.leases.ttl / 2 and not self.leases.holds(key):
            try:  # the owner learnt by the last claim (the owner checks its own lease anyway)
                return await self._forward_watched(key, known[0], known[1], tool, arguments, tenant)
            except (Moved, _Unreachable, _Lapsed):
                pass  # claimed below: a lapsed lease is taken, and its loss marked (leases.py)
        self._owners.pop(key, None)
        owner = ""
        for _ in range(_ATTEMPTS):
            where = await self.place(key)
            if isinstance(where, Here):
                return where
            owner = where.url
            self._remember(key, owner, where.expires)
            try:
                return await self._forward_watched(key, owner, where.expires, tool, arguments, tenant)
            except Moved:
                self._owners.pop(key, None)
                continue
            except _Lapsed:
                self._owners.pop(key, None)
                logger.warning("the replica %s let its lease lapse during a call: taking the call over", owner)
                continue
            except _Unreachable as exc:
                self._owners.pop(key, None)
                logger.warning("the replica %s does not answer (%s): waiting for its lease to expire", owner, exc)
                await anyio.sleep(min(max(where.expires - time.time(), 0.0), self.leases.ttl) + 0.05)
        said = "the replica running this conversation does not answer: retry in a moment"
        return Forwarded(owner, error_result(said))

    async def accept(self, key: str, draining: bool) -> Here:
        """Whether a call another replica forwarded here runs here: :class:`Here` if this replica holds
        (or can take) conversation ``key``'s lease. ``draining``: this replica takes no lease; one it
        still holds has a call going (the call answers that the server is shutting down), one it gave
        back sends the caller to claim it.

        Raises:
            Moved: another replica holds it (or may take it). WorkspaceError: see :meth:`place`.
        """
        if draining:
            if self.leases.holds(key):
                return Here(self.leases.epoch(key))
            raise Moved(self.me)
        where = await self.place(key)
        if isinstance(where, Owner):
            raise Moved(where.url)
        return where

    async def _forward_watched(
        self, key: str, owner: str, expires: float, tool: str, arguments: dict[str, Any] | None, tenant: str
    ) -> Forwarded:
        """``forward`` to ``owner``, cancelled once ``owner``'s lease of ``key`` expired unrenewed.

        Raises:
            Moved, _Unreachable: see :meth:`Forwarder.forward`. _Lapsed: the lease expired meanwhile.
        """
        outcome: list[types.CallToolResult | Exception] = []
        async with anyio.create_task_group() as group:

            async def hop() -> None:
                try:
                    outcome.append(await self._forwarder.forward(owner, tool, arguments, tenant))
                except (Moved, _Unreachable) as exc:
                    outcome.append(exc)
                group.cancel_scope.cancel()

            group.start_soon(hop)
            await self._lapse(key, owner, expires)
            group.cancel_scope.cancel()
        if not outcome:
            raise _Lapsed(owner)
        if isinstance(outcome[0], Exception):
            raise outcome[0]
        return Forwarded(owner, outcome[0])

    async def _lapse(self, key: str, owner: str, expires: float) -> None:
        """Return once ``owner``'s lease of ``key`` is no longer ``owner``'s or expired (read again at
        each expiry it had: one read per lease time while the owner renews it)."""
        while True:
            await anyio.sleep(max(expires - time.time(), 0.0) + _LAPSE_MARGIN)
            try:
                held = await anyio.to_thread.run_sync(self.leases.table.holder, key)
            except WorkspaceError:  # the database cannot be read: nothing says the owner is gone
                expires = time.time() + self.leases.ttl / 3
                continue
            if held is None or held[0] != owner or held[1] <= time.time():
                return
            expires = held[1]
