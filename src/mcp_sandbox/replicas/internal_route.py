"""``POST /internal/v1/call``: a tool call another replica forwarded here, signed with the shared secret.

Not for clients: no bearer token is asked, the signature is (:mod:`.signing`);
anything unsigned, stale, replayed (even across a restart), meant for another replica or naming an unknown tenant is
refused (401, 400) before anything runs. The call runs as the tenant the body names, and its tool
result is the answer; 409 says this replica does not hold the conversation (the caller claims
again). A caller that hangs up cancels the call, as an MCP client's cancellation would. The route
is answered ahead of the app (:func:`with_internal_route`): the app's middleware (Host and
Origin checks, bearer tokens, Starlette's routing) is for clients, and cost the hop CPU per call.

``POST /internal/v1/task`` is signed and checked the same way: a ``tasks/get`` or ``tasks/cancel``
of a task this replica runs, asked by another (``serve_task`` answers it: :mod:`..server.tasks.remote`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from starlette.types import ASGIApp, Receive, Scope, Send

from mcp_sandbox import tracing
from mcp_sandbox.replicas.forward import CALL_PATH, FORWARDED_TOOLS, TASK_PATH, Moved
from mcp_sandbox.replicas.signing import SIGNATURE_HEADER, TIME_HEADER, Verifier

__all__ = ["CALL_PATH", "TASK_PATH", "ServeTask", "with_internal_route"]

logger = logging.getLogger(__name__)

Serve = Callable[[str, dict[str, Any] | None, str], Awaitable[types.CallToolResult]]
# Answers a task's request another replica signed: the HTTP status and the JSON body.
ServeTask = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes]]]


async def _answer(send: Send, status: int, body: bytes = b"", more: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *more]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _body(receive: Receive, limit: int) -> bytes | None:
    """The request's body, or None past ``limit`` bytes or when the caller hung up."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


def with_internal_route(
    app: ASGIApp,
    me: str,
    verifier: Verifier,
    known_tenant: Callable[[str], bool],
    serve: Serve,
    limit: int,
    serve_task: ServeTask | None = None,
) -> ASGIApp:
    """``app`` with :data:`CALL_PATH` (and :data:`TASK_PATH`, with ``serve_task``) answered ahead of
    it; ``me`` is this replica's ``replica_url``, ``serve(tool, arguments, tenant)`` runs a call,
    ``limit`` bounds the body."""

    async def signed(scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The request's body once its signature is checked; None when it was refused (answered)."""
        if scope["method"] != "POST":
            await _answer(send, 405, more=((b"allow", b"POST"),))
            return None
        body = await _body(receive, limit)
        if body is None:
            await _answer(send, 413)
            return None
        headers = _headers(scope)
        why = await verifier.check(headers.get(TIME_HEADER), headers.get(SIGNATURE_HEADER), body, time.time())
        if why is not None:
            client = scope.get("client")
            logger.warning("refused an internal call from %s: %s", client[0] if client else "?", why)
            await _answer(send, 401)
            return None
        return body

    async def task(scope: Scope, receive: Receive, send: Send) -> None:
        if (body := await signed(scope, receive, send)) is None or serve_task is None:
            return
        try:
            request = json.loads(body)
            valid = request["to"] == me and isinstance(request["tenant"], str) and known_tenant(request["tenant"])
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            await _answer(send, 400)
            return
        status, answer = await serve_task(request)
        await _answer(send, status, answer)

    async def call(scope: Scope, receive: Receive, send: Send) -> None:
        if (body := await signed(scope, receive, send)) is None:
            return
        try:
            request = json.loads(body)
            tool, tenant, arguments = request["tool"], request["tenant"], request["arguments"]
            valid = (
                request["to"] == me
                and tool in FORWARDED_TOOLS
                and isinstance(tenant, str)
                and known_tenant(tenant)
                and (arguments is None or isinstance(arguments, dict))
            )
        except (ValueError, KeyError, TypeError):
            valid = False
        if not valid:
            await _answer(send, 400)
            return
        answered = False
        async with anyio.create_task_group() as group:

            async def hang_up() -> None:  # the caller went away: so does the call
                while (await receive())["type"] != "http.disconnect":
                    pass
                if not answered:  # (once answered, the server says "disconnect" to every receive)
                    group.cancel_scope.cancel()

            group.start_soon(hang_up)
            try:
                with tracing.span(
                    "mcp_sandbox.forwarded",
                    {"gen_ai.tool.name": tool},
                    tracing.SpanKind.SERVER,
                    context=tracing.context_of(_headers(scope)),
                ):
                    result = await serve(tool, arguments, tenant)
            except Moved as moved:
                answered = True
                await _answer(send, 409, json.dumps({"owner": str(moved)}).encode())
            else:
                answered = True
                # Answered before the watcher is stopped: the caller reads while this replica tidies up.
                await _answer(send, 200, result.model_dump_json(by_alias=True, exclude_none=True).encode())
            group.cancel_scope.cancel()

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == CALL_PATH:
            await call(scope, receive, send)
        elif scope["type"] == "http" and scope["path"] == TASK_PATH and serve_task is not None:
            await task(scope, receive, send)
        else:
            await app(scope, receive, send)

    return dispatch
