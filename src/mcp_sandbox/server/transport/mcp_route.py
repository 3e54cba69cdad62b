"""The ``/mcp`` endpoint: Streamable HTTP for MCP clients, plain JSON-RPC for curl, n8n and scripts.

One SDK session manager cannot serve both kinds of client, so :class:`McpRoute` routes each
request among three (see there). ``initialize`` without ``capabilities`` (the earlier runner's
README sent none) is completed with ``{}``; other missing or malformed fields are refused with
-32602 naming them. A GET without a session that accepts only ``text/event-stream`` opens the
deprecated HTTP+SSE transport (that runner's "establish SSE stream"). Before the SDK sees a POST,
:func:`_refusal` answers what it would drop or fail on: JSON nested too deeply for Python (-32700,
where it answered HTTP 500), a request whose ``id`` is not a string, an integer or null (-32600,
where it answered 202 and dropped it), and other malformed envelopes and batches (-32600 naming
the field; MCP has no batches since 2025-06-18). Error replies to requests that carried no session
never carry ``Mcp-Session-Id``: the SDK mints one for the request, then discards it when it fails.
With tracing on, a request's HTTP ``traceparent`` (and ``tracestate``, ``baggage``) headers become
its ``_meta``'s where that names no trace of its own, for callers that cannot write ``_meta``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecuritySettings
from mcp.types import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, InitializeRequestParams
from pydantic import ValidationError
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mcp_sandbox import tracing

__all__ = ["McpRoute"]

_SESSION_HEADER = b"mcp-session-id"
_EVENT_STREAM = "text/event-stream"
_TRACE_HEADERS = ("traceparent", "tracestate", "baggage")


def _wants_stream(headers: Headers) -> bool:
    """Whether the client names ``text/event-stream`` in ``Accept`` (a wildcard does not count)."""
    types = [part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")]
    return _EVENT_STREAM in types


def _only_stream(headers: Headers) -> bool:
    """Whether ``Accept`` names ``text/event-stream`` alone: an HTTP+SSE client opening its stream."""
    types = {part.split(";")[0].strip().lower() for part in headers.get("accept", "").split(",")}
    return types == {_EVENT_STREAM}


def _field_errors(error: ValidationError) -> str:
    return "; ".join(f"params.{'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in error.errors())


def _complete_initialize(message: dict[str, Any]) -> str | None:
    """Fill in ``capabilities`` when missing; return what is still wrong with the params, or None."""
    params = message.get("params")
    if not isinstance(params, dict):
        return "params: must be an object with protocolVersion, clientInfo and capabilities"
    params.setdefault("capabilities", {})
    try:
        InitializeRequestParams.model_validate(params)
    except ValidationError as exc:
        return _field_errors(exc)
    return None


def _continue_trace(message: Any, headers: Headers) -> bool:
    """Put the HTTP request's W3C trace headers into a request's ``params._meta`` that has no ``traceparent``
    of its own (a plain JSON-RPC caller's way to pass its trace; the MCP SDK continues ``_meta``'s); whether it did.
    """
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return False
    params = message.setdefault("params", {})
    if not isinstance(params, dict):
        return False
    meta = params.setdefault("_meta", {})
    if not isinstance(meta, dict) or "traceparent" in meta:
        return False
    meta.update({name: headers[name] for name in _TRACE_HEADERS if name in headers})
    return True


def _error(code: int, message: str, request_id: Any = None) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}, 400)


def _refusal(body: bytes) -> tuple[Any, JSONResponse | None]:
    """The parsed body (None when it is not JSON: the SDK answers that), or the error to answer instead."""
    try:
        message = json.loads(body)
    except RecursionError:
        return None, _error(PARSE_ERROR, "Parse error: the JSON is nested too deeply")
    except ValueError:
        return None, None
    problem = _envelope_problem(message)
    if problem is not None:
        return None, _error(INVALID_REQUEST, f"Invalid request: {problem}")
    return message, None


def _envelope_problem(message: Any) -> str | None:
    """What makes ``message`` no JSON-RPC 2.0 message, named (the SDK dumps its model's errors)."""
    if isinstance(message, list):
        return "batches are not supported; send one message per request"
    if not isinstance(message, dict):
        return f"a message must be a JSON object, not {type(message).__name__}"
    if message.get("jsonrpc") != "2.0":
        return 'jsonrpc must be "2.0"'
    request_id = message.get("id")
    if isinstance(request_id, bool) or not (
        isinstance(request_id, str | int | None) or (isinstance(request_id, float) and request_id.is_integer())
    ):
        shown = json.dumps(request_id)
        return f"id must be a string, an integer or null, not {shown if len(shown) <= 100 else shown[:100] + '...'}"
    if "result" in message or "error" in message:
        return None
    if not isinstance(message.get("method"), str):
        return "method must be a string" if "method" in message else "method is missing"
    if "params" in message and not isinstance(message["params"], dict):
        return "params must be an object"
    return None


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole request body (already bounded by the body-limit middleware) and what followed it."""
    chunks: list[bytes] = []
    trailing: list[Message] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            trailing.append(message)
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks), trailing


def _replay(body: bytes, trailing: list[Message], receive: Receive) -> Receive:
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}, *trailing]

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed


async def _cancelled_on_hang_up(
    app: ASGIApp, scope: Scope, body: bytes, trailing: list[Message], receive: Receive, send: Send
) -> None:
    """Serve a plain-JSON request with ``app``, cancelled when the client hangs up before its reply.

    Such a reply is one JSON document sent at the end, so nothing writes to the connection
    while the tool runs and nothing would notice that the client left (curl ``--max-time``):
    the run would go on to its own timeout, holding its slot. This reads ``receive`` for the
    client's ``http.disconnect`` meanwhile and cancels the request, which ends the call (the SDK
    cancels the handler of a request whose transport is terminated) and with it the run.
    """
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    gone = anyio.Event()
    replied = False

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        await gone.wait()  # the watcher below is the one reader of the connection
        return {"type": "http.disconnect"}

    async def tracked(message: Message) -> None:
        nonlocal replied
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            replied = True

    async def watch(request: anyio.CancelScope) -> None:
        messages = list(trailing)
        while True:
            message = messages.pop(0) if messages else await receive()
            if message["type"] == "http.disconnect":
                gone.set()
                if not replied:
                    request.cancel()
                return

    async with anyio.create_task_group() as group:
        group.start_soon(watch, group.cancel_scope)
        await app(scope, replayed, tracked)
        group.cancel_scope.cancel()


def _without_session_on_error(send: Send) -> Send:
    """Drop ``Mcp-Session-Id`` from an error reply: the session the SDK opened for it is gone."""

    async def filtered(message: Message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 400:
            message = {**message, "headers": [(k, v) for k, v in message.get("headers", []) if k != _SESSION_HEADER]}
        await send(message)

    return filtered


def _with_headers(scope: Scope, **replace: bytes) -> Scope:
    names = {name.replace("_", "-").encode() for name in replace}
    headers = [(k, v) for k, v in scope["headers"] if k not in names]
    headers += [(name.replace("_", "-").encode(), value) for name, value in replace.items()]
    return {**scope, "headers": headers}


class McpRoute:
    """The ASGI app behind ``/mcp``: routes each request to the stateful or a stateless session manager.

    - a request that carries ``Mcp-Session-Id``, a GET (the standalone stream), a DELETE, and an
      ``initialize`` from a client that accepts ``text/event-stream`` go to the *stateful* manager
      (sessions, SSE-framed replies) — what every MCP SDK client does;
    - a GET without a session that accepts ``text/event-stream`` alone opens the deprecated
      HTTP+SSE transport (``legacy_sse``: its ``endpoint`` event names where to post), as the
      earlier code runner served it at ``/mcp``;
    - any other POST without a session is served *statelessly*: SSE-framed when the client names
      ``text/event-stream`` in ``Accept``, plain ``application/json`` otherwise (``*/*``, curl's
      default, and a missing ``Accept`` included). So the earlier code runner's users can
      ``POST`` a ``tools/call`` without ever initializing, and no reply to them carries a session
      id that the server has already thrown away.

    ``stateful`` is the manager MCP clients keep sessions with (its options, such as the idle
    timeout and the session cap, are the caller's); the two stateless ones are built here.
    """

    def __init__(
        self,
        server: Server,
        stateful: StreamableHTTPSessionManager,
        security: TransportSecuritySettings,
        max_body_size: int,
        legacy_sse: ASGIApp | None = None,
    ) -> None:
        self.stateful = stateful
        self._legacy_sse = legacy_sse
        common: dict[str, Any] = {"security_settings": security, "max_request_body_size": max_body_size}
        self._stateless_stream = StreamableHTTPSessionManager(server, stateless=True, **common)
        self._stateless_json = StreamableHTTPSessionManager(server, stateless=True, json_response=True, **common)
        self._app = RequestBodyLimitMiddleware(self._route, max_body_size)

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Run the three managers (the app's lifespan)."""
        async with self.stateful.run(), self._stateless_stream.run(), self._stateless_json.run():
            yield

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        session = headers.get("mcp-session-id") is not None
        if scope["method"] == "GET" and not session and self._legacy_sse is not None and _only_stream(headers):
            await self._legacy_sse(scope, receive, send)
            return
        if scope["method"] != "POST":
            await self.stateful.handle_request(scope, receive, send if session else _without_session_on_error(send))
            return
        body, trailing = await _read_body(receive)
        message, refused = _refusal(body)
        if refused is not None:
            await refused(scope, receive, send)
            return
        if "traceparent" in headers and tracing.enabled() and _continue_trace(message, headers):
            body = json.dumps(message).encode()
            scope = _with_headers(scope, content_length=str(len(body)).encode())
        if session:
            await self.stateful.handle_request(scope, _replay(body, trailing, receive), send)
            return
        wants_stream = _wants_stream(headers)
        if isinstance(message, dict) and message.get("method") == "initialize":
            problem = _complete_initialize(message)
            if problem is not None:
                error = {"code": INVALID_PARAMS, "message": f"initialize: {problem}"}
                reply = {"jsonrpc": "2.0", "id": message.get("id"), "error": error}
                await JSONResponse(reply, status_code=400)(scope, receive, send)
                return
            body = json.dumps(message).encode()
            scope = _with_headers(scope, content_length=str(len(body)).encode())
        if "accept" not in headers:
            # No Accept means anything is acceptable (RFC 9110); the SDK wants it spelled out.
            scope = _with_headers(scope, accept=b"application/json")
        send = _without_session_on_error(send)
        if not wants_stream:
            await _cancelled_on_hang_up(self._stateless_json.handle_request, scope, body, trailing, receive, send)
            return
        receive = _replay(body, trailing, receive)
        if isinstance(message, dict) and message.get("method") == "initialize":
            await self.stateful.handle_request(scope, receive, send)
        else:
            await self._stateless_stream.handle_request(scope, receive, send)
